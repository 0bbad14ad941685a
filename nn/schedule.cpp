#include "nn/schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <stdexcept>

#include <fmt/format.h>

namespace anvil::optim {
namespace {

[[noreturn]] void bad(const char* flag, const std::string& what) {
  throw std::invalid_argument(fmt::format("{}: {}", flag, what));
}

void check_finite(const char* flag, double v) {
  if (!std::isfinite(v)) bad(flag, fmt::format("expected a finite number, got {}", v));
}

}  // namespace

ScheduleShape parse_schedule_shape(const std::string& name) {
  if (name == "constant") return ScheduleShape::Constant;
  if (name == "step") return ScheduleShape::Step;
  if (name == "cosine") return ScheduleShape::Cosine;
  bad("--lr-schedule", fmt::format("unknown schedule '{}' (known: constant, step, cosine)", name));
}

const char* schedule_shape_name(ScheduleShape shape) {
  switch (shape) {
    case ScheduleShape::Constant: return "constant";
    case ScheduleShape::Step: return "step";
    case ScheduleShape::Cosine: return "cosine";
  }
  return "?";
}

LRSchedule::LRSchedule(const ScheduleOptions& o) : options_(o) {
  check_finite("--lr", o.lr);
  if (o.lr < 0) bad("--lr", fmt::format("expected a number >= 0, got {}", o.lr));
  if (o.epochs < 0) bad("--epochs", fmt::format("expected a number >= 0, got {}", o.epochs));
  // The step and cosine settings are checked only when used, so that a
  // constant schedule does not trip over a preset's unused step length.
  if (o.shape == ScheduleShape::Step) {
    if (o.step_epochs < 1)
      bad("--lr-step-epochs", fmt::format("expected a whole number >= 1, got {}", o.step_epochs));
    check_finite("--lr-gamma", o.gamma);
    // gamma 0 would stop training after the first decay and gamma > 1 grows
    // the rate: both are almost surely typos.
    if (!(o.gamma > 0 && o.gamma <= 1))
      bad("--lr-gamma", fmt::format("expected a number in (0, 1], got {}", o.gamma));
  }
  if (o.shape == ScheduleShape::Cosine) {
    check_finite("--lr-min", o.min_lr);
    if (o.min_lr < 0 || o.min_lr > o.lr)
      bad("--lr-min", fmt::format("expected a number between 0 and --lr ({}), got {}", o.lr,
                                  o.min_lr));
  }
  if (o.warmup_epochs < 0)
    bad("--warmup-epochs", fmt::format("expected a whole number >= 0, got {}", o.warmup_epochs));
  // (A run of 0 epochs trains nothing: a recipe's warmup does not stop it.)
  if (o.epochs > 0 && o.warmup_epochs > o.epochs)
    bad("--warmup-epochs", fmt::format("{} is longer than the run (--epochs {})",
                                       o.warmup_epochs, o.epochs));
  if (o.warmup_epochs > 0) {
    check_finite("--warmup-start-factor", o.warmup_start_factor);
    // torch's LinearLR accepts the same range: starting at 0 would make the
    // first step a no-op, above 1 would be a cool-down.
    if (!(o.warmup_start_factor > 0 && o.warmup_start_factor <= 1))
      bad("--warmup-start-factor",
          fmt::format("expected a number in (0, 1], got {}", o.warmup_start_factor));
  }
}

double LRSchedule::lr(int64_t epoch, int64_t batch, int64_t batches_per_epoch) const {
  if (epoch < 0 || batch < 0 || batches_per_epoch < 1 || batch >= batches_per_epoch)
    throw std::invalid_argument(fmt::format(
        "LRSchedule::lr: bad position epoch {}, batch {} of {}", epoch, batch, batches_per_epoch));
  const ScheduleOptions& o = options_;
  const int64_t iteration = epoch * batches_per_epoch + batch;
  const int64_t warmup_iterations = o.warmup_epochs * batches_per_epoch;
  if (iteration < warmup_iterations) {
    double progress = double(iteration) / double(warmup_iterations);
    return o.lr * (o.warmup_start_factor + (1 - o.warmup_start_factor) * progress);
  }
  switch (o.shape) {
    case ScheduleShape::Constant: return o.lr;
    case ScheduleShape::Step: {
      // Whole epochs since the warmup: batches within an epoch share its rate.
      int64_t decays = (epoch - o.warmup_epochs) / o.step_epochs;
      return o.lr * std::pow(o.gamma, double(decays));
    }
    case ScheduleShape::Cosine: {
      int64_t span = o.epochs * batches_per_epoch - warmup_iterations;
      if (span <= 0) return o.lr;
      int64_t t = std::min(iteration - warmup_iterations, span);
      double cosine = std::cos(std::numbers::pi * double(t) / double(span));
      return o.min_lr + (o.lr - o.min_lr) * (1 + cosine) / 2;
    }
  }
  return o.lr;
}

}  // namespace anvil::optim
