#include "parallel/pipeline.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <stdexcept>
#include <string>

#include <fmt/format.h>

#include "core/autograd.h"
#include "core/storage.h"
#include "parallel/data_parallel.h"

namespace anvil::parallel {
namespace {
using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}
}  // namespace

Schedule parse_schedule(std::string_view name) {
  if (name == "gpipe") return Schedule::kGPipe;
  if (name == "1f1b") return Schedule::kOneFOneB;
  throw std::invalid_argument(
      fmt::format("unknown pipeline schedule '{}' (known: gpipe, 1f1b)", name));
}

std::string_view schedule_name(Schedule schedule) {
  return schedule == Schedule::kGPipe ? "gpipe" : "1f1b";
}

struct Pipeline::InFlight {
  train::MicroBatch part;
  Tensor input;   // stage 0: the images' rows; later stages: the activation received
  Tensor labels;  // the last stage's
  Tensor output;  // what this stage sends on (not on the last stage)
  train::StepResult result;  // the last stage's logits and loss
  const std::function<void(const train::StepResult&, const Tensor&)>* done = nullptr;
};

Pipeline::Pipeline(Communicator& comm, std::vector<PipelineLayer> layers,
                   std::vector<size_t> bounds, Schedule schedule, Device device)
    : comm_(comm),
      layers_(std::move(layers)),
      bounds_(std::move(bounds)),
      schedule_(schedule),
      device_(device) {
  if (bounds_.size() != size_t(comm_.size()) + 1 || bounds_.front() != 0 ||
      bounds_.back() != layers_.size())
    throw std::invalid_argument(fmt::format(
        "Pipeline: {} stage bounds for {} layers over a group of {} ranks: the group needs one "
        "rank per stage",
        bounds_.size(), layers_.size(), comm_.size()));
  const size_t s = size_t(stage_index());
  stage_ = std::make_unique<Stage>(layers_, bounds_[s], bounds_[s + 1]);
}

Tensor Pipeline::activation_buffer(int64_t rows) const {
  const PipelineLayer& before = layers_[bounds_[size_t(stage_index())] - 1];
  Shape shape = {rows};
  shape.insert(shape.end(), before.output.begin(), before.output.end());
  return Tensor::empty(shape, before.dtype, device_);
}

void Pipeline::send(const Tensor& t, int peer) {
  comm_.send(t, peer);
  sent_ += int64_t(t.nbytes());
}

Tensor Pipeline::run_forward(InFlight& f) {
  const auto start = Clock::now();
  if (!first()) f.input.set_requires_grad(true);
  if (last()) {
    f.result = train::forward_loss(*stage_, f.input, f.labels, label_smoothing_);
    (*f.done)(f.result, f.labels);
  } else {
    f.output = stage_->forward(f.input);
  }
  compute_ += seconds_since(start);
  stats_.peak_in_flight = std::max(stats_.peak_in_flight, ++in_flight_);
  return f.output;
}

Tensor Pipeline::run_backward(InFlight& f, const Tensor& grad_out) {
  const auto start = Clock::now();
  if (last()) train::backward_loss(f.result, f.part.share);
  // (A first stage without parameters, a Flatten say, has nothing to do.)
  else if (f.output.requires_grad()) f.output.backward(grad_out);
  compute_ += seconds_since(start);
  const Tensor grad_in = first() ? Tensor() : f.input.grad();
  f = InFlight{.part = f.part};  // its activations go
  --in_flight_;
  return grad_in;
}

void Pipeline::train_step(const Tensor& x, const Tensor& y,
                          const std::vector<train::MicroBatch>& parts, int64_t global_rows,
                          double label_smoothing, train::Replicas& replicas,
                          const std::function<void(const train::StepResult&, const Tensor&)>& done) {
  const auto start = Clock::now();
  const MemoryStats at_start = memory_stats(device_);
  reset_peak_memory_stats(device_);
  compute_ = 0;
  sent_ = 0;
  label_smoothing_ = label_smoothing;
  // Every stage of a pipeline has the same batch, so every stage skips the
  // same empty micro-batches.
  std::vector<InFlight> work;
  for (const train::MicroBatch& p : parts)
    if (p.rows() > 0) work.push_back({.part = p, .done = &done});
  const size_t m = work.size();
  const int prev = stage_index() - 1, next = stage_index() + 1;
  auto take_input = [&](size_t k) {  // stage 0's rows of x, or a buffer to receive into
    InFlight& f = work[k];
    if (last()) f.labels = y.narrow(f.part.begin, f.part.rows());
    f.input = first() ? x.narrow(f.part.begin, f.part.rows()) : activation_buffer(f.part.rows());
  };
  auto grad_buffer = [&](size_t k) {
    return last() ? Tensor() : Tensor::empty(work[k].output.shape(), work[k].output.dtype(), device_);
  };
  // Each forward tells the replicas its micro-batch's counts (SyncBN's);
  // each backward is one of their steps, which reduce their gradients
  // after the last.
  auto forward = [&](size_t k) {
    replicas.begin_forward(work[k].part.rows(), work[k].part.global_rows);
    return run_forward(work[k]);
  };
  size_t backwards = 0;
  auto backward = [&](size_t k, const Tensor& grad_out) {
    replicas.set_no_sync(backwards + 1 < m);
    replicas.begin_step(work[k].part.rows(), work[k].part.global_rows);
    Tensor grad_in = run_backward(work[k], grad_out);
    replicas.after_backward();
    ++backwards;
    return grad_in;
  };
  if (m == 0) {  // this replica's share of the batch is empty: it still reduces
    replicas.set_no_sync(false);
    replicas.begin_step(0, global_rows);
    replicas.after_backward();
  }
  if (schedule_ == Schedule::kGPipe) {
    for (size_t k = 0; k < m; ++k) {
      take_input(k);
      if (!first()) comm_.recv(work[k].input, prev);
      const Tensor out = forward(k);
      if (!last()) send(out, next);
    }
    for (size_t k = 0; k < m; ++k) {
      Tensor grad_out = grad_buffer(k);
      if (!last()) comm_.recv(grad_out, next);
      const Tensor grad_in = backward(k, grad_out);
      if (!first()) send(grad_in, prev);
    }
  } else {
    // PipeDream-flush (Megatron-LM's order): warm-up forwards, then one
    // forward and one backward at a time, then the backwards left. In the
    // steady state each exchange with a neighbour is one sendrecv, so two
    // neighbours never both wait in a send.
    const size_t warmup = std::min(size_t(stages() - stage_index() - 1), m);
    const size_t steady = m - warmup;
    for (size_t k = 0; k < warmup; ++k) {
      take_input(k);
      if (!first()) comm_.recv(work[k].input, prev);
      send(forward(k), next);  // warm-up: never on the last stage
    }
    if (steady > 0) {
      take_input(warmup);
      if (!first()) comm_.recv(work[warmup].input, prev);
    }
    for (size_t i = 0; i < steady; ++i) {
      const size_t f = warmup + i, b = i;
      const Tensor out = forward(f);
      Tensor grad_out = grad_buffer(b);
      if (!last()) {
        comm_.sendrecv(out, next, grad_out, next);
        sent_ += int64_t(out.nbytes());
      }
      const Tensor grad_in = backward(b, grad_out);
      if (i + 1 < steady) take_input(f + 1);
      if (first()) continue;
      if (i + 1 == steady) {
        send(grad_in, prev);
      } else {
        comm_.sendrecv(grad_in, prev, work[f + 1].input, prev);
        sent_ += int64_t(grad_in.nbytes());
      }
    }
    for (size_t k = steady; k < m; ++k) {
      Tensor grad_out = grad_buffer(k);
      comm_.recv(grad_out, next);  // cool-down: never on the last stage
      const Tensor grad_in = backward(k, grad_out);
      if (!first()) send(grad_in, prev);
    }
  }
  if (steps_run_++ == 0) return;  // warm-up: not measured
  const MemoryStats at_end = memory_stats(device_);
  stats_.steps += 1;
  stats_.step_seconds += seconds_since(start);
  stats_.compute_seconds += compute_;
  stats_.bytes_sent += sent_;
  stats_.peak_step_bytes =
      std::max(stats_.peak_step_bytes, int64_t(at_end.peak_allocated) - int64_t(at_start.allocated));
}

Tensor Pipeline::forward(const Tensor& x) {
  Tensor input = x;
  if (!first()) {
    input = activation_buffer(x.size(0));
    comm_.recv(input, stage_index() - 1);
  }
  Tensor out = stage_->forward(input);
  if (last()) return out;
  comm_.send(out, stage_index() + 1);
  return Tensor();
}

void Pipeline::sum_totals(const Tensor& loss_sum, const Tensor& correct, int64_t& examples) {
  if (stages() > 1) parallel::sum_totals(comm_, loss_sum, correct, examples);
}

void Pipeline::gather_to_first(nn::Module& model, std::vector<Tensor>* momentum_out) {
  if (stages() == 1) return;
  NoGradGuard no_grad;
  std::map<std::string, size_t> index;  // parameter name -> its place in model.parameters()
  const nn::NamedTensors named = model.named_parameters();
  for (size_t i = 0; i < named.size(); ++i) index[named[i].first] = i;
  std::vector<Tensor> empty;
  std::vector<Tensor>& momentum = momentum_out ? *momentum_out : empty;
  const std::vector<PipelineLayer> whole = with_modules_of(layers_, model);
  for (int s = 1; s < stages(); ++s) {
    if (!first() && stage_index() != s) continue;
    // Stage s's layers in this rank's model: on stage 0 the copies that
    // receive, on stage s its own.
    const Stage part(whole, bounds_[size_t(s)], bounds_[size_t(s) + 1]);
    for (auto& [name, t] : part.state_dict()) {
      if (first()) comm_.recv(t, s);
      else comm_.send(t, 0);
    }
    if (!momentum_out) continue;
    // Which of its parameters have a momentum buffer (after a step, all of
    // them; none with momentum 0), then those buffers.
    const nn::NamedTensors params = part.named_parameters();
    std::vector<int64_t> has(params.size());
    for (size_t i = 0; i < params.size(); ++i) has[i] = momentum[index.at(params[i].first)].defined();
    Tensor mask = Tensor::from_vector(has, {int64_t(has.size())}, device_);
    if (first()) comm_.recv(mask, s);
    else comm_.send(mask, 0);
    comm_.synchronize();
    has = mask.to_int_vector();
    for (size_t i = 0; i < params.size(); ++i) {
      Tensor& buffer = momentum[index.at(params[i].first)];
      if (!has[i]) {
        if (first()) buffer = Tensor();
        continue;
      }
      if (first()) {
        buffer = Tensor::empty(params[i].second.shape(), DType::Float32, device_);
        comm_.recv(buffer, s);
      } else {
        comm_.send(buffer, 0);
      }
    }
  }
  comm_.synchronize();
}

}  // namespace anvil::parallel
