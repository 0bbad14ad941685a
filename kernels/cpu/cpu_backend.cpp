// The CPU Backend: unpacks tensors into raw pointers and calls the kernels
// of kernels/cpu/cpu_kernels.h. Shapes were checked by the op layer.
//
// Convolutions and matrix products follow core/precision.h: FP32 with the
// fastest algorithm by default; kIeee rules Winograd out; kTf32 emulates a
// tensor core: the operands are rounded to TF32 (grow-only copies), and the exact
// FP32 algorithm runs on them. A product of two TF32 values (11 significant
// bits each) is exact in FP32, so only the order of the FP32 sums differs
// from the GPU's. The bias and its gradient stay FP32, as on the GPU.
#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "core/backend.h"
#include "core/precision.h"
#include "kernels/cpu/cpu_kernels.h"

namespace anvil {
namespace {

float* f(const Tensor& t) { return t.defined() ? t.data<float>() : nullptr; }
const int64_t* i64(const Tensor& t) { return t.data<int64_t>(); }

// A copy of t's floats rounded to TF32, as a tensor core reads them, in one
// of the calling thread's two grow-only buffers (cpu::scratch's slots belong
// to the kernels): no allocation in steady state. Valid until the next copy
// into the same buffer.
const float* tf32_copy(const Tensor& t, int buffer) {
  thread_local std::vector<float> buffers[2];
  std::vector<float>& r = buffers[buffer];
  if (r.size() < static_cast<size_t>(t.numel())) r.resize(static_cast<size_t>(t.numel()));
  cpu::round_to_tf32(t.numel(), f(t), r.data());
  return r.data();
}

Fp32Math conv_math() { return fp32_math(OpFamily::kConv, DeviceType::CPU); }
cpu::ConvAlgo conv_algo(Fp32Math m) {
  return m == Fp32Math::kFp32Fast ? cpu::ConvAlgo::kFastest : cpu::ConvAlgo::kExact;
}

class CpuBackend final : public Backend {
 public:
  void copy(const Tensor& src, const Tensor& dst) override {
    if (!src.device().is_cpu() || !dst.device().is_cpu())
      throw std::logic_error("cpu backend asked to copy device memory");
    if (src.nbytes()) std::memmove(dst.raw_data(), src.raw_data(), src.nbytes());
  }

  void fill(const Tensor& dst, double value) override {
    switch (dst.dtype()) {
      case DType::Float32: cpu::fill(dst.numel(), float(value), dst.data<float>()); break;
      case DType::Int64: std::fill_n(dst.data<int64_t>(), dst.numel(), int64_t(value)); break;
      case DType::UInt8: std::fill_n(dst.data<uint8_t>(), dst.numel(), uint8_t(value)); break;
      case DType::BFloat16:
        std::fill_n(dst.data<bfloat16>(), dst.numel(), bfloat16(float(value)));
        break;
    }
  }

  void convert(const Tensor& src, const Tensor& dst) override {
    if (!src.device().is_cpu() || !dst.device().is_cpu())
      throw std::logic_error("cpu backend asked to convert device memory");
    const int64_t n = src.numel();
    if (src.dtype() == DType::Float32 && dst.dtype() == DType::BFloat16)
      return cpu::float_to_bf16(n, src.data<float>(), dst.data<bfloat16>());
    if (src.dtype() == DType::BFloat16 && dst.dtype() == DType::Float32)
      return cpu::bf16_to_float(n, src.data<bfloat16>(), dst.data<float>());
    // Other pairs go through double, which holds every float32, bfloat16 and
    // uint8 value exactly, and an int64 rounded to nearest. Rounding that
    // double to float32 and then to bfloat16 rounds correctly: float32 keeps
    // more than twice bfloat16's precision plus two bits.
    for (int64_t i = 0; i < n; ++i) {
      double v = 0;
      switch (src.dtype()) {
        case DType::Float32: v = src.data<float>()[i]; break;
        case DType::Int64: v = double(src.data<int64_t>()[i]); break;
        case DType::UInt8: v = src.data<uint8_t>()[i]; break;
        case DType::BFloat16: v = src.data<bfloat16>()[i].to_float(); break;
      }
      switch (dst.dtype()) {
        case DType::Float32: dst.data<float>()[i] = float(v); break;
        case DType::Int64: dst.data<int64_t>()[i] = int64_t(v); break;
        case DType::UInt8: dst.data<uint8_t>()[i] = uint8_t(v); break;
        case DType::BFloat16: dst.data<bfloat16>()[i] = bfloat16(float(v)); break;
      }
    }
  }

  void add_scalar_int64(const Tensor& dst, int64_t value) override {
    int64_t* y = dst.data<int64_t>();
    for (int64_t i = 0; i < dst.numel(); ++i) y[i] += value;
  }

  void gemm(bool ta, bool tb, float alpha, const Tensor& a, const Tensor& b, float beta,
            const Tensor& y) override {
    int64_t M = y.size(0), N = y.size(1);
    int64_t K = ta ? a.size(0) : a.size(1);
    if (fp32_math(OpFamily::kMatmul, DeviceType::CPU) == Fp32Math::kTf32) {
      return cpu::gemm(ta, tb, M, N, K, alpha, tf32_copy(a, 0), a.size(1), tf32_copy(b, 1),
                       b.size(1), beta, f(y), N);
    }
    cpu::gemm(ta, tb, M, N, K, alpha, f(a), a.size(1), f(b), b.size(1), beta, f(y), N);
  }

  void conv2d_forward(const Conv2dShape& s, const Tensor& x, const Tensor& w, const Tensor& bias,
                      const Tensor& y) override {
    const Fp32Math m = conv_math();
    if (m == Fp32Math::kTf32) {
      return cpu::conv2d_forward(s, tf32_copy(x, 0), tf32_copy(w, 1), f(bias), f(y),
                                 cpu::ConvAlgo::kExact);
    }
    cpu::conv2d_forward(s, f(x), f(w), f(bias), f(y), conv_algo(m));
  }
  void conv2d_backward_data(const Conv2dShape& s, const Tensor& dy, const Tensor& w,
                            const Tensor& dx) override {
    const Fp32Math m = conv_math();
    if (m == Fp32Math::kTf32) {
      return cpu::conv2d_backward_data(s, tf32_copy(dy, 0), tf32_copy(w, 1), f(dx),
                                       cpu::ConvAlgo::kExact);
    }
    cpu::conv2d_backward_data(s, f(dy), f(w), f(dx), conv_algo(m));
  }
  void conv2d_backward_weight(const Conv2dShape& s, const Tensor& x, const Tensor& dy,
                              const Tensor& dw, const Tensor& dbias) override {
    const Fp32Math m = conv_math();
    if (m == Fp32Math::kTf32) {
      cpu::conv2d_backward_weight(s, tf32_copy(x, 0), tf32_copy(dy, 1), f(dw), nullptr,
                                  cpu::ConvAlgo::kExact);
      if (dbias.defined()) cpu::channel_sum(s.N, s.K, s.P * s.Q, f(dy), f(dbias));
      return;
    }
    cpu::conv2d_backward_weight(s, f(x), f(dy), f(dw), f(dbias), conv_algo(m));
  }

  void max_pool2d_forward(const Pool2dShape& s, const Tensor& x, const Tensor& y,
                          const Tensor& argmax) override {
    cpu::max_pool2d_forward(s, f(x), f(y), argmax.data<int64_t>());
  }
  void max_pool2d_backward(const Pool2dShape& s, const Tensor& dy, const Tensor& argmax,
                           const Tensor& dx) override {
    cpu::max_pool2d_backward(s, f(dy), i64(argmax), f(dx));
  }
  void avg_pool2d_forward(const Pool2dShape& s, const Tensor& x, const Tensor& y) override {
    cpu::avg_pool2d_forward(s, f(x), f(y));
  }
  void avg_pool2d_backward(const Pool2dShape& s, const Tensor& dy, const Tensor& dx) override {
    cpu::avg_pool2d_backward(s, f(dy), f(dx));
  }

  void relu_forward(const Tensor& x, const Tensor& y) override {
    cpu::relu_forward(x.numel(), f(x), f(y));
  }
  void relu_backward(const Tensor& y, const Tensor& dy, const Tensor& dx) override {
    cpu::relu_backward(y.numel(), f(y), f(dy), f(dx));
  }
  void add(const Tensor& a, const Tensor& b, const Tensor& y) override {
    cpu::add(a.numel(), f(a), f(b), f(y));
  }
  void mul(const Tensor& a, const Tensor& b, const Tensor& y) override {
    cpu::mul(a.numel(), f(a), f(b), f(y));
  }
  void axpy(float alpha, const Tensor& x, const Tensor& y) override {
    cpu::axpy(x.numel(), alpha, f(x), f(y));
  }
  void scale(float alpha, const Tensor& x, const Tensor& y) override {
    cpu::scale(x.numel(), alpha, f(x), f(y));
  }
  void add_channel_bias(int64_t outer, int64_t C, int64_t inner, const Tensor& x,
                        const Tensor& bias, const Tensor& y) override {
    cpu::add_channel_bias(outer, C, inner, f(x), f(bias), f(y));
  }
  void channel_sum(int64_t outer, int64_t C, int64_t inner, const Tensor& dy,
                   const Tensor& db) override {
    cpu::channel_sum(outer, C, inner, f(dy), f(db));
  }
  void sum(const Tensor& x, double scale, const Tensor& out) override {
    f(out)[0] = static_cast<float>(double(cpu::sum(x.numel(), f(x))) * scale);
  }
  void broadcast_scalar(const Tensor& scalar, float alpha, const Tensor& y) override {
    cpu::fill(y.numel(), alpha * f(scalar)[0], f(y));
  }

  void softmax_cross_entropy_forward(const Tensor& logits, const Tensor& labels,
                                     float label_smoothing, const Tensor& loss,
                                     const Tensor& probs) override {
    cpu::softmax_cross_entropy_forward(logits.size(0), logits.size(1), f(logits), i64(labels),
                                       label_smoothing, f(loss), f(probs));
  }
  void softmax_cross_entropy_backward(const Tensor& probs, const Tensor& labels,
                                      float label_smoothing, const Tensor& dloss,
                                      const Tensor& dlogits) override {
    cpu::softmax_cross_entropy_backward(probs.size(0), probs.size(1), f(probs), i64(labels),
                                        label_smoothing, f(dloss), f(dlogits));
  }
  void count_correct(const Tensor& logits, const Tensor& labels,
                     const Tensor& counter) override {
    *counter.data<int64_t>() +=
        cpu::count_correct(logits.size(0), logits.size(1), f(logits), i64(labels));
  }
  std::pair<int64_t, int64_t> label_range(const Tensor& labels) override {
    const int64_t* p = i64(labels);
    auto [lo, hi] = std::minmax_element(p, p + labels.numel());
    return {*lo, *hi};
  }

  void batch_norm_forward_train(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                float eps, float momentum, const Tensor& running_mean,
                                const Tensor& running_var, const Tensor& save_mean,
                                const Tensor& save_invstd, const Tensor& y) override {
    auto [N, C, HW] = nchw_view(x);
    cpu::batch_norm_forward_train(N, C, HW, f(x), f(gamma), f(beta), eps, momentum,
                                  f(running_mean), f(running_var), f(save_mean), f(save_invstd),
                                  f(y));
  }
  void batch_norm_forward_eval(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                               const Tensor& running_mean, const Tensor& running_var, float eps,
                               const Tensor& y) override {
    auto [N, C, HW] = nchw_view(x);
    cpu::batch_norm_forward_eval(N, C, HW, f(x), f(gamma), f(beta), f(running_mean),
                                 f(running_var), eps, f(y));
  }
  void batch_norm_backward_train(const Tensor& x, const Tensor& gamma, const Tensor& save_mean,
                                 const Tensor& save_invstd, const Tensor& dy, const Tensor& dx,
                                 const Tensor& dgamma, const Tensor& dbeta) override {
    auto [N, C, HW] = nchw_view(x);
    cpu::batch_norm_backward_train(N, C, HW, f(x), f(gamma), f(save_mean), f(save_invstd),
                                   f(dy), f(dx), f(dgamma), f(dbeta));
  }

  void sgd_update(const Tensor& param, const Tensor& grad, const Tensor& momentum_buf, float lr,
                  float momentum, float weight_decay, bool nesterov, bool first_step) override {
    cpu::sgd_update(param.numel(), f(param), f(grad), f(momentum_buf), lr, momentum,
                    weight_decay, nesterov, first_step);
  }
};

}  // namespace

Backend& cpu_backend() {
  static CpuBackend backend;
  return backend;
}

}  // namespace anvil
