// Sum rung 04 (the one that ships), two-pass deterministic: As 3, but each
// block writes its sum to workspace[block] instead of an atomic; a second
// launch of one 256-thread block reduces the partials the same way. Every
// addition happens in an order fixed by n alone (the grid size is a function
// of n), so the result is bitwise the same on every run, and out needs no
// zeroing and no atomics. The second launch costs a few microseconds, nothing
// next to a large vector.
//   build/sim/bench_cuda_kernels sum 4
#include "kernels/cuda/reduce/block_sum.cuh"

namespace anvil::cuda {
namespace reduce_kernels {

// Pass 1: partials[block] = the block's sum.
__global__ void __launch_bounds__(kThreads)
    sum_partials(int64_t n, const float* __restrict__ x, float* __restrict__ partials) {
  __shared__ float warp_sums[kWarps];
  const float total = block_sum(thread_slice_sum(n, x), warp_sums);
  if (threadIdx.x == 0) partials[blockIdx.x] = total;
}

// Pass 2 (one block): out[0] = the sum of the partials.
__global__ void __launch_bounds__(kThreads)
    sum_final(int64_t count, const float* __restrict__ partials, float* out) {
  __shared__ float warp_sums[kWarps];
  const float total = block_sum(thread_slice_sum(count, partials), warp_sums);
  if (threadIdx.x == 0) out[0] = total;
}

}  // namespace reduce_kernels

size_t sum_rungs::two_pass_workspace_floats(int64_t n) {
  return n > 0 ? static_cast<size_t>(reduce_kernels::blocks_for(n)) : 0;
}

void sum_rungs::two_pass(int64_t n, const float* x, float* out, float* workspace,
                         cudaStream_t stream) {
  using namespace reduce_kernels;
  const unsigned blocks = static_cast<unsigned>(blocks_for(n));
  launch(sum_partials, blocks, dim3(kThreads), 0, stream, n, x, workspace);
  launch(sum_final, 1u, dim3(kThreads), 0, stream, int64_t{blocks}, workspace, out);
}

}  // namespace anvil::cuda
