// One epoch of an anvil-train run (apps/train_setup.h's Run): training,
// evaluation, and the checkpoint written after it. The same on one device
// and on every replica of a data-parallel run.
#pragma once
#include <optional>

#include <nlohmann/json.hpp>

#include "apps/train_setup.h"
#include "nn/train.h"

namespace anvil::app {

// One epoch's figures, the whole batch's (summed over the ranks).
struct EpochResult {
  int epoch = 0;  // 1-based
  train::EpochStats train, test;
  // --bn-recalibrate: the test figures with the running statistics training
  // left, before they were re-estimated (`test` has the re-estimated ones).
  std::optional<train::EpochStats> test_running_stats;
};

// Trains epoch `epoch` (1-based) of the run and evaluates the model after it;
// `progress` is shown during training (may be empty).
EpochResult run_epoch(Run& run, int epoch, const train::Progress& progress);

// After epoch `epoch`: rank 0 writes --checkpoint (when given), with the
// run's settings and `history`, the metrics of every epoch so far. With a
// pipeline the stages first send rank 0 their parts: a collective.
void save_checkpoint(Run& run, int epoch, const nlohmann::ordered_json& history);

// At the end: rank 0 writes --save (when given), as save_checkpoint the
// whole model. Returns whether it did.
bool save_weights(Run& run);

}  // namespace anvil::app
