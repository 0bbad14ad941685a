// SGD parameter update (PyTorch semantics, dampening 0), one fused pass:
// weight decay, momentum buffer and the step are applied per element so the
// parameter, gradient and buffer are each streamed through memory once.
// The branches on the hyper-parameters are hoisted out of the loops so each
// variant is a plain vectorisable loop.
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/parallel_util.h"
#include "kernels/cpu/cpu_backend.h"

namespace anvil::cpu {

void sgd_update(int64_t n, float* param, const float* grad, float* momentum_buf, float lr,
                float momentum, float weight_decay, bool nesterov, bool first_step) {
  const bool par = n >= detail::kMinParallel;
  const float wd = weight_decay;
  if (momentum == 0.0f) {
#pragma omp parallel for simd schedule(static) if (par)
    for (int64_t i = 0; i < n; ++i) param[i] -= lr * (grad[i] + wd * param[i]);
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
      param[i] -= lr * (nesterov ? g + mom * g : g);
    }
    return;
  }
  if (nesterov) {
#pragma omp parallel for simd schedule(static) if (par)
    for (int64_t i = 0; i < n; ++i) {
      const float g = grad[i] + wd * param[i];
      const float b = mom * momentum_buf[i] + g;
      momentum_buf[i] = b;
      param[i] -= lr * (g + mom * b);
    }
  } else {
#pragma omp parallel for simd schedule(static) if (par)
    for (int64_t i = 0; i < n; ++i) {
      const float g = grad[i] + wd * param[i];
      const float b = mom * momentum_buf[i] + g;
      momentum_buf[i] = b;
      param[i] -= lr * b;
    }
  }
}

// ---- CpuBackend (cpu_backend.h) ----

void CpuBackend::sgd_update(const Tensor& param, const Tensor& grad, const Tensor& momentum_buf,
                            float lr, float momentum, float weight_decay, bool nesterov,
                            bool first_step) {
  cpu::sgd_update(param.numel(), floats(param), floats(grad), floats(momentum_buf), lr, momentum,
                  weight_decay, nesterov, first_step);
}

}  // namespace anvil::cpu
