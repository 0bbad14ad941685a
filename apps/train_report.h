// What an anvil-train run prints and records: the header, a line and a
// --metrics record per epoch, and the closing lines. Rank 0 reports; the
// other ranks' report goes nowhere (they print nothing, write no file).
#pragma once
#include <fstream>
#include <iosfwd>

#include <nlohmann/json.hpp>

#include "apps/train_epoch.h"
#include "apps/train_setup.h"
#include "nn/train.h"

namespace anvil::app {

class Report {
 public:
  // Rank 0 opens --metrics, starting it with the epochs of a resumed run.
  explicit Report(const Run& run);

  // What the run will do: model, device(s), data, recipe, resumed epochs.
  void header();
  // Rank 0's display of an epoch's progress: a bar on a terminal, a line a
  // minute in a log. Empty on the other ranks.
  train::Progress progress() const;
  // The epoch's line, and its record in --metrics and in history().
  void epoch(const EpochResult& e);
  // Every epoch's record so far, the resumed run's first.
  const nlohmann::ordered_json& history() const { return history_; }
  // Where the run stopped, and why when before --epochs; the checkpoint's state.
  void stopped(int last_epoch);
  void saved(const std::string& path);
  // The last test accuracy and the mean time per epoch; with a pipeline,
  // every rank's idle time, bytes sent and activations held (a collective).
  void summary();

 private:
  nlohmann::ordered_json metrics_record(const EpochResult& e) const;
  void pipeline_summary();

  const Run& run_;
  std::ostream& out_;
  bool tty_ = false;
  std::ofstream metrics_;
  nlohmann::ordered_json history_;
  int epochs_run_ = 0;
  double total_seconds_ = 0;
  train::EpochStats last_test_;
};

}  // namespace anvil::app
