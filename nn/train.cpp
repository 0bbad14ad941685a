#include "nn/train.h"

#include <chrono>
#include <map>
#include <string_view>

#include <fmt/format.h>

#include "core/autograd.h"
#include "core/ops.h"
#include "data/device_prefetcher.h"
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
  // size for a mean loss, 1 for a summed one).
  void add(const Tensor& loss, double weight, const Tensor& logits, const Tensor& labels) {
    add_scaled_(loss_sum_, loss.detach(), weight);
    count_correct_(correct_, logits.detach(), labels);
    examples_ += logits.size(0);
  }

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

 private:
  Tensor loss_sum_, correct_;  // float32 and int64 scalars on the device
  int64_t examples_ = 0;
  Clock::time_point start_;
};

}  // namespace

EpochStats train_epoch(nn::Module& model, optim::SGD& optimizer, data::DataLoader& loader,
                       Device device, const EpochOptions& options) {
  model.train();
  // Batches reach the device through pinned buffers on the copy stream, the
  // next one copying while this one computes (data/device_prefetcher.h).
  data::DevicePrefetcher batches(loader, device);
  if (options.epoch) batches.start_epoch(*options.epoch);
  else batches.start_epoch();
  RunningTotals totals(device);
  int64_t done = 0;
  data::DeviceBatch b;
  while (batches.next(b)) {
    const data::Batch& batch = b.host;
    const Tensor& x = b.images;
    const Tensor& y = b.labels;
    if (options.schedule)
      optimizer.set_lr(options.schedule->lr(int64_t(batch.epoch), batch.index,
                                            loader.num_batches()));
    Tensor logits = model(x);
    Tensor loss = cross_entropy(logits, y);
    optimizer.zero_grad();
    loss.backward();
    optimizer.step();
    totals.add(loss, double(batch.size), logits, y);
    ++done;
    if (options.progress)
      options.progress({.done = done,
                        .total = loader.num_batches(),
                        .stats = [&totals] { return totals.stats(); }});
  }
  EpochStats stats = totals.stats();
  stats.last_lr = optimizer.lr();
  return stats;
}

EpochStats train_epoch(nn::Module& model, optim::SGD& optimizer, data::DataLoader& loader,
                       Device device, const Progress& progress) {
  EpochOptions options;
  options.progress = progress;
  return train_epoch(model, optimizer, loader, device, options);
}

EpochStats evaluate(nn::Module& model, data::DataLoader& loader, Device device) {
  bool was_training = model.is_training();
  model.eval();
  NoGradGuard no_grad;
  data::DevicePrefetcher batches(loader, device);
  batches.start_epoch();
  RunningTotals totals(device);
  data::DeviceBatch b;
  while (batches.next(b)) {
    Tensor logits = model(b.images);
    totals.add(cross_entropy(logits, b.labels, Reduction::Sum), 1.0, logits, b.labels);
  }
  EpochStats stats = totals.stats();
  model.train(was_training);
  return stats;
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
  nn::NamedTensors tensors;
  for (auto& [key, t] : model.state_dict())
    tensors.emplace_back(std::string(kModelPrefix) + key, t);
  nn::NamedTensors params = model.named_parameters();
  const std::vector<Tensor>& momentum = optimizer.momentum_buffers();
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
  return state;
}

}  // namespace anvil::train
