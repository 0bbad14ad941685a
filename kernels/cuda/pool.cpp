// The CUDA backend's pooling methods (cuda_backend.h); the kernels are pool.cu's.
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/element.h"

namespace anvil::cuda {

// x, y, dy, dx: float32 or bfloat16; average pooling's also bfloat16 x with
// float32 y, float32 dy with bfloat16 dx (global average pooling).
void CudaBackend::max_pool2d_forward(const Pool2dShape& s, const Tensor& x, const Tensor& y,
                                     const Tensor& argmax) {
  activate();
  visit_float_dtype(x.dtype(), "max_pool2d_forward", [&](auto t) {
    using T = decltype(t);
    cuda::max_pool2d_forward(s, x.data<T>(), y.data<T>(),
                             static_cast<int64_t*>(argmax.raw_data()), stream_);
  });
}
void CudaBackend::max_pool2d_backward(const Pool2dShape& s, const Tensor& dy,
                                      const Tensor& argmax, const Tensor& dx) {
  activate();
  visit_float_dtype(dy.dtype(), "max_pool2d_backward", [&](auto t) {
    using T = decltype(t);
    cuda::max_pool2d_backward(s, dy.data<T>(), int64s(argmax), dx.data<T>(), stream_);
  });
}
void CudaBackend::avg_pool2d_forward(const Pool2dShape& s, const Tensor& x, const Tensor& y) {
  activate();
  if (x.dtype() == DType::BFloat16 && y.dtype() == DType::Float32)  // global average pooling
    return cuda::avg_pool2d_forward(s, x.data<bfloat16>(), floats(y), stream_);
  visit_float_dtype(x.dtype(), "avg_pool2d_forward", [&](auto t) {
    using T = decltype(t);
    cuda::avg_pool2d_forward(s, x.data<T>(), y.data<T>(), stream_);
  });
}
void CudaBackend::avg_pool2d_backward(const Pool2dShape& s, const Tensor& dy, const Tensor& dx) {
  activate();
  if (dy.dtype() == DType::Float32 && dx.dtype() == DType::BFloat16)  // global average pooling
    return cuda::avg_pool2d_backward(s, floats(dy), dx.data<bfloat16>(), stream_);
  visit_float_dtype(dy.dtype(), "avg_pool2d_backward", [&](auto t) {
    using T = decltype(t);
    cuda::avg_pool2d_backward(s, dy.data<T>(), dx.data<T>(), stream_);
  });
}

}  // namespace anvil::cuda
