// Fused softmax + cross-entropy over the rows of logits[N, C]:
//   probs[i, :] = softmax(logits[i, :])
//   loss[i]     = logsumexp(logits[i, :]) - logits[i, label[i]]
// Numerically stable: each row is shifted by its max m before exp, so every
// exp(x - m) is in (0, 1] and the row's sum s is in [1, C]; then
// loss = log(s) + (m - x[label]) and probs = exp(x - m) / s. Logits of
// magnitude 80 or 1000 neither overflow nor lose the small terms.
//
// Label smoothing e (PyTorch's CrossEntropyLoss(label_smoothing=e)) trains
// against q = (1 - e) onehot(label) + e / C: loss = -sum_j q_j log p_j, and
// as q sums to 1 and log p_j = x_j - m - log(s),
//   loss = log(s) + (1 - e) (m - x[label]) + (e / C) sum_j (m - x_j).
// The pass that sums the exps also sums the gaps m - x_j: all >= 0, so large
// logits cancel nothing. The backward is probs - q; e = 0 is the plain
// cross-entropy. exp and log are the accurate expf / logf, not the fast
// intrinsics, so the results match the CPU reference to float rounding.
//
// The forward's ladder: a row takes three steps (max, sum of exps,
// normalise); the rungs differ in how many threads share one row.
//   01_thread_per_row.cu     one thread per row, three serial loops
//   02_block_per_row.cu      256 threads per row, shared-memory trees
//   03_warp_per_row.cu (ships) one warp per row, shuffle butterflies
// Beside it, without a ladder: backward.cu (probs - q, one thread per
// element) and count_correct.cu (a batch's correct predictions).
// Run one rung alone (checked against the CPU, then timed):
//   build/sim/bench_cuda_kernels softmax 2
#pragma once
#include <cstdint>

#include "kernels/cuda/runtime.h"
#include "core/bfloat16.h"

namespace anvil::cuda {

constexpr int kSoftmaxRungs = 3;
constexpr int kBestSoftmax = 3;  // the one the backend uses

// As cpu::softmax_cross_entropy_*: labels in [0, C) (checked by the caller).
// Indices are int64 (N*C may exceed 2^31); N needs at most 2^31-1 blocks.
void softmax_cross_entropy_forward(int rung, int64_t N, int64_t C, const float* logits,
                                   const int64_t* labels, float label_smoothing, float* loss,
                                   float* probs, cudaStream_t stream);
// bfloat16 logits (autocast's) on the rung that ships, each widened as it is
// read: the float32 rung's results on the same values.
void softmax_cross_entropy_forward(int64_t N, int64_t C, const bfloat16* logits,
                                   const int64_t* labels, float label_smoothing, float* loss,
                                   float* probs, cudaStream_t stream);
// T: float, or bfloat16 (rounded once as it is stored).
template <class T>
void softmax_cross_entropy_backward(int64_t N, int64_t C, const float* probs,
                                    const int64_t* labels, float label_smoothing,
                                    const float* dloss, T* dlogits, cudaStream_t stream);
// counter[0] += the number of rows of logits[N, C] whose first largest logit
// is at column labels[i], as cpu::count_correct (counter: one int64 of
// device memory, not zeroed here, so batches add up on the device).
// T: float or bfloat16.
template <class T>
void count_correct(int64_t N, int64_t C, const T* logits, const int64_t* labels,
                   int64_t* counter, cudaStream_t stream);

// The forward rungs' launchers (N >= 1, shape checked).
namespace softmax_rungs {
struct Args {
  int64_t N, C;
  const float* logits;
  const int64_t* labels;
  float smoothing;
  float* loss;
  float* probs;
};
using Launch = void (*)(const Args&, cudaStream_t);
void thread_per_row(const Args&, cudaStream_t);
void block_per_row(const Args&, cudaStream_t);
void warp_per_row(const Args&, cudaStream_t);
struct Rung {
  const char* name;
  Launch launch;
};
inline constexpr Rung kRungs[kSoftmaxRungs] = {
    {"thread per row", thread_per_row}, {"block per row", block_per_row},
    {"warp per row", warp_per_row}};
// Throws std::invalid_argument naming `fn` unless N >= 0 and C >= 1.
void check_shape(const char* fn, int64_t N, int64_t C);
// Blocks for `rows` rows at rows_per_block (throws past 2^31-1).
unsigned grid_for(int64_t rows, int64_t rows_per_block);
}  // namespace softmax_rungs

}  // namespace anvil::cuda
