#include "apps/train_checks.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <sstream>
#include <utility>

#include <fmt/format.h>

#include "nn/layers.h"
#include "parallel/tensor_parallel.h"

namespace anvil::app {
namespace {

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
      {"--save", o.save}, {"--metrics", o.metrics}, {"--checkpoint", o.checkpoint},
      {"--profile-trace", o.profile_trace}};
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
                                               {"--bn-recalibrate", o.bn_recalibrate > 0},
                                               {"--accumulate", o.accumulate > 1}};
  for (auto& [flag, given] : idle)
    if (given)
      throw UsageError(fmt::format("{} has no effect with --eval-only (nothing is trained)", flag));
}

}  // namespace

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

void check_files(const Options& o) {
  if (!o.resume.empty() && !o.init_from.empty())
    throw UsageError("--resume and --init-from both set the weights: give one");
  if (!o.resume.empty() && !std::filesystem::is_regular_file(o.resume))
    throw UsageError(fmt::format("--resume {}: no such file", o.resume));
  check_eval_only(o);
  check_writable("--save", o.save);
  check_writable("--metrics", o.metrics);
  check_writable("--checkpoint", o.checkpoint);
  check_writable("--profile-trace", o.profile_trace);
  check_distinct_outputs(o);
}

void check_ranks(const Options& o, int ranks) {
  if (o.batch_size < ranks)
    throw UsageError(fmt::format("--batch-size {}: the global batch is split across {} ranks, "
                                 "so it needs at least {} images",
                                 o.batch_size, ranks, ranks));
}

namespace {

void check_tensor_parallel(const Options& o) {
  const int t = o.tensor_parallel;
  if (t <= 1) return;
  try {
    parallel::tensor_parallel_plan(o.model);
  } catch (const std::invalid_argument& e) {
    throw UsageError(fmt::format("--tensor-parallel {} with --model {}: {}", t, o.model, e.what()));
  }
}

}  // namespace

int check_layout(const Options& o, int ranks) {
  check_tensor_parallel(o);
  const int n = o.pipeline_parallel;
  const int t = o.tensor_parallel;
  if (ranks % t != 0)
    throw UsageError(fmt::format(
        "--tensor-parallel {}: the run's {} rank(s) do not make whole groups of {} (one rank "
        "each); start a multiple of {} ranks (--distributed under mpirun -np, or --gpus)",
        t, ranks, t, t));
  ranks /= t;
  if (n <= 1) {
    if (o.micro_batches > 1)
      throw UsageError(fmt::format(
          "--micro-batches {}: cuts a pipeline's step, and this run has none (--pipeline-parallel "
          "1); without a pipeline the same step is --accumulate {}",
          o.micro_batches, o.micro_batches));
    return ranks;
  }
  if (o.accumulate > 1)
    throw UsageError(fmt::format(
        "--accumulate {} with --pipeline-parallel {}: a pipeline cuts each step into "
        "--micro-batches; give --micro-batches {} (the same step as --accumulate {} without "
        "a pipeline)",
        o.accumulate, n, o.accumulate, o.accumulate));
  if (o.bn_recalibrate > 0)
    throw UsageError(fmt::format(
        "--bn-recalibrate {} with --pipeline-parallel {}: not supported (the re-estimation runs "
        "the whole model on one rank)",
        o.bn_recalibrate, n));
  if (ranks % n != 0) {
    if (t > 1)
      throw UsageError(fmt::format(
          "--pipeline-parallel {} with --tensor-parallel {}: the run's {} rank(s) do not make "
          "whole pipelines of {} stages of {} ranks each; start a multiple of {} ranks "
          "(--distributed under mpirun -np, or --gpus)",
          n, t, ranks * t, n, t, n * t));
    throw UsageError(fmt::format(
        "--pipeline-parallel {}: the run's {} rank(s) do not make whole pipelines of {} stages "
        "(one rank each); start a multiple of {} ranks (--distributed under mpirun -np, or --gpus)",
        n, ranks, n, n));
  }
  return ranks / n;
}

void check_data_parallel_only(const Options& o) {
  if (o.distributed || o.gpus > 0 || !o.devices.empty()) return;
  if (o.sync_bn)
    throw UsageError("--sync-bn: only for data-parallel runs (--gpus, --devices, --distributed)");
  if (o.grad_dtype != "float32")
    throw UsageError(fmt::format(
        "--grad-dtype {}: only for data-parallel runs (--gpus, --devices, --distributed): on "
        "one device no gradient is all-reduced",
        o.grad_dtype));
}

void check_sync_bn(const Options& o, nn::Module& model, int64_t examples, int ranks) {
  check_data_parallel_only(o);
  bool has_bn = false;
  for (nn::Module* m : model.modules()) has_bn = has_bn || dynamic_cast<nn::BatchNorm2d*>(m);
  if (!has_bn)
    throw UsageError(fmt::format("--sync-bn: model {} has no BatchNorm layers", o.model));
  // SyncBN normalises each micro-batch over the ranks (each rank's k-th
  // together): every rank's every micro-batch needs an image, the smallest
  // share of each batch (rows / ranks, data::shard_rows) one per part. One
  // replica syncs nothing, and skips empty micro-batches as without it.
  if (ranks == 1) return;
  const int64_t parts = std::max(o.accumulate, o.micro_batches);
  const std::string cut =
      parts > 1 ? fmt::format(", cut into {} micro-batches ({}),", parts,
                              o.micro_batches > 1 ? "--micro-batches" : "--accumulate")
                : "";
  const int64_t last = examples % o.batch_size;
  for (const auto& [rows, which] : {std::pair{o.batch_size, "each batch"},
                                    std::pair{last, "the last batch of each epoch"}})
    if (rows > 0 && rows / ranks < parts)
      throw UsageError(fmt::format(
          "--sync-bn: {} has {} image(s) for {} ranks{} so a rank would have a micro-batch "
          "without any; change --batch-size or --limit-train{}",
          which, rows, ranks, cut.empty() ? "," : cut, parts > 1 ? " or the micro-batches" : ""));
}

void check_bn_recalibrate(const Options& o, nn::Module& model) {
  if (o.bn_recalibrate <= 0) return;
  for (nn::Module* m : model.modules())
    if (dynamic_cast<nn::BatchNorm2d*>(m)) return;
  throw UsageError(fmt::format("--bn-recalibrate {}: model {} has no BatchNorm layers",
                               o.bn_recalibrate, o.model));
}

}  // namespace anvil::app
