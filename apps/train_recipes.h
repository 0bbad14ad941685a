// anvil-train's settings and its --recipe presets.
//
// A recipe fills every training setting (epochs, batch, optimizer, schedule,
// init, data transforms) for the chosen model; each flag given explicitly on
// the command line then overrides its preset value. The presets are the
// table apps/recipes.json (why each value: apps/recipes.md).
#pragma once
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "nn/models.h"
#include "nn/schedule.h"

namespace anvil::app {

struct Options {
  std::string model = "lenet";
  std::string recipe = "seed";
  std::string device = "auto";
  // Set by the recipe (the values here are LeNet's seed recipe).
  int epochs = 10;
  int64_t batch_size = 256;
  double lr = 0.2, momentum = 0, weight_decay = 0;
  bool nesterov = false;
  std::string init = "seed";
  std::string lr_schedule = "constant";
  int64_t lr_step_epochs = 10;
  double lr_gamma = 0.1, lr_min = 0;
  int64_t warmup_epochs = 0;
  double warmup_start_factor = 0.1;
  int64_t resize = 0;  // 0: the images' own 28x28
  bool augment = false;
  int64_t crop_padding = 0;
  bool normalize = false;
  double label_smoothing = 0;  // the training loss's (cross_entropy); 0: plain
  // Not part of a recipe.
  uint64_t seed = 0;
  std::string data_dir = "/usr/share/datasets/fashion-mnist";
  int64_t limit_train = 0, limit_test = 0;
  bool no_shuffle = false;
  std::string init_from, save, metrics, checkpoint, resume;
  int stop_after_epoch = 0;  // 0: run to --epochs
  bool eval_only = false;    // evaluate the --init-from or --resume weights, train nothing
  // > 0: BatchNorm running statistics re-estimated over this many training
  // batches before each evaluation (train::recalibrate_batch_norm). It changes
  // what evaluation sees, not the weights, so it is not a training setting.
  int64_t bn_recalibrate = 0;
  // Gradient accumulation: each rank's share of a batch in this many
  // micro-batches, one optimizer step per batch (train::EpochOptions). For
  // memory: without BatchNorm the step is the same, so it is not a training
  // setting either.
  int64_t accumulate = 1;
  // Data-parallel training (docs/parallel.md): one rank per MPI process
  // (--distributed, under mpirun), or one thread per GPU (--gpus / --devices).
  // --batch-size stays the global batch. Not training settings either: a
  // checkpoint from N ranks resumes on M.
  bool distributed = false;
  int gpus = 0;
  std::string devices;  // "cuda:0,cuda:1"
  std::string allreduce = "ring";
  double bucket_mb = 25;
  bool no_overlap = false;
  bool sync_bn = false;     // BatchNorm statistics over the whole batch (SyncBatchNorm)
  // The dtype gradients are all-reduced in: "float32" or "bf16" (half the
  // bytes, summed in float32 arithmetic; parallel::DataParallelOptions).
  std::string grad_dtype = "float32";
  bool grad_bf16() const { return grad_dtype == "bf16"; }
  double comm_timeout = 0;  // seconds; 0: ANVIL_COMM_TIMEOUT or 300
  // Pipeline parallel (parallel/pipeline.h): the model cut into this many
  // stages, one per rank, each step's batch (each data-parallel replica's
  // share) in micro_batches, run in pipeline_schedule ("gpipe" or "1f1b").
  // The ranks form a mesh of (ranks / pipeline_parallel) data-parallel
  // replicas of the pipeline. Not training settings either: a pipelined
  // step is the step of --accumulate micro_batches on one device.
  int pipeline_parallel = 1;
  int64_t micro_batches = 1;
  std::string pipeline_schedule = "1f1b";
  // Tensor parallel (parallel/tensor_parallel.h): LeNet's linear layers split
  // over this many ranks (column-parallel, then row-parallel); every other
  // layer runs whole on each. Not a training setting.
  int tensor_parallel = 1;
  // How float32 convolutions and matmuls may round (core/precision.h):
  // default (PyTorch's: TF32 convolutions on CUDA), ieee or tf32.
  std::string fp32_precision = "default";
  // Mixed precision (core/autocast.h): "off" or "bf16" (conv and linear layers
  // in bfloat16, float32 master weights, optimizer and loss).
  std::string amp = "off";
  bool amp_bf16() const { return amp == "bf16"; }
  // Every flag of anvil-train's option table (apps/anvil_train.cpp), keyed by
  // its name without "--", with its value as given or its default: what the
  // ranks of one run compare besides the training settings, so that a flag
  // added to the table is compared too.
  nlohmann::ordered_json command_line = nlohmann::ordered_json::object();
  // The profiler (apps/train_profile.h): the table after the run, and the
  // Chrome trace of the same steps written to this file.
  bool profile = false;
  std::string profile_trace;
  // CUDA graphs for the steady training steps (train::EpochOptions::cuda_graphs):
  // the same results, so not a training setting.
  bool cuda_graphs = true;
};

// Bad input from the user: exit status 2.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};
// A usage error that only this rank of an MPI job finds (flags that differ
// from rank 0's): it prints its message, where a plain UsageError, which
// every rank finds alike, is printed by rank 0 alone.
struct RankUsageError : UsageError {
  using UsageError::UsageError;
};

// The recipe's settings for `o.model`, in a copy of `o` (other fields kept).
// Throws UsageError for an unknown --recipe; an unknown --model gets the
// LeNet values here and is refused later by models::create.
Options apply_recipe(const Options& o);

// Calls visit(flag, pointer to member) for each setting that a recipe
// fills, so that the caller can keep the ones given on the command line.
template <class Visit>
void for_each_recipe_flag(Visit&& visit) {
  visit("--epochs", &Options::epochs);
  visit("--batch-size", &Options::batch_size);
  visit("--lr", &Options::lr);
  visit("--momentum", &Options::momentum);
  visit("--weight-decay", &Options::weight_decay);
  visit("--nesterov", &Options::nesterov);
  visit("--init", &Options::init);
  visit("--lr-schedule", &Options::lr_schedule);
  visit("--lr-step-epochs", &Options::lr_step_epochs);
  visit("--lr-gamma", &Options::lr_gamma);
  visit("--lr-min", &Options::lr_min);
  visit("--warmup-epochs", &Options::warmup_epochs);
  visit("--warmup-start-factor", &Options::warmup_start_factor);
  visit("--resize", &Options::resize);
  visit("--augment", &Options::augment);
  visit("--crop-padding", &Options::crop_padding);
  visit("--normalize", &Options::normalize);
  visit("--label-smoothing", &Options::label_smoothing);
}

// Checks the settings that no single flag's validator can (model against
// resize, Nesterov against momentum, the schedule's values) and returns the
// schedule's options. Throws UsageError naming the flag.
optim::ScheduleOptions check_settings(const Options& o);
models::Init parse_init(const std::string& name);

// The settings that determine the weights a run produces, keyed by flag name
// (without "--"): a resumed run must match its checkpoint's exactly.
nlohmann::ordered_json training_settings(const Options& o);
// training_settings plus every other flag of the option table (o.command_line):
// what every rank of one run must agree on (rank 0 sends its own; a rank that
// differs names the flag).
nlohmann::ordered_json replica_settings(const Options& o);

// A one-paragraph summary of the presets for --help.
std::string recipes_help();

}  // namespace anvil::app
