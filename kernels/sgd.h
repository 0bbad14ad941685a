// SGD's update of one element, written once for the CPU kernel
// (kernels/cpu/sgd.cpp) and the CUDA kernel (kernels/cuda/sgd.cu), with
// PyTorch's semantics (torch.optim.SGD, dampening 0):
//   g = grad + weight_decay * p
//   if momentum != 0: buf = first_step ? g : momentum * buf + g
//                     g = nesterov ? g + momentum * buf : buf
//   p -= lr * g
// Both kernels run this function on every element, so they agree bit for
// bit wherever their compilers contract the same multiply-adds (the tests
// check it); a multi-tensor update is this function over a table of
// tensors, and gives each tensor the bits a one-tensor update gives it.
//
// The hyper-parameter branches are the mode, a template parameter: each
// kernel instantiates a straight-line loop per mode. With kFirstStep the
// old buffer is never read (an uninitialised buffer cannot leak NaN into
// the parameters); with kPlain (momentum 0, where nesterov means nothing)
// the buffer is not touched and may be null.
#pragma once
#include <cstdint>

#include "core/bfloat16.h"
#include "core/host_device.h"

namespace anvil {

// One tensor of a (multi-tensor) SGD update, as both kernels take it.
struct SgdEntry {
  float* param = nullptr;
  const float* grad = nullptr;
  float* momentum_buf = nullptr;   // may be null with momentum 0
  bfloat16* param_copy = nullptr;  // when not null, gets the updated param rounded to bfloat16
  int64_t n = 0;
  bool first_step = false;  // the buffer is set to g; its old contents are not read
};

enum class SgdMode { kPlain, kFirstStep, kMomentum };

// The updated parameter p of element i; writes buf[i] unless kMode is kPlain.
template <SgdMode kMode, bool kNesterov>
ANVIL_HOST_DEVICE inline float sgd_element(float p, float grad, float* buf, int64_t i, float lr,
                                           float momentum, float weight_decay) {
  float g = grad + weight_decay * p;
  if constexpr (kMode == SgdMode::kFirstStep) {
    buf[i] = g;
    if constexpr (kNesterov) g = g + momentum * g;
  } else if constexpr (kMode == SgdMode::kMomentum) {
    const float b = momentum * buf[i] + g;
    buf[i] = b;
    g = kNesterov ? g + momentum * b : b;
  }
  return p - lr * g;
}

}  // namespace anvil
