#include "nn/train.h"

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <stdexcept>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "core/autocast.h"
#include "core/autograd.h"
#include "core/graph.h"
#include "core/ops.h"
#include "core/profile.h"
#include "data/device_prefetcher.h"
#include "data/shard.h"
#include "nn/layers.h"
#include "nn/safetensors.h"

namespace anvil::train {
namespace {

using Clock = std::chrono::steady_clock;

// The loss sum and correct count of an epoch so far, added up on the
// batches' device: a step adds to them without waiting for the device, and
// only stats() reads them back.
class RunningTotals {
 public:
  explicit RunningTotals(Device device)
      : loss_sum_(Tensor::zeros({}, DType::Float32, device)),
        correct_(Tensor::zeros({}, DType::Int64, device)),
        start_(Clock::now()) {}

  // loss: the batch's loss as a scalar, weight times it is added (the batch
  // size for a mean loss, 1 for a summed one). Device work only: the
  // examples are counted by count(), on the host (a graph's replay repeats
  // the one, not the other).
  void add(const Tensor& loss, double weight, const Tensor& logits, const Tensor& labels) {
    add_scaled_(loss_sum_, loss.detach(), weight);
    count_correct_(correct_, logits.detach(), labels);
  }
  void count(int64_t examples) { examples_ += examples; }

  EpochStats stats() const {
    EpochStats s;
    s.examples = examples_;
    s.seconds = std::chrono::duration<double>(Clock::now() - start_).count();
    if (examples_) {
      s.loss = loss_sum_.item() / double(examples_);
      s.accuracy = correct_.item() / double(examples_);
    }
    return s;
  }

  // The totals of every rank (a collective: every rank calls it once, at the
  // same point). Returns the summed figures; this object's own are spent.
  // Over one replica they are this object's figures.
  // With stages, the last stage's totals first reach every stage.
  EpochStats summed(Replicas& replicas, Stages* stages) {
    if (stages) stages->sum_totals(loss_sum_, correct_, examples_);
    replicas.sum_totals(loss_sum_, correct_, examples_);
    return stats();
  }

 private:
  Tensor loss_sum_, correct_;  // float32 and int64 scalars on the device
  int64_t examples_ = 0;
  Clock::time_point start_;
};

// Training on one device is data-parallel training over a single replica,
// which has nothing to share: the loops below use this when given none.
class OneReplica final : public Replicas {
 public:
  void begin_step(int64_t, int64_t) override {}
  void after_backward() override {}
  void set_no_sync(bool) override {}
  void sum_totals(const Tensor&, const Tensor&, int64_t&) override {}
  bool capturable() const override { return true; }
};

Replicas& replicas_or_one(Replicas* replicas) {
  static OneReplica one;
  return replicas ? *replicas : one;
}

}  // namespace

StepResult forward_loss(nn::Module& model, const Tensor& x, const Tensor& y,
                        double label_smoothing) {
  StepResult s;
  s.logits = model(x);
  s.loss = cross_entropy(s.logits, y, Reduction::Mean, label_smoothing);
  return s;
}

void backward_loss(const StepResult& step, double share) {
  (share == 1.0 ? step.loss : scale(step.loss, share)).backward();
}

StepResult forward_backward(nn::Module& model, const Tensor& x, const Tensor& y,
                            double label_smoothing, double share) {
  StepResult s = forward_loss(model, x, y, label_smoothing);
  backward_loss(s, share);
  return s;
}

std::vector<MicroBatch> micro_batches(int64_t rows, int64_t parts, int64_t global_rows,
                                      int ranks) {
  auto cut = [parts](int64_t n, int64_t k) { return n * k / parts; };
  std::vector<MicroBatch> out;
  for (int64_t k = 0; k < parts; ++k) {
    MicroBatch m{.begin = cut(rows, k), .end = cut(rows, k + 1)};
    m.share = double(m.rows()) / double(global_rows);
    for (int r = 0; r < ranks; ++r) {
      const int64_t shard = ranks == 1 ? rows : data::shard_rows(global_rows, ranks, r);
      m.global_rows += cut(shard, k + 1) - cut(shard, k);
    }
    out.push_back(m);
  }
  return out;
}

std::string graphs_unavailable(Device device, const Replicas* replicas, const Stages* stages) {
  if (stages)
    return "a pipeline's stages send their activations and gradients through the communicator, "
           "which is not captured";
  if (replicas && !replicas->capturable())
    return "data-parallel steps run eagerly: their gradients are all-reduced from backward's hooks "
           "through the communicator, which is not captured";
  if (profile::enabled()) return "the profiler times every launch with events of its own";
  return CudaGraph::unavailable(device);
}

EpochStats train_epoch(nn::Module& model, optim::SGD& optimizer, data::DataLoader& loader,
                       Device device, const EpochOptions& options) {
  model.train();
  // Batches reach the device through pinned buffers on the copy stream, the
  // next one copying while this one computes (data/device_prefetcher.h).
  data::DevicePrefetcher batches(loader, device);
  if (options.epoch) batches.start_epoch(*options.epoch);
  else batches.start_epoch();
  RunningTotals totals(device);
  Replicas& replicas = replicas_or_one(options.replicas);
  if (options.accumulate < 1)
    throw std::invalid_argument(
        fmt::format("train_epoch: accumulate must be >= 1, got {}", options.accumulate));
  const int64_t parts = options.accumulate;
  AutocastGuard autocast(device.type, options.amp, DType::BFloat16, &optimizer.cast_cache());
  // CUDA graphs: the rate read from the device, and after the first step
  // the batches copied into the graph's static inputs (EpochOptions::cuda_graphs).
  const bool graphs = options.cuda_graphs && graphs_unavailable(device, options.replicas, options.stages).empty();
  if (graphs) optimizer.keep_lr_on_device();
  Tensor static_images;
  std::unique_ptr<CudaGraph> graph;
  int64_t done = 0;
  data::DeviceBatch b;
  // With the profiler on (core/profile.h) a step spans the wait for its
  // batch to the end of the optimizer's step, its device work included.
  const bool profiled = profile::enabled();
  for (;;) {
    if (profiled) profile::begin_step(device);
    bool more = false;
    {
      profile::Scope wait(profile::Family::DataWait, "next batch", true);
      more = batches.next(b);
    }
    if (!more) {
      if (profiled) profile::cancel_step();
      break;
    }
    const data::Batch& batch = b.host;
    const Tensor& x = b.images;
    const Tensor& y = b.labels;
    if (options.schedule)
      optimizer.set_lr(options.schedule->lr(int64_t(batch.epoch), batch.index,
                                            loader.num_batches()));
    // The step's device work: on a GPU queued without a wait, so that it
    // can be captured as a graph.
    auto device_step = [&] {
      optimizer.zero_grad();
      // This rank's part of the batch may be empty (a last batch smaller
      // than the rank count), and so may a micro-batch: it then adds nothing
      // but still takes part in the sum. Each backpropagates its share of
      // the whole batch's mean loss, so the summed gradients are the batch's.
      const std::vector<MicroBatch> micro =
          micro_batches(batch.size, parts, batch.global_size, loader.shard_count());
      auto part = [&](const Tensor& t, const MicroBatch& m) {
        return parts > 1 ? t.narrow(m.begin, m.rows()) : t;
      };
      if (options.stages) {
        options.stages->train_step(x, y, micro, batch.global_size, options.label_smoothing,
                                   replicas, [&](const StepResult& s, const Tensor& labels) {
                                     totals.add(s.loss, double(labels.size(0)), s.logits, labels);
                                   });
      } else {
        for (int64_t k = 0; k < parts; ++k) {
          const MicroBatch& m = micro[size_t(k)];
          if (parts > 1) replicas.set_no_sync(k + 1 < parts);  // reduce after the last one
          replicas.begin_step(m.rows(), m.global_rows);
          if (m.rows() > 0) {
            const Tensor ys = part(y, m);
            const StepResult s =
                forward_backward(model, part(x, m), ys, options.label_smoothing, m.share);
            totals.add(s.loss, double(m.rows()), s.logits, ys);
          }
          replicas.after_backward();
        }
      }
      optimizer.step();
    };
    const bool steady = static_images.defined() && x.impl() == static_images.impl();
    if (steady && graph) {
      graph->replay();
    } else if (steady) {
      try {
        graph = std::make_unique<CudaGraph>(device, device_step);
      } catch (const std::exception& e) {
        throw std::runtime_error(fmt::format(
            "train_epoch: capturing the training step as a CUDA graph failed (--no-cuda-graphs "
            "runs every step eagerly): {}",
            e.what()));
      }
      graph->replay();  // the capture ran nothing: this step runs now
    } else {
      device_step();
      if (graphs && !static_images.defined()) {
        // From the next batch of this shape on, the graph's inputs.
        static_images = Tensor::empty(x.shape(), x.dtype(), device);
        batches.set_static_buffers(static_images, Tensor::empty(y.shape(), y.dtype(), device));
      }
    }
    // The examples, counted where the losses are: on the last stage of a pipeline.
    if (!options.stages || options.stages->last_stage()) totals.count(batch.size);
    if (profiled) profile::end_step(device);
    ++done;
    if (options.progress)
      options.progress({.done = done,
                        .total = loader.num_batches(),
                        .stats = [&totals] { return totals.stats(); }});
  }
  EpochStats stats = totals.summed(replicas, options.stages);
  stats.last_lr = optimizer.lr();
  return stats;
}

EpochStats train_epoch(nn::Module& model, optim::SGD& optimizer, data::DataLoader& loader,
                       Device device, const Progress& progress) {
  EpochOptions options;
  options.progress = progress;
  return train_epoch(model, optimizer, loader, device, options);
}

namespace {

// The loop of evaluate() and evaluate_classes(): each batch's logits go to
// `batch_done` (when set) as well as into the totals; with replicas, the
// totals are summed over the ranks.
EpochStats evaluate_batches(
    nn::Module& model, data::DataLoader& loader, Device device,
    const std::function<void(const Tensor& logits, const data::Batch& batch)>& batch_done,
    Replicas* replicas, bool amp, Stages* stages) {
  bool was_training = model.is_training();
  model.eval();
  NoGradGuard no_grad;
  AutocastGuard autocast(device.type, amp);  // its own cache: one cast per weight
  data::DevicePrefetcher batches(loader, device);
  batches.start_epoch();
  RunningTotals totals(device);
  data::DeviceBatch b;
  while (batches.next(b)) {
    if (b.host.size == 0) continue;  // this rank's part of a short last batch
    Tensor logits = stages ? stages->forward(b.images) : model(b.images);
    if (!logits.defined()) continue;  // a pipeline's stage before the last
    totals.add(cross_entropy(logits, b.labels, Reduction::Sum), 1.0, logits, b.labels);
    totals.count(logits.size(0));
    if (batch_done) batch_done(logits, b.host);
  }
  EpochStats stats = totals.summed(replicas_or_one(replicas), stages);
  model.train(was_training);
  return stats;
}

}  // namespace

EpochStats evaluate(nn::Module& model, data::DataLoader& loader, Device device,
                    Replicas* replicas, bool amp, Stages* stages) {
  return evaluate_batches(model, loader, device, {}, replicas, amp, stages);
}

int64_t ClassEvaluation::examples_of(int64_t truth) const {
  int64_t n = 0;
  for (int64_t p = 0; p < classes; ++p) n += count(truth, p);
  return n;
}

double ClassEvaluation::accuracy_of(int64_t truth) const {
  const int64_t n = examples_of(truth);
  return n ? double(count(truth, truth)) / double(n) : 0.0;
}

ClassEvaluation evaluate_classes(nn::Module& model, data::DataLoader& loader, Device device,
                                 int64_t classes, bool amp) {
  if (classes < 1)
    throw std::invalid_argument(fmt::format("evaluate_classes: classes must be >= 1, got {}", classes));
  ClassEvaluation result;
  result.classes = classes;
  result.confusion.assign(size_t(classes * classes), 0);
  result.stats = evaluate_batches(model, loader, device, [&](const Tensor& logits,
                                                             const data::Batch& batch) {
    if (logits.dim() != 2 || logits.size(1) != classes)
      throw std::invalid_argument(fmt::format(
          "evaluate_classes: the model gives logits of shape {}, not [N, {}]",
          shape_str(logits.shape()), classes));
    const std::vector<int64_t> predicted = argmax_rows(logits).to_int_vector();
    for (size_t i = 0; i < predicted.size(); ++i) {
      const int64_t truth = batch.labels[i];
      if (truth < 0 || truth >= classes)
        throw std::invalid_argument(
            fmt::format("evaluate_classes: label {} is not below {} classes", truth, classes));
      ++result.confusion[size_t(truth * classes + predicted[i])];
    }
  }, nullptr, amp, nullptr);
  return result;
}

int64_t recalibrate_batch_norm(nn::Module& model, data::DataLoader& loader, Device device,
                               int64_t batches, std::optional<uint64_t> epoch) {
  std::vector<nn::BatchNorm2d*> layers;
  for (nn::Module* m : model.modules())
    if (auto* bn = dynamic_cast<nn::BatchNorm2d*>(m)) layers.push_back(bn);
  if (layers.empty())
    throw std::invalid_argument("recalibrate_batch_norm: the model has no BatchNorm layers");
  if (batches < 1 || batches > loader.num_batches())
    throw std::invalid_argument(
        fmt::format("recalibrate_batch_norm: batches must be in 1..{} (the loader's batches per "
                    "epoch), got {}",
                    loader.num_batches(), batches));
  const bool was_training = model.is_training();
  std::vector<double> momenta;
  NoGradGuard no_grad;
  for (nn::BatchNorm2d* bn : layers) {
    momenta.push_back(bn->momentum);
    bn->running_mean.copy_(Tensor::zeros(bn->running_mean.shape(), DType::Float32, device));
    bn->running_var.copy_(Tensor::ones(bn->running_var.shape(), DType::Float32, device));
    bn->num_batches_tracked.copy_(Tensor::zeros({}, DType::Int64, device));
  }
  model.train();
  data::DevicePrefetcher prefetcher(loader, device);
  if (epoch) prefetcher.start_epoch(*epoch);
  else prefetcher.start_epoch();
  data::DeviceBatch b;
  // With momentum 1/k at the k-th batch, running = running + (batch - running) / k:
  // the running statistics are exactly the mean of the k batches' statistics.
  for (int64_t k = 1; k <= batches && prefetcher.next(b); ++k) {
    for (nn::BatchNorm2d* bn : layers) bn->momentum = 1.0 / double(k);
    model(b.images);
  }
  for (size_t i = 0; i < layers.size(); ++i) layers[i]->momentum = momenta[i];
  model.train(was_training);
  return int64_t(layers.size());
}

// ---- checkpoints

namespace {

constexpr std::string_view kModelPrefix = "model.";
constexpr std::string_view kMomentumPrefix = "optimizer.momentum.";
constexpr const char* kStateKey = "trainer.state";
constexpr const char* kFormat = "anvil-train-checkpoint";
constexpr int kVersion = 1;

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw nn::CheckpointError(fmt::format("{}: {}", path, what));
}

int64_t counter(const std::string& path, const nlohmann::ordered_json& state, const char* key) {
  auto it = state.find(key);
  if (it == state.end() || !it->is_number_integer() || it->get<int64_t>() < 0)
    fail(path, fmt::format("'{}' in {} must be a whole number >= 0", key, kStateKey));
  return it->get<int64_t>();
}

}  // namespace

void save_checkpoint(const std::string& path, const nn::Module& model, const optim::SGD& optimizer,
                     const RunState& state) {
  save_checkpoint(path, model, optimizer.momentum_buffers(), state);
}

void save_checkpoint(const std::string& path, const nn::Module& model,
                     const std::vector<Tensor>& momentum, const RunState& state) {
  nn::NamedTensors tensors;
  for (auto& [key, t] : model.state_dict())
    tensors.emplace_back(std::string(kModelPrefix) + key, t);
  nn::NamedTensors params = model.named_parameters();
  if (momentum.size() != params.size())
    fail(path, fmt::format("the optimizer has {} parameters, the model {}", momentum.size(),
                           params.size()));
  for (size_t i = 0; i < params.size(); ++i)
    if (momentum[i].defined())
      tensors.emplace_back(std::string(kMomentumPrefix) + params[i].first, momentum[i]);
  nlohmann::ordered_json json = {{"format", kFormat},
                                 {"version", kVersion},
                                 {"epochs_done", state.epochs_done},
                                 {"steps_done", state.steps_done},
                                 {"info", state.info}};
  std::string text = json.dump();
  tensors.emplace_back(kStateKey, Tensor::from_host(text.data(), {int64_t(text.size())},
                                                    DType::UInt8));
  nn::save_safetensors(path, tensors);
}

namespace {

// The trainer.state tensor of a loaded checkpoint file, parsed and checked.
RunState parse_run_state(const std::string& path, const nn::NamedTensors& file) {
  const Tensor* state_bytes = nullptr;
  for (auto& [key, t] : file)
    if (key == kStateKey) state_bytes = &t;
  if (!state_bytes)
    fail(path, fmt::format("no '{}' tensor: not a training checkpoint of anvil-train "
                           "--checkpoint (a --save file holds the weights only)",
                           kStateKey));
  if (state_bytes->dtype() != DType::UInt8 || state_bytes->dim() != 1)
    fail(path, fmt::format("'{}' must be 1-D uint8 (JSON text)", kStateKey));
  const char* text = static_cast<const char*>(state_bytes->raw_data());
  auto json = nlohmann::ordered_json::parse(text, text + state_bytes->numel(), nullptr,
                                           /*allow_exceptions=*/false);
  if (!json.is_object()) fail(path, fmt::format("'{}' is not a JSON object", kStateKey));
  auto format = json.find("format");
  auto version = json.find("version");
  if (format == json.end() || !format->is_string() || *format != kFormat ||
      version == json.end() || !version->is_number_integer() || *version != kVersion)
    fail(path, fmt::format("'{}' is not format '{}' version {}", kStateKey, kFormat, kVersion));
  RunState state;
  state.epochs_done = counter(path, json, "epochs_done");
  state.steps_done = counter(path, json, "steps_done");
  state.info = json.value("info", nlohmann::ordered_json::object());
  if (state.info.is_null()) state.info = nlohmann::ordered_json::object();  // RunState's default
  if (!state.info.is_object()) fail(path, fmt::format("'info' in {} must be an object", kStateKey));
  return state;
}

}  // namespace

RunState read_run_state(const std::string& path) {
  return parse_run_state(path, nn::load_safetensors(path));
}

RunState load_checkpoint(const std::string& path, nn::Module& model, optim::SGD& optimizer) {
  nn::NamedTensors file = nn::load_safetensors(path);
  RunState state = parse_run_state(path, file);
  nn::NamedTensors model_state;
  std::map<std::string, Tensor> momentum_by_name;
  for (auto& [key, t] : file) {
    if (key.starts_with(kModelPrefix)) model_state.emplace_back(key.substr(kModelPrefix.size()), t);
    else if (key.starts_with(kMomentumPrefix))
      momentum_by_name[key.substr(kMomentumPrefix.size())] = t;
    else if (key != kStateKey)
      fail(path, fmt::format("unexpected tensor '{}' in a training checkpoint", key));
  }

  // Everything is checked before anything changes: the model's tensors
  // first (another model's checkpoint is named as such), then the momentum.
  nn::check_state_dict(model, model_state, path);
  nn::NamedTensors params = model.named_parameters();
  if (optimizer.momentum_buffers().size() != params.size())
    fail(path, fmt::format("the optimizer has {} parameters, the model {}",
                           optimizer.momentum_buffers().size(), params.size()));
  std::vector<Tensor> momentum(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    auto it = momentum_by_name.find(params[i].first);
    if (it == momentum_by_name.end()) {
      // After a step with momentum every parameter has a buffer (the models
      // here give each one a gradient): a missing one means an edited file,
      // and resuming without it would silently change the run.
      if (optimizer.options().momentum > 0 && state.steps_done > 0)
        fail(path, fmt::format("no '{}{}': a run with momentum {} saves one buffer per parameter "
                               "after its first step",
                               kMomentumPrefix, params[i].first, optimizer.options().momentum));
      continue;
    }
    if (optimizer.options().momentum == 0)
      fail(path, fmt::format("'{}{}' is a momentum buffer, but this optimizer has momentum 0",
                             kMomentumPrefix, it->first));
    const Tensor& t = it->second;
    if (t.dtype() != DType::Float32 || t.shape() != params[i].second.shape())
      fail(path, fmt::format("'{}{}' is {} {}, the parameter is float32 {}", kMomentumPrefix,
                             it->first, dtype_name(t.dtype()), shape_str(t.shape()),
                             shape_str(params[i].second.shape())));
    momentum[i] = t;
    momentum_by_name.erase(it);
  }
  if (!momentum_by_name.empty())
    fail(path, fmt::format("'{}{}' is the momentum of no parameter of this model", kMomentumPrefix,
                           momentum_by_name.begin()->first));
  nn::load_state_dict(model, model_state, path);
  optimizer.load_momentum_buffers(momentum);
  optimizer.cast_cache().clear();  // the weights changed under any copies
  return state;
}

}  // namespace anvil::train
