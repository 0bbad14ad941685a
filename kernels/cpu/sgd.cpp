// SGD parameter update (PyTorch semantics, dampening 0), one fused pass:
// weight decay, momentum buffer and the step are applied per element so the
// parameter, gradient and buffer are each streamed through memory once.
// The branches on the hyper-parameters are hoisted out of the loops so each
// variant is a plain vectorisable loop. Under autocast the step also writes
// the parameter's bfloat16 copy (core/autocast.h's CastCache) in the same pass.
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/parallel_util.h"
#include "kernels/cpu/cpu_backend.h"

namespace anvil::cpu {

namespace {

// The loops, with or without the bfloat16 copy, each a plain vectorisable loop.
template <bool kCopy>
void sgd_loops(int64_t n, float* param, const float* grad, float* momentum_buf,
               bfloat16* param_copy, float lr, float momentum, float weight_decay, bool nesterov,
               bool first_step) {
  const bool par = n >= detail::kMinParallel;
  const float wd = weight_decay;
  auto store = [param, param_copy](int64_t i, float p) {
    param[i] = p;
    if constexpr (kCopy) param_copy[i] = bfloat16(p);
  };
  if (momentum == 0.0f) {
#pragma omp parallel for simd schedule(static) if (par)
    for (int64_t i = 0; i < n; ++i) store(i, param[i] - lr * (grad[i] + wd * param[i]));
    return;
  }
  const float mom = momentum;
  // first_step: buf = g, and the old buffer is never read (so an
  // uninitialised buffer cannot leak NaN into the parameters).
  if (first_step) {
#pragma omp parallel for simd schedule(static) if (par)
    for (int64_t i = 0; i < n; ++i) {
      const float g = grad[i] + wd * param[i];
      momentum_buf[i] = g;
      store(i, param[i] - lr * (nesterov ? g + mom * g : g));
    }
    return;
  }
  if (nesterov) {
#pragma omp parallel for simd schedule(static) if (par)
    for (int64_t i = 0; i < n; ++i) {
      const float g = grad[i] + wd * param[i];
      const float b = mom * momentum_buf[i] + g;
      momentum_buf[i] = b;
      store(i, param[i] - lr * (g + mom * b));
    }
  } else {
#pragma omp parallel for simd schedule(static) if (par)
    for (int64_t i = 0; i < n; ++i) {
      const float g = grad[i] + wd * param[i];
      const float b = mom * momentum_buf[i] + g;
      momentum_buf[i] = b;
      store(i, param[i] - lr * b);
    }
  }
}

}  // namespace

void sgd_update(int64_t n, float* param, const float* grad, float* momentum_buf, float lr,
                float momentum, float weight_decay, bool nesterov, bool first_step,
                bfloat16* param_copy) {
  if (param_copy)
    sgd_loops<true>(n, param, grad, momentum_buf, param_copy, lr, momentum, weight_decay,
                    nesterov, first_step);
  else
    sgd_loops<false>(n, param, grad, momentum_buf, nullptr, lr, momentum, weight_decay,
                     nesterov, first_step);
}

// ---- CpuBackend (cpu_backend.h) ----

void CpuBackend::sgd_update(const Tensor& param, const Tensor& grad, const Tensor& momentum_buf,
                            const Tensor& param_copy, float lr, float momentum,
                            float weight_decay, bool nesterov, bool first_step) {
  cpu::sgd_update(param.numel(), floats(param), floats(grad), floats(momentum_buf), lr, momentum,
                  weight_decay, nesterov, first_step,
                  param_copy.defined() ? param_copy.data<bfloat16>() : nullptr);
}

}  // namespace anvil::cpu
