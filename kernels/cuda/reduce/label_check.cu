// label_min_max(n, labels, out): one block of 256 threads (labels are a
// batch, a few thousand at most), each thread keeping the min and max of its
// strided slice, then warp shuffles of the int64 values (__shfl_xor_sync
// moves 8-byte types) and a shared-memory step across the 8 warps.
#include <stdexcept>
#include <string>

#include "kernels/cuda/reduce/block_sum.cuh"

namespace anvil::cuda {
namespace reduce_kernels {

__global__ void __launch_bounds__(kThreads)
    label_min_max_kernel(int64_t n, const int64_t* __restrict__ labels, int64_t* __restrict__ out) {
  __shared__ int64_t warp_min[kWarps], warp_max[kWarps];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  int64_t lo = labels[0], hi = labels[0];  // n >= 1; a neutral start for idle threads
  for (int64_t i = threadIdx.x; i < n; i += kThreads) {
    const int64_t v = labels[i];
    lo = v < lo ? v : lo;
    hi = v > hi ? v : hi;
  }
  for (int offset = 16; offset > 0; offset /= 2) {
    const int64_t other_lo = __shfl_xor_sync(kFullMask, lo, offset);
    const int64_t other_hi = __shfl_xor_sync(kFullMask, hi, offset);
    lo = other_lo < lo ? other_lo : lo;
    hi = other_hi > hi ? other_hi : hi;
  }
  if (lane == 0) warp_min[warp] = lo, warp_max[warp] = hi;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kWarps; ++w) {
      lo = warp_min[w] < lo ? warp_min[w] : lo;
      hi = warp_max[w] > hi ? warp_max[w] : hi;
    }
    out[0] = lo;
    out[1] = hi;
  }
}

}  // namespace reduce_kernels

void label_min_max(int64_t n, const int64_t* labels, int64_t* out, cudaStream_t stream) {
  using namespace reduce_kernels;
  if (n < 1)
    throw std::invalid_argument("cuda::label_min_max: n = " + std::to_string(n) +
                                " (needs n >= 1)");
  launch(label_min_max_kernel, 1u, dim3(kThreads), 0, stream, n, labels, out);
}

}  // namespace anvil::cuda
