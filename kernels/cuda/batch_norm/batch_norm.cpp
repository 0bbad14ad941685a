// The BatchNorm training entry points: checks, then the rung's launcher
// (batch_norm.h lists the rungs).
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "kernels/cuda/batch_norm/batch_norm.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/element.h"

namespace anvil::cuda {
namespace {

const batch_norm_rungs::Rung& checked_rung(int number, const char* who) {
  if (number < 1 || number > kBatchNormRungs)
    throw std::invalid_argument(std::string("cuda::") + who + ": no rung " +
                                std::to_string(number) + " (there are 1 to " +
                                std::to_string(kBatchNormRungs) + ")");
  return *batch_norm_rungs::kRungs[number - 1];
}

void require_workspace(const batch_norm_rungs::Rung& rung, int64_t N, int64_t C, int64_t HW,
                       const float* workspace, int number, const char* who) {
  if (workspace == nullptr && rung.workspace(N, C, HW) > 0)
    throw std::invalid_argument(std::string("cuda::") + who + ": rung " +
                                std::to_string(number) +
                                " needs batch_norm_workspace_floats of workspace");
}

}  // namespace

void batch_norm_rungs::check_sizes(int64_t N, int64_t C, int64_t HW, const char* who) {
  if (N < 0 || C < 0 || HW < 0)
    throw std::invalid_argument(std::string("cuda::") + who + ": negative size " +
                                std::to_string(N) + "x" + std::to_string(C) + "x" +
                                std::to_string(HW));
  if (C > INT32_MAX)
    throw std::invalid_argument(std::string("cuda::") + who + ": more than 2^31-1 channels");
}

size_t batch_norm_workspace_floats(int number, int64_t N, int64_t C, int64_t HW) {
  const batch_norm_rungs::Rung& rung = checked_rung(number, "batch_norm_workspace_floats");
  batch_norm_rungs::check_sizes(N, C, HW, "batch_norm_workspace_floats");
  return rung.workspace(N, C, HW);
}

// The rung's launcher for T; a rung without bfloat16 kernels is refused.
template <class T, class F>
F launcher_or_throw(F f, int number, const char* who) {
  if (f == nullptr)
    throw std::invalid_argument(std::string("cuda::") + who + ": rung " +
                                std::to_string(number) + " has no bfloat16 kernels");
  return f;
}

template <class T>
void batch_norm_forward_train(int number, int64_t N, int64_t C, int64_t HW, const T* x,
                              const float* gamma, const float* beta, float eps, float momentum,
                              float* running_mean, float* running_var, float* save_mean,
                              float* save_invstd, T* y, float* workspace, cudaStream_t stream,
                              bool relu, const T* residual) {
  const char* who = "batch_norm_forward_train";
  const batch_norm_rungs::Rung& rung = checked_rung(number, who);
  batch_norm_rungs::check_sizes(N, C, HW, who);
  if (C == 0) return;
  require_workspace(rung, N, C, HW, workspace, number, who);
  const batch_norm_rungs::ForwardOf<T> f{N,           C,           HW,        x,
                                          gamma,       beta,        eps,       momentum,
                                          running_mean, running_var, save_mean, save_invstd,
                                          y,           workspace,   relu,     residual};
  if constexpr (std::is_same_v<T, bfloat16>)
    launcher_or_throw<T>(rung.forward_bf16, number, who)(f, stream);
  else
    rung.forward(f, stream);
}

template <class T>
void batch_norm_backward_train(int number, int64_t N, int64_t C, int64_t HW, const T* x,
                               const float* gamma, const float* save_mean,
                               const float* save_invstd, const T* dy, T* dx, float* dgamma,
                               float* dbeta, float* workspace, cudaStream_t stream,
                               const T* relu_y, T* dresidual) {
  const char* who = "batch_norm_backward_train";
  const batch_norm_rungs::Rung& rung = checked_rung(number, who);
  batch_norm_rungs::check_sizes(N, C, HW, who);
  if (C == 0) return;
  require_workspace(rung, N, C, HW, workspace, number, who);
  const batch_norm_rungs::BackwardOf<T> b{N,  C,  HW,     x,      gamma,  save_mean, save_invstd,
                                           dy, dx, dgamma, dbeta, workspace, relu_y, dresidual};
  if constexpr (std::is_same_v<T, bfloat16>)
    launcher_or_throw<T>(rung.backward_bf16, number, who)(b, stream);
  else
    rung.backward(b, stream);
}

#define ANVIL_BATCH_NORM(T)                                                                    \
  template void batch_norm_forward_train<T>(int, int64_t, int64_t, int64_t, const T*,          \
                                            const float*, const float*, float, float, float*,   \
                                            float*, float*, float*, T*, float*, cudaStream_t,   \
                                            bool, const T*);                                    \
  template void batch_norm_backward_train<T>(int, int64_t, int64_t, int64_t, const T*,         \
                                             const float*, const float*, const float*, const T*, \
                                             T*, float*, float*, float*, cudaStream_t,          \
                                             const T*, T*);
ANVIL_BATCH_NORM(float)
ANVIL_BATCH_NORM(bfloat16)
#undef ANVIL_BATCH_NORM

// ---- CudaBackend (cuda_backend.h) ----

// x, y, dy, dx: float32 or bfloat16 (the rest float32).
void CudaBackend::batch_norm_forward_train(const Tensor& x, const Tensor& gamma,
                                           const Tensor& beta, float eps, float momentum,
                                           const Tensor& running_mean, const Tensor& running_var,
                                           const Tensor& save_mean, const Tensor& save_invstd,
                                           const Tensor& y, bool relu,
                                           const Tensor& residual) {
  activate();
  auto [N, C, HW] = nchw_view(x);
  Tensor ws = workspace(batch_norm_workspace_floats(kBestBatchNorm, N, C, HW));
  visit_float_dtype(x.dtype(), "batch_norm_forward_train", [&](auto t) {
    using T = decltype(t);
    cuda::batch_norm_forward_train(kBestBatchNorm, N, C, HW, x.data<T>(), floats(gamma),
                                   floats(beta), eps, momentum, floats(running_mean),
                                   floats(running_var), floats(save_mean), floats(save_invstd),
                                   y.data<T>(), floats(ws), stream_, relu,
                                   residual.defined() ? residual.data<T>() : nullptr);
  });
}
void CudaBackend::batch_norm_forward_eval(const Tensor& x, const Tensor& gamma,
                                          const Tensor& beta, const Tensor& running_mean,
                                          const Tensor& running_var, float eps,
                                          const Tensor& y, bool relu) {
  activate();
  auto [N, C, HW] = nchw_view(x);
  visit_float_dtype(x.dtype(), "batch_norm_forward_eval", [&](auto t) {
    using T = decltype(t);
    cuda::batch_norm_forward_eval(N, C, HW, x.data<T>(), floats(gamma), floats(beta),
                                  floats(running_mean), floats(running_var), eps, y.data<T>(),
                                  stream_, relu);
  });
}
void CudaBackend::batch_norm_backward_train(const Tensor& x, const Tensor& gamma,
                                            const Tensor& save_mean, const Tensor& save_invstd,
                                            const Tensor& dy, const Tensor& relu_y,
                                            const Tensor& dx, const Tensor& dgamma,
                                            const Tensor& dbeta, const Tensor& dresidual) {
  activate();
  auto [N, C, HW] = nchw_view(x);
  Tensor ws = workspace(batch_norm_workspace_floats(kBestBatchNorm, N, C, HW));
  visit_float_dtype(x.dtype(), "batch_norm_backward_train", [&](auto t) {
    using T = decltype(t);
    cuda::batch_norm_backward_train(kBestBatchNorm, N, C, HW, x.data<T>(), floats(gamma),
                                    floats(save_mean), floats(save_invstd), dy.data<T>(),
                                    dx.data<T>(), floats(dgamma), floats(dbeta), floats(ws),
                                    stream_, relu_y.defined() ? relu_y.data<T>() : nullptr,
                                    dresidual.defined() ? dresidual.data<T>() : nullptr);
  });
}

}  // namespace anvil::cuda
