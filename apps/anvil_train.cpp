// anvil-train: trains an image classifier on Fashion-MNIST and reports
// accuracy and speed per epoch, in the manner of d2l's train_ch6.
//
//   anvil-train --model lenet --recipe seed
//   anvil-train --model resnet18 --recipe best --checkpoint run.ckpt   # later: --resume run.ckpt
//   anvil-train --gpus 2 ...                                # data-parallel, one thread per GPU
//   mpirun -np 4 anvil-train --distributed ...              # data-parallel, one process per rank
//
// This file is the command line; apps/train_run.cpp runs the training.
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <string>
#include <thread>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "apps/train_recipes.h"
#include "apps/train_run.h"
#include "core/device.h"
#include "parallel/communicator.h"

using namespace anvil;
using app::Options;
using app::RankUsageError;
using app::UsageError;

namespace {

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
  app.add_option("--amp", o.amp, "Mixed precision: off, or bf16 (as torch.autocast: convolutions and linear layers in bfloat16 with float32 sums, activations kept in bfloat16; BatchNorm statistics, the loss and the float32 master weights, gradients and momentum as before)")->capture_default_str()->check(CLI::IsMember({"off", "bf16"}));
  app.add_option("--fp32-precision", o.fp32_precision, "How float32 convolutions and matmuls compute: default (PyTorch's: TF32 convolutions on CUDA, everything else FP32), ieee (FP32 throughout; no Winograd on the CPU) or tf32 (convolutions and matmuls in TF32; the CPU emulates it)")->capture_default_str()->check(CLI::IsMember({"default", "ieee", "tf32"}));
  app.add_option("--seed", o.seed, "Seed for initialisation, shuffling and augmentation")->capture_default_str();
  app.add_option("--data-dir", o.data_dir, "Directory with the Fashion-MNIST IDX files")->capture_default_str();
  app.add_option("--limit-train", o.limit_train, "Use only the first N training images (0 = all)")->check(number_at_least(0, true));
  app.add_option("--limit-test", o.limit_test, "Use only the first N test images (0 = all)")->check(number_at_least(0, true));
  app.add_flag("--no-shuffle", o.no_shuffle, "Keep the training set in file order");
  app.add_option("--init-from", o.init_from, "Start from a safetensors checkpoint (weights only; bfloat16 tensors are widened exactly into the float32 weights, as PyTorch's load_state_dict)");
  app.add_option("--save", o.save, "Write the trained weights as safetensors");
  app.add_option("--metrics", o.metrics, "Write one JSON line per epoch to this file");
  app.add_option("--checkpoint", o.checkpoint, "After every epoch, write weights, momentum and counters here (atomically)");
  app.add_flag("--eval-only", o.eval_only, "Evaluate the weights of --init-from or --resume on the test set (loss, accuracy, per class, confusion matrix) and exit");
  app.add_option("--resume", o.resume, "Continue the run saved in this checkpoint (same training flags; keeps checkpointing to it)");
  app.add_option("--bn-recalibrate", o.bn_recalibrate, "Before each evaluation, re-estimate BatchNorm running statistics over N training batches (0 = keep the running averages)")->check(number_at_least(0, true));
  app.add_option("--accumulate", o.accumulate, "Gradient accumulation: each step's batch (each rank's share) as N micro-batches, one forward/backward each, gradients summed and all-reduced once per step; --batch-size stays the step's batch. Saves activation memory; BatchNorm sees the micro-batch")->check(number_at_least(1, true));
  app.add_option("--stop-after-epoch", o.stop_after_epoch, "End this invocation after epoch N (0 = run all); --resume continues")->check(number_at_least(0, true));
  // Data-parallel training (docs/parallel.md); --batch-size stays the global batch.
  app.add_flag("--distributed", o.distributed, "One data-parallel rank per MPI process: start with mpirun -np N (CPU ranks, or GPU ranks on cuda:<local rank>)");
  app.add_option("--gpus", o.gpus, "Data-parallel on GPUs cuda:0..N-1, one thread each")->check(number_at_least(1, true));
  app.add_option("--devices", o.devices, "Data-parallel on these GPUs, one thread each: cuda:0,cuda:1,...");
  app.add_option("--allreduce", o.allreduce, "Gradient all-reduce: ring, naive or native")->capture_default_str()->check(CLI::IsMember({"ring", "naive", "native"}));
  app.add_option("--bucket-mb", o.bucket_mb, "Gradients are reduced in buckets of this many MiB")->capture_default_str()->check(number_at_least(0, false));
  app.add_flag("--no-overlap", o.no_overlap, "Reduce the gradients after backward, not bucket by bucket during it");
  app.add_option("--grad-dtype", o.grad_dtype, "The dtype gradients are all-reduced in: float32, or bf16 (half the bytes on the wire; each rank's gradient rounded to bfloat16, summed in float32 arithmetic with one rounding per ring step, widened back into the float32 gradients)")->capture_default_str()->check(CLI::IsMember({"float32", "bf16"}));
  app.add_flag("--sync-bn", o.sync_bn, "BatchNorm normalises with the statistics of the whole global batch, every rank's part together (SyncBatchNorm)");
  app.add_option("--pipeline-parallel", o.pipeline_parallel, "Pipeline parallel: cut the model into N stages of consecutive layers, balanced by forward FLOPs, one per rank (--distributed or --gpus; the ranks a multiple of N: ranks / N data-parallel replicas of the pipeline)")->capture_default_str()->check(number_at_least(1, true));
  app.add_option("--micro-batches", o.micro_batches, "Pipeline parallel: each step's batch (each replica's share) as M micro-batches that flow through the stages; the step is --accumulate M's on one device")->capture_default_str()->check(number_at_least(1, true));
  app.add_option("--pipeline-schedule", o.pipeline_schedule, "Pipeline parallel: gpipe (every forward, then every backward: M micro-batches' activations held) or 1f1b (PipeDream-flush: one forward, one backward; at most N held)")->capture_default_str()->check(CLI::IsMember({"gpipe", "1f1b"}));
  app.add_option("--tensor-parallel", o.tensor_parallel, "Tensor parallel: split layers over N ranks in column-then-row pairs (one all-reduce forward and one backward per pair): LeNet's Linear 7 and 9; ResNet-18's conv1 and conv2 of every residual block, its 1x1 shortcut conv3 by output channels (then all-gathered); the other layers run whole on each (the ranks a multiple of N: ranks / N data-parallel replicas)")->capture_default_str()->check(number_at_least(1, true));
  app.add_option("--comm-timeout", o.comm_timeout, "Seconds any wait on another rank may last (default: ANVIL_COMM_TIMEOUT or 300)")->check(number_at_least(0, false));
  app.add_flag("--cuda-graphs,!--no-cuda-graphs", o.cuda_graphs, "On a GPU, each steady training step as one CUDA graph launch: the step (forward, loss, backward, SGD) is captured after a first eager step and replayed for every later batch of that size, a short last batch running eagerly; the same results bit for bit (default on; data-parallel runs of several ranks and --profile run eagerly; docs/cuda.md)");
  app.add_flag("--profile", o.profile, "After the run, print a table of the steady training steps (the first is left out as warm-up) by op family: calls, ms and % per step; CPU ops by the wall clock, CUDA kernels by CUDA events (docs/profiling.md)");
  app.add_option("--profile-trace", o.profile_trace, "Write the same steps as a Chrome trace-event JSON file (Perfetto, chrome://tracing): a process per rank, a track per stream, a slice per op or kernel");
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
  // Every flag of the table, as given or its default: the ranks of an MPI job
  // compare them all (apps/train_setup.h, agree_on_flags), so that a flag
  // added above cannot be left out of that check. Only --help and
  // --list-devices, which end the program here, are not compared.
  for (const CLI::Option* opt : app.get_options()) {
    const std::string name = opt->get_name();
    if (name == "--help" || name == "--list-devices" || name.rfind("--", 0) != 0) continue;
    std::string value = opt->get_default_str().empty() ? "(not given)" : opt->get_default_str();
    if (opt->count() > 0) {
      value.clear();
      for (const std::string& part : opt->results()) value += (value.empty() ? "" : ",") + part;
    }
    o.command_line[name.substr(2)] = value;
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
    return app::run_training(settings);
  } catch (const std::exception& e) {
    // In an MPI job every rank usually finds the same bad flag: rank 0 says
    // so, and mpirun ends the others as soon as it exits. A rank whose flags
    // differ from rank 0's (mpirun's MPMD form) may find it alone, before
    // MPI starts (once MPI is up, the ranks compare their flags): it waits a
    // moment for that, then says so itself, naming its rank, and its exit
    // ends the job.
    const bool usage = dynamic_cast<const UsageError*>(&e) != nullptr;
    const bool this_rank_only = dynamic_cast<const RankUsageError*>(&e) != nullptr;
    const int rank = o.distributed ? parallel::mpi_rank_from_environment() : -1;
    if (usage && !this_rank_only && rank > 0 && !parallel::mpi_started()) {
      std::this_thread::sleep_for(std::chrono::seconds(2));
      std::cerr << "anvil-train: error: rank " << rank << ": " << e.what() << '\n';
    } else if (!usage || this_rank_only || rank <= 0) {
      std::cerr << "anvil-train: error: " << e.what() << '\n';
    }
    return usage ? 2 : 1;
  }
}
