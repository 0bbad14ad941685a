// Sum rung 02, shared-memory tree: 256 threads per block. Each thread first
// adds up its grid-stride slice of x in a register (x[i], x[i + 256*grid],
// ...), so the number of partial sums is the number of threads in the grid,
// not n. The block then halves its 256 partials in shared memory, smem[t] +=
// smem[t + s] for s = 128, 64, ..., 1, with a __syncthreads after each step,
// and thread 0 issues one atomicAdd per block: atomics drop from n to the grid
// size.
//   build/sim/bench_cuda_kernels sum 2
#include "kernels/cuda/reduce/block_sum.cuh"

namespace anvil::cuda {
namespace reduce_kernels {

__global__ void __launch_bounds__(kThreads)
    sum_tree(int64_t n, const float* __restrict__ x, float* out) {
  __shared__ float partial[kThreads];
  const int t = threadIdx.x;
  partial[t] = thread_slice_sum(n, x);
  __syncthreads();
  for (int s = kThreads / 2; s > 0; s /= 2) {
    if (t < s) partial[t] += partial[t + s];
    __syncthreads();
  }
  if (t == 0) atomicAdd(out, partial[0]);
}

}  // namespace reduce_kernels

void sum_rungs::tree(int64_t n, const float* x, float* out, float*, cudaStream_t stream) {
  using namespace reduce_kernels;
  launch(sum_tree, static_cast<unsigned>(blocks_for(n)), dim3(kThreads), 0, stream, n, x, out);
}

}  // namespace anvil::cuda
