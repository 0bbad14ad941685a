// The classification training loop shared by anvil-train, the benchmarks
// and the tests: one epoch of SGD over a DataLoader, evaluation, and the
// checkpoints that let a run stop after any epoch and resume exactly.
#pragma once
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/dataloader.h"
#include "nn/module.h"
#include "nn/optim.h"
#include "nn/schedule.h"

namespace anvil::train {

struct EpochStats {
  double loss = 0;      // mean loss over the examples seen
  double accuracy = 0;  // fraction classified correctly
  int64_t examples = 0;
  double seconds = 0;
  double last_lr = 0;   // train_epoch: the learning rate of its last step
  double images_per_second() const { return seconds > 0 ? double(examples) / seconds : 0; }
};

// What a Progress callback is given after each batch. The running loss and
// accuracy are summed on the batches' device; stats() reads them back, which
// waits for the device, so a callback should call it only when it shows them
// (a GPU that is waited for after every step idles while the host issues the
// next one). A steady step itself never waits: on a GPU a label out of range
// is thrown at that read, or at the epoch's end (Backend::check_labels).
struct EpochProgress {
  int64_t done = 0;   // batches done
  int64_t total = 0;  // batches in the epoch
  std::function<EpochStats()> stats;  // callable during the callback only
};
using Progress = std::function<void(const EpochProgress&)>;

// Data-parallel training's part in train_epoch and evaluate: one replica of
// the model per rank, each fed its shard of every batch (DataLoader's
// set_shard). parallel/data_parallel.h implements it over a Communicator.
class Replicas {
 public:
  virtual ~Replicas() = default;
  // Before this rank's forward of a micro-batch (the whole batch without
  // accumulation): its examples in it, and that micro-batch's summed over
  // the ranks, which SyncBN's statistics divide by (each rank's k-th
  // micro-batch together are one batch to BatchNorm). train_epoch
  // backpropagates this rank's share of the batch's mean loss
  // (MicroBatch::share), so that the gradients summed over the ranks and
  // micro-batches are the whole batch's mean.
  virtual void begin_step(int64_t examples, int64_t global_examples) = 0;
  // The same counts before a forward that runs apart from its step: a
  // pipeline stage's forwards come before their backwards' begin_step.
  virtual void begin_forward(int64_t /*examples*/, int64_t /*global_examples*/) {}
  // After backward, before the optimizer's step: every rank's .grad holds
  // the sum over the ranks (the same everywhere), and every buffer (BatchNorm's
  // running statistics) rank 0's.
  virtual void after_backward() = 0;
  // Gradient accumulation (DataParallel::no_sync()): while true, steps
  // reduce nothing and each rank's gradients add up in .grad; the next step
  // with it false reduces their sum. Every rank sets it at the same steps.
  virtual void set_no_sync(bool no_sync) = 0;
  // Sums an epoch's running totals over the ranks, in place: loss_sum
  // (float32 scalar), correct (int64 scalar), both on the replica's device.
  virtual void sum_totals(const Tensor& loss_sum, const Tensor& correct, int64_t& examples) = 0;
  // Whether a step's work here can be captured in a CUDA graph
  // (EpochOptions::cuda_graphs): true where it issues nothing to the
  // device (one rank); the all-reduce of several is not captured.
  virtual bool capturable() const { return false; }
};

class Stages;  // below

struct EpochOptions {
  Progress progress;
  // When set, the optimizer's lr is set from it before every step, at the
  // position (loader epoch, batch index, loader.num_batches()).
  const optim::LRSchedule* schedule = nullptr;
  // The loader epoch to run (0-based), e.g. the first one left when resuming;
  // unset: the loader's next epoch.
  std::optional<uint64_t> epoch;
  // The training loss's label smoothing (cross_entropy, core/ops.h); the
  // epoch's reported loss is that smoothed loss. evaluate() always reports
  // the plain cross-entropy.
  double label_smoothing = 0.0;
  // Data-parallel training: the loader is this rank's shard. The figures
  // returned (and those the progress shows) are the whole batch's, summed
  // over the ranks (progress: this rank's own so far). Null: one replica,
  // the whole batch on this device.
  Replicas* replicas = nullptr;
  // Gradient accumulation: each step's batch (this rank's share of it) is
  // cut into this many micro-batches, each one forward and backward, their
  // gradients summed in .grad and reduced over the ranks once, before the
  // one optimizer step. Without BatchNorm the step equals the whole batch
  // at once, within float rounding; BatchNorm normalises each micro-batch
  // with its own statistics, as in PyTorch. A micro-batch may be empty (a
  // share smaller than this count).
  int64_t accumulate = 1;
  // Pipeline-parallel training: this rank runs its stage of the model on
  // `accumulate` micro-batches per step, in the stages' schedule (the model
  // given to train_epoch is the whole model, of which the stages run parts).
  // Null: the whole model here.
  Stages* stages = nullptr;
  // Mixed precision: forward passes under AutocastGuard(device, bfloat16)
  // (core/autocast.h) with the optimizer's cast cache, so the weights, their
  // gradients and the momentum stay float32 and each step refreshes the
  // bfloat16 copies the next forward reads.
  bool amp = false;
  // CUDA graphs (core/graph.h; anvil-train --cuda-graphs): on a CUDA device
  // the epoch's first step runs eagerly (it makes the momentum buffers, the
  // bfloat16 weight copies and the label record), the second is captured as
  // one graph (the gradients dropped, forward, loss, backward, the
  // optimizer's step, the running totals) and then replayed, and so is every
  // later step of the same batch shape: one cudaGraphLaunch a step, its
  // batch copied into the graph's static input buffers by the prefetcher,
  // its learning rate read from the device (SGD::keep_lr_on_device). A
  // batch of another size (a short last batch) runs eagerly. The graph and
  // its memory pool live for the epoch. Where graphs_unavailable() gives a
  // reason, every step runs eagerly.
  bool cuda_graphs = false;
};

// Why train_epoch cannot run its steps as CUDA graphs on `device` with
// these replicas and stages (EpochOptions::replicas, ::stages) ("" when it
// can): the CPU, data-parallel replicas of more than one rank (their
// all-reduce runs from backward's hooks through a communicator, which is not
// captured), a pipeline's stages (their sends and receives go through one
// too), the profiler, ANVIL_CUDA_SYNC=1.
std::string graphs_unavailable(Device device, const Replicas* replicas = nullptr,
                               const Stages* stages = nullptr);


// One training step's forward and backward on a batch on the model's device:
// the logits, the mean cross-entropy (with label smoothing), and backward of
// `share` times that loss (a replica's part of the whole batch's mean: its
// examples / the batch's; 1 on one device). The caller zeroes the gradients
// before and steps the optimizer after. train_epoch's step, and bench_train's.
struct StepResult {
  Tensor logits, loss;  // loss: the unscaled mean, a scalar on the device
};
StepResult forward_backward(nn::Module& model, const Tensor& x, const Tensor& y,
                            double label_smoothing = 0.0, double share = 1.0);
// Its two halves, for a pipeline's last stage, which runs the backward of a
// micro-batch later than its forward: the logits and loss of x (the graph
// kept), then backward of `share` times the loss.
StepResult forward_loss(nn::Module& model, const Tensor& x, const Tensor& y,
                        double label_smoothing = 0.0);
void backward_loss(const StepResult& step, double share = 1.0);

// One micro-batch of a step: rows [begin, end) of this rank's batch, its
// share of the whole (global) batch's mean loss, (end - begin) / global,
// and global_rows: the rows of every rank's micro-batch of this index.
struct MicroBatch {
  int64_t begin = 0, end = 0;
  double share = 0;
  int64_t global_rows = 0;
  int64_t rows() const { return end - begin; }
};
// A batch of `rows` (this rank's share of `global_rows`, shared among
// `ranks` as data::shard_rows shares it) cut into `parts` micro-batches as
// evenly as possible, in order, as every rank cuts its own; some may be empty.
std::vector<MicroBatch> micro_batches(int64_t rows, int64_t parts, int64_t global_rows,
                                      int ranks = 1);

// Pipeline-parallel training's part in train_epoch and evaluate: the model
// cut into stages of consecutive layers, one per rank of a pipeline group,
// each running its own layers on every micro-batch and passing activations
// forward and their gradients back; the last stage has the logits and the
// loss. parallel/pipeline.h implements it. Every stage of a pipeline loads
// the same batches (stage 0 reads the images, the last stage the labels,
// every stage the sizes).
class Stages {
 public:
  virtual ~Stages() = default;
  // A step's forward and backward over the micro-batches `parts` of (x, y),
  // in the stages' schedule, each micro-batch backpropagating its share of
  // the loss, so that .grad holds this stage's gradients summed over them
  // (the same as train_epoch's accumulation on one device). `replicas` gets
  // begin_forward before each micro-batch's forward, and begin_step ..
  // after_backward around its backward, synced on the last one only. `done`
  // gets each micro-batch's result and labels, on the last stage.
  // global_rows: the whole batch's, every replica's part together.
  virtual void train_step(const Tensor& x, const Tensor& y, const std::vector<MicroBatch>& parts,
                          int64_t global_rows, double label_smoothing, Replicas& replicas,
                          const std::function<void(const StepResult&, const Tensor& labels)>& done) = 0;
  // Evaluation's forward of x through every stage: the logits on the last
  // stage, an undefined Tensor on the others.
  virtual Tensor forward(const Tensor& x) = 0;
  // An epoch's running totals (as Replicas::sum_totals), which the last
  // stage alone has: every stage gets them (a collective of the pipeline).
  virtual void sum_totals(const Tensor& loss_sum, const Tensor& correct, int64_t& examples) = 0;
  // Whether this rank runs the last stage, the one whose totals count.
  virtual bool last_stage() const = 0;
};

// One epoch: the epoch to run must not have been started on the loader yet.
EpochStats train_epoch(nn::Module& model, optim::SGD& optimizer, data::DataLoader& loader,
                       Device device, const EpochOptions& options);
EpochStats train_epoch(nn::Module& model, optim::SGD& optimizer, data::DataLoader& loader,
                       Device device, const Progress& progress = {});

// Eval mode (BatchNorm uses its running statistics), no gradients, every
// example of the loader; restores the module's previous mode afterwards.
// With replicas, each rank evaluates its shard and the figures are summed.
// amp: forward passes under bfloat16 autocast, as EpochOptions::amp.
// With stages, the batches go through the pipeline's stages.
EpochStats evaluate(nn::Module& model, data::DataLoader& loader, Device device,
                    Replicas* replicas = nullptr, bool amp = false, Stages* stages = nullptr);

// An evaluation with its figures per class, as anvil-train --eval-only
// reports them.
struct ClassEvaluation {
  EpochStats stats;  // as evaluate() gives them
  int64_t classes = 0;
  // classes x classes, row-major: confusion[t * classes + p] counts the
  // examples of true class t that the model predicted as class p (the first
  // largest logit).
  std::vector<int64_t> confusion;
  int64_t count(int64_t truth, int64_t predicted) const {
    return confusion[size_t(truth * classes + predicted)];
  }
  int64_t examples_of(int64_t truth) const;  // the row's sum
  double accuracy_of(int64_t truth) const;   // the diagonal over the row; 0 for no examples
};

// evaluate() that also counts the confusion matrix: it reads each batch's
// predictions back from the device. The model must give `classes` logits per
// example; every label must be < classes. Throws std::invalid_argument
// otherwise (classes < 1 too).
ClassEvaluation evaluate_classes(nn::Module& model, data::DataLoader& loader, Device device,
                                 int64_t classes, bool amp = false);

// Re-estimates every BatchNorm layer's running mean and variance from
// scratch as a plain average over the first `batches` batches of the
// loader's epoch `epoch` (0-based; unset: its next epoch), run forward in
// train mode without gradients; as torch.optim.swa_utils.update_bn. The
// running averages BatchNorm keeps while training (momentum 0.1) follow the
// last few dozen steps; at a high learning rate the weights move too far in
// those steps for them to fit the final weights, and evaluation in eval mode
// then suffers. Parameters are not touched; num_batches_tracked ends at
// `batches`; the module's mode and each layer's momentum are restored.
// Returns the number of BatchNorm layers. Throws std::invalid_argument when
// the model has none, or `batches` is not in 1..loader.num_batches().
int64_t recalibrate_batch_norm(nn::Module& model, data::DataLoader& loader, Device device,
                               int64_t batches, std::optional<uint64_t> epoch = std::nullopt);

// ---- Checkpoints of a run in progress.
//
// One safetensors file (so a single atomic rename replaces it whole):
//   "model.<key>"              the model's state_dict (parameters and buffers)
//   "optimizer.momentum.<key>" the SGD momentum buffer of parameter <key>,
//                              for each parameter that has one
//   "trainer.state"            uint8 bytes of a JSON object:
//       {"format": "anvil-train-checkpoint", "version": 1,
//        "epochs_done": E, "steps_done": S, "info": {...}}
// The optimizer must have been built over model.parameters(), in that order.

struct RunState {
  int64_t epochs_done = 0;  // complete epochs: the next one to run is this (0-based)
  int64_t steps_done = 0;   // optimizer steps taken
  nlohmann::ordered_json info;  // the caller's (anvil-train: its settings and per-epoch metrics)
};

// Writes atomically (a temporary file renamed over `path`). Throws
// nn::CheckpointError naming the file.
void save_checkpoint(const std::string& path, const nn::Module& model, const optim::SGD& optimizer,
                     const RunState& state);
// The same, with the momentum buffers given (one per parameter of the model,
// in its order; undefined: none yet): those of a model trained in parts.
void save_checkpoint(const std::string& path, const nn::Module& model,
                     const std::vector<Tensor>& momentum, const RunState& state);

// Restores the model's state and the optimizer's momentum buffers and
// returns the counters. Every problem (not a checkpoint, a missing or
// misshapen tensor, another model) throws nn::CheckpointError naming the file
// and what is wrong, and then leaves model and optimizer unchanged.
RunState load_checkpoint(const std::string& path, nn::Module& model, optim::SGD& optimizer);

// Only the counters and info of a checkpoint, checked as load_checkpoint
// does, touching no model: for checking a run's settings before its tensors.
RunState read_run_state(const std::string& path);

}  // namespace anvil::train
