// The op layer's half of the profiler (core/profile.h): while profiling is
// on, backend_for hands out this wrapper of the device's Backend, which runs
// each method inside a profile::Scope of the method's op family. The family
// is the method's, known here, not guessed from kernel names.
#include "core/profile_backend.h"

#include <array>
#include <memory>
#include <mutex>

#include "core/profile.h"

namespace anvil {
namespace {

using profile::Family;

class ProfilingBackend final : public Backend {
 public:
  ProfilingBackend(Backend& inner, bool host) : b_(inner), host_(host) {}

  void copy(const Tensor& src, const Tensor& dst) override {
    Op op(this, Family::Other, "copy");
    b_.copy(src, dst);
  }
  void copy_rows(const Tensor& src, int64_t src_stride, const Tensor& dst, int64_t dst_stride,
                 int64_t rows, int64_t width) override {
    Op op(this, Family::Other, "copy_rows");
    b_.copy_rows(src, src_stride, dst, dst_stride, rows, width);
  }
  void fill(const Tensor& dst, double value) override {
    Op op(this, Family::Other, "fill");
    b_.fill(dst, value);
  }
  void convert(const Tensor& src, const Tensor& dst) override {
    Op op(this, Family::Conversion, "convert");
    b_.convert(src, dst);
  }
  void add_scalar_int64(const Tensor& dst, int64_t value) override {
    Op op(this, Family::Other, "add_scalar_int64");
    b_.add_scalar_int64(dst, value);
  }
  void gemm(bool ta, bool tb, float alpha, const Tensor& a, const Tensor& b, float beta,
            const Tensor& y, const Tensor& bias) override {
    Op op(this, Family::Gemm, "gemm");
    b_.gemm(ta, tb, alpha, a, b, beta, y, bias);
  }
  void conv2d_forward(const Conv2dShape& s, const Tensor& x, const Tensor& w, const Tensor& bias,
                      const Tensor& y) override {
    Op op(this, Family::ConvForward, "conv2d_forward");
    b_.conv2d_forward(s, x, w, bias, y);
  }
  void conv2d_backward_data(const Conv2dShape& s, const Tensor& dy, const Tensor& w,
                            const Tensor& dx) override {
    Op op(this, Family::ConvBackwardData, "conv2d_backward_data");
    b_.conv2d_backward_data(s, dy, w, dx);
  }
  void conv2d_backward_weight(const Conv2dShape& s, const Tensor& x, const Tensor& dy,
                              const Tensor& dw, const Tensor& dbias) override {
    Op op(this, Family::ConvBackwardWeight, "conv2d_backward_weight");
    b_.conv2d_backward_weight(s, x, dy, dw, dbias);
  }
  void max_pool2d_forward(const Pool2dShape& s, const Tensor& x, const Tensor& y,
                          const Tensor& argmax) override {
    Op op(this, Family::Pooling, "max_pool2d_forward");
    b_.max_pool2d_forward(s, x, y, argmax);
  }
  void max_pool2d_backward(const Pool2dShape& s, const Tensor& dy, const Tensor& argmax,
                           const Tensor& dx) override {
    Op op(this, Family::Pooling, "max_pool2d_backward");
    b_.max_pool2d_backward(s, dy, argmax, dx);
  }
  void avg_pool2d_forward(const Pool2dShape& s, const Tensor& x, const Tensor& y) override {
    Op op(this, Family::Pooling, "avg_pool2d_forward");
    b_.avg_pool2d_forward(s, x, y);
  }
  void avg_pool2d_backward(const Pool2dShape& s, const Tensor& dy, const Tensor& dx) override {
    Op op(this, Family::Pooling, "avg_pool2d_backward");
    b_.avg_pool2d_backward(s, dy, dx);
  }
  void pointwise_forward(PointwiseOp o, const Tensor& x, const Tensor& y) override {
    Op op(this, family(o), o == PointwiseOp::kRelu ? "relu_forward" : "pointwise_forward");
    b_.pointwise_forward(o, x, y);
  }
  void pointwise_backward(PointwiseOp o, const Tensor& saved, const Tensor& dy,
                          const Tensor& dx) override {
    Op op(this, family(o), o == PointwiseOp::kRelu ? "relu_backward" : "pointwise_backward");
    b_.pointwise_backward(o, saved, dy, dx);
  }
  void add(const Tensor& a, const Tensor& b, const Tensor& y) override {
    Op op(this, Family::Add, "add");
    b_.add(a, b, y);
  }
  void mul(const Tensor& a, const Tensor& b, const Tensor& y) override {
    Op op(this, Family::Other, "mul");
    b_.mul(a, b, y);
  }
  void axpy(float alpha, const Tensor& x, const Tensor& y) override {
    Op op(this, Family::Add, "axpy");
    b_.axpy(alpha, x, y);
  }
  void scale(float alpha, const Tensor& x, const Tensor& y) override {
    Op op(this, Family::Other, "scale");
    b_.scale(alpha, x, y);
  }
  void add_channel_bias(int64_t outer, int64_t C, int64_t inner, const Tensor& x,
                        const Tensor& bias, const Tensor& y) override {
    Op op(this, Family::Add, "add_channel_bias");
    b_.add_channel_bias(outer, C, inner, x, bias, y);
  }
  void channel_sum(int64_t outer, int64_t C, int64_t inner, const Tensor& dy,
                   const Tensor& db) override {
    Op op(this, Family::Other, "channel_sum");
    b_.channel_sum(outer, C, inner, dy, db);
  }
  void sum(const Tensor& x, double scale, const Tensor& out) override {
    Op op(this, Family::Other, "sum");
    b_.sum(x, scale, out);
  }
  void broadcast_scalar(const Tensor& scalar, float alpha, const Tensor& y) override {
    Op op(this, Family::Other, "broadcast_scalar");
    b_.broadcast_scalar(scalar, alpha, y);
  }
  void softmax_cross_entropy_forward(const Tensor& logits, const Tensor& labels, float ls,
                                     const Tensor& loss, const Tensor& probs) override {
    Op op(this, Family::CrossEntropy, "softmax_cross_entropy_forward");
    b_.softmax_cross_entropy_forward(logits, labels, ls, loss, probs);
  }
  void softmax_cross_entropy_backward(const Tensor& probs, const Tensor& labels, float ls,
                                      const Tensor& dloss, const Tensor& dlogits) override {
    Op op(this, Family::CrossEntropy, "softmax_cross_entropy_backward");
    b_.softmax_cross_entropy_backward(probs, labels, ls, dloss, dlogits);
  }
  void count_correct(const Tensor& logits, const Tensor& labels, const Tensor& counter) override {
    Op op(this, Family::Other, "count_correct");
    b_.count_correct(logits, labels, counter);
  }
  void check_labels(const Tensor& labels, int64_t classes) override {
    Op op(this, Family::CrossEntropy, "check_labels");
    b_.check_labels(labels, classes);
  }
  void batch_norm_forward_train(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                float eps, float momentum, const Tensor& running_mean,
                                const Tensor& running_var, const Tensor& save_mean,
                                const Tensor& save_invstd, const Tensor& y, bool relu,
                                const Tensor& residual) override {
    Op op(this, Family::BatchNorm, "batch_norm_forward_train");
    b_.batch_norm_forward_train(x, gamma, beta, eps, momentum, running_mean, running_var,
                                save_mean, save_invstd, y, relu, residual);
  }
  void batch_norm_forward_eval(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                               const Tensor& running_mean, const Tensor& running_var, float eps,
                               const Tensor& y, bool relu) override {
    Op op(this, Family::BatchNorm, "batch_norm_forward_eval");
    b_.batch_norm_forward_eval(x, gamma, beta, running_mean, running_var, eps, y, relu);
  }
  void batch_norm_backward_train(const Tensor& x, const Tensor& gamma, const Tensor& save_mean,
                                 const Tensor& save_invstd, const Tensor& dy,
                                 const Tensor& relu_y, const Tensor& dx, const Tensor& dgamma,
                                 const Tensor& dbeta, const Tensor& dresidual) override {
    Op op(this, Family::BatchNorm, "batch_norm_backward_train");
    b_.batch_norm_backward_train(x, gamma, save_mean, save_invstd, dy, relu_y, dx, dgamma, dbeta,
                                 dresidual);
  }
  void sgd_step(std::span<const SgdTensors> tensors, const SgdHyper& h) override {
    Op op(this, Family::Sgd, "sgd_step");
    b_.sgd_step(tensors, h);
  }
  void zero_tensors(std::span<const Tensor> tensors) override {
    Op op(this, Family::Sgd, "zero_tensors");
    b_.zero_tensors(tensors);
  }

 private:
  // ReLU has a row of its own in the profile; the other pointwise ops are Other.
  static Family family(PointwiseOp o) { return o == PointwiseOp::kRelu ? Family::Relu : Family::Other; }
  // One method's scope: timed on the host for the CPU; on a CUDA device the
  // launches inside it carry the family.
  struct Op : profile::Scope {
    Op(const ProfilingBackend* self, Family f, const char* name) : Scope(f, name, self->host_) {}
  };
  Backend& b_;
  bool host_;
};

}  // namespace

Backend& profiling_backend(Backend& inner, Device device) {
  // One wrapper per device, made on first use and kept (backends live as
  // long as the process).
  static std::mutex mutex;
  static std::array<std::unique_ptr<ProfilingBackend>, 65> wrappers;  // CPU, then cuda:0..63
  const size_t slot = device.is_cpu() ? 0 : size_t(device.index) + 1;
  std::lock_guard lock(mutex);
  auto& w = wrappers.at(slot);
  if (!w) w = std::make_unique<ProfilingBackend>(inner, device.is_cpu());
  return *w;
}

}  // namespace anvil
