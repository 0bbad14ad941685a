// anvil-train: trains an image classifier on Fashion-MNIST and reports
// accuracy and speed per epoch, in the manner of d2l's train_ch6.
//
//   anvil-train --model lenet --recipe seed
//   anvil-train --model resnet18 --recipe best --checkpoint run.ckpt   # later: --resume run.ckpt
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "apps/evaluation.h"
#include "apps/train_recipes.h"
#include "core/device.h"
#include "core/random.h"
#include "data/dataloader.h"
#include "data/transforms.h"
#include "nn/layers.h"
#include "nn/models.h"
#include "nn/safetensors.h"
#include "nn/schedule.h"
#include "nn/train.h"

using namespace anvil;
using app::Options;
using app::UsageError;

namespace {

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

// Checks that a file we will write later can be created now, so a bad path
// fails before training rather than after it.
void check_writable(const std::string& flag, const std::string& path) {
  if (path.empty()) return;
  std::filesystem::path p(path);
  std::filesystem::path dir = p.has_parent_path() ? p.parent_path() : ".";
  if (!std::filesystem::is_directory(dir))
    throw UsageError(fmt::format("{} {}: directory '{}' does not exist", flag, path, dir.string()));
  if (std::filesystem::is_directory(p))
    throw UsageError(fmt::format("{} {}: is a directory", flag, path));
  // Only creating a file proves that one can be written: access() says yes
  // to root in /proc, say, where no file can be created. The probe is named
  // as save_safetensors names its temporary file, and removed at once.
  std::string probe = path + ".tmp.XXXXXX";
  int fd = mkstemp(probe.data());
  if (fd < 0) {
    int err = errno;
    throw UsageError(fmt::format("{} {}: cannot create a file in directory '{}' ({})", flag, path,
                                 dir.string(), std::strerror(err)));
  }
  ::close(fd);
  std::remove(probe.c_str());
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

// Progress on a terminal: a bar redrawn in place, at most five times a
// second (reading the running figures waits for the device, see
// train::EpochProgress), and always for the last batch.
train::Progress bar_progress() {
  auto last = std::make_shared<std::chrono::steady_clock::time_point>();
  return [last](const train::EpochProgress& p) {
    const auto now = std::chrono::steady_clock::now();
    if (p.done != p.total && now - *last < std::chrono::milliseconds(200)) return;
    *last = now;
    constexpr int kWidth = 30;
    int filled = int(kWidth * p.done / std::max<int64_t>(p.total, 1));
    std::string bar(size_t(filled), '#');
    bar.resize(kWidth, '.');
    const train::EpochStats s = p.stats();
    std::cout << fmt::format("\r  [{}] {}/{} loss {:.4f} acc {:.3f} {:.0f} img/s", bar, p.done,
                             p.total, s.loss, s.accuracy, s.images_per_second())
              << std::flush;
  };
}

// Progress for a log file (stdout not a terminal): no bar redrawn in place,
// one plain line a minute at most, so a ResNet epoch of a quarter of an
// hour on a CPU shows it is alive while a LeNet epoch prints nothing extra.
train::Progress log_progress() {
  auto last = std::make_shared<std::chrono::steady_clock::time_point>(
      std::chrono::steady_clock::now());
  return [last](const train::EpochProgress& p) {
    const auto now = std::chrono::steady_clock::now();
    if (p.done == p.total || now - *last < std::chrono::seconds(60)) return;
    *last = now;
    const train::EpochStats s = p.stats();
    std::cout << fmt::format("  batch {}/{}: loss {:.4f}, acc {:.3f}, {:.0f} img/s\n", p.done,
                             p.total, s.loss, s.accuracy, s.images_per_second())
              << std::flush;
  };
}

// The train and test transforms: crop and flip for training only; both
// resize and normalise alike. Empty (no per-batch work) when nothing is on.
struct Transforms {
  data::BatchTransform train, test;
  std::string summary;  // for the run's header, e.g. "resize 96, normalise (mean 0.286, std 0.353)"
};

Transforms make_transforms(const Options& o, const data::ImageSet& train_set) {
  data::TransformOptions test;
  test.resize = o.resize;
  test.seed = o.seed;
  std::vector<std::string> parts;
  if (o.resize) parts.push_back(fmt::format("resize {}", o.resize));
  if (o.normalize) {
    // The training set's statistics, for the test set too (as torchvision
    // recipes do), so the test images are not looked at before evaluation.
    data::ChannelStats stats = data::channel_stats(train_set);
    test.mean = stats.mean;
    test.std = stats.std;
    parts.push_back(fmt::format("normalise (mean {:.4f}, std {:.4f})", stats.mean[0], stats.std[0]));
  }
  data::TransformOptions train = test;
  if (o.augment) {
    train.crop_padding = o.crop_padding;
    train.horizontal_flip = true;
    parts.push_back(o.crop_padding ? fmt::format("random crop (padding {}) + flip", o.crop_padding)
                                   : std::string("flip"));
  }
  Transforms t;
  bool train_work = o.resize || o.normalize || o.augment;
  bool test_work = o.resize || o.normalize;
  if (train_work) t.train = data::make_transform(train);
  if (test_work) t.test = data::make_transform(test);
  for (auto& p : parts) t.summary += (t.summary.empty() ? "" : ", ") + p;
  if (t.summary.empty()) t.summary = "none";
  return t;
}

std::string schedule_summary(const optim::ScheduleOptions& s) {
  std::string text = optim::schedule_shape_name(s.shape);
  if (s.shape == optim::ScheduleShape::Step)
    text += fmt::format(" (x{} every {} epochs)", s.gamma, s.step_epochs);
  if (s.shape == optim::ScheduleShape::Cosine) text += fmt::format(" (to {})", s.min_lr);
  if (s.warmup_epochs)
    text += fmt::format(", {} warmup epoch(s) from {}x", s.warmup_epochs, s.warmup_start_factor);
  return text;
}

// What anvil-train keeps in a checkpoint besides the weights: the settings
// it was trained with (a resumed run must use the same) and the metrics of
// the epochs done (so the resumed run's --metrics file is complete).
struct Resumed {
  int64_t epochs_done = 0;
  nlohmann::ordered_json history = nlohmann::ordered_json::array();
};

// The run's settings and counters are checked before any tensor is read into
// the model, so resuming with another --model (or --lr, ...) names the flag
// rather than a tensor.
Resumed resume_from(const Options& o, nn::Module& model, optim::SGD& optimizer,
                    int64_t batches_per_epoch) {
  train::RunState state = train::read_run_state(o.resume);
  const nlohmann::ordered_json saved =
      state.info.value("settings", nlohmann::ordered_json::object());
  if (!saved.is_object())
    throw nn::CheckpointError(fmt::format("{}: its 'settings' are not a JSON object", o.resume));
  const nlohmann::ordered_json settings = app::training_settings(o);
  for (auto& [key, value] : settings.items()) {
    if (!saved.contains(key))
      throw nn::CheckpointError(fmt::format("{}: has no setting '{}'", o.resume, key));
    if (saved[key] != value)
      throw nn::CheckpointError(fmt::format(
          "{}: was trained with --{} {}, this run has --{} {}; resume with the flags the run "
          "started with",
          o.resume, key, saved[key].dump(), key, value.dump()));
  }
  if (state.steps_done != state.epochs_done * batches_per_epoch)
    throw nn::CheckpointError(fmt::format(
        "{}: {} steps for {} epochs, but an epoch here has {} batches", o.resume, state.steps_done,
        state.epochs_done, batches_per_epoch));
  Resumed r;
  r.epochs_done = state.epochs_done;
  r.history = state.info.value("history", nlohmann::ordered_json::array());
  if (!r.history.is_array() || int64_t(r.history.size()) != state.epochs_done)
    throw nn::CheckpointError(fmt::format(
        "{}: its 'history' must be a list of one entry per epoch done ({})", o.resume,
        state.epochs_done));
  train::load_checkpoint(o.resume, model, optimizer);  // the tensors, checked before any is copied
  return r;
}

// Whether two paths name one file (through ".", "..", symbolic links),
// falling back to the absolute paths' text when they cannot be resolved.
bool same_file_path(const std::string& a, const std::string& b) {
  namespace fs = std::filesystem;
  std::error_code ea, eb;
  fs::path ca = fs::weakly_canonical(a, ea), cb = fs::weakly_canonical(b, eb);
  if (ea || eb) return fs::absolute(a).lexically_normal() == fs::absolute(b).lexically_normal();
  return ca == cb;
}

// The files a run writes must be distinct: --save onto the checkpoint, say,
// would leave a weights-only file where the resumable run was.
void check_distinct_outputs(const Options& o) {
  std::vector<std::pair<const char*, std::string>> outputs = {
      {"--save", o.save}, {"--metrics", o.metrics}, {"--checkpoint", o.checkpoint}};
  for (size_t i = 0; i < outputs.size(); ++i)
    for (size_t j = i + 1; j < outputs.size(); ++j) {
      auto& [flag_a, a] = outputs[i];
      auto& [flag_b, b] = outputs[j];
      if (a.empty() || b.empty()) continue;
      if (same_file_path(a, b))
        throw UsageError(fmt::format("{} and {} name the same file '{}'; give each its own",
                                     flag_a, flag_b, a));
    }
  // The metrics file is rewritten from its first line: it must not be the
  // weights the run reads (--save may replace them: the run has read them).
  for (const auto& [flag, input] : {std::pair{"--init-from", o.init_from}, {"--resume", o.resume}})
    if (!o.metrics.empty() && !input.empty() && same_file_path(o.metrics, input))
      throw UsageError(fmt::format("--metrics {}: is the {} file; writing metrics there would "
                                   "destroy the weights",
                                   o.metrics, flag));
  // A new run must not overwrite another run's checkpoint after its first epoch.
  if (!o.checkpoint.empty() && o.resume.empty() && std::filesystem::exists(o.checkpoint))
    throw UsageError(fmt::format("--checkpoint {}: exists; continue that run with --resume {}, "
                                 "or remove the file or choose another to start afresh",
                                 o.checkpoint, o.checkpoint));
}

// --bn-recalibrate needs a model with BatchNorm layers.
void check_bn_recalibrate(const Options& o, nn::Module& model) {
  if (o.bn_recalibrate <= 0) return;
  for (nn::Module* m : model.modules())
    if (dynamic_cast<nn::BatchNorm2d*>(m)) return;
  throw UsageError(fmt::format("--bn-recalibrate {}: model {} has no BatchNorm layers",
                               o.bn_recalibrate, o.model));
}

// --eval-only: the flags that would have nothing to do, and the weights it needs.
void check_eval_only(const Options& o) {
  if (!o.eval_only) return;
  if (o.init_from.empty() && o.resume.empty())
    throw UsageError("--eval-only evaluates weights: give --init-from FILE (weights) or --resume "
                     "FILE (a training checkpoint)");
  const std::pair<const char*, bool> idle[] = {{"--save", !o.save.empty()},
                                               {"--checkpoint", !o.checkpoint.empty()},
                                               {"--stop-after-epoch", o.stop_after_epoch > 0},
                                               {"--bn-recalibrate", o.bn_recalibrate > 0}};
  for (auto& [flag, given] : idle)
    if (given)
      throw UsageError(fmt::format("{} has no effect with --eval-only (nothing is trained)", flag));
}

// --eval-only --resume FILE: the model's tensors of a training checkpoint.
// The settings that decide what evaluation computes (the model, and the
// inputs it sees) must be the checkpoint's, as for a resumed run.
void load_checkpoint_weights(const Options& o, nn::Module& model) {
  const train::RunState state = train::read_run_state(o.resume);
  const nlohmann::ordered_json saved =
      state.info.value("settings", nlohmann::ordered_json::object());
  const nlohmann::ordered_json settings = app::training_settings(o);
  std::vector<std::string> keys = {"model", "resize", "normalize"};
  if (o.normalize) keys.push_back("limit-train");  // the normalisation's statistics
  for (const std::string& key : keys)
    if (saved.is_object() && saved.contains(key) && saved[key] != settings[key])
      throw nn::CheckpointError(fmt::format(
          "{}: was trained with --{} {}, this run has --{} {}; evaluate with the flags it was "
          "trained with",
          o.resume, key, saved[key].dump(), key, settings[key].dump()));
  nn::NamedTensors weights;
  for (auto& [key, t] : nn::load_safetensors(o.resume))
    if (key.starts_with("model.")) weights.emplace_back(key.substr(6), t);
  nn::load_state_dict(model, weights, o.resume);
}

// anvil-train --eval-only: the test figures of the weights, per class and as
// a confusion matrix; --metrics gets them as one JSON object.
int evaluate_only(const Options& o, nn::Module& model, Device device) {
  const std::string weights = o.resume.empty() ? o.init_from : o.resume;
  if (!o.resume.empty()) load_checkpoint_weights(o, model);
  model.to(device);
  auto test_set = std::make_shared<const data::ImageSet>(
      data::load_mnist_split(o.data_dir, false, o.limit_test));
  // The training set only for its statistics, when the inputs are normalised.
  data::ImageSet train_set;
  if (o.normalize) train_set = data::load_mnist_split(o.data_dir, true, o.limit_train);
  Transforms transforms = make_transforms(o, train_set);
  data::DataLoader test_loader(test_set, o.batch_size, false, false, o.seed, transforms.test);
  std::cout << fmt::format("evaluating {} ({} parameters) from {} on {}: {} test images, batch {}, "
                           "transforms {}\n",
                           o.model, model.num_parameters(), weights, device.str(), test_set->count,
                           o.batch_size, transforms.summary)
            << std::flush;
  const train::ClassEvaluation result =
      train::evaluate_classes(model, test_loader, device, int64_t(app::kFashionClasses.size()));
  std::cout << app::evaluation_text(result) << std::flush;
  if (!o.metrics.empty()) {
    nlohmann::ordered_json j = {{"mode", "eval"},     {"weights", weights}, {"model", o.model},
                                {"recipe", o.recipe}, {"device", device.str()}};
    j.update(app::evaluation_json(result));
    std::ofstream out(o.metrics, std::ios::trunc);
    out << j.dump() << '\n';
    out.close();
    if (!out) throw UsageError(fmt::format("--metrics {}: cannot write", o.metrics));
  }
  return 0;
}

int run(const Options& o) {
  models::Init init = app::parse_init(o.init);
  optim::ScheduleOptions schedule_opts = app::check_settings(o);
  if (!o.resume.empty() && !o.init_from.empty())
    throw UsageError("--resume and --init-from both set the weights: give one");
  if (!o.resume.empty() && !std::filesystem::is_regular_file(o.resume))
    throw UsageError(fmt::format("--resume {}: no such file", o.resume));
  check_eval_only(o);
  check_writable("--save", o.save);
  check_writable("--metrics", o.metrics);
  check_writable("--checkpoint", o.checkpoint);
  check_distinct_outputs(o);

  manual_seed(o.seed);
  std::shared_ptr<nn::Module> model;
  try {
    model = models::create(o.model, init);
  } catch (const std::invalid_argument& e) {
    throw UsageError(fmt::format("--model: {}", e.what()));
  }
  check_bn_recalibrate(o, *model);
  // After the cheap checks of the other flags, so that a mistyped --model
  // reports only its own error (not also the GPU probe's "no GPU" note).
  Device device = choose_device(o.device);
  if (!o.init_from.empty())
    nn::load_state_dict(*model, nn::load_safetensors(o.init_from), o.init_from);
  if (o.eval_only) return evaluate_only(o, *model, device);
  model->to(device);

  auto train_set = std::make_shared<const data::ImageSet>(
      data::load_mnist_split(o.data_dir, true, o.limit_train));
  auto test_set = std::make_shared<const data::ImageSet>(
      data::load_mnist_split(o.data_dir, false, o.limit_test));
  Transforms transforms = make_transforms(o, *train_set);
  data::DataLoader train_loader(train_set, o.batch_size, !o.no_shuffle, false, o.seed,
                                transforms.train);
  data::DataLoader test_loader(test_set, o.batch_size, false, false, o.seed, transforms.test);
  // --bn-recalibrate: the first batches of the epoch just trained, in the
  // same order but without augmentation (the inputs evaluation sees).
  std::optional<data::DataLoader> recalibration_loader;
  if (o.bn_recalibrate > 0) {
    recalibration_loader.emplace(train_set, o.batch_size, !o.no_shuffle, false, o.seed,
                                 transforms.test);
    if (o.bn_recalibrate > recalibration_loader->num_batches())
      throw UsageError(fmt::format(
          "--bn-recalibrate {}: more than the {} training batches of {} images in an epoch",
          o.bn_recalibrate, recalibration_loader->num_batches(), o.batch_size));
  }
  optim::SGD optimizer(model->parameters(),
                       {.lr = o.lr, .momentum = o.momentum, .weight_decay = o.weight_decay,
                        .nesterov = o.nesterov});
  optim::LRSchedule schedule(schedule_opts);

  Resumed resumed;
  if (!o.resume.empty()) resumed = resume_from(o, *model, optimizer, train_loader.num_batches());

  std::ofstream metrics;
  if (!o.metrics.empty()) {
    metrics.open(o.metrics, std::ios::trunc);
    if (!metrics) throw UsageError(fmt::format("--metrics {}: cannot open for writing", o.metrics));
    for (auto& line : resumed.history) metrics << line.dump() << '\n';
    metrics << std::flush;
  }
  std::cout << fmt::format("training {} ({} parameters) on {}: {} train / {} test images, "
                           "batch {}, lr {}, {} epochs\n",
                           o.model, model->num_parameters(), device.str(), train_set->count,
                           test_set->count, o.batch_size, o.lr, o.epochs);
  std::cout << fmt::format(
      "  recipe {}: init {}, SGD momentum {}{}, weight decay {}, schedule {}, transforms {}{}\n",
      o.recipe, o.init, o.momentum, o.nesterov ? " (nesterov)" : "", o.weight_decay,
      schedule_summary(schedule_opts), transforms.summary,
      o.label_smoothing > 0 ? fmt::format(", label smoothing {}", o.label_smoothing) : "");
  if (o.bn_recalibrate > 0)
    std::cout << fmt::format("  BatchNorm statistics re-estimated over {} training batches before "
                             "each evaluation\n",
                             o.bn_recalibrate);
  if (!o.resume.empty())
    std::cout << fmt::format("resumed from {} after epoch {}/{}\n", o.resume,
                             resumed.epochs_done, o.epochs);
  std::cout << std::flush;

  const int last_epoch =
      o.stop_after_epoch > 0 ? std::min(o.epochs, o.stop_after_epoch) : o.epochs;
  bool tty = isatty(STDOUT_FILENO);
  double total_seconds = 0;
  int epochs_run = 0;
  train::EpochStats test;
  nlohmann::ordered_json history = resumed.history;
  for (int epoch = int(resumed.epochs_done) + 1; epoch <= last_epoch; ++epoch) {
    train::EpochOptions epoch_options;
    epoch_options.schedule = &schedule;
    epoch_options.epoch = uint64_t(epoch - 1);  // the loader's epochs count from 0
    epoch_options.progress = tty ? bar_progress() : log_progress();
    epoch_options.label_smoothing = o.label_smoothing;
    train::EpochStats tr = train::train_epoch(*model, optimizer, train_loader, device, epoch_options);
    if (tty) std::cout << "\r\033[K";
    // With --bn-recalibrate the model is evaluated twice: first with the
    // running statistics training left (what the recipe alone gives), then
    // with the re-estimated ones, so the run shows what recalibration adds.
    std::optional<train::EpochStats> test_running_stats;
    if (recalibration_loader) {
      test_running_stats = train::evaluate(*model, test_loader, device);
      train::recalibrate_batch_norm(*model, *recalibration_loader, device, o.bn_recalibrate,
                                    uint64_t(epoch - 1));
    }
    test = train::evaluate(*model, test_loader, device);
    total_seconds += tr.seconds;
    ++epochs_run;
    std::cout << fmt::format(
        "epoch {:>3}/{}: train loss {:.4f}, train acc {:.4f}, test acc {:.4f}{}, {:.2f} s, "
        "{:.0f} img/s, lr {:.4g}\n",
        epoch, o.epochs, tr.loss, tr.accuracy, test.accuracy,
        test_running_stats ? fmt::format(" (running statistics: {:.4f})",
                                         test_running_stats->accuracy)
                           : std::string(),
        tr.seconds, tr.images_per_second(), tr.last_lr)
              << std::flush;
    nlohmann::ordered_json line = {{"epoch", epoch},
                                   {"train_loss", tr.loss},
                                   {"train_acc", tr.accuracy},
                                   {"test_loss", test.loss},
                                   {"test_acc", test.accuracy},
                                   {"epoch_seconds", tr.seconds},
                                   {"images_per_second", tr.images_per_second()},
                                   {"device", device.str()},
                                   {"model", o.model},
                                   {"recipe", o.recipe},
                                   {"batch_size", o.batch_size},
                                   {"lr", o.lr},
                                   {"last_lr", tr.last_lr}};
    if (test_running_stats) {
      line["bn_recalibrate"] = o.bn_recalibrate;
      line["test_loss_running_stats"] = test_running_stats->loss;
      line["test_acc_running_stats"] = test_running_stats->accuracy;
    }
    if (metrics) metrics << line.dump() << '\n' << std::flush;
    history.push_back(line);
    if (!o.checkpoint.empty()) {
      train::RunState state{.epochs_done = epoch,
                            .steps_done = int64_t(epoch) * train_loader.num_batches(),
                            .info = {{"settings", app::training_settings(o)}, {"history", history}}};
      train::save_checkpoint(o.checkpoint, *model, optimizer, state);
    }
  }
  if (!o.checkpoint.empty() && epochs_run > 0)
    std::cout << "checkpoint " << o.checkpoint << " holds epoch " << resumed.epochs_done + epochs_run
              << '\n';
  if (resumed.epochs_done > 0 && resumed.epochs_done >= last_epoch)
    std::cout << fmt::format("nothing to train: {} already holds epoch {} of {}\n", o.resume,
                             resumed.epochs_done, o.epochs);
  else if (last_epoch < o.epochs)
    std::cout << fmt::format("stopped after epoch {} of {} (--stop-after-epoch){}\n", last_epoch,
                             o.epochs,
                             o.checkpoint.empty() ? "" : "; continue with --resume " + o.checkpoint);
  if (!o.save.empty()) {
    nn::save_safetensors(o.save, model->state_dict());
    std::cout << "saved " << o.save << '\n';
  }
  if (epochs_run > 0)
    std::cout << fmt::format("test acc: {:.2f}, {:.1f} sec/epoch on [{}]\n", test.accuracy,
                             total_seconds / epochs_run, device.str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"anvil-train: train a classifier on Fashion-MNIST"};
  app.footer(app::recipes_help());
  // A flag given twice takes its last value, so wrappers can set defaults.
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.add_option("--model", o.model, "Model: lenet, resnet18 (28x28), resnet18-96 (96x96)")->capture_default_str();
  app.add_option("--recipe", o.recipe, "Preset of the training settings: seed or best (see below)")->capture_default_str();
  app.add_option("--device", o.device, "auto (best present), cpu or cuda:N")->capture_default_str();
  // The recipe's settings: no default shown, the recipe decides.
  app.add_option("--epochs", o.epochs, "Number of epochs (recipe)")->check(number_at_least(0, true));
  app.add_option("--batch-size", o.batch_size, "Mini-batch size (recipe)")->check(number_at_least(0, false));
  app.add_option("--lr", o.lr, "Peak learning rate (recipe)")->check(number_at_least(0, true));
  app.add_option("--momentum", o.momentum, "SGD momentum (recipe)")->check(number_at_least(0, true));
  app.add_option("--weight-decay", o.weight_decay, "L2 weight decay (recipe)")->check(number_at_least(0, true));
  app.add_flag("--nesterov,!--no-nesterov", o.nesterov, "Nesterov momentum (recipe)");
  app.add_option("--init", o.init, "Weight init: seed (N(0, 0.01)), kaiming, default (recipe)");
  app.add_option("--lr-schedule", o.lr_schedule, "constant, step or cosine, per iteration (recipe)");
  app.add_option("--lr-step-epochs", o.lr_step_epochs, "step: epochs between decays (recipe)");
  app.add_option("--lr-gamma", o.lr_gamma, "step: decay factor in (0, 1] (recipe)");
  app.add_option("--lr-min", o.lr_min, "cosine: final learning rate (recipe)");
  app.add_option("--warmup-epochs", o.warmup_epochs, "Linear warmup epochs before the schedule (recipe)");
  app.add_option("--warmup-start-factor", o.warmup_start_factor, "Warmup starts at lr * this, in (0, 1] (recipe)");
  app.add_option("--resize", o.resize, "Bilinear resize to N x N (0 = keep 28x28; recipe)")->check(number_at_least(0, true));
  app.add_flag("--augment,!--no-augment", o.augment, "Training only: random crop (--crop-padding) + horizontal flip (recipe)");
  app.add_option("--crop-padding", o.crop_padding, "Zero padding before the random crop, pixels (recipe)")->check(number_at_least(0, true));
  app.add_flag("--normalize,!--no-normalize", o.normalize, "Normalise with the training set's mean/std (recipe)");
  app.add_option("--label-smoothing", o.label_smoothing, "Training loss: cross-entropy against (1 - e) onehot + e / classes, e in [0, 1] (recipe)")->check(number_at_least(0, true));
  app.add_option("--seed", o.seed, "Seed for initialisation, shuffling and augmentation")->capture_default_str();
  app.add_option("--data-dir", o.data_dir, "Directory with the Fashion-MNIST IDX files")->capture_default_str();
  app.add_option("--limit-train", o.limit_train, "Use only the first N training images (0 = all)")->check(number_at_least(0, true));
  app.add_option("--limit-test", o.limit_test, "Use only the first N test images (0 = all)")->check(number_at_least(0, true));
  app.add_flag("--no-shuffle", o.no_shuffle, "Keep the training set in file order");
  app.add_option("--init-from", o.init_from, "Start from a safetensors checkpoint (weights only)");
  app.add_option("--save", o.save, "Write the trained weights as safetensors");
  app.add_option("--metrics", o.metrics, "Write one JSON line per epoch to this file");
  app.add_option("--checkpoint", o.checkpoint, "After every epoch, write weights, momentum and counters here (atomically)");
  app.add_flag("--eval-only", o.eval_only, "Evaluate the weights of --init-from or --resume on the test set (loss, accuracy, per class, confusion matrix) and exit");
  app.add_option("--resume", o.resume, "Continue the run saved in this checkpoint (same training flags; keeps checkpointing to it)");
  app.add_option("--bn-recalibrate", o.bn_recalibrate, "Before each evaluation, re-estimate BatchNorm running statistics over N training batches (0 = keep the running averages)")->check(number_at_least(0, true));
  app.add_option("--stop-after-epoch", o.stop_after_epoch, "End this invocation after epoch N (0 = run all); --resume continues")->check(number_at_least(0, true));
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
    // The recipe fills every setting it covers; what the command line gave
    // explicitly stays.
    Options settings = app::apply_recipe(o);
    app::for_each_recipe_flag([&](const char* flag, auto field) {
      if (app.count(flag) > 0) settings.*field = o.*field;
    });
    if (settings.checkpoint.empty() && !settings.eval_only) settings.checkpoint = settings.resume;
    if (app.count("--crop-padding") > 0 && !settings.augment)
      throw UsageError(fmt::format("--crop-padding {}: has no effect without --augment",
                                   settings.crop_padding));
    return run(settings);
  } catch (const std::exception& e) {
    std::cerr << "anvil-train: error: " << e.what() << '\n';
    return dynamic_cast<const UsageError*>(&e) ? 2 : 1;
  }
}
