// Channel-sum rung 01, one block per channel: One 256-thread block per channel
// walks the channel's outer*inner elements as one flat range k (o = k / inner,
// i = k % inner): consecutive threads read consecutive i, coalesced when inner
// is large. The block sum is done as in sum rung 3. The grid is C blocks: 64
// channels fill 64 of an H100's 132 SMs, each thread with one load in flight
// at a time.
//   build/sim/bench_cuda_kernels csum 1
#include "kernels/cuda/reduce/block_sum.cuh"

namespace anvil::cuda {
namespace reduce_kernels {

__global__ void __launch_bounds__(kThreads)
    channel_sum_kernel(int64_t outer, int64_t C, int64_t inner, const float* __restrict__ dy,
                       float* __restrict__ db) {
  __shared__ float warp_sums[kWarps];
  const int64_t c = blockIdx.x, count = outer * inner;
  float acc = 0.0f;
  for (int64_t k = threadIdx.x; k < count; k += kThreads) {
    const int64_t o = k / inner, i = k - o * inner;
    acc += dy[(o * C + c) * inner + i];
  }
  const float total = block_sum(acc, warp_sums);
  if (threadIdx.x == 0) db[c] = total;
}

}  // namespace reduce_kernels

void channel_sum_rungs::block_per_channel(int64_t outer, int64_t C, int64_t inner,
                                          const float* dy, float* db, float*,
                                          cudaStream_t stream) {
  using namespace reduce_kernels;
  launch(channel_sum_kernel, static_cast<unsigned>(C), dim3(kThreads), 0, stream, outer, C,
         inner, dy, db);
}

}  // namespace anvil::cuda
