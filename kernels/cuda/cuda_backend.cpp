// The CUDA Backend: unpacks tensors into device pointers and launches the
// kernels of kernels/cuda/cuda_kernels.h on the device's compute stream.
// Shapes were checked by the op layer; this layer picks variants, finds
// scratch memory and moves data between host and device.
//
// Kernels run asynchronously. Everything that hands a value to the host
// (copies to the CPU, sum, label_range) waits for the stream first.
#include <stdexcept>

#include "core/precision.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_kernels.h"

namespace anvil::cuda {
namespace {

float* f(const Tensor& t) { return t.defined() ? static_cast<float*>(t.raw_data()) : nullptr; }
const int64_t* i64(const Tensor& t) { return static_cast<const int64_t*>(t.raw_data()); }

// The rung an op runs, by core/precision.h: the tensor-core rungs where the
// family computes in TF32 (PyTorch's default for convolutions), else the
// FP32 ones.
int gemm_rung() {
  return fp32_math(OpFamily::kMatmul, DeviceType::CUDA) == Fp32Math::kTf32 ? kTf32Gemm
                                                                          : kBestGemm;
}
int conv_rung() {
  return fp32_math(OpFamily::kConv, DeviceType::CUDA) == Fp32Math::kTf32 ? kTf32Conv
                                                                        : kBestConv;
}

class CudaBackend final : public Backend {
 public:
  CudaBackend(int device, cudaStream_t stream) : device_(device), stream_(stream) {}

  void copy(const Tensor& src, const Tensor& dst) override {
    const size_t bytes = src.nbytes();
    if (bytes == 0) return;
    if (src.device().is_cuda() && src.device().index != device_)
      synchronize(src.device());  // the source's producer runs on its own device's stream
    activate();
    cudaMemcpyKind kind = src.device().is_cpu()   ? cudaMemcpyHostToDevice
                          : dst.device().is_cpu() ? cudaMemcpyDeviceToHost
                                                  : cudaMemcpyDeviceToDevice;
    // Peer copies between devices go through unified addressing (cudaMemcpyDefault).
    if (kind == cudaMemcpyDeviceToDevice && src.device() != dst.device()) kind = cudaMemcpyDefault;
    check(cudaMemcpyAsync(dst.raw_data(), src.raw_data(), bytes, kind, stream_),
          "cudaMemcpyAsync");
    // A host destination must hold the data on return; a pageable host
    // source has been staged by the time cudaMemcpyAsync returns, but a
    // pinned one is read only when the copy runs: the caller may change it
    // as soon as this returns.
    if (dst.device().is_cpu() || kind == cudaMemcpyDefault || src.is_pinned()) wait();
  }

  void fill(const Tensor& dst, double value) override {
    activate();
    switch (dst.dtype()) {
      case DType::Float32: cuda::fill(dst.numel(), float(value), f(dst), stream_); break;
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

  // float32 <-> bfloat16 runs on the device; the other pairs (integer
  // dtypes, off the training path) convert on the host.
  void convert(const Tensor& src, const Tensor& dst) override {
    if (src.device() != dst.device())
      throw std::logic_error("cuda backend asked to convert across devices");
    activate();
    if (src.dtype() == DType::Float32 && dst.dtype() == DType::BFloat16)
      return cuda::float_to_bf16(src.numel(), f(src), dst.data<bfloat16>(), stream_);
    if (src.dtype() == DType::BFloat16 && dst.dtype() == DType::Float32)
      return cuda::bf16_to_float(src.numel(), src.data<bfloat16>(), f(dst), stream_);
    Tensor host_dst = Tensor::empty(dst.shape(), dst.dtype(), Device::cpu());
    backend_for(Device::cpu()).convert(src.to(Device::cpu()), host_dst);
    copy(host_dst, dst);
  }

  void add_scalar_int64(const Tensor& dst, int64_t value) override {
    activate();
    cuda::add_scalar(dst.numel(), value, dst.data<int64_t>(), stream_);
  }

  void gemm(bool ta, bool tb, float alpha, const Tensor& a, const Tensor& b, float beta,
            const Tensor& y) override {
    activate();
    int64_t M = y.size(0), N = y.size(1);
    int64_t K = ta ? a.size(0) : a.size(1);
    const int rung = gemm_rung();
    Tensor ws = workspace(gemm_workspace_floats(rung, M, N, K));
    cuda::gemm(rung, ta, tb, M, N, K, alpha, f(a), a.size(1), f(b), b.size(1), beta, f(y), N,
               f(ws), stream_);
  }

  void conv2d_forward(const Conv2dShape& s, const Tensor& x, const Tensor& w, const Tensor& bias,
                      const Tensor& y) override {
    activate();
    const int rung = conv_rung();
    Tensor ws = workspace(conv2d_workspace_floats(rung, s));
    cuda::conv2d_forward(rung, s, f(x), f(w), f(bias), f(y), f(ws), stream_);
  }
  void conv2d_backward_data(const Conv2dShape& s, const Tensor& dy, const Tensor& w,
                            const Tensor& dx) override {
    activate();
    const int rung = conv_rung();
    Tensor ws = workspace(conv2d_workspace_floats(rung, s));
    cuda::conv2d_backward_data(rung, s, f(dy), f(w), f(dx), f(ws), stream_);
  }
  void conv2d_backward_weight(const Conv2dShape& s, const Tensor& x, const Tensor& dy,
                              const Tensor& dw, const Tensor& dbias) override {
    activate();
    const int rung = conv_rung();
    Tensor ws = workspace(conv2d_workspace_floats(rung, s));
    cuda::conv2d_backward_weight(rung, s, f(x), f(dy), f(dw), f(dbias), f(ws), stream_);
  }

  void max_pool2d_forward(const Pool2dShape& s, const Tensor& x, const Tensor& y,
                          const Tensor& argmax) override {
    activate();
    cuda::max_pool2d_forward(s, f(x), f(y), static_cast<int64_t*>(argmax.raw_data()), stream_);
  }
  void max_pool2d_backward(const Pool2dShape& s, const Tensor& dy, const Tensor& argmax,
                           const Tensor& dx) override {
    activate();
    cuda::max_pool2d_backward(s, f(dy), i64(argmax), f(dx), stream_);
  }
  void avg_pool2d_forward(const Pool2dShape& s, const Tensor& x, const Tensor& y) override {
    activate();
    cuda::avg_pool2d_forward(s, f(x), f(y), stream_);
  }
  void avg_pool2d_backward(const Pool2dShape& s, const Tensor& dy, const Tensor& dx) override {
    activate();
    cuda::avg_pool2d_backward(s, f(dy), f(dx), stream_);
  }

  void relu_forward(const Tensor& x, const Tensor& y) override {
    activate();
    cuda::relu_forward(x.numel(), f(x), f(y), stream_);
  }
  void relu_backward(const Tensor& y, const Tensor& dy, const Tensor& dx) override {
    activate();
    cuda::relu_backward(y.numel(), f(y), f(dy), f(dx), stream_);
  }
  void add(const Tensor& a, const Tensor& b, const Tensor& y) override {
    activate();
    cuda::add(a.numel(), f(a), f(b), f(y), stream_);
  }
  void mul(const Tensor& a, const Tensor& b, const Tensor& y) override {
    activate();
    cuda::mul(a.numel(), f(a), f(b), f(y), stream_);
  }
  void axpy(float alpha, const Tensor& x, const Tensor& y) override {
    activate();
    cuda::axpy(x.numel(), alpha, f(x), f(y), stream_);
  }
  void scale(float alpha, const Tensor& x, const Tensor& y) override {
    activate();
    cuda::scale(x.numel(), alpha, f(x), f(y), stream_);
  }
  void add_channel_bias(int64_t outer, int64_t C, int64_t inner, const Tensor& x,
                        const Tensor& bias, const Tensor& y) override {
    activate();
    cuda::add_channel_bias(outer, C, inner, f(x), f(bias), f(y), stream_);
  }
  void channel_sum(int64_t outer, int64_t C, int64_t inner, const Tensor& dy,
                   const Tensor& db) override {
    activate();
    Tensor ws = workspace(channel_sum_workspace_floats(kBestChannelSum, outer, C, inner));
    cuda::channel_sum(kBestChannelSum, outer, C, inner, f(dy), f(db), f(ws), stream_);
  }
  void sum(const Tensor& x, double scale, const Tensor& out) override {
    activate();
    Tensor ws = workspace(sum_workspace_floats(kBestSum, x.numel()));
    cuda::sum(kBestSum, x.numel(), f(x), f(out), f(ws), stream_);
    if (scale != 1.0) cuda::scale(1, static_cast<float>(scale), f(out), f(out), stream_);
  }
  void broadcast_scalar(const Tensor& scalar, float alpha, const Tensor& y) override {
    activate();
    cuda::broadcast_scalar(y.numel(), alpha, f(scalar), f(y), stream_);
  }

  void softmax_cross_entropy_forward(const Tensor& logits, const Tensor& labels,
                                     float label_smoothing, const Tensor& loss,
                                     const Tensor& probs) override {
    activate();
    cuda::softmax_cross_entropy_forward(kBestSoftmax, logits.size(0), logits.size(1), f(logits),
                                        i64(labels), label_smoothing, f(loss), f(probs), stream_);
  }
  void softmax_cross_entropy_backward(const Tensor& probs, const Tensor& labels,
                                      float label_smoothing, const Tensor& dloss,
                                      const Tensor& dlogits) override {
    activate();
    cuda::softmax_cross_entropy_backward(probs.size(0), probs.size(1), f(probs), i64(labels),
                                         label_smoothing, f(dloss), f(dlogits), stream_);
  }
  void count_correct(const Tensor& logits, const Tensor& labels,
                     const Tensor& counter) override {
    activate();
    cuda::count_correct(logits.size(0), logits.size(1), f(logits), i64(labels),
                        static_cast<int64_t*>(counter.raw_data()), stream_);
  }
  std::pair<int64_t, int64_t> label_range(const Tensor& labels) override {
    activate();
    Tensor out = Tensor::empty({2}, DType::Int64, labels.device());
    cuda::label_min_max(labels.numel(), i64(labels), static_cast<int64_t*>(out.raw_data()),
                        stream_);
    int64_t host[2] = {0, 0};
    check(cudaMemcpyAsync(host, out.raw_data(), sizeof host, cudaMemcpyDeviceToHost, stream_),
          "cudaMemcpyAsync");
    wait();
    return {host[0], host[1]};
  }

  void batch_norm_forward_train(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                float eps, float momentum, const Tensor& running_mean,
                                const Tensor& running_var, const Tensor& save_mean,
                                const Tensor& save_invstd, const Tensor& y) override {
    activate();
    auto [N, C, HW] = nchw_view(x);
    Tensor ws = workspace(batch_norm_workspace_floats(kBestBatchNorm, N, C, HW));
    cuda::batch_norm_forward_train(kBestBatchNorm, N, C, HW, f(x), f(gamma), f(beta), eps,
                                   momentum, f(running_mean), f(running_var), f(save_mean),
                                   f(save_invstd), f(y), f(ws), stream_);
  }
  void batch_norm_forward_eval(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                               const Tensor& running_mean, const Tensor& running_var, float eps,
                               const Tensor& y) override {
    activate();
    auto [N, C, HW] = nchw_view(x);
    cuda::batch_norm_forward_eval(N, C, HW, f(x), f(gamma), f(beta), f(running_mean),
                                  f(running_var), eps, f(y), stream_);
  }
  void batch_norm_backward_train(const Tensor& x, const Tensor& gamma, const Tensor& save_mean,
                                 const Tensor& save_invstd, const Tensor& dy, const Tensor& dx,
                                 const Tensor& dgamma, const Tensor& dbeta) override {
    activate();
    auto [N, C, HW] = nchw_view(x);
    Tensor ws = workspace(batch_norm_workspace_floats(kBestBatchNorm, N, C, HW));
    cuda::batch_norm_backward_train(kBestBatchNorm, N, C, HW, f(x), f(gamma), f(save_mean),
                                    f(save_invstd), f(dy), f(dx), f(dgamma), f(dbeta), f(ws),
                                    stream_);
  }

  void sgd_update(const Tensor& param, const Tensor& grad, const Tensor& momentum_buf, float lr,
                  float momentum, float weight_decay, bool nesterov, bool first_step) override {
    activate();
    cuda::sgd_update(param.numel(), f(param), f(grad), f(momentum_buf), lr, momentum,
                     weight_decay, nesterov, first_step, stream_);
  }

 private:

  // Kernels launch on the current device: make it this backend's.
  void activate() { check(cudaSetDevice(device_), "cudaSetDevice"); }
  void wait() { check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize"); }

  // Scratch for one kernel, from the caching allocator. Freed when the
  // caller returns, which is safe: later work on the same stream runs after
  // the kernel that used it.
  Tensor workspace(size_t floats) const {
    if (floats == 0) return Tensor();
    return Tensor::empty({int64_t(floats)}, DType::Float32, Device::cuda(device_));
  }

  const int device_;
  const cudaStream_t stream_;
};

}  // namespace

std::unique_ptr<Backend> make_backend(int device, cudaStream_t stream) {
  return std::make_unique<CudaBackend>(device, stream);
}

}  // namespace anvil::cuda
