#include "apps/train_epoch.h"

#include "nn/safetensors.h"

namespace anvil::app {

EpochResult run_epoch(Run& run, int epoch, const train::Progress& progress) {
  const Options& o = run.o;
  train::EpochOptions options;
  options.schedule = &*run.schedule;
  options.epoch = uint64_t(epoch - 1);  // the loader's epochs count from 0
  options.progress = progress;
  options.label_smoothing = o.label_smoothing;
  options.replicas = &*run.replicas;
  options.accumulate = o.accumulate;
  options.amp = o.amp_bf16();
  EpochResult e;
  e.epoch = epoch;
  e.train = train::train_epoch(*run.model, *run.optimizer, *run.train_loader, run.r.device,
                               options);
  // With --bn-recalibrate the model is evaluated twice: first with the
  // running statistics training left (what the recipe alone gives), then
  // with the re-estimated ones, so the run shows what recalibration adds.
  if (run.recalibration_loader) {
    e.test_running_stats =
        train::evaluate(*run.model, *run.test_loader, run.r.device, options.replicas, options.amp);
    train::recalibrate_batch_norm(*run.model, *run.recalibration_loader, run.r.device,
                                  o.bn_recalibrate, uint64_t(epoch - 1));
  }
  e.test = train::evaluate(*run.model, *run.test_loader, run.r.device, options.replicas,
                           options.amp);
  return e;
}

void save_checkpoint(const Run& run, int epoch, const nlohmann::ordered_json& history) {
  if (run.o.checkpoint.empty() || run.r.rank() != 0) return;
  train::RunState state{.epochs_done = epoch,
                        .steps_done = int64_t(epoch) * run.train_loader->num_batches(),
                        .info = {{"settings", app::training_settings(run.o)},
                                 {"history", history}}};
  train::save_checkpoint(run.o.checkpoint, *run.model, *run.optimizer, state);
}

bool save_weights(const Run& run) {
  if (run.o.save.empty() || run.r.rank() != 0) return false;
  nn::save_safetensors(run.o.save, run.model->state_dict());
  return true;
}

}  // namespace anvil::app
