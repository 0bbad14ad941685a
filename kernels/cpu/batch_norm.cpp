// Batch normalisation over x[N, C, HW], one channel at a time.
// A channel's data is N contiguous runs of HW floats; OpenMP splits the
// channels (each thread owns whole channels, so no reductions across
// threads and results do not depend on the thread count). Statistics use
// two passes in double (mean, then sum of squared deviations) to avoid the
// cancellation of E[x^2] - E[x]^2; the per-element passes stay in float.
// Semantics match PyTorch: biased variance normalises, the running
// variance is updated with the unbiased one (M/(M-1), M = N*HW; with M == 1
// the biased value is used instead of dividing by zero). x, y, dy and dx may
// be float or bfloat16 (T, kernels/element.h: autocast's activations), loaded
// into float; the statistics, parameters and buffers are float32.
#include <cmath>
#include <type_traits>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/parallel_util.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/element.h"
#include "core/pointwise.h"

namespace anvil::cpu {
namespace {

// y = x * a + b over one run of a channel, then ReLU (core/pointwise.h)
// where `relu` (BatchNorm and ReLU fused: one pass). Each branch is a plain
// vectorisable loop. With a residual r: y = relu(bn + r), bn rounded to T
// before the add and the sum rounded after it, as batch_norm then add()
// round them (the same bits as the three ops).
template <class T>
void normalize(const T* x, T* y, int64_t n, float a, float b, bool relu, const T* r) {
  if (r != nullptr) {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) {
      const float s = load(store<T>(load(store<T>(load(x[i]) * a + b)) + load(r[i])));
      y[i] = store<T>(relu ? Relu::forward(s) : s);
    }
  } else if (relu) {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) y[i] = store<T>(Relu::forward(load(x[i]) * a + b));
  } else {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) y[i] = store<T>(load(x[i]) * a + b);
  }
}

}  // namespace

template <class T>
void batch_norm_forward_train(int64_t N, int64_t C, int64_t HW, const T* x, const float* gamma,
                              const float* beta, float eps, float momentum, float* running_mean,
                              float* running_var, float* save_mean, float* save_invstd, T* y,
                              bool relu, const T* residual) {
  const int64_t M = N * HW, CHW = C * HW;
#pragma omp parallel for schedule(static) if (N * CHW >= detail::kMinParallel)
  for (int64_t c = 0; c < C; ++c) {
    double s = 0.0;
    for (int64_t n = 0; n < N; ++n) {
      const T* xp = x + n * CHW + c * HW;
#pragma omp simd reduction(+ : s)
      for (int64_t i = 0; i < HW; ++i) s += load(xp[i]);
    }
    const double mean = M > 0 ? s / static_cast<double>(M) : 0.0;
    double ss = 0.0;
    for (int64_t n = 0; n < N; ++n) {
      const T* xp = x + n * CHW + c * HW;
#pragma omp simd reduction(+ : ss)
      for (int64_t i = 0; i < HW; ++i) {
        const double d = load(xp[i]) - mean;
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
      const int64_t o = n * CHW + c * HW;
      normalize(x + o, y + o, HW, a, b, relu, residual ? residual + o : nullptr);
    }
  }
}

template <class T>
void batch_norm_forward_eval(int64_t N, int64_t C, int64_t HW, const T* x, const float* gamma,
                             const float* beta, const float* running_mean,
                             const float* running_var, float eps, T* y, bool relu) {
  const int64_t CHW = C * HW, rows = N * C;
#pragma omp parallel for schedule(static) if (rows * HW >= detail::kMinParallel)
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t c = r % C;
    const double invstd = 1.0 / std::sqrt(static_cast<double>(running_var[c]) + eps);
    const float a = static_cast<float>(gamma[c] * invstd);
    const float b = static_cast<float>(beta[c] - running_mean[c] * gamma[c] * invstd);
    normalize<T>(x + (r / C) * CHW + c * HW, y + (r / C) * CHW + c * HW, HW, a, b, relu, nullptr);
  }
}

namespace {

// sum(g) and sum(g * (x - mean)) over one run of a channel, added to s.
// The same loop for every gradient g, so a masked gradient staged in a
// buffer is summed in the order of an unmasked one: the same bits.
template <class G, class T>
void add_sums(const G* g, const T* x, int64_t n, float mean, double& sdy, double& sdyx) {
#pragma omp simd reduction(+ : sdy, sdyx)
  for (int64_t i = 0; i < n; ++i) {
    const float gi = load(g[i]);
    sdy += gi;
    sdyx += static_cast<double>(gi) * (load(x[i]) - mean);
  }
}

// The gradient taken is dy, or with kRelu ReLU's backward of it from the
// forward's output relu_y (g below). The sums stage a run's masked gradient
// in a buffer of the thread's (a select inside the reduction loop is not
// vectorised: a branch per element); the dx loop masks in place, and stores
// g in dr too where there is one (the residual's gradient).
template <bool kRelu, class T>
void backward_train(int64_t N, int64_t C, int64_t HW, const T* x, const float* gamma,
                    const float* save_mean, const float* save_invstd, const T* dy, T* dx,
                    float* dgamma, float* dbeta, const T* relu_y, T* dr) {
  const int64_t M = N * HW, CHW = C * HW;
#pragma omp parallel if (N * CHW >= detail::kMinParallel)
  {
    std::vector<float> masked(kRelu ? static_cast<size_t>(HW) : 0);
#pragma omp for schedule(static)
    for (int64_t c = 0; c < C; ++c) {
      const float mean = save_mean[c], invstd = save_invstd[c];
      double sdy = 0.0, sdyx = 0.0;  // sum(g), sum(g * (x - mean))
      for (int64_t n = 0; n < N; ++n) {
        const int64_t o = n * CHW + c * HW;
        if constexpr (kRelu) {
          float* mp = masked.data();
          const T* yp = relu_y + o;
          const T* gp = dy + o;
#pragma omp simd
          for (int64_t i = 0; i < HW; ++i) mp[i] = Relu::backward(load(yp[i]), load(gp[i]));
          add_sums(mp, x + o, HW, mean, sdy, sdyx);
        } else {
          add_sums(dy + o, x + o, HW, mean, sdy, sdyx);
        }
      }
      const double sdyxhat = sdyx * invstd;  // sum(g * xhat)
      dbeta[c] = static_cast<float>(sdy);
      dgamma[c] = static_cast<float>(sdyxhat);
      if (M == 0) continue;
      // dx = gamma*invstd * (g - sdy/M - xhat * sdyxhat/M)
      //    = k * g + u * (x - mean) + v   (folded per channel; x - mean is
      // kept explicit so a large mean does not cancel catastrophically)
      const double k = static_cast<double>(gamma[c]) * invstd;
      const double u = -k * invstd * sdyxhat / static_cast<double>(M);
      const double v = -k * sdy / static_cast<double>(M);
      const float kf = static_cast<float>(k), uf = static_cast<float>(u),
                  vf = static_cast<float>(v);
      for (int64_t n = 0; n < N; ++n) {
        const int64_t o = n * CHW + c * HW;
        const T* xp = x + o;
        const T* gp = dy + o;
        const T* yp = kRelu ? relu_y + o : nullptr;
        T* dp = dx + o;
        // One loop, instantiated with and without the store of g into dr.
        auto run = [&](auto with_dr) {
          T* rp = with_dr ? dr + o : nullptr;
#pragma omp simd
          for (int64_t i = 0; i < HW; ++i) {
            float g = load(gp[i]);
            if constexpr (kRelu) g = Relu::backward(load(yp[i]), g);
            if constexpr (decltype(with_dr)::value) rp[i] = store<T>(g);
            dp[i] = store<T>(kf * g + uf * (load(xp[i]) - mean) + vf);
          }
        };
        if (dr != nullptr)
          run(std::true_type{});
        else
          run(std::false_type{});
      }
    }
  }
}

}  // namespace

template <class T>
void batch_norm_backward_train(int64_t N, int64_t C, int64_t HW, const T* x, const float* gamma,
                               const float* save_mean, const float* save_invstd, const T* dy,
                               T* dx, float* dgamma, float* dbeta, const T* relu_y, T* dr) {
  if (relu_y)
    backward_train<true>(N, C, HW, x, gamma, save_mean, save_invstd, dy, dx, dgamma, dbeta,
                         relu_y, dr);
  else
    backward_train<false>(N, C, HW, x, gamma, save_mean, save_invstd, dy, dx, dgamma, dbeta,
                          relu_y, dr);
}

#define ANVIL_BATCH_NORM(T)                                                                   \
  template void batch_norm_forward_train<T>(int64_t, int64_t, int64_t, const T*, const float*, \
                                            const float*, float, float, float*, float*, float*, \
                                            float*, T*, bool, const T*);                       \
  template void batch_norm_forward_eval<T>(int64_t, int64_t, int64_t, const T*, const float*,  \
                                           const float*, const float*, const float*, float, T*,  \
                                           bool);                                                \
  template void batch_norm_backward_train<T>(int64_t, int64_t, int64_t, const T*, const float*, \
                                             const float*, const float*, const T*, T*, float*,   \
                                             float*, const T*, T*);
ANVIL_BATCH_NORM(float)
ANVIL_BATCH_NORM(bfloat16)
#undef ANVIL_BATCH_NORM

// ---- CpuBackend (cpu_backend.h) ----

void CpuBackend::batch_norm_forward_train(const Tensor& x, const Tensor& gamma,
                                          const Tensor& beta, float eps, float momentum,
                                          const Tensor& running_mean, const Tensor& running_var,
                                          const Tensor& save_mean, const Tensor& save_invstd,
                                          const Tensor& y, bool relu, const Tensor& residual) {
  auto [N, C, HW] = nchw_view(x);
  visit_float_dtype(x.dtype(), "batch_norm_forward_train", [&](auto t) {
    using T = decltype(t);
    cpu::batch_norm_forward_train(N, C, HW, x.data<T>(), floats(gamma), floats(beta), eps,
                                  momentum, floats(running_mean), floats(running_var),
                                  floats(save_mean), floats(save_invstd), y.data<T>(), relu,
                                  residual.defined() ? residual.data<T>() : nullptr);
  });
}
void CpuBackend::batch_norm_forward_eval(const Tensor& x, const Tensor& gamma,
                                         const Tensor& beta, const Tensor& running_mean,
                                         const Tensor& running_var, float eps, const Tensor& y,
                                         bool relu) {
  auto [N, C, HW] = nchw_view(x);
  visit_float_dtype(x.dtype(), "batch_norm_forward_eval", [&](auto t) {
    using T = decltype(t);
    cpu::batch_norm_forward_eval(N, C, HW, x.data<T>(), floats(gamma), floats(beta),
                                 floats(running_mean), floats(running_var), eps, y.data<T>(), relu);
  });
}
void CpuBackend::batch_norm_backward_train(const Tensor& x, const Tensor& gamma,
                                           const Tensor& save_mean, const Tensor& save_invstd,
                                           const Tensor& dy, const Tensor& relu_y,
                                           const Tensor& dx, const Tensor& dgamma,
                                           const Tensor& dbeta, const Tensor& dresidual) {
  auto [N, C, HW] = nchw_view(x);
  visit_float_dtype(x.dtype(), "batch_norm_backward_train", [&](auto t) {
    using T = decltype(t);
    cpu::batch_norm_backward_train(N, C, HW, x.data<T>(), floats(gamma), floats(save_mean),
                                   floats(save_invstd), dy.data<T>(), dx.data<T>(),
                                   floats(dgamma), floats(dbeta),
                                   relu_y.defined() ? relu_y.data<T>() : nullptr,
                                   dresidual.defined() ? dresidual.data<T>() : nullptr);
  });
}

}  // namespace anvil::cpu
