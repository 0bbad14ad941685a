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
// logits cancel nothing. The backward is probs - q. e = 0 is the plain
// cross-entropy, computed exactly as before.
//
// A row takes three steps (max, sum of exps, normalise). The forward
// variants differ in how many threads share one row:
//
// 1 thread     One thread per row, the three steps as three loops over the
//   per row    row (128 rows per block). Simple, but neighbouring threads read
//              addresses C floats apart (uncoalesced), a thread does C
//              serial steps per loop, and N threads may not fill the GPU.
// 2 block      One block of 256 threads per row. Each step is a strided loop
//   per row    (thread t takes elements t, t+256, ...: a warp reads 32
//              consecutive floats) followed by a shared-memory tree (max,
//              then sum) with a __syncthreads per halving. Good for long rows;
//              for short rows most threads idle and the 8 barriers per tree
//              dominate.
// 3 warp       One warp per row, 8 rows per 256-thread block. Lane l takes
//   per row    elements l, l+32, ... (coalesced), and the row's max and sum
//              come from five __shfl_xor_sync butterfly steps, after which
//              every lane holds the result: no shared memory, no barrier.
//              Right for the C of a classifier (10 to a few thousand).
//
// Backward: dlogits[i, j] = (probs[i, j] - q[i, j]) * dloss[i], one
// thread per element, grid-stride. Indices are int64 (N*C may exceed 2^31);
// the grid is N blocks for variant 2 and N/128 or N/8 blocks for variants 1
// and 3, each below 2^31 (checked).
// exp and log are the accurate expf / logf, not the fast intrinsics, so the
// results match the CPU reference to float rounding.
//
// count_correct scores a batch for the epoch's accuracy without reading the
// logits back: one thread per row finds the row's argmax (a classifier's C is
// small, so a serial loop is enough), each warp turns its 32 verdicts into one
// word with __ballot_sync and counts it with __popc, and lane 0 of each warp
// adds its warp's total to the counter with one 64-bit atomicAdd at the end.
#include <stdexcept>
#include <string>

#include "kernels/cuda/cuda_compat.h"
#include "kernels/cuda/cuda_kernels.h"

namespace anvil::cuda {

namespace softmax_kernels {

constexpr int kRowsPerBlock1 = 128;  // variant 1: threads (= rows) per block
constexpr int kThreads2 = 256;       // variant 2: threads per row
constexpr int kWarps3 = 8;           // variant 3: rows (= warps) per block
constexpr int kBackwardThreads = 256;
constexpr int kCountThreads = 256;   // whole warps: count_correct_kernel's ballots need them
constexpr unsigned kFullMask = 0xffffffffu;

__device__ __forceinline__ float fmax2(float a, float b) { return a > b ? a : b; }

// A row's loss from its sum of exps s, the gap m - x[label] and the sum of
// the gaps m - x_j (see the top of the file).
__device__ __forceinline__ float row_loss(float s, float label_gap, float gap_sum, float e,
                                          int64_t C) {
  return logf(s) + (1.0f - e) * label_gap + (e / float(C)) * gap_sum;
}

__global__ void __launch_bounds__(kRowsPerBlock1) forward_thread_per_row(int64_t N, int64_t C, const float* __restrict__ logits,
                                       const int64_t* __restrict__ labels, float smoothing,
                                       float* __restrict__ loss, float* __restrict__ probs) {
  const int64_t row = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (row >= N) return;
  const float* x = logits + row * C;
  float* p = probs + row * C;
  float m = x[0];
  for (int64_t j = 1; j < C; ++j) m = fmax2(m, x[j]);
  float s = 0.0f, gap_sum = 0.0f;
  for (int64_t j = 0; j < C; ++j) {
    const float e = expf(x[j] - m);
    p[j] = e;
    s += e;
    gap_sum += m - x[j];
  }
  const float inv = 1.0f / s;
  for (int64_t j = 0; j < C; ++j) p[j] *= inv;
  loss[row] = row_loss(s, m - x[labels[row]], gap_sum, smoothing, C);
}

__global__ void __launch_bounds__(kThreads2) forward_block_per_row(int64_t C, const float* __restrict__ logits,
                                      const int64_t* __restrict__ labels, float smoothing,
                                      float* __restrict__ loss, float* __restrict__ probs) {
  __shared__ float red[kThreads2];
  __shared__ float red_x[kThreads2];  // the gaps' sum, reduced beside the exps'
  const int t = threadIdx.x;
  const int64_t row = blockIdx.x;
  const float* x = logits + row * C;
  float* p = probs + row * C;

  float m = x[0];  // a real element: threads with no element of their own stay neutral
  for (int64_t j = t; j < C; j += kThreads2) m = fmax2(m, x[j]);
  red[t] = m;
  __syncthreads();
  for (int s = kThreads2 / 2; s > 0; s /= 2) {
    if (t < s) red[t] = fmax2(red[t], red[t + s]);
    __syncthreads();
  }
  m = red[0];
  __syncthreads();  // every thread has read red[0] before the sum reuses red

  float sum = 0.0f, gap_sum = 0.0f;
  for (int64_t j = t; j < C; j += kThreads2) {
    const float e = expf(x[j] - m);
    p[j] = e;
    sum += e;
    gap_sum += m - x[j];
  }
  red[t] = sum;
  red_x[t] = gap_sum;
  __syncthreads();
  for (int s = kThreads2 / 2; s > 0; s /= 2) {
    if (t < s) {
      red[t] += red[t + s];
      red_x[t] += red_x[t + s];
    }
    __syncthreads();
  }
  sum = red[0];
  const float inv = 1.0f / sum;
  for (int64_t j = t; j < C; j += kThreads2) p[j] *= inv;  // this thread's own writes
  if (t == 0) loss[row] = row_loss(sum, m - x[labels[row]], red_x[0], smoothing, C);
}

__global__ void __launch_bounds__(kWarps3 * 32) forward_warp_per_row(int64_t N, int64_t C, const float* __restrict__ logits,
                                     const int64_t* __restrict__ labels, float smoothing,
                                     float* __restrict__ loss, float* __restrict__ probs) {
  const int lane = threadIdx.x % 32;
  const int64_t row = int64_t{blockIdx.x} * kWarps3 + threadIdx.x / 32;
  if (row >= N) return;  // the whole warp leaves together: no lane is left waiting
  const float* x = logits + row * C;
  float* p = probs + row * C;

  float m = x[0];
  for (int64_t j = lane; j < C; j += 32) m = fmax2(m, x[j]);
  for (int offset = 16; offset > 0; offset /= 2)
    m = fmax2(m, __shfl_xor_sync(kFullMask, m, offset));

  float sum = 0.0f, gap_sum = 0.0f;
  for (int64_t j = lane; j < C; j += 32) {
    const float e = expf(x[j] - m);
    p[j] = e;
    sum += e;
    gap_sum += m - x[j];
  }
  for (int offset = 16; offset > 0; offset /= 2) {
    sum += __shfl_xor_sync(kFullMask, sum, offset);
    gap_sum += __shfl_xor_sync(kFullMask, gap_sum, offset);
  }

  const float inv = 1.0f / sum;
  for (int64_t j = lane; j < C; j += 32) p[j] *= inv;
  if (lane == 0) loss[row] = row_loss(sum, m - x[labels[row]], gap_sum, smoothing, C);
}

__global__ void __launch_bounds__(kBackwardThreads) backward_kernel(int64_t N, int64_t C, const float* __restrict__ probs,
                                const int64_t* __restrict__ labels, float smoothing,
                                const float* __restrict__ dloss, float* __restrict__ dlogits) {
  const int64_t total = N * C, stride = int64_t{gridDim.x} * blockDim.x;
  const float per_class = smoothing / float(C), on_label = 1.0f - smoothing;
  for (int64_t k = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; k < total; k += stride) {
    const int64_t i = k / C, j = k - i * C;
    const float target = (j == labels[i] ? on_label : 0.0f) + per_class;
    dlogits[k] = (probs[k] - target) * dloss[i];
  }
}

// Whole blocks walk the rows together (base is the same for every thread of
// a block), so all 32 lanes reach each __ballot_sync, rows past N voting 0.
__global__ void __launch_bounds__(kCountThreads) count_correct_kernel(int64_t N, int64_t C, const float* __restrict__ logits,
                                     const int64_t* __restrict__ labels,
                                     unsigned long long* __restrict__ counter) {
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  unsigned long long warp_total = 0;
  for (int64_t base = int64_t{blockIdx.x} * blockDim.x; base < N; base += stride) {
    const int64_t row = base + threadIdx.x;
    bool correct = false;
    if (row < N) {
      const float* x = logits + row * C;
      int64_t best = 0;
      for (int64_t j = 1; j < C; ++j) best = x[j] > x[best] ? j : best;
      correct = best == labels[row];
    }
    warp_total += static_cast<unsigned>(__popc(__ballot_sync(kFullMask, correct)));
  }
  if (threadIdx.x % 32 == 0 && warp_total > 0) atomicAdd(counter, warp_total);
}

unsigned grid_for(int64_t rows, int64_t rows_per_block) {
  const int64_t b = (rows + rows_per_block - 1) / rows_per_block;
  if (b > INT32_MAX)
    throw std::invalid_argument("cuda::softmax_cross_entropy_forward: N = " +
                                std::to_string(rows) + " needs more than 2^31-1 blocks");
  return static_cast<unsigned>(b);
}

void check_shape(const char* name, int64_t N, int64_t C) {
  if (N < 0 || C < 1)
    throw std::invalid_argument(std::string("cuda::") + name + ": shape " + std::to_string(N) +
                                "x" + std::to_string(C) + " (needs N >= 0, C >= 1)");
}

}  // namespace softmax_kernels

void softmax_cross_entropy_forward(int variant, int64_t N, int64_t C, const float* logits,
                                   const int64_t* labels, float label_smoothing, float* loss,
                                   float* probs, cudaStream_t stream) {
  using namespace softmax_kernels;
  if (variant < 1 || variant > kSoftmaxVariants)
    throw std::invalid_argument("cuda::softmax_cross_entropy_forward: no variant " +
                                std::to_string(variant) + " (there are 1 to " +
                                std::to_string(kSoftmaxVariants) + ")");
  check_shape("softmax_cross_entropy_forward", N, C);
  if (N == 0) return;
  switch (variant) {
    case 1:
      launch(forward_thread_per_row, grid_for(N, kRowsPerBlock1), dim3(kRowsPerBlock1), 0, stream,
             N, C, logits, labels, label_smoothing, loss, probs);
      break;
    case 2:
      launch(forward_block_per_row, grid_for(N, 1), dim3(kThreads2), 0, stream, C,
             logits, labels, label_smoothing, loss, probs);
      break;
    default:
      launch(forward_warp_per_row, grid_for(N, kWarps3), dim3(kWarps3 * 32), 0, stream, N, C,
             logits, labels, label_smoothing, loss, probs);
      break;
  }
}

void softmax_cross_entropy_backward(int64_t N, int64_t C, const float* probs,
                                    const int64_t* labels, float label_smoothing,
                                    const float* dloss, float* dlogits, cudaStream_t stream) {
  using namespace softmax_kernels;
  check_shape("softmax_cross_entropy_backward", N, C);
  if (N == 0) return;
  const int64_t blocks = (N * C + kBackwardThreads - 1) / kBackwardThreads;
  launch(backward_kernel, static_cast<unsigned>(blocks < 65536 ? blocks : 65536),
         dim3(kBackwardThreads),
         0, stream, N, C, probs, labels, label_smoothing, dloss, dlogits);
}

void count_correct(int64_t N, int64_t C, const float* logits, const int64_t* labels,
                   int64_t* counter, cudaStream_t stream) {
  using namespace softmax_kernels;
  check_shape("count_correct", N, C);
  if (N == 0) return;
  const int64_t blocks = (N + kCountThreads - 1) / kCountThreads;
  // The int64 counter is added to as unsigned: two's complement makes the sum
  // the same, and CUDA's 64-bit atomicAdd is the unsigned one.
  launch(count_correct_kernel, static_cast<unsigned>(blocks < 1024 ? blocks : 1024),
         dim3(kCountThreads), 0, stream, N, C, logits, labels,
         reinterpret_cast<unsigned long long*>(counter));
}

}  // namespace anvil::cuda
