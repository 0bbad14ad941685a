// The op layer's view of a device: one Backend per device, whose methods run
// one kernel on tensors the op layer has already checked and allocated. Ops
// (core/ops.cpp) and their backwards are written once against this
// interface; kernels/cpu and kernels/cuda implement it.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <utility>

#include "core/sgd.h"
#include "core/tensor.h"
#include "core/pointwise.h"
#include "core/shapes.h"

namespace anvil {

class Backend {
 public:
  virtual ~Backend() = default;

  // Memory. copy moves elements between this backend's device and the host
  // (or within the device); fill writes one value everywhere, in dst's dtype.
  virtual void copy(const Tensor& src, const Tensor& dst) = 0;
  virtual void fill(const Tensor& dst, double value) = 0;
  // dst = src's elements in dst's dtype (same shape, both on this backend's
  // device). To bfloat16 rounds to nearest even, to an integer dtype
  // truncates toward zero.
  virtual void convert(const Tensor& src, const Tensor& dst) = 0;
  // dst += value over an int64 tensor (counters), without a round trip to the host.
  virtual void add_scalar_int64(const Tensor& dst, int64_t value) = 0;
  // A strided copy, cudaMemcpy2D's: for i in [0, rows), the `width` elements
  // at src's element i * src_stride go to dst's element i * dst_stride. One
  // dtype, both on this backend's device; every run inside its tensor (the
  // op layer checks, core/ops.h copy_rows_).
  virtual void copy_rows(const Tensor& src, int64_t src_stride, const Tensor& dst,
                         int64_t dst_stride, int64_t rows, int64_t width) = 0;

  // y = a*op(A)*op(B) + bias + beta*y over 2-D float tensors (row-major);
  // bias: undefined, or float32 [N], one per column of y. y may be bfloat16
  // (with a bfloat16 operand): the float32 result, bias included, rounded
  // once to nearest even.
  virtual void gemm(bool trans_a, bool trans_b, float alpha, const Tensor& a, const Tensor& b,
                    float beta, const Tensor& y, const Tensor& bias) = 0;

  // The convolutions read float32 or bfloat16 x, w and dy; y and dx are
  // float32 or bfloat16 (the FP32 sums, bias included, rounded once), dw,
  // the bias and its gradient float32.

  virtual void conv2d_forward(const Conv2dShape& s, const Tensor& x, const Tensor& w,
                              const Tensor& bias, const Tensor& y) = 0;
  virtual void conv2d_backward_data(const Conv2dShape& s, const Tensor& dy, const Tensor& w,
                                    const Tensor& dx) = 0;
  virtual void conv2d_backward_weight(const Conv2dShape& s, const Tensor& x, const Tensor& dy,
                                      const Tensor& dw, const Tensor& dbias) = 0;

  virtual void max_pool2d_forward(const Pool2dShape& s, const Tensor& x, const Tensor& y,
                                  const Tensor& argmax) = 0;
  virtual void max_pool2d_backward(const Pool2dShape& s, const Tensor& dy, const Tensor& argmax,
                                   const Tensor& dx) = 0;
  virtual void avg_pool2d_forward(const Pool2dShape& s, const Tensor& x, const Tensor& y) = 0;
  virtual void avg_pool2d_backward(const Pool2dShape& s, const Tensor& dy, const Tensor& dx) = 0;

  // The pointwise ops (ReLU among them), add, mul and scale take float32 or bfloat16
  // tensors (all of one dtype: kernels/element.h), and so do the pooling
  // and BatchNorm methods' x, y, dy and dx (average pooling also reads a
  // bfloat16 x into a float32 y and a float32 dy into a bfloat16 dx: global
  // average pooling under autocast); everything else is float32, but
  // for copy, fill and convert (any dtype) and what gemm, the convolutions
  // and channel_sum say.
  // y = op(x) and dx = dy * op'(saved) elementwise, for the ops of
  // core/pointwise.h; saved is op's input or output, as its kSaved says.
  virtual void pointwise_forward(PointwiseOp op, const Tensor& x, const Tensor& y) = 0;
  virtual void pointwise_backward(PointwiseOp op, const Tensor& saved, const Tensor& dy,
                                  const Tensor& dx) = 0;
  virtual void add(const Tensor& a, const Tensor& b, const Tensor& y) = 0;
  virtual void mul(const Tensor& a, const Tensor& b, const Tensor& y) = 0;
  virtual void axpy(float alpha, const Tensor& x, const Tensor& y) = 0;  // y += alpha*x
  virtual void scale(float alpha, const Tensor& x, const Tensor& y) = 0;
  // x viewed as [outer, C, inner]; bias [C].
  virtual void add_channel_bias(int64_t outer, int64_t C, int64_t inner, const Tensor& x,
                                const Tensor& bias, const Tensor& y) = 0;
  // db (float32) = dy (float32 or bfloat16) summed over outer and inner, in FP32.
  virtual void channel_sum(int64_t outer, int64_t C, int64_t inner, const Tensor& dy,
                           const Tensor& db) = 0;
  // out[0] = scale * sum of x, written on the device: out is a one-element
  // float tensor on x's device, so that nothing waits for the result.
  virtual void sum(const Tensor& x, double scale, const Tensor& out) = 0;
  // y[i] = alpha * scalar[0] for every element of y (scalar: one float on y's
  // device, not overlapping y): a loss's incoming gradient spread over the
  // batch without reading it back to the host.
  virtual void broadcast_scalar(const Tensor& scalar, float alpha, const Tensor& y) = 0;

  // Against the target (1 - label_smoothing) onehot(label) + label_smoothing / C.
  virtual void softmax_cross_entropy_forward(const Tensor& logits, const Tensor& labels,
                                             float label_smoothing, const Tensor& loss,
                                             const Tensor& probs) = 0;
  virtual void softmax_cross_entropy_backward(const Tensor& probs, const Tensor& labels,
                                              float label_smoothing, const Tensor& dloss,
                                              const Tensor& dlogits) = 0;
  // counter[0] (int64, on the logits' device) += the rows of logits[N, C]
  // whose first largest logit is at their label: a batch's correct
  // predictions, added up on the device.
  virtual void count_correct(const Tensor& logits, const Tensor& labels,
                             const Tensor& counter) = 0;
  // Checks that every label (int64, numel >= 1) is in [0, classes): a bad
  // one throws std::invalid_argument with label_error()'s message, naming
  // the first bad label, its position and the class count. The CPU backend
  // throws at once. The CUDA backend does not wait for the device: a kernel
  // records the first bad label on the device and the backend throws at its
  // next wait for the device (a copy to the host, synchronize()), which the
  // training loop already has at its log interval and the epoch's end; the
  // kernels queued meanwhile see the bad label (its row's loss is nan).
  virtual void check_labels(const Tensor& labels, int64_t classes) = 0;

  // x viewed as [N, C, HW]. relu: y = ReLU of the normalised x (NaN kept,
  // as PyTorch's), in the same pass: BatchNorm and ReLU fused. residual,
  // where defined (x's shape and dtype), is added to the normalised x
  // before ReLU, each sum rounded as add() rounds it: a residual block's
  // end, relu(bn(x) + residual), in that one pass.
  virtual void batch_norm_forward_train(const Tensor& x, const Tensor& gamma,
                                        const Tensor& beta, float eps, float momentum,
                                        const Tensor& running_mean, const Tensor& running_var,
                                        const Tensor& save_mean, const Tensor& save_invstd,
                                        const Tensor& y, bool relu, const Tensor& residual) = 0;
  virtual void batch_norm_forward_eval(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                       const Tensor& running_mean, const Tensor& running_var,
                                       float eps, const Tensor& y, bool relu) = 0;
  // relu_y, where defined, is the output of a forward with relu: the
  // gradient taken is ReLU's backward of dy (dy where relu_y > 0, else 0),
  // formed as the kernel reads dy (BatchNorm's and ReLU's backward fused).
  // dresidual, where defined (dy's shape and dtype), receives that
  // gradient: the residual's, of a forward with a residual.
  virtual void batch_norm_backward_train(const Tensor& x, const Tensor& gamma,
                                         const Tensor& save_mean, const Tensor& save_invstd,
                                         const Tensor& dy, const Tensor& relu_y,
                                         const Tensor& dx, const Tensor& dgamma,
                                         const Tensor& dbeta, const Tensor& dresidual) = 0;

  // The optimizer, one pass over all its tensors (one launch on a CUDA
  // device, for up to 128 tensors): SGD over every entry (SgdTensors), and
  // every tensor (float32) set to zero.
  virtual void sgd_step(std::span<const SgdTensors> tensors, const SgdHyper& h) = 0;
  virtual void zero_tensors(std::span<const Tensor> tensors) = 0;
};

// A tensor [N, C, ...] viewed as [N, C, HW], as the BatchNorm kernels take it.
struct NchwView {
  int64_t N, C, HW;
};
inline NchwView nchw_view(const Tensor& x) {
  int64_t N = x.size(0), C = x.size(1);
  return {N, C, N * C > 0 ? x.numel() / (N * C) : 0};
}

// The message of a label outside [0, classes) (Backend::check_labels): the
// label, the class count, its position in a batch of `size` labels, then
// `found` where not empty (how a deferred check came upon it).
std::string label_error(int64_t label, int64_t classes, int64_t position, int64_t size,
                        const std::string& found = {});

// The backend for a device; throws a clear error for a device this build
// cannot run on.
Backend& backend_for(Device device);

}  // namespace anvil
