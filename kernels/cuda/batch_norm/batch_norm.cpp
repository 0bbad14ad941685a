// The BatchNorm training entry points: checks, then the rung's launcher
// (batch_norm.h lists the rungs).
#include <cstdint>
#include <stdexcept>
#include <string>

#include "kernels/cuda/batch_norm/batch_norm.h"
#include "kernels/cuda/cuda_backend.h"

namespace anvil::cuda {
namespace {

const batch_norm_rungs::Rung& checked_rung(int variant, const char* who) {
  if (variant < 1 || variant > kBatchNormVariants)
    throw std::invalid_argument(std::string("cuda::") + who + ": no variant " +
                                std::to_string(variant) + " (there are 1 to " +
                                std::to_string(kBatchNormVariants) + ")");
  return *batch_norm_rungs::kRungs[variant - 1];
}

void require_workspace(const batch_norm_rungs::Rung& rung, int64_t N, int64_t C, int64_t HW,
                       const float* workspace, int variant, const char* who) {
  if (workspace == nullptr && rung.workspace(N, C, HW) > 0)
    throw std::invalid_argument(std::string("cuda::") + who + ": variant " +
                                std::to_string(variant) +
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

size_t batch_norm_workspace_floats(int variant, int64_t N, int64_t C, int64_t HW) {
  const batch_norm_rungs::Rung& rung = checked_rung(variant, "batch_norm_workspace_floats");
  batch_norm_rungs::check_sizes(N, C, HW, "batch_norm_workspace_floats");
  return rung.workspace(N, C, HW);
}

void batch_norm_forward_train(int variant, int64_t N, int64_t C, int64_t HW, const float* x,
                              const float* gamma, const float* beta, float eps, float momentum,
                              float* running_mean, float* running_var, float* save_mean,
                              float* save_invstd, float* y, float* workspace,
                              cudaStream_t stream) {
  const batch_norm_rungs::Rung& rung = checked_rung(variant, "batch_norm_forward_train");
  batch_norm_rungs::check_sizes(N, C, HW, "batch_norm_forward_train");
  if (C == 0) return;
  require_workspace(rung, N, C, HW, workspace, variant, "batch_norm_forward_train");
  rung.forward({N, C, HW, x, gamma, beta, eps, momentum, running_mean, running_var, save_mean,
                save_invstd, y, workspace},
               stream);
}

void batch_norm_backward_train(int variant, int64_t N, int64_t C, int64_t HW, const float* x,
                               const float* gamma, const float* save_mean,
                               const float* save_invstd, const float* dy, float* dx,
                               float* dgamma, float* dbeta, float* workspace,
                               cudaStream_t stream) {
  const batch_norm_rungs::Rung& rung = checked_rung(variant, "batch_norm_backward_train");
  batch_norm_rungs::check_sizes(N, C, HW, "batch_norm_backward_train");
  if (C == 0) return;
  require_workspace(rung, N, C, HW, workspace, variant, "batch_norm_backward_train");
  rung.backward({N, C, HW, x, gamma, save_mean, save_invstd, dy, dx, dgamma, dbeta, workspace},
                stream);
}

// ---- CudaBackend (cuda_backend.h) ----

void CudaBackend::batch_norm_forward_train(const Tensor& x, const Tensor& gamma,
                                           const Tensor& beta, float eps, float momentum,
                                           const Tensor& running_mean, const Tensor& running_var,
                                           const Tensor& save_mean, const Tensor& save_invstd,
                                           const Tensor& y) {
  activate();
  auto [N, C, HW] = nchw_view(x);
  Tensor ws = workspace(batch_norm_workspace_floats(kBestBatchNorm, N, C, HW));
  cuda::batch_norm_forward_train(kBestBatchNorm, N, C, HW, floats(x), floats(gamma),
                                 floats(beta), eps, momentum, floats(running_mean),
                                 floats(running_var), floats(save_mean), floats(save_invstd),
                                 floats(y), floats(ws), stream_);
}
void CudaBackend::batch_norm_forward_eval(const Tensor& x, const Tensor& gamma,
                                          const Tensor& beta, const Tensor& running_mean,
                                          const Tensor& running_var, float eps,
                                          const Tensor& y) {
  activate();
  auto [N, C, HW] = nchw_view(x);
  cuda::batch_norm_forward_eval(N, C, HW, floats(x), floats(gamma), floats(beta),
                                floats(running_mean), floats(running_var), eps, floats(y),
                                stream_);
}
void CudaBackend::batch_norm_backward_train(const Tensor& x, const Tensor& gamma,
                                            const Tensor& save_mean, const Tensor& save_invstd,
                                            const Tensor& dy, const Tensor& dx,
                                            const Tensor& dgamma, const Tensor& dbeta) {
  activate();
  auto [N, C, HW] = nchw_view(x);
  Tensor ws = workspace(batch_norm_workspace_floats(kBestBatchNorm, N, C, HW));
  cuda::batch_norm_backward_train(kBestBatchNorm, N, C, HW, floats(x), floats(gamma),
                                  floats(save_mean), floats(save_invstd), floats(dy), floats(dx),
                                  floats(dgamma), floats(dbeta), floats(ws), stream_);
}

}  // namespace anvil::cuda
