// The CUDA backend's elementwise methods (cuda_backend.h): fills,
// conversions and the pointwise ops; the kernels are elementwise.cu's.
#include <stdexcept>

#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/element.h"

namespace anvil::cuda {

void CudaBackend::fill(const Tensor& dst, double value) {
  activate();
  switch (dst.dtype()) {
    case DType::Float32: cuda::fill(dst.numel(), float(value), floats(dst), stream_); break;
    case DType::Int64:
      cuda::fill(dst.numel(), int64_t(value), static_cast<int64_t*>(dst.raw_data()), stream_);
      break;
    case DType::UInt8:
      cuda::fill(dst.numel(), uint8_t(value), static_cast<uint8_t*>(dst.raw_data()), stream_);
      break;
    case DType::BFloat16:
      cuda::fill(dst.numel(), bfloat16(float(value)), dst.data<bfloat16>(), stream_);
      break;
  }
}

// float32 <-> bfloat16 runs on the device; the other pairs (integer dtypes,
// off the training path) convert on the host.
void CudaBackend::convert(const Tensor& src, const Tensor& dst) {
  if (src.device() != dst.device())
    throw std::logic_error("cuda backend asked to convert across devices");
  activate();
  if (src.dtype() == DType::Float32 && dst.dtype() == DType::BFloat16)
    return cuda::float_to_bf16(src.numel(), floats(src), dst.data<bfloat16>(), stream_);
  if (src.dtype() == DType::BFloat16 && dst.dtype() == DType::Float32)
    return cuda::bf16_to_float(src.numel(), src.data<bfloat16>(), floats(dst), stream_);
  Tensor host_dst = Tensor::empty(dst.shape(), dst.dtype(), Device::cpu());
  backend_for(Device::cpu()).convert(src.to(Device::cpu()), host_dst);
  copy(host_dst, dst);
}

void CudaBackend::add_scalar_int64(const Tensor& dst, int64_t value) {
  activate();
  cuda::add_scalar(dst.numel(), value, dst.data<int64_t>(), stream_);
}

// These take float32 or bfloat16 tensors, all of one dtype.
void CudaBackend::pointwise_forward(PointwiseOp op, const Tensor& x, const Tensor& y) {
  activate();
  visit_float_dtype(x.dtype(), "pointwise_forward", [&](auto t) {
    using T = decltype(t);
    cuda::pointwise_forward(op, x.numel(), x.data<T>(), y.data<T>(), stream_);
  });
}
void CudaBackend::pointwise_backward(PointwiseOp op, const Tensor& saved, const Tensor& dy,
                                     const Tensor& dx) {
  activate();
  visit_float_dtype(saved.dtype(), "pointwise_backward", [&](auto t) {
    using T = decltype(t);
    cuda::pointwise_backward(op, saved.numel(), saved.data<T>(), dy.data<T>(), dx.data<T>(),
                             stream_);
  });
}
void CudaBackend::add(const Tensor& a, const Tensor& b, const Tensor& y) {
  activate();
  visit_float_dtype(a.dtype(), "add", [&](auto t) {
    using T = decltype(t);
    cuda::add(a.numel(), a.data<T>(), b.data<T>(), y.data<T>(), stream_);
  });
}
void CudaBackend::mul(const Tensor& a, const Tensor& b, const Tensor& y) {
  activate();
  visit_float_dtype(a.dtype(), "mul", [&](auto t) {
    using T = decltype(t);
    cuda::mul(a.numel(), a.data<T>(), b.data<T>(), y.data<T>(), stream_);
  });
}
void CudaBackend::axpy(float alpha, const Tensor& x, const Tensor& y) {
  activate();
  cuda::axpy(x.numel(), alpha, floats(x), floats(y), stream_);
}
void CudaBackend::scale(float alpha, const Tensor& x, const Tensor& y) {
  activate();
  visit_float_dtype(x.dtype(), "scale", [&](auto t) {
    using T = decltype(t);
    cuda::scale(x.numel(), alpha, x.data<T>(), y.data<T>(), stream_);
  });
}
void CudaBackend::add_channel_bias(int64_t outer, int64_t C, int64_t inner, const Tensor& x,
                                   const Tensor& bias, const Tensor& y) {
  activate();
  cuda::add_channel_bias(outer, C, inner, floats(x), floats(bias), floats(y), stream_);
}
void CudaBackend::broadcast_scalar(const Tensor& scalar, float alpha, const Tensor& y) {
  activate();
  cuda::broadcast_scalar(y.numel(), alpha, floats(scalar), floats(y), stream_);
}

}  // namespace anvil::cuda
