// Differentiable tensor operations. Each checks its inputs (shapes, dtypes,
// devices: errors name the op and the shapes), allocates its output on the
// inputs' device, runs the device's Backend kernel, and, when a gradient is
// needed, records its backward — written once here, in terms of Backend
// kernels, for every device.
#pragma once
#include <cstdint>
#include <span>

#include "core/sgd.h"
#include "core/tensor.h"

namespace anvil {

// Elementwise / broadcasting.
// a + b where b has a's shape, is a scalar (one element), or is a channel
// bias of shape [a.size(1)] broadcast over every other dim of a.
Tensor add(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);  // same shapes
Tensor scale(const Tensor& x, double alpha);   // alpha * x
Tensor relu(const Tensor& x);
Tensor silu(const Tensor& x);  // x * sigmoid(x), as torch.nn.functional.silu

// Matrix products. a[M,K] @ b[K,N]; linear: x[N,in] w[out,in] -> x w^T + bias[out].
Tensor matmul(const Tensor& a, const Tensor& b);
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor());

// x[N,C,H,W], weight[K,C,R,S], bias [K] or undefined.
Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor(),
              int64_t stride = 1, int64_t padding = 0);
Tensor max_pool2d(const Tensor& x, int64_t kernel, int64_t stride = -1, int64_t padding = 0);
// count_include_pad semantics, as PyTorch's default.
Tensor avg_pool2d(const Tensor& x, int64_t kernel, int64_t stride = -1, int64_t padding = 0);
// Mean over H and W: [N,C,H,W] -> [N,C,1,1] (AdaptiveAvgPool2d(1)).
Tensor global_avg_pool2d(const Tensor& x);

// Batch normalisation over [N,C] or [N,C,H,W]. Training: batch statistics,
// running_mean/running_var (may be undefined) updated in place with momentum.
// Eval: running statistics.
Tensor batch_norm(const Tensor& x, const Tensor& weight, const Tensor& bias,
                  const Tensor& running_mean, const Tensor& running_var, bool training,
                  double momentum = 0.1, double eps = 1e-5);
// relu(batch_norm(...)) in one pass over x (the same bits: ReLU applied as
// the normalised value is stored), BatchNorm2d followed by ReLU fused. Its
// training backward is BatchNorm's passes reading y with dy, x and taking
// ReLU's backward (dy where y > 0) as they load dy: the masked gradient is
// never stored as a tensor. In eval, ReLU's backward runs first, then BatchNorm's.
Tensor batch_norm_relu(const Tensor& x, const Tensor& weight, const Tensor& bias,
                       const Tensor& running_mean, const Tensor& running_var, bool training,
                       double momentum = 0.1, double eps = 1e-5);
// relu(batch_norm(x, ...) + residual), a residual block's end (residual:
// x's shape), in one pass over x and the residual with the same bits as the
// three ops. Its training backward is batch_norm_relu's, which also writes
// the masked gradient out once as the residual's: no ReLU pass and no add
// in either direction. In eval, or with a residual of another dtype, it is
// the three ops.
Tensor batch_norm_add_relu(const Tensor& x, const Tensor& residual, const Tensor& weight,
                           const Tensor& bias, const Tensor& running_mean,
                           const Tensor& running_var, bool training, double momentum = 0.1,
                           double eps = 1e-5);

enum class Reduction { None, Mean, Sum };
// Fused log-softmax + negative log-likelihood over logits[N,C] and int64
// labels[N] in [0, C) (checked: on the CPU at once; on a GPU without waiting
// for it, the error thrown at the device's next wait, Backend::check_labels).
// label_smoothing e in [0, 1] (checked), as
// PyTorch's CrossEntropyLoss(label_smoothing=e): the target of row i is
// (1 - e) onehot(labels[i]) + e / C, so the loss is
// (1 - e) * nll + e * mean_j(-log_softmax(logits)[i, j]).
Tensor cross_entropy(const Tensor& logits, const Tensor& labels,
                     Reduction reduction = Reduction::Mean, double label_smoothing = 0.0);

// Reductions to a scalar (shape []).
Tensor sum(const Tensor& x);
Tensor mean(const Tensor& x);

// Row-wise argmax of a 2-D tensor, as int64 [N] on the host.
Tensor argmax_rows(const Tensor& x);

// counter += value in place, on the counter's own device (no autograd): for
// int64 counters such as BatchNorm's num_batches_tracked, so that counting a
// step on a GPU does not wait for the device.
void add_int64_(const Tensor& counter, int64_t value);

// A strided copy, without autograd: for i in [0, rows), the `width` elements
// of src from element src_offset + i * src_stride go to dst from element
// dst_offset + i * dst_stride (cudaMemcpy2D's copy, on the tensors' device).
// One dtype and one device; every run inside its tensor (std::invalid_argument
// naming the numbers otherwise). Channels [c, c + k) of an [N, C, H, W]
// tensor are N runs of k*H*W elements, offset c*H*W, stride C*H*W.
void copy_rows_(const Tensor& src, int64_t src_offset, int64_t src_stride, const Tensor& dst,
                int64_t dst_offset, int64_t dst_stride, int64_t rows, int64_t width);

// Running totals of a training loop, kept on the device so that adding a
// batch's figures does not wait for it (no autograd):
// total += alpha * x, for float tensors of one shape (e.g. a loss scalar);
void add_scaled_(const Tensor& total, const Tensor& x, double alpha);
// counter (an int64 scalar) += the rows of logits[N, C] whose prediction (the
// first largest logit) equals labels[N] (int64).
void count_correct_(const Tensor& counter, const Tensor& logits, const Tensor& labels);

// The optimizer's in-place updates (no autograd), each one pass over all of
// its tensors, which must share one device: on a CUDA device one launch
// (multi-tensor apply; one per 128 SGD tensors or 256 zeroed ones), where a
// loop over the tensors would launch once per tensor.
// SGD with PyTorch's semantics (dampening 0; kernels/sgd.h) on every entry,
// checked (float32 of the parameter's shape, a buffer with momentum, a
// bfloat16 copy); entries without a gradient are the caller's to leave out.
void sgd_step_(std::span<const SgdTensors> tensors, const SgdHyper& h);
// Every tensor (float32) set to zero.
void zero_(std::span<const Tensor> tensors);

}  // namespace anvil
