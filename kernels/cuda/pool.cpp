// The CUDA backend's pooling methods (cuda_backend.h); the kernels are pool.cu's.
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_kernels.h"

namespace anvil::cuda {

void CudaBackend::max_pool2d_forward(const Pool2dShape& s, const Tensor& x, const Tensor& y,
                                     const Tensor& argmax) {
  activate();
  cuda::max_pool2d_forward(s, floats(x), floats(y), static_cast<int64_t*>(argmax.raw_data()),
                           stream_);
}
void CudaBackend::max_pool2d_backward(const Pool2dShape& s, const Tensor& dy,
                                      const Tensor& argmax, const Tensor& dx) {
  activate();
  cuda::max_pool2d_backward(s, floats(dy), int64s(argmax), floats(dx), stream_);
}
void CudaBackend::avg_pool2d_forward(const Pool2dShape& s, const Tensor& x, const Tensor& y) {
  activate();
  cuda::avg_pool2d_forward(s, floats(x), floats(y), stream_);
}
void CudaBackend::avg_pool2d_backward(const Pool2dShape& s, const Tensor& dy, const Tensor& dx) {
  activate();
  cuda::avg_pool2d_backward(s, floats(dy), floats(dx), stream_);
}

}  // namespace anvil::cuda
