// One anvil-train run (apps/train_run.h): on one device, or as replicas of
// data-parallel training, one per GPU thread or per MPI process. Each
// replica runs the same loop, on its shard of every batch; rank 0 prints
// and writes the files, and rank 0's settings are checked on every rank.
#include "apps/train_run.h"

#include "apps/evaluation.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>
#include <thread>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/device.h"
#include "core/random.h"
#include "data/dataloader.h"
#include "data/transforms.h"
#include "nn/layers.h"
#include "nn/models.h"
#include "nn/safetensors.h"
#include "nn/schedule.h"
#include "nn/train.h"
#include "parallel/communicator.h"
#include "parallel/data_parallel.h"

namespace anvil::app {
namespace {

// Where and as what one copy of the training loop runs.
struct Replica {
  int rank = 0, size = 1;
  Device device;
  parallel::Communicator* comm = nullptr;  // null: one device, no replicas
  // Read once and shared by the replicas of one process (null: read here).
  std::shared_ptr<const data::ImageSet> train_set, test_set;
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

// --eval-only: the flags that would have nothing to do, and the weights it needs.
void check_eval_only(const Options& o) {
  if (!o.eval_only) return;
  if (o.init_from.empty() && o.resume.empty())
    throw UsageError("--eval-only evaluates weights: give --init-from FILE (weights) or --resume "
                     "FILE (a training checkpoint)");
  if (o.distributed || o.gpus > 0 || !o.devices.empty())
    throw UsageError("--eval-only evaluates on one device: drop --distributed, --gpus, --devices");
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

// --sync-bn needs BatchNorm layers, replicas, and a part of every batch for
// every rank (the last batch too).
void check_sync_bn(const Options& o, nn::Module& model, int64_t examples, int ranks) {
  if (!o.distributed && o.gpus == 0 && o.devices.empty())
    throw UsageError("--sync-bn: only for data-parallel runs (--gpus, --devices, --distributed)");
  bool has_bn = false;
  for (nn::Module* m : model.modules()) has_bn = has_bn || dynamic_cast<nn::BatchNorm2d*>(m);
  if (!has_bn)
    throw UsageError(fmt::format("--sync-bn: model {} has no BatchNorm layers", o.model));
  const int64_t last = examples % o.batch_size;
  if (last > 0 && last < ranks)
    throw UsageError(fmt::format(
        "--sync-bn: the last batch of each epoch has {} image(s) for {} ranks, so a rank would "
        "have none; change --batch-size or --limit-train",
        last, ranks));
}

// --bn-recalibrate needs a model with BatchNorm layers.
void check_bn_recalibrate(const Options& o, nn::Module& model) {
  if (o.bn_recalibrate <= 0) return;
  for (nn::Module* m : model.modules())
    if (dynamic_cast<nn::BatchNorm2d*>(m)) return;
  throw UsageError(fmt::format("--bn-recalibrate {}: model {} has no BatchNorm layers",
                               o.bn_recalibrate, o.model));
}

// Where a replica prints: rank 0 to stdout, the others nowhere.
std::ostream& output_of(const Replica& r) {
  static std::ostream nowhere(nullptr);
  return r.rank == 0 ? std::cout : nowhere;
}

// Rank 0's run settings, epochs done and (for the log) its history, sent to
// every rank; a rank started with other flags names the first that differs.
struct Shared {
  int64_t epochs_done = 0;
};
Shared agree_on_run(const Options& o, const Replica& r, const Resumed& resumed) {
  nlohmann::ordered_json mine = {{"settings", app::replica_settings(o)},
                                 {"epochs_done", resumed.epochs_done}};
  const nlohmann::ordered_json root =
      nlohmann::ordered_json::parse(parallel::broadcast_text(*r.comm, mine.dump(), 0));
  const auto& theirs = root["settings"];
  for (auto& [key, value] : mine["settings"].items())
    if (!theirs.contains(key) || theirs[key] != value)
      throw RankUsageError(fmt::format(
          "rank {} was started with --{} {}, rank 0 with --{} {}: every rank of a run needs "
          "the same flags",
          r.rank, key, value.dump(), key, theirs.contains(key) ? theirs[key].dump() : "(none)"));
  return Shared{root["epochs_done"].get<int64_t>()};
}

int run_replica(const Options& o, const Replica& r) {
  std::ostream& out = output_of(r);
  models::Init init = app::parse_init(o.init);
  optim::ScheduleOptions schedule_opts = app::check_settings(o);
  manual_seed(o.seed);
  std::shared_ptr<nn::Module> model;
  try {
    model = models::create(o.model, init);
  } catch (const std::invalid_argument& e) {
    throw UsageError(fmt::format("--model: {}", e.what()));
  }
  check_bn_recalibrate(o, *model);
  const Device device = r.device;
  if (!o.init_from.empty() && r.rank == 0)  // the other ranks get rank 0's weights
    nn::load_state_dict(*model, nn::load_safetensors(o.init_from), o.init_from);
  model->to(device);

  auto train_set = r.train_set ? r.train_set
                               : std::make_shared<const data::ImageSet>(
                                     data::load_mnist_split(o.data_dir, true, o.limit_train));
  auto test_set = r.test_set ? r.test_set
                             : std::make_shared<const data::ImageSet>(
                                   data::load_mnist_split(o.data_dir, false, o.limit_test));
  Transforms transforms = make_transforms(o, *train_set);
  data::DataLoader train_loader(train_set, o.batch_size, !o.no_shuffle, false, o.seed,
                                transforms.train);
  data::DataLoader test_loader(test_set, o.batch_size, false, false, o.seed, transforms.test);
  if (r.comm) {
    train_loader.set_shard(r.rank, r.size);
    test_loader.set_shard(r.rank, r.size);
  }
  if (o.sync_bn) check_sync_bn(o, *model, train_set->count, r.size);
  // --bn-recalibrate: the first batches of the epoch just trained, in the
  // same order but without augmentation (the inputs evaluation sees); every
  // rank goes through the whole batches, so their statistics agree.
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
  if (!o.resume.empty() && r.rank == 0)
    resumed = resume_from(o, *model, optimizer, train_loader.num_batches());
  std::optional<parallel::DataParallel> replicas;
  if (r.comm) {
    resumed.epochs_done = agree_on_run(o, r, resumed).epochs_done;
    parallel::DataParallelOptions dp;
    dp.algorithm = parallel::parse_algorithm(o.allreduce);
    dp.bucket_bytes = size_t(o.bucket_mb * 1048576.0);
    dp.overlap = !o.no_overlap;
    dp.sync_batch_norm = o.sync_bn;
    replicas.emplace(*r.comm, *model, dp);  // rank 0's weights everywhere
    if (!o.resume.empty()) replicas->broadcast_state(&optimizer);  // and its momentum
  }

  std::ofstream metrics;
  if (!o.metrics.empty() && r.rank == 0) {
    metrics.open(o.metrics, std::ios::trunc);
    if (!metrics) throw UsageError(fmt::format("--metrics {}: cannot open for writing", o.metrics));
    for (auto& line : resumed.history) metrics << line.dump() << '\n';
    metrics << std::flush;
  }
  const std::string where =
      r.comm ? fmt::format("{} {} ranks ({}{}, {} all-reduce{})", r.size,
                           r.device.is_cuda() ? "GPU" : "CPU", r.comm->backend(),
                           r.device.is_cuda() ? "" : ", one process each", o.allreduce,
                           o.no_overlap ? ", no overlap" : "")
             : device.str();
  out << fmt::format("training {} ({} parameters) on {}: {} train / {} test images, "
                     "batch {}, lr {}, {} epochs\n",
                     o.model, model->num_parameters(), where, train_set->count, test_set->count,
                     o.batch_size, o.lr, o.epochs);
  out << fmt::format(
      "  recipe {}: init {}, SGD momentum {}{}, weight decay {}, schedule {}, transforms {}{}\n",
      o.recipe, o.init, o.momentum, o.nesterov ? " (nesterov)" : "", o.weight_decay,
      schedule_summary(schedule_opts), transforms.summary,
      o.label_smoothing > 0 ? fmt::format(", label smoothing {}", o.label_smoothing) : "");
  if (o.bn_recalibrate > 0)
    out << fmt::format("  BatchNorm statistics re-estimated over {} training batches before "
                       "each evaluation\n",
                       o.bn_recalibrate);
  if (!o.resume.empty())
    out << fmt::format("resumed from {} after epoch {}/{}\n", o.resume, resumed.epochs_done,
                       o.epochs);
  out << std::flush;

  const int last_epoch =
      o.stop_after_epoch > 0 ? std::min(o.epochs, o.stop_after_epoch) : o.epochs;
  const bool tty = r.rank == 0 && isatty(STDOUT_FILENO);
  train::Replicas* sync = replicas ? &*replicas : nullptr;
  double total_seconds = 0;
  int epochs_run = 0;
  train::EpochStats test;
  nlohmann::ordered_json history = resumed.history;
  for (int epoch = int(resumed.epochs_done) + 1; epoch <= last_epoch; ++epoch) {
    train::EpochOptions epoch_options;
    epoch_options.schedule = &schedule;
    epoch_options.epoch = uint64_t(epoch - 1);  // the loader's epochs count from 0
    if (r.rank == 0) epoch_options.progress = tty ? bar_progress() : log_progress();
    epoch_options.label_smoothing = o.label_smoothing;
    epoch_options.replicas = sync;
    train::EpochStats tr = train::train_epoch(*model, optimizer, train_loader, device, epoch_options);
    if (tty) out << "\r\033[K";
    // With --bn-recalibrate the model is evaluated twice: first with the
    // running statistics training left (what the recipe alone gives), then
    // with the re-estimated ones, so the run shows what recalibration adds.
    std::optional<train::EpochStats> test_running_stats;
    if (recalibration_loader) {
      test_running_stats = train::evaluate(*model, test_loader, device, sync);
      train::recalibrate_batch_norm(*model, *recalibration_loader, device, o.bn_recalibrate,
                                    uint64_t(epoch - 1));
    }
    test = train::evaluate(*model, test_loader, device, sync);
    total_seconds += tr.seconds;
    ++epochs_run;
    out << fmt::format(
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
    if (r.comm) {
      line["ranks"] = r.size;
      line["allreduce"] = o.allreduce;
      line["sync_bn"] = o.sync_bn;
    }
    if (test_running_stats) {
      line["bn_recalibrate"] = o.bn_recalibrate;
      line["test_loss_running_stats"] = test_running_stats->loss;
      line["test_acc_running_stats"] = test_running_stats->accuracy;
    }
    if (metrics) metrics << line.dump() << '\n' << std::flush;
    history.push_back(line);
    if (!o.checkpoint.empty() && r.rank == 0) {
      train::RunState state{.epochs_done = epoch,
                            .steps_done = int64_t(epoch) * train_loader.num_batches(),
                            .info = {{"settings", app::training_settings(o)}, {"history", history}}};
      train::save_checkpoint(o.checkpoint, *model, optimizer, state);
    }
  }
  if (!o.checkpoint.empty() && epochs_run > 0)
    out << "checkpoint " << o.checkpoint << " holds epoch " << resumed.epochs_done + epochs_run
        << '\n';
  if (resumed.epochs_done > 0 && resumed.epochs_done >= last_epoch)
    out << fmt::format("nothing to train: {} already holds epoch {} of {}\n", o.resume,
                       resumed.epochs_done, o.epochs);
  else if (last_epoch < o.epochs)
    out << fmt::format("stopped after epoch {} of {} (--stop-after-epoch){}\n", last_epoch,
                       o.epochs,
                       o.checkpoint.empty() ? "" : "; continue with --resume " + o.checkpoint);
  if (!o.save.empty() && r.rank == 0) {
    nn::save_safetensors(o.save, model->state_dict());
    out << "saved " << o.save << '\n';
  }
  if (epochs_run > 0)
    out << fmt::format("test acc: {:.2f}, {:.1f} sec/epoch on [{}]\n", test.accuracy,
                       total_seconds / epochs_run,
                       r.comm ? fmt::format("{} x {}", r.size, device.is_cuda() ? "GPU" : "cpu")
                              : device.str());
  out << std::flush;
  return 0;
}

parallel::CommOptions comm_options(const Options& o) {
  parallel::CommOptions c;
  if (o.comm_timeout > 0) c.timeout = std::chrono::milliseconds(int64_t(o.comm_timeout * 1000));
  return c;
}

// The checks of the files a run reads and writes, made before any training
// (by rank 0 alone in an MPI job: the other ranks write nothing).
void check_files(const Options& o) {
  if (!o.resume.empty() && !o.init_from.empty())
    throw UsageError("--resume and --init-from both set the weights: give one");
  if (!o.resume.empty() && !std::filesystem::is_regular_file(o.resume))
    throw UsageError(fmt::format("--resume {}: no such file", o.resume));
  check_eval_only(o);
  check_writable("--save", o.save);
  check_writable("--metrics", o.metrics);
  check_writable("--checkpoint", o.checkpoint);
  check_distinct_outputs(o);
}

void check_ranks(const Options& o, int ranks) {
  if (o.batch_size < ranks)
    throw UsageError(fmt::format("--batch-size {}: the global batch is split across {} ranks, "
                                 "so it needs at least {} images",
                                 o.batch_size, ranks, ranks));
}

// The GPUs of --gpus N (cuda:0 .. cuda:N-1) or --devices cuda:a,cuda:b,...
std::vector<Device> replica_devices(const Options& o) {
  if (o.gpus > 0 && !o.devices.empty())
    throw UsageError("--gpus and --devices both choose the GPUs: give one");
  if (o.device != "auto")
    throw UsageError(fmt::format("--device {} with {}: each replica has its own GPU; give "
                                 "--gpus N or --devices, not --device",
                                 o.device, o.gpus > 0 ? "--gpus" : "--devices"));
  std::vector<Device> devices;
  if (o.gpus > 0) {
    if (o.gpus > device_count())
      throw UsageError(fmt::format("--gpus {}: this machine has {} GPU(s){}{}", o.gpus,
                                   device_count(), device_count() ? "" : ": ", no_gpu_reason()));
    for (int i = 0; i < o.gpus; ++i) devices.push_back(Device::cuda(i));
    return devices;
  }
  std::stringstream list(o.devices);
  for (std::string item; std::getline(list, item, ',');) {
    Device d;
    try {
      d = Device::parse(item);
    } catch (const std::invalid_argument& e) {
      throw UsageError(fmt::format("--devices {}: {}", o.devices, e.what()));
    }
    if (!d.is_cuda())
      throw UsageError(fmt::format("--devices {}: '{}' is not a GPU (data-parallel replicas "
                                   "on the CPU run as MPI processes: --distributed)",
                                   o.devices, item));
    if (d.index >= device_count())
      throw UsageError(fmt::format("--devices {}: {} is not available ({} GPU(s))", o.devices,
                                   d.str(), device_count()));
    if (std::find(devices.begin(), devices.end(), d) != devices.end())
      throw UsageError(fmt::format("--devices {}: {} is named twice", o.devices, d.str()));
    devices.push_back(d);
  }
  if (devices.empty()) throw UsageError("--devices: name at least one GPU, e.g. cuda:0,cuda:1");
  return devices;
}

// One MPI process per rank: CPU ranks over MPI, or GPU ranks over NCCL on
// cuda:<local rank> when there are GPUs (and --device is not cpu).
int run_mpi_rank(const Options& o) {
  if (o.gpus > 0 || !o.devices.empty())
    throw UsageError("--distributed runs one rank per MPI process; --gpus and --devices run "
                     "them as threads of one process: choose one");
  if (!parallel::mpi_missing_reason().empty()) throw UsageError(parallel::mpi_missing_reason());
  bool gpu = false;
  if (o.device == "cuda") gpu = true;
  else if (o.device == "auto") gpu = device_count() > 0 && !devices_are_simulated() &&
                                     parallel::nccl_missing_reason().empty();
  else if (o.device != "cpu")
    throw UsageError(fmt::format("--device {} with --distributed: each rank takes the GPU of "
                                 "its local rank; give --device cuda (or cpu, or auto)",
                                 o.device));
  const parallel::CommOptions co = comm_options(o);
  std::unique_ptr<parallel::Communicator> comm =
      gpu ? parallel::nccl_world(co) : parallel::mpi_world(co);
  try {
    if (comm->rank() == 0) check_files(o);
    check_ranks(o, comm->size());
  } catch (const std::exception& e) {
    comm->abort(e.what());
    throw;
  }
  Replica r;
  r.rank = comm->rank();
  r.size = comm->size();
  r.device = comm->device();
  r.comm = comm.get();
  try {
    return run_replica(o, r);
  } catch (const std::exception& e) {
    // This rank leaves at once, without MPI_Finalize (which would wait for
    // the others): mpirun then ends the job instead of letting the other
    // ranks wait for this one until their deadline.
    comm->abort(e.what());
    throw;
  }
}

// One thread per GPU in this process, each with its replica; the data is
// read once and shared.
int run_gpu_threads(const Options& o) {
  const std::vector<Device> devices = replica_devices(o);
  if (!parallel::nccl_missing_reason().empty()) throw UsageError(parallel::nccl_missing_reason());
  check_files(o);
  const int n = int(devices.size());
  check_ranks(o, n);
  auto train_set = std::make_shared<const data::ImageSet>(
      data::load_mnist_split(o.data_dir, true, o.limit_train));
  auto test_set = std::make_shared<const data::ImageSet>(
      data::load_mnist_split(o.data_dir, false, o.limit_test));
  const parallel::NcclId id = parallel::nccl_unique_id();
  const parallel::CommOptions co = comm_options(o);
  std::vector<std::exception_ptr> errors(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int rank = 0; rank < n; ++rank)
    threads.emplace_back([&, rank] {
      std::unique_ptr<parallel::Communicator> comm;
      try {
        comm = parallel::nccl_communicator(id, rank, n, devices[size_t(rank)], co);
        Replica r;
        r.rank = rank;
        r.size = n;
        r.device = devices[size_t(rank)];
        r.comm = comm.get();
        r.train_set = train_set;
        r.test_set = test_set;
        run_replica(o, r);
      } catch (const std::exception& e) {
        errors[size_t(rank)] = std::current_exception();
        if (comm) comm->abort(e.what());  // the others stop at once, not at their deadline
      }
    });
  for (auto& t : threads) t.join();
  // The first error that is not another rank's echo is the cause.
  std::exception_ptr cause;
  for (auto& e : errors) {
    if (!e) continue;
    if (!cause) cause = e;
    try {
      std::rethrow_exception(e);
    } catch (const parallel::CommError& c) {
      if (std::string(c.what()).find("another rank failed") == std::string::npos) {
        cause = e;
        break;
      }
    } catch (...) {
      cause = e;
      break;
    }
  }
  if (cause) std::rethrow_exception(cause);
  return 0;
}

}  // namespace

int run_training(const Options& o) {
  app::parse_init(o.init);
  app::check_settings(o);
  parallel::parse_algorithm(o.allreduce);  // (a CLI validator names the flag first)
  if (o.distributed) return run_mpi_rank(o);
  if (o.gpus > 0 || !o.devices.empty()) return run_gpu_threads(o);
  if (o.sync_bn)
    throw UsageError("--sync-bn: only for data-parallel runs (--gpus, --devices, --distributed)");
  check_files(o);
  {
    // The model's own checks before the device is chosen, so that a mistyped
    // --model reports only its own error (not also the GPU probe's note).
    manual_seed(o.seed);
    std::shared_ptr<nn::Module> model;
    try {
      model = models::create(o.model, app::parse_init(o.init));
    } catch (const std::invalid_argument& e) {
      throw UsageError(fmt::format("--model: {}", e.what()));
    }
    check_bn_recalibrate(o, *model);
    if (o.eval_only) {
      const Device device = choose_device(o.device);
      if (!o.init_from.empty())
        nn::load_state_dict(*model, nn::load_safetensors(o.init_from), o.init_from);
      return evaluate_only(o, *model, device);
    }
  }
  Replica r;
  r.device = choose_device(o.device);
  return run_replica(o, r);
}

}  // namespace anvil::app
