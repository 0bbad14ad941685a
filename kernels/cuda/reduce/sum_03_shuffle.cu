// Sum rung 03, warp shuffles: The same per-thread accumulation, but a warp
// adds its 32 values with five __shfl_down_sync steps: registers move between
// the lanes of a warp without shared memory and without a barrier (a warp
// executes together). Lane 0 of each warp writes its warp's sum to smem[warp]
// (8 floats), one __syncthreads, and warp 0 adds those 8 with shuffles; one
// atomicAdd per block. Eight shared-memory tree steps and their barriers
// become one.
//   build/sim/bench_cuda_kernels sum 3
#include "kernels/cuda/reduce/block_sum.cuh"

namespace anvil::cuda {
namespace reduce_kernels {

__global__ void __launch_bounds__(kThreads)
    sum_shuffle(int64_t n, const float* __restrict__ x, float* out) {
  __shared__ float warp_sums[kWarps];
  const float total = block_sum(thread_slice_sum(n, x), warp_sums);
  if (threadIdx.x == 0) atomicAdd(out, total);
}

}  // namespace reduce_kernels

void sum_rungs::shuffle(int64_t n, const float* x, float* out, float*, cudaStream_t stream) {
  using namespace reduce_kernels;
  launch(sum_shuffle, static_cast<unsigned>(blocks_for(n)), dim3(kThreads), 0, stream, n, x, out);
}

}  // namespace anvil::cuda
