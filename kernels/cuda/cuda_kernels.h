// The CUDA backend's kernels, as host entry points over device pointers.
// Built by nvcc for a GPU, or by g++ against the simulator (sim/); the same
// source either way. Every entry point launches asynchronously on `stream`
// on the current device (cudaSetDevice), checks the launch and returns;
// memory is NCHW and contiguous, as in kernels/cpu/cpu_kernels.h, whose
// functions are the reference each kernel is tested against.
//
// Where a kernel has a ladder of numbered variants (naive -> fast, for study
// and benchmarks) the first argument picks one; kBest* names the one the
// backend uses. Sizes are int64 at the interface; each kernel documents the
// limits of its index arithmetic. Scratch memory is passed in by the caller
// (the backend takes it from its caching allocator): *_workspace_floats says
// how much a variant needs, and may be 0.
#pragma once
#include <cstddef>
#include <cstdint>

#include "core/bfloat16.h"
#include "kernels/cuda/conv/conv.h"
#include "kernels/cuda/gemm/gemm.h"
#include "kernels/cuda/runtime.h"
#include "kernels/shapes.h"

namespace anvil::cuda {

// ---- pooling (pool.cu) ----
// Same contracts as cpu:: (argmax = flat h*W+w index within the plane,
// padding counts as -inf for max and as zeros in the average).
void max_pool2d_forward(const Pool2dShape& s, const float* x, float* y, int64_t* argmax,
                        cudaStream_t stream);
void max_pool2d_backward(const Pool2dShape& s, const float* dy, const int64_t* argmax, float* dx,
                         cudaStream_t stream);
void avg_pool2d_forward(const Pool2dShape& s, const float* x, float* y, cudaStream_t stream);
void avg_pool2d_backward(const Pool2dShape& s, const float* dy, float* dx, cudaStream_t stream);

// ---- elementwise (elementwise.cu) ----
// Output may alias an input exactly (in place).
void relu_forward(int64_t n, const float* x, float* y, cudaStream_t stream);
void relu_backward(int64_t n, const float* y, const float* dy, float* dx, cudaStream_t stream);
void add(int64_t n, const float* a, const float* b, float* y, cudaStream_t stream);
void mul(int64_t n, const float* a, const float* b, float* y, cudaStream_t stream);
void axpy(int64_t n, float alpha, const float* x, float* y, cudaStream_t stream);
void scale(int64_t n, float alpha, const float* x, float* y, cudaStream_t stream);
void fill(int64_t n, float value, float* y, cudaStream_t stream);
void fill(int64_t n, int64_t value, int64_t* y, cudaStream_t stream);
void fill(int64_t n, uint8_t value, uint8_t* y, cudaStream_t stream);
void fill(int64_t n, bfloat16 value, bfloat16* y, cudaStream_t stream);
// float32 -> bfloat16 rounds to nearest even (NaN stays a quiet NaN);
// bfloat16 -> float32 is exact.
void float_to_bf16(int64_t n, const float* x, bfloat16* y, cudaStream_t stream);
void bf16_to_float(int64_t n, const bfloat16* x, float* y, cudaStream_t stream);
// y += value (int64 counters)
void add_scalar(int64_t n, int64_t value, int64_t* y, cudaStream_t stream);
// y[i] = alpha * x[0] for i < n (x: one float of device memory, outside y)
void broadcast_scalar(int64_t n, float alpha, const float* x, float* y, cudaStream_t stream);
// y[outer, C, inner] = x + bias[C]
void add_channel_bias(int64_t outer, int64_t C, int64_t inner, const float* x, const float* bias,
                      float* y, cudaStream_t stream);

// ---- reductions (reduce.cu) ----
// out[0] = sum of x[0..n) (out is one float of device memory). Variants:
// 1 atomic per element, 2 shared-memory tree per block, 3 warp shuffles,
// 4 two-pass deterministic (see reduce.cu).
constexpr int kSumVariants = 4;
constexpr int kBestSum = 4;
size_t sum_workspace_floats(int variant, int64_t n);
void sum(int variant, int64_t n, const float* x, float* out, float* workspace,
         cudaStream_t stream);
// db[C] = sum over outer and inner of dy[outer, C, inner] (overwrites db;
// deterministic). Variants: 1 one block per channel, 2 several blocks per
// channel and a fixed-order second pass over their partials, which needs
// channel_sum_workspace_floats (see reduce.cu).
constexpr int kChannelSumVariants = 2;
constexpr int kBestChannelSum = 2;
size_t channel_sum_workspace_floats(int variant, int64_t outer, int64_t C, int64_t inner);
void channel_sum(int variant, int64_t outer, int64_t C, int64_t inner, const float* dy, float* db,
                 float* workspace, cudaStream_t stream);
// out[0] = min, out[1] = max of labels[0..n), n >= 1 (out: two int64 of device memory).
void label_min_max(int64_t n, const int64_t* labels, int64_t* out, cudaStream_t stream);

// ---- softmax cross-entropy (softmax_cross_entropy.cu) ----
// As cpu::softmax_cross_entropy_*: labels in [0, C) (checked by the caller),
// label_smoothing e: the target is (1 - e) onehot(label) + e / C.
// Variants: 1 one thread per row, 2 one block per row with a shared-memory
// tree, 3 one warp per row with warp shuffles (see the file).
constexpr int kSoftmaxVariants = 3;
constexpr int kBestSoftmax = 3;
void softmax_cross_entropy_forward(int variant, int64_t N, int64_t C, const float* logits,
                                   const int64_t* labels, float label_smoothing, float* loss,
                                   float* probs, cudaStream_t stream);
void softmax_cross_entropy_backward(int64_t N, int64_t C, const float* probs,
                                    const int64_t* labels, float label_smoothing,
                                    const float* dloss, float* dlogits, cudaStream_t stream);
// counter[0] += the number of rows of logits[N, C] whose first largest logit
// is at column labels[i], as cpu::count_correct (counter: one int64 of
// device memory, not zeroed here, so batches add up on the device).
void count_correct(int64_t N, int64_t C, const float* logits, const int64_t* labels,
                   int64_t* counter, cudaStream_t stream);

// ---- BatchNorm (batch_norm.cu) ----
// As cpu::batch_norm_*, over x[N, C, HW] per channel; running_* may be null.
// Training forward and backward, deterministic in both variants: 1 one block
// per channel, 2 several blocks per channel, their partials merged in a fixed
// order by a second kernel (see batch_norm.cu). Variant 2 needs
// batch_norm_workspace_floats of workspace (forward and backward alike; 0 for
// variant 1).
constexpr int kBatchNormVariants = 2;
constexpr int kBestBatchNorm = 2;
size_t batch_norm_workspace_floats(int variant, int64_t N, int64_t C, int64_t HW);
void batch_norm_forward_train(int variant, int64_t N, int64_t C, int64_t HW, const float* x,
                              const float* gamma, const float* beta, float eps, float momentum,
                              float* running_mean, float* running_var, float* save_mean,
                              float* save_invstd, float* y, float* workspace,
                              cudaStream_t stream);
void batch_norm_forward_eval(int64_t N, int64_t C, int64_t HW, const float* x,
                             const float* gamma, const float* beta, const float* running_mean,
                             const float* running_var, float eps, float* y, cudaStream_t stream);
void batch_norm_backward_train(int variant, int64_t N, int64_t C, int64_t HW, const float* x,
                               const float* gamma, const float* save_mean,
                               const float* save_invstd, const float* dy, float* dx,
                               float* dgamma, float* dbeta, float* workspace,
                               cudaStream_t stream);

// ---- SGD (sgd.cu) ----
// As cpu::sgd_update (PyTorch semantics); momentum_buf may be null when momentum == 0.
void sgd_update(int64_t n, float* param, const float* grad, float* momentum_buf, float lr,
                float momentum, float weight_decay, bool nesterov, bool first_step,
                cudaStream_t stream);

// ---- the collectives' reduction step (accumulate.cu) ----
// As cpu::accumulate: dst = (dst + src) * scale (scale 1: dst += src). The
// collectives (parallel/) launch it on their own stream, not the compute one.
void accumulate(int64_t n, float* dst, const float* src, float scale, cudaStream_t stream);
void accumulate(int64_t n, int64_t* dst, const int64_t* src, cudaStream_t stream);

}  // namespace anvil::cuda
