#include "apps/train_epoch.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <thread>

#include <fmt/format.h>

#include "nn/safetensors.h"

namespace anvil::app {
namespace {

// ANVIL_TRAIN_FAULT=RANK:STEP[:stall], for the fault tests: after its STEP-th
// training step of the first epoch, rank RANK fails (throws), or with
// ":stall" stops taking part for an hour, as a hung thread or process would.
struct Fault {
  int rank = -1;
  int64_t step = 0;
  bool stall = false;
};

Fault injected_fault() {
  const char* env = std::getenv("ANVIL_TRAIN_FAULT");
  if (env == nullptr || *env == '\0') return {};
  Fault f;
  char kind[16] = "";
  long long step = 0;
  const int fields = std::sscanf(env, "%d:%lld:%15s", &f.rank, &step, kind);
  f.step = step;
  f.stall = fields == 3 && std::string(kind) == "stall";
  if (fields < 2 || f.rank < 0 || f.step < 1 || (fields == 3 && !f.stall))
    throw std::invalid_argument(fmt::format(
        "ANVIL_TRAIN_FAULT='{}': expected RANK:STEP or RANK:STEP:stall", env));
  return f;
}

// `progress`, and the injected fault where this rank has one.
train::Progress with_fault(const Run& run, int epoch, train::Progress progress) {
  const Fault f = injected_fault();
  if (f.rank != run.replica.rank() || epoch != 1) return progress;
  return [f, progress](const train::EpochProgress& p) {
    if (progress) progress(p);
    if (p.done != f.step) return;
    if (f.stall) std::this_thread::sleep_for(std::chrono::hours(1));
    throw std::runtime_error(fmt::format(
        "rank {}: injected fault after step {} (ANVIL_TRAIN_FAULT)", f.rank, f.step));
  };
}

}  // namespace

EpochResult run_epoch(Run& run, int epoch, const train::Progress& progress) {
  const Options& o = run.options;
  train::EpochOptions options;
  options.schedule = &*run.schedule;
  options.epoch = uint64_t(epoch - 1);  // the loader's epochs count from 0
  options.progress = with_fault(run, epoch, progress);
  options.label_smoothing = o.label_smoothing;
  options.replicas = &*run.replicas;
  options.stages = run.pipeline.get();
  options.accumulate = run.pipeline ? o.micro_batches : o.accumulate;
  options.amp = o.amp_bf16();
  options.cuda_graphs = o.cuda_graphs;
  EpochResult e;
  e.epoch = epoch;
  e.train = train::train_epoch(run.net(), *run.optimizer, *run.train_loader, run.replica.device,
                               options);
  // With --bn-recalibrate the model is evaluated twice: first with the
  // running statistics training left (what the recipe alone gives), then
  // with the re-estimated ones, so the run shows what recalibration adds.
  if (run.recalibration_loader) {
    e.test_running_stats = train::evaluate(run.net(), *run.test_loader, run.replica.device,
                                           options.replicas, options.amp);
    train::recalibrate_batch_norm(run.net(), *run.recalibration_loader, run.replica.device,
                                  o.bn_recalibrate, uint64_t(epoch - 1));
  }
  e.test = train::evaluate(run.net(), *run.test_loader, run.replica.device, options.replicas,
                           options.amp, options.stages);
  return e;
}

namespace {

// The whole model on world rank 0, to save as one file, and (given
// `momentum`) its momentum buffers in its parameters' order. Tensor
// parallelism: every group gathers its split layers' parts (its ranks hold
// the same whole model otherwise). A pipeline: the stages hand their parts
// to the first pipeline's stage 0, world rank 0 (the replicas of each stage
// hold the same weights; the first tensor-parallel rank of each stage sends).
void gather_whole_model(Run& run, std::vector<Tensor>* momentum) {
  if (run.split) {
    parallel::gather_tensor_parallel(*run.mesh->tp, *run.split,
                                     dynamic_cast<nn::Sequential&>(*run.model));
    if (momentum)
      *momentum = parallel::gather_momentum(*run.mesh->tp, *run.split,
                                            run.optimizer->momentum_buffers(), *run.model);
  } else if (momentum) {
    *momentum = run.optimizer->momentum_buffers();
  }
  if (run.pipeline && run.mesh->coords.dp == 0 && run.mesh->coords.tp == 0)
    run.pipeline->gather_to_first(*run.model, momentum);
}

}  // namespace

void save_checkpoint(Run& run, int epoch, const nlohmann::ordered_json& history) {
  if (run.options.checkpoint.empty()) return;
  std::vector<Tensor> momentum;
  gather_whole_model(run, &momentum);
  if (run.replica.rank() != 0) return;
  train::RunState state{.epochs_done = epoch,
                        .steps_done = int64_t(epoch) * run.train_loader->num_batches(),
                        .info = {{"settings", app::training_settings(run.options)},
                                 {"history", history}}};
  train::save_checkpoint(run.options.checkpoint, *run.model, momentum, state);
}

bool save_weights(Run& run) {
  if (run.options.save.empty()) return false;
  gather_whole_model(run, nullptr);
  if (run.replica.rank() != 0) return false;
  nn::save_safetensors(run.options.save, run.model->state_dict());
  return true;
}

}  // namespace anvil::app
