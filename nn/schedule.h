// Learning-rate schedules, stepped once per optimizer step (every batch), with
// the formulas of torch.optim.lr_scheduler:
//
//   constant   lr
//   step       lr * gamma^floor(epoch / step_epochs)            (StepLR)
//   cosine     min_lr + (lr - min_lr) * (1 + cos(pi * t / T)) / 2 (CosineAnnealingLR,
//              t = iterations done, T = iterations in the run)
//
// Each may be preceded by a linear warmup of `warmup_epochs` epochs that
// climbs per iteration from lr * warmup_start_factor to lr (LinearLR), after
// which the main shape starts from its own beginning, as torch's SequentialLR
// does: the step shape counts epochs from the end of the warmup, and the
// cosine spans the iterations left after it (reaching min_lr at the end of
// the run). tests/golden/make_schedule_golden.py computes the same values
// with torch's schedulers.
#pragma once
#include <cstdint>
#include <string>

namespace anvil::optim {

enum class ScheduleShape { Constant, Step, Cosine };

// "constant", "step", "cosine"; anything else throws std::invalid_argument
// naming --lr-schedule and the known shapes.
ScheduleShape parse_schedule_shape(const std::string& name);
const char* schedule_shape_name(ScheduleShape shape);

struct ScheduleOptions {
  ScheduleShape shape = ScheduleShape::Constant;
  double lr = 0.1;                   // peak learning rate (--lr)
  int64_t epochs = 10;               // length of the run (--epochs): the cosine spans it
  int64_t step_epochs = 10;          // step: epochs between decays (--lr-step-epochs)
  double gamma = 0.1;                // step: decay factor (--lr-gamma)
  double min_lr = 0;                 // cosine: learning rate at the end (--lr-min)
  int64_t warmup_epochs = 0;         // linear warmup before the shape (--warmup-epochs)
  double warmup_start_factor = 0.1;  // warmup starts at lr * this (--warmup-start-factor)
};

class LRSchedule {
 public:
  // Checks every field; a bad one throws std::invalid_argument whose message
  // starts with the flag that sets it, e.g. "--lr-gamma: expected ...".
  explicit LRSchedule(const ScheduleOptions& options);

  // The learning rate for the step on batch `batch` (0-based) of epoch
  // `epoch` (0-based) when every epoch has `batches_per_epoch` batches.
  // Past the end of the run the cosine stays at min_lr (torch's would rise
  // again); throws std::invalid_argument for a negative position.
  double lr(int64_t epoch, int64_t batch, int64_t batches_per_epoch) const;

  const ScheduleOptions& options() const { return options_; }

 private:
  ScheduleOptions options_;
};

}  // namespace anvil::optim
