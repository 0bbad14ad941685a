// count_correct scores a batch for the epoch's accuracy without reading the
// logits back: one thread per row finds the row's argmax (a classifier's C is
// small, so a serial loop is enough), each warp turns its 32 verdicts into one
// word with __ballot_sync and counts it with __popc, and lane 0 of each warp
// adds its warp's total to the counter with one 64-bit atomicAdd at the end.
#include "kernels/cuda/softmax/rung.cuh"
#include "kernels/element.h"

namespace anvil::cuda {
namespace softmax_kernels {

constexpr int kCountThreads = 256;  // whole warps: the ballots need them

// Whole blocks walk the rows together (base is the same for every thread of
// a block), so all 32 lanes reach each __ballot_sync, rows past N voting 0.
// T: float or bfloat16 logits, compared as floats.
template <class T>
__global__ void __launch_bounds__(kCountThreads)
    count_correct_kernel(int64_t N, int64_t C, const T* __restrict__ logits,
                         const int64_t* __restrict__ labels,
                         unsigned long long* __restrict__ counter) {
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  unsigned long long warp_total = 0;
  for (int64_t base = int64_t{blockIdx.x} * blockDim.x; base < N; base += stride) {
    const int64_t row = base + threadIdx.x;
    bool correct = false;
    if (row < N) {
      const T* x = logits + row * C;
      int64_t best = 0;
      float top = load(x[0]);
      for (int64_t j = 1; j < C; ++j) {
        const float v = load(x[j]);
        if (v > top) {
          top = v;
          best = j;
        }
      }
      correct = best == labels[row];
    }
    warp_total += static_cast<unsigned>(__popc(__ballot_sync(kFullMask, correct)));
  }
  if (threadIdx.x % 32 == 0 && warp_total > 0) atomicAdd(counter, warp_total);
}

}  // namespace softmax_kernels

template <class T>
void count_correct(int64_t N, int64_t C, const T* logits, const int64_t* labels,
                   int64_t* counter, cudaStream_t stream) {
  using namespace softmax_kernels;
  softmax_rungs::check_shape("count_correct", N, C);
  if (N == 0) return;
  const int64_t blocks = (N + kCountThreads - 1) / kCountThreads;
  // The int64 counter is added to as unsigned: two's complement makes the sum
  // the same, and CUDA's 64-bit atomicAdd is the unsigned one.
  launch(count_correct_kernel<T>, static_cast<unsigned>(blocks < 1024 ? blocks : 1024),
         dim3(kCountThreads), 0, stream, N, C, logits, labels,
         reinterpret_cast<unsigned long long*>(counter));
}
template void count_correct(int64_t, int64_t, const float*, const int64_t*, int64_t*,
                            cudaStream_t);
template void count_correct(int64_t, int64_t, const bfloat16*, const int64_t*, int64_t*,
                            cudaStream_t);

}  // namespace anvil::cuda
