// Batch normalisation over x[N, C, HW], one channel at a time.
// A channel's data is N contiguous runs of HW floats; OpenMP splits the
// channels (each thread owns whole channels, so no reductions across
// threads and results do not depend on the thread count). Statistics use
// two passes in double (mean, then sum of squared deviations) to avoid the
// cancellation of E[x^2] - E[x]^2; the per-element passes stay in float.
// Semantics match PyTorch: biased variance normalises, the running
// variance is updated with the unbiased one (M/(M-1), M = N*HW; with M == 1
// the biased value is used instead of dividing by zero).
#include <cmath>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/parallel_util.h"
#include "kernels/cpu/cpu_backend.h"

namespace anvil::cpu {

void batch_norm_forward_train(int64_t N, int64_t C, int64_t HW, const float* x,
                              const float* gamma, const float* beta, float eps, float momentum,
                              float* running_mean, float* running_var, float* save_mean,
                              float* save_invstd, float* y) {
  const int64_t M = N * HW, CHW = C * HW;
#pragma omp parallel for schedule(static) if (N * CHW >= detail::kMinParallel)
  for (int64_t c = 0; c < C; ++c) {
    double s = 0.0;
    for (int64_t n = 0; n < N; ++n) {
      const float* xp = x + n * CHW + c * HW;
#pragma omp simd reduction(+ : s)
      for (int64_t i = 0; i < HW; ++i) s += xp[i];
    }
    const double mean = M > 0 ? s / static_cast<double>(M) : 0.0;
    double ss = 0.0;
    for (int64_t n = 0; n < N; ++n) {
      const float* xp = x + n * CHW + c * HW;
#pragma omp simd reduction(+ : ss)
      for (int64_t i = 0; i < HW; ++i) {
        const double d = xp[i] - mean;
        ss += d * d;
      }
    }
    const double var = M > 0 ? ss / static_cast<double>(M) : 0.0;
    const double invstd = 1.0 / std::sqrt(var + static_cast<double>(eps));
    save_mean[c] = static_cast<float>(mean);
    save_invstd[c] = static_cast<float>(invstd);
    if (running_mean)
      running_mean[c] = static_cast<float>((1.0 - momentum) * running_mean[c] + momentum * mean);
    if (running_var) {
      const double unbiased = M > 1 ? ss / static_cast<double>(M - 1) : var;
      running_var[c] = static_cast<float>((1.0 - momentum) * running_var[c] + momentum * unbiased);
    }
    // y = x * a + b with a = gamma*invstd, b = beta - mean*a.
    const float a = static_cast<float>(gamma[c] * invstd);
    const float b = static_cast<float>(beta[c] - mean * gamma[c] * invstd);
    for (int64_t n = 0; n < N; ++n) {
      const float* xp = x + n * CHW + c * HW;
      float* yp = y + n * CHW + c * HW;
#pragma omp simd
      for (int64_t i = 0; i < HW; ++i) yp[i] = xp[i] * a + b;
    }
  }
}

void batch_norm_forward_eval(int64_t N, int64_t C, int64_t HW, const float* x,
                             const float* gamma, const float* beta, const float* running_mean,
                             const float* running_var, float eps, float* y) {
  const int64_t CHW = C * HW, rows = N * C;
#pragma omp parallel for schedule(static) if (rows * HW >= detail::kMinParallel)
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t c = r % C;
    const double invstd = 1.0 / std::sqrt(static_cast<double>(running_var[c]) + eps);
    const float a = static_cast<float>(gamma[c] * invstd);
    const float b = static_cast<float>(beta[c] - running_mean[c] * gamma[c] * invstd);
    const float* xp = x + (r / C) * CHW + c * HW;
    float* yp = y + (r / C) * CHW + c * HW;
#pragma omp simd
    for (int64_t i = 0; i < HW; ++i) yp[i] = xp[i] * a + b;
  }
}

void batch_norm_backward_train(int64_t N, int64_t C, int64_t HW, const float* x,
                               const float* gamma, const float* save_mean,
                               const float* save_invstd, const float* dy, float* dx,
                               float* dgamma, float* dbeta) {
  const int64_t M = N * HW, CHW = C * HW;
#pragma omp parallel for schedule(static) if (N * CHW >= detail::kMinParallel)
  for (int64_t c = 0; c < C; ++c) {
    const float mean = save_mean[c], invstd = save_invstd[c];
    double sdy = 0.0, sdyx = 0.0;  // sum(dy), sum(dy * (x - mean))
    for (int64_t n = 0; n < N; ++n) {
      const float* xp = x + n * CHW + c * HW;
      const float* gp = dy + n * CHW + c * HW;
#pragma omp simd reduction(+ : sdy, sdyx)
      for (int64_t i = 0; i < HW; ++i) {
        sdy += gp[i];
        sdyx += static_cast<double>(gp[i]) * (xp[i] - mean);
      }
    }
    const double sdyxhat = sdyx * invstd;  // sum(dy * xhat)
    dbeta[c] = static_cast<float>(sdy);
    dgamma[c] = static_cast<float>(sdyxhat);
    if (M == 0) continue;
    // dx = gamma*invstd * (dy - sdy/M - xhat * sdyxhat/M)
    //    = k * dy + u * (x - mean) + v   (folded per channel; x - mean is
    // kept explicit so a large mean does not cancel catastrophically)
    const double k = static_cast<double>(gamma[c]) * invstd;
    const double u = -k * invstd * sdyxhat / static_cast<double>(M);
    const double v = -k * sdy / static_cast<double>(M);
    const float kf = static_cast<float>(k), uf = static_cast<float>(u), vf = static_cast<float>(v);
    for (int64_t n = 0; n < N; ++n) {
      const float* xp = x + n * CHW + c * HW;
      const float* gp = dy + n * CHW + c * HW;
      float* dp = dx + n * CHW + c * HW;
#pragma omp simd
      for (int64_t i = 0; i < HW; ++i) dp[i] = kf * gp[i] + uf * (xp[i] - mean) + vf;
    }
  }
}

// ---- CpuBackend (cpu_backend.h) ----

void CpuBackend::batch_norm_forward_train(const Tensor& x, const Tensor& gamma,
                                          const Tensor& beta, float eps, float momentum,
                                          const Tensor& running_mean, const Tensor& running_var,
                                          const Tensor& save_mean, const Tensor& save_invstd,
                                          const Tensor& y) {
  auto [N, C, HW] = nchw_view(x);
  cpu::batch_norm_forward_train(N, C, HW, floats(x), floats(gamma), floats(beta), eps, momentum,
                                floats(running_mean), floats(running_var), floats(save_mean),
                                floats(save_invstd), floats(y));
}
void CpuBackend::batch_norm_forward_eval(const Tensor& x, const Tensor& gamma,
                                         const Tensor& beta, const Tensor& running_mean,
                                         const Tensor& running_var, float eps, const Tensor& y) {
  auto [N, C, HW] = nchw_view(x);
  cpu::batch_norm_forward_eval(N, C, HW, floats(x), floats(gamma), floats(beta),
                               floats(running_mean), floats(running_var), eps, floats(y));
}
void CpuBackend::batch_norm_backward_train(const Tensor& x, const Tensor& gamma,
                                           const Tensor& save_mean, const Tensor& save_invstd,
                                           const Tensor& dy, const Tensor& dx,
                                           const Tensor& dgamma, const Tensor& dbeta) {
  auto [N, C, HW] = nchw_view(x);
  cpu::batch_norm_backward_train(N, C, HW, floats(x), floats(gamma), floats(save_mean),
                                 floats(save_invstd), floats(dy), floats(dx), floats(dgamma),
                                 floats(dbeta));
}

}  // namespace anvil::cpu
