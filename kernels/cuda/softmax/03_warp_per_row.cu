// Softmax cross-entropy rung 03 (the one that ships), one warp per row, 8
// rows per 256-thread block. Lane l takes elements l, l+32, ... (coalesced),
// and the row's max and sum come from five __shfl_xor_sync butterfly steps,
// after which every lane holds the result: no shared memory, no barrier.
// Right for the C of a classifier (10 to a few thousand). Under autocast the
// logits are bfloat16: forward_warp_per_row_bf16 reads them as stored,
// widening each element as it is read, and computes what the float32
// kernel computes on the same values (probs and loss stay float32).
//   build/sim/bench_cuda_kernels softmax 3
#include "kernels/cuda/softmax/rung.cuh"
#include "kernels/element.h"

namespace anvil::cuda {
namespace softmax_kernels {

constexpr int kWarps3 = 8;  // rows (= warps) per block

template <class T>
__device__ __forceinline__ void forward_row(int64_t N, int64_t C, const T* __restrict__ logits,
                                            const int64_t* __restrict__ labels, float smoothing,
                                            float* __restrict__ loss, float* __restrict__ probs) {
  const int lane = threadIdx.x % 32;
  const int64_t row = int64_t{blockIdx.x} * kWarps3 + threadIdx.x / 32;
  if (row >= N) return;  // the whole warp leaves together: no lane is left waiting
  const T* x = logits + row * C;
  float* p = probs + row * C;

  float m = load(x[0]);
  for (int64_t j = lane; j < C; j += 32) m = fmax2(m, load(x[j]));
  for (int offset = 16; offset > 0; offset /= 2)
    m = fmax2(m, __shfl_xor_sync(kFullMask, m, offset));

  float sum = 0.0f, gap_sum = 0.0f;
  for (int64_t j = lane; j < C; j += 32) {
    const float e = expf(load(x[j]) - m);
    p[j] = e;
    sum += e;
    gap_sum += m - load(x[j]);
  }
  for (int offset = 16; offset > 0; offset /= 2) {
    sum += __shfl_xor_sync(kFullMask, sum, offset);
    gap_sum += __shfl_xor_sync(kFullMask, gap_sum, offset);
  }

  const float inv = 1.0f / sum;
  for (int64_t j = lane; j < C; j += 32) p[j] *= inv;
  if (lane == 0) {
    const int64_t label = labels[row];
    loss[row] = row_loss(sum, label_in_row(label, C) ? m - load(x[label]) : nanf(""), gap_sum,
                         smoothing, C);
  }
}

// One kernel per logits type, each with a name of its own for the audits.
__global__ void __launch_bounds__(kWarps3 * 32)
    forward_warp_per_row(int64_t N, int64_t C, const float* __restrict__ logits,
                         const int64_t* __restrict__ labels, float smoothing,
                         float* __restrict__ loss, float* __restrict__ probs) {
  forward_row(N, C, logits, labels, smoothing, loss, probs);
}
__global__ void __launch_bounds__(kWarps3 * 32)
    forward_warp_per_row_bf16(int64_t N, int64_t C, const bfloat16* __restrict__ logits,
                              const int64_t* __restrict__ labels, float smoothing,
                              float* __restrict__ loss, float* __restrict__ probs) {
  forward_row(N, C, logits, labels, smoothing, loss, probs);
}

}  // namespace softmax_kernels

void softmax_cross_entropy_forward(int64_t N, int64_t C, const bfloat16* logits,
                                   const int64_t* labels, float label_smoothing, float* loss,
                                   float* probs, cudaStream_t stream) {
  using namespace softmax_kernels;
  softmax_rungs::check_shape("softmax_cross_entropy_forward", N, C);
  if (N == 0) return;
  launch(forward_warp_per_row_bf16, softmax_rungs::grid_for(N, kWarps3), dim3(kWarps3 * 32), 0,
         stream, N, C, logits, labels, label_smoothing, loss, probs);
}

void softmax_rungs::warp_per_row(const Args& a, cudaStream_t stream) {
  using namespace softmax_kernels;
  launch(forward_warp_per_row, grid_for(a.N, kWarps3), dim3(kWarps3 * 32), 0, stream, a.N, a.C,
         a.logits, a.labels, a.smoothing, a.loss, a.probs);
}

}  // namespace anvil::cuda
