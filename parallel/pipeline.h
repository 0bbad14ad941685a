// Pipeline-parallel training (docs/parallel.md, "Pipeline parallel"): the
// model's layers cut into stages (parallel/stages.h), one stage per rank of
// a pipeline group, each step's batch cut into micro-batches. Every rank
// holds the whole model but runs only its stage; activations go forward and
// their gradients back by the group's send/recv (whose agreement checks
// each tensor's dtype and shape against the other end's).
//
//   auto mesh = parallel::make_mesh(*world, {.dp = 1, .pp = 2});
//   auto layers = parallel::pipeline_layers(*model, {1, 28, 28}, false);   // on the CPU
//   auto bounds = parallel::balance_stages(costs of layers, 2);
//   model->to(device);
//   parallel::Pipeline stages(*mesh.pp, layers, bounds, Schedule::kOneFOneB, device);
//   train::EpochOptions o;  o.stages = &stages;  o.accumulate = 4;   // micro-batches
//   train::train_epoch(*model, optimizer, loader, device, o);
//
// A step is the same step as one device's with accumulate = M: each
// micro-batch goes through every layer once, BatchNorm normalising it with
// its own statistics (with SyncBN, those of every replica's micro-batch of
// its index: Replicas::begin_forward gives the count), and each stage's
// gradients add up over the micro-batches in their order. The schedules:
//   gpipe  every micro-batch's forward, then every backward (in the same
//          order): each stage holds all M micro-batches' activations.
//   1f1b   PipeDream-flush, as Megatron-LM runs it: stage s does
//          min(N - s - 1, M) forwards, then alternates one forward and one
//          backward, then the backwards left: at most N - s micro-batches'
//          activations at once (N on stage 0). Its steady state sends an
//          activation and receives a gradient in one sendrecv, so that
//          neighbours never wait on each other's sends.
// Both have GPipe's bubble: with stages of equal cost, each stage idles
// (N - 1) / (M + N - 1) of the step. PipelineStats measures it.
#pragma once
#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "nn/optim.h"
#include "nn/train.h"
#include "parallel/communicator.h"
#include "parallel/stages.h"

namespace anvil::parallel {

enum class Schedule : uint8_t { kGPipe, kOneFOneB };
// "gpipe", "1f1b"; anything else throws std::invalid_argument naming them.
Schedule parse_schedule(std::string_view name);
std::string_view schedule_name(Schedule schedule);

// What a stage measured over its training steps after the first (a warm-up:
// the allocator's first blocks, the caches). Host clock: on the CPU it is
// the work's own time; on a GPU, whose work is asynchronous, only the time
// to issue it.
struct PipelineStats {
  int64_t steps = 0;
  double step_seconds = 0;     // from a step's first forward to its last backward
  double compute_seconds = 0;  // in this stage's forward and backward (and the loss)
  double idle_seconds() const { return step_seconds - compute_seconds; }
  int64_t bytes_sent = 0;      // activations and gradients
  int64_t peak_in_flight = 0;  // the most micro-batches whose activations were held at once
  // The device allocator's peak during a step above what was allocated at
  // its start: the activations held, the gradients and the temporaries.
  int64_t peak_step_bytes = 0;
};

class Pipeline final : public train::Stages {
 public:
  // `comm`: the pipeline group, whose rank r runs stage r; `layers` and
  // `bounds` as pipeline_layers and balance_stages give them, the same on
  // every stage, of the model this rank holds (on `device`). Checks that the
  // group has a rank per stage; communicates nothing.
  Pipeline(Communicator& comm, std::vector<PipelineLayer> layers, std::vector<size_t> bounds,
           Schedule schedule, Device device);

  int stage_index() const { return comm_.rank(); }
  int stages() const { return comm_.size(); }
  bool first() const { return stage_index() == 0; }
  bool last() const { return stage_index() + 1 == stages(); }
  Schedule schedule() const { return schedule_; }
  // This rank's layers: what its optimizer updates and its data-parallel
  // replicas reduce.
  nn::Module& stage() { return *stage_; }
  const std::vector<PipelineLayer>& layers() const { return layers_; }
  const std::vector<size_t>& bounds() const { return bounds_; }
  const PipelineStats& stats() const { return stats_; }

  // train::Stages
  void train_step(const Tensor& x, const Tensor& y, const std::vector<train::MicroBatch>& parts,
                  int64_t global_rows, double label_smoothing, train::Replicas& replicas,
                  const std::function<void(const train::StepResult&, const Tensor&)>& done) override;
  Tensor forward(const Tensor& x) override;
  void sum_totals(const Tensor& loss_sum, const Tensor& correct, int64_t& examples) override;
  bool last_stage() const override { return last(); }

  // Every later stage's parameters, buffers and (given them, one per
  // parameter of `model` in its order, undefined before a parameter's first
  // step) momentum buffers into stage 0's copy of the whole `model` (and into
  // stage 0's `momentum`), so that stage 0 can save it as one file. `model`
  // is the model whose layers the stages were listed from: the stages' own
  // modules, or a copy of which they run a split (with_modules_of). A
  // collective of the pipeline group.
  void gather_to_first(nn::Module& model, std::vector<Tensor>* momentum);

 private:
  struct InFlight;  // a micro-batch between its forward and its backward
  // One micro-batch's forward on this stage (its input received or x's
  // rows) and its backward; each returns what the schedule sends on.
  Tensor run_forward(InFlight& f);
  Tensor run_backward(InFlight& f, const Tensor& grad_out);
  Tensor activation_buffer(int64_t rows) const;  // what stage s receives
  void send(const Tensor& t, int peer);

  Communicator& comm_;
  std::vector<PipelineLayer> layers_;
  std::vector<size_t> bounds_;
  Schedule schedule_;
  Device device_;
  std::unique_ptr<nn::Module> stage_;
  PipelineStats stats_;
  int64_t steps_run_ = 0;
  int64_t in_flight_ = 0;
  double compute_ = 0;     // this step's, so far
  int64_t sent_ = 0;
  double label_smoothing_ = 0;
};

}  // namespace anvil::parallel
