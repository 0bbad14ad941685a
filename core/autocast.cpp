#include "core/autocast.h"

#include <stdexcept>

#include <fmt/format.h>

#include "core/ops_util.h"

namespace anvil {
namespace {

// Per thread and per device type, as PyTorch's autocast state.
struct State {
  bool enabled = false;
  CastCache* cache = nullptr;
};
thread_local State t_state[2];  // [0] CPU, [1] CUDA

State& state(DeviceType device) { return t_state[device == DeviceType::CUDA ? 1 : 0]; }

}  // namespace

Tensor CastCache::get(const Tensor& w) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = copies_.find(w.impl().get());
  if (it != copies_.end()) return it->second.copy;
  Tensor copy = w.detach().to(DType::BFloat16);
  copies_.emplace(w.impl().get(), Entry{w.impl(), copy});
  return copy;
}

Tensor CastCache::find(const Tensor& w) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = copies_.find(w.impl().get());
  return it == copies_.end() ? Tensor() : it->second.copy;
}

void CastCache::clear() {
  std::lock_guard<std::mutex> lock(mutex_);
  copies_.clear();
}

size_t CastCache::size() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return copies_.size();
}

AutocastGuard::AutocastGuard(DeviceType device, bool enabled, DType dtype, CastCache* cache)
    : device_(device),
      previous_enabled_(state(device).enabled),
      previous_cache_(state(device).cache) {
  if (dtype != DType::BFloat16)
    throw std::invalid_argument(fmt::format(
        "autocast: dtype {} is not supported; anvil autocasts to bfloat16", dtype_name(dtype)));
  State& s = state(device);
  s.enabled = enabled;
  if (enabled) {
    if (!cache && !previous_cache_) {
      own_ = std::make_unique<CastCache>();
      cache = own_.get();
    }
    // A nested guard without a cache of its own shares the outer one's.
    s.cache = cache ? cache : previous_cache_;
  }
}

AutocastGuard::~AutocastGuard() {
  State& s = state(device_);
  s.enabled = previous_enabled_;
  s.cache = previous_cache_;
}

bool autocast_enabled(DeviceType device) { return state(device).enabled; }

CastCache* autocast_cache(DeviceType device) {
  const State& s = state(device);
  return s.enabled ? s.cache : nullptr;
}

}  // namespace anvil

// ---- the op layer's side (core/ops_util.h)

namespace anvil::ops_detail {

bool amp_active(const Tensor& x) { return x.defined() && autocast_enabled(x.device().type); }

AmpOperand amp_operand(const Tensor& t, bool amp) {
  if (!amp || !t.defined() || t.dtype() != DType::Float32) return {t, t};
  if (t.is_leaf() && t.requires_grad()) return {autocast_cache(t.device().type)->get(t), t};
  Tensor cast = t.to(DType::BFloat16);
  return {cast, cast};
}

AmpOperands amp_operands(const Tensor& a_in, const Tensor& b_in) {
  const bool amp = amp_active(a_in);
  auto [a, a_graph] = amp_operand(a_in, amp);
  auto [b, b_graph] = amp_operand(b_in, amp);
  if (a.dtype() != b.dtype()) {  // only outside autocast: under it both are bfloat16
    a = a_graph = a.to(DType::Float32);
    b = b_graph = b.to(DType::Float32);
  }
  return {a, b, a_graph, b_graph, amp};
}

}  // namespace anvil::ops_detail
