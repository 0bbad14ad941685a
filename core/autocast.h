// Automatic mixed precision, as torch.autocast(device_type, dtype=torch.bfloat16).
// Inside an AutocastGuard for a device type, on the calling thread, ops on
// tensors of that device type follow PyTorch's bfloat16 policy:
//
//   conv2d, linear, matmul    compute in bfloat16: float32 inputs are cast
//                             (activations by a differentiable cast,
//                             parameters through a CastCache, once); the
//                             products are of bfloat16 operands, the sums
//                             float32 (core/precision.h, kBf16); the output is
//                             bfloat16. A bias stays float32 and is added
//                             before the output's rounding.
//   relu, silu, add, mul,     keep their input's dtype (bfloat16 in, bfloat16
//   scale, max/avg pooling,   out). batch_norm computes its statistics in
//   batch_norm, views         float32 and keeps its parameters and running
//                             buffers float32.
//   cross_entropy, sum, mean, compute in float32 and return float32, from
//   global_avg_pool2d         either dtype (outside autocast too).
//
// Gradients flow back in the dtype of the tensor they belong to: a bfloat16
// activation gets a bfloat16 gradient, a float32 parameter a float32 .grad,
// which the op computes from the bfloat16 operands with float32 sums and
// never rounds to bfloat16. So the optimizer updates float32 master weights.
//
// What runs outside a guard is unchanged: float32 everywhere.
#pragma once
#include <memory>
#include <mutex>
#include <unordered_map>

#include "core/tensor.h"

namespace anvil {

// The bfloat16 copies of float32 parameters that ops read under autocast.
// A copy is made by one conversion when an op first reads the parameter;
// after that it is valid only while the parameter changes by an optimizer
// that refreshes the copy in its own update (optim::SGD::step writes both in
// one kernel): whoever writes a parameter otherwise must clear() the cache.
class CastCache {
 public:
  // w's bfloat16 copy (w: a float32 leaf), made now if there is none.
  Tensor get(const Tensor& w);
  // w's copy, or an undefined tensor when none has been made.
  Tensor find(const Tensor& w) const;
  void clear();
  size_t size() const;

 private:
  struct Entry {
    std::shared_ptr<TensorImpl> param;  // keeps the key's address from being reused
    Tensor copy;
  };
  mutable std::mutex mutex_;
  std::unordered_map<const TensorImpl*, Entry> copies_;
};

class AutocastGuard {
 public:
  // Autocast to bfloat16 (the one dtype anvil autocasts to; any other throws
  // std::invalid_argument) for ops on `device` type tensors, until the guard
  // ends; enabled = false turns it off inside an outer guard, as
  // torch.autocast(enabled=False). cache: where parameters' copies live;
  // null: a cache of the guard's own, dropped at its end (PyTorch's
  // behaviour, correct whatever writes the parameters).
  explicit AutocastGuard(DeviceType device, bool enabled = true,
                         DType dtype = DType::BFloat16, CastCache* cache = nullptr);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  DeviceType device_;
  bool previous_enabled_;
  CastCache* previous_cache_;
  std::unique_ptr<CastCache> own_;
};

// Is autocast on for ops on `device` on this thread?
bool autocast_enabled(DeviceType device);

// The cache that autocast's parameter copies go to on this thread (null
// when autocast is off for `device`).
CastCache* autocast_cache(DeviceType device);

}  // namespace anvil
