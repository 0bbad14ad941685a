// The CUDA backend's optimizer step (cuda_backend.h); the kernel is sgd.cu's.
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_kernels.h"

namespace anvil::cuda {

void CudaBackend::sgd_update(const Tensor& param, const Tensor& grad, const Tensor& momentum_buf,
                             const Tensor& param_copy, float lr, float momentum,
                             float weight_decay, bool nesterov, bool first_step) {
  activate();
  cuda::sgd_update(param.numel(), floats(param), floats(grad), floats(momentum_buf), lr,
                   momentum, weight_decay, nesterov, first_step, stream_,
                   param_copy.defined() ? param_copy.data<bfloat16>() : nullptr);
}

}  // namespace anvil::cuda
