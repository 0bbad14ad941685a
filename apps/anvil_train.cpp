// anvil-train: trains an image classifier on Fashion-MNIST and reports
// accuracy and speed per epoch, in the manner of d2l's train_ch6.
//
//   anvil-train --model lenet --epochs 10 --batch-size 256 --lr 0.2
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/device.h"
#include "core/random.h"
#include "data/dataloader.h"
#include "nn/models.h"
#include "nn/safetensors.h"
#include "nn/train.h"

using namespace anvil;

namespace {

struct Options {
  std::string model = "lenet";
  std::string device = "auto";
  int epochs = 10;
  int64_t batch_size = 256;
  double lr = 0.2, momentum = 0, weight_decay = 0;
  bool nesterov = false;
  uint64_t seed = 0;
  std::string data_dir = "/usr/share/datasets/fashion-mnist";
  int64_t limit_train = 0, limit_test = 0;
  bool no_shuffle = false;
  std::string init = "seed";
  std::string init_from, save, metrics;
};

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

Device choose_device(const std::string& text) {
  if (text == "auto") {
    if (devices_are_simulated()) {
      // Simulated GPUs are for checking kernels, orders of magnitude slower
      // than the CPU backend: used only when named.
      std::cout << "no GPU available (this build's cuda:N are simulated; name --device cuda:0 "
                   "to train on one); training on cpu\n";
      return Device::cpu();
    }
    Device d = try_gpu(0);
    if (d.is_cpu()) std::cout << "no GPU available (" << no_gpu_reason() << "); training on cpu\n";
    return d;
  }
  Device d;
  try {
    d = Device::parse(text);
  } catch (const std::invalid_argument& e) {
    throw UsageError(fmt::format("--device: {} (or 'auto')", e.what()));
  }
  if (d.is_cuda() && d.index >= device_count())
    throw UsageError(fmt::format("--device {}: not available ({} GPU(s) usable{}{})", text,
                                 device_count(), device_count() ? "" : "; ", no_gpu_reason()));
  return d;
}

// Checks that a file we will write at the end can be created now, so a bad
// path fails before training rather than after it.
void check_writable(const std::string& flag, const std::string& path) {
  if (path.empty()) return;
  std::filesystem::path p(path);
  std::filesystem::path dir = p.has_parent_path() ? p.parent_path() : ".";
  if (!std::filesystem::is_directory(dir))
    throw UsageError(fmt::format("{} {}: directory '{}' does not exist", flag, path, dir.string()));
  if (std::filesystem::is_directory(p))
    throw UsageError(fmt::format("{} {}: is a directory", flag, path));
  if (access(dir.c_str(), W_OK) != 0)
    throw UsageError(fmt::format("{} {}: directory '{}' is not writable", flag, path, dir.string()));
}

// Range checks for numeric flags. CLI11's NonNegativeNumber/PositiveNumber
// report a double range ("Value 0 not in range 0.000000 to 1797...") and let
// nan through; these reject nan and inf and say what is wanted.
CLI::Validator number_at_least(double min, bool inclusive) {
  std::string want = fmt::format("a finite number {} {}", inclusive ? ">=" : ">", min);
  return CLI::Validator(
      [=](std::string& text) -> std::string {
        char* end = nullptr;
        double v = std::strtod(text.c_str(), &end);
        bool ok = !text.empty() && end == text.c_str() + text.size() && std::isfinite(v) &&
                  (inclusive ? v >= min : v > min);
        return ok ? std::string() : fmt::format("expected {}, got '{}'", want, text);
      },
      inclusive ? "NONNEGATIVE" : "POSITIVE");
}

void print_progress(int64_t done, int64_t total, const train::EpochStats& s) {
  constexpr int kWidth = 30;
  int filled = int(kWidth * done / std::max<int64_t>(total, 1));
  std::string bar(size_t(filled), '#');
  bar.resize(kWidth, '.');
  std::cout << fmt::format("\r  [{}] {}/{} loss {:.4f} acc {:.3f} {:.0f} img/s", bar, done, total,
                           s.loss, s.accuracy, s.images_per_second())
            << std::flush;
}

int run(const Options& o) {
  models::Init init;
  if (o.init == "seed") init = models::Init::Seed;
  else if (o.init == "kaiming") init = models::Init::Kaiming;
  else if (o.init == "default") init = models::Init::Default;
  else throw UsageError(fmt::format("--init: unknown scheme '{}' (seed, kaiming, default)", o.init));
  check_writable("--save", o.save);
  check_writable("--metrics", o.metrics);

  manual_seed(o.seed);
  std::shared_ptr<nn::Module> model;
  try {
    model = models::create(o.model, init);
  } catch (const std::invalid_argument& e) {
    throw UsageError(fmt::format("--model: {}", e.what()));
  }
  // After the cheap checks of the other flags, so that a mistyped --model
  // reports only its own error (not also the GPU probe's "no GPU" note).
  Device device = choose_device(o.device);
  if (!o.init_from.empty())
    nn::load_state_dict(*model, nn::load_safetensors(o.init_from), o.init_from);
  model->to(device);

  auto train_set = std::make_shared<const data::ImageSet>(
      data::load_mnist_split(o.data_dir, true, o.limit_train));
  auto test_set = std::make_shared<const data::ImageSet>(
      data::load_mnist_split(o.data_dir, false, o.limit_test));
  data::DataLoader train_loader(train_set, o.batch_size, !o.no_shuffle, false, o.seed);
  data::DataLoader test_loader(test_set, o.batch_size, false, false, o.seed);
  optim::SGD optimizer(model->parameters(),
                       {.lr = o.lr, .momentum = o.momentum, .weight_decay = o.weight_decay,
                        .nesterov = o.nesterov});

  std::ofstream metrics;
  if (!o.metrics.empty()) {
    metrics.open(o.metrics, std::ios::trunc);
    if (!metrics) throw UsageError(fmt::format("--metrics {}: cannot open for writing", o.metrics));
  }
  std::cout << fmt::format("training {} ({} parameters) on {}: {} train / {} test images, "
                           "batch {}, lr {}, {} epochs\n",
                           o.model, model->num_parameters(), device.str(), train_set->count,
                           test_set->count, o.batch_size, o.lr, o.epochs);

  bool tty = isatty(STDOUT_FILENO);
  double total_seconds = 0;
  train::EpochStats test;
  for (int epoch = 1; epoch <= o.epochs; ++epoch) {
    train::Progress progress;
    if (tty) progress = print_progress;
    train::EpochStats tr = train::train_epoch(*model, optimizer, train_loader, device, progress);
    if (tty) std::cout << "\r\033[K";
    test = train::evaluate(*model, test_loader, device);
    total_seconds += tr.seconds;
    std::cout << fmt::format(
        "epoch {:>3}/{}: train loss {:.4f}, train acc {:.4f}, test acc {:.4f}, {:.2f} s, "
        "{:.0f} img/s\n",
        epoch, o.epochs, tr.loss, tr.accuracy, test.accuracy, tr.seconds,
        tr.images_per_second())
              << std::flush;
    if (metrics) {
      nlohmann::ordered_json line = {{"epoch", epoch},
                                     {"train_loss", tr.loss},
                                     {"train_acc", tr.accuracy},
                                     {"test_loss", test.loss},
                                     {"test_acc", test.accuracy},
                                     {"epoch_seconds", tr.seconds},
                                     {"images_per_second", tr.images_per_second()},
                                     {"device", device.str()},
                                     {"model", o.model},
                                     {"batch_size", o.batch_size},
                                     {"lr", o.lr}};
      metrics << line.dump() << '\n' << std::flush;
    }
  }
  if (!o.save.empty()) {
    nn::save_safetensors(o.save, model->state_dict());
    std::cout << "saved " << o.save << '\n';
  }
  if (o.epochs > 0)
    std::cout << fmt::format("test acc: {:.2f}, {:.1f} sec/epoch on [{}]\n", test.accuracy,
                             total_seconds / o.epochs, device.str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"anvil-train: train a classifier on Fashion-MNIST"};
  // A flag given twice takes its last value, so wrappers can set defaults.
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.add_option("--model", o.model, "Model: lenet")->capture_default_str();
  app.add_option("--device", o.device, "auto (best present), cpu or cuda:N")->capture_default_str();
  app.add_option("--epochs", o.epochs, "Number of epochs")->capture_default_str()->check(number_at_least(0, true));
  app.add_option("--batch-size", o.batch_size, "Mini-batch size")->capture_default_str()->check(number_at_least(0, false));
  app.add_option("--lr", o.lr, "Learning rate")->capture_default_str()->check(number_at_least(0, true));
  app.add_option("--momentum", o.momentum, "SGD momentum")->capture_default_str()->check(number_at_least(0, true));
  app.add_option("--weight-decay", o.weight_decay, "L2 weight decay")->capture_default_str()->check(number_at_least(0, true));
  app.add_flag("--nesterov", o.nesterov, "Nesterov momentum");
  app.add_option("--seed", o.seed, "Seed for initialisation and shuffling")->capture_default_str();
  app.add_option("--init", o.init, "Weight init: seed (N(0, 0.01)), kaiming, default")->capture_default_str();
  app.add_option("--data-dir", o.data_dir, "Directory with the Fashion-MNIST IDX files")->capture_default_str();
  app.add_option("--limit-train", o.limit_train, "Use only the first N training images (0 = all)")->check(number_at_least(0, true));
  app.add_option("--limit-test", o.limit_test, "Use only the first N test images (0 = all)")->check(number_at_least(0, true));
  app.add_flag("--no-shuffle", o.no_shuffle, "Keep the training set in file order");
  app.add_option("--init-from", o.init_from, "Start from a safetensors checkpoint");
  app.add_option("--save", o.save, "Write the trained weights as safetensors");
  app.add_option("--metrics", o.metrics, "Write one JSON line per epoch to this file");
  bool list_devices = false;
  app.add_flag("--list-devices", list_devices, "Print the CUDA devices present and exit");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  if (list_devices) {
    std::cout << device_summary();
    return 0;
  }
  try {
    return run(o);
  } catch (const std::exception& e) {
    std::cerr << "anvil-train: error: " << e.what() << '\n';
    return dynamic_cast<const UsageError*>(&e) ? 2 : 1;
  }
}
