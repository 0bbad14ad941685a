// Sum rung 01, atomic: One thread per element (grid-stride when n is larger
// than the grid), each doing atomicAdd(out, x[i]). Loads are coalesced, but
// every atomic lands on the same address, so the memory system performs them
// one after another: n serialised read-modify-writes. The result depends on
// their order.
//   build/sim/bench_cuda_kernels sum 1
#include "kernels/cuda/reduce/block_sum.cuh"

namespace anvil::cuda {
namespace reduce_kernels {

__global__ void __launch_bounds__(kThreads)
    sum_atomic(int64_t n, const float* __restrict__ x, float* out) {
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += stride)
    atomicAdd(out, x[i]);
}

}  // namespace reduce_kernels

void sum_rungs::atomic(int64_t n, const float* x, float* out, float*, cudaStream_t stream) {
  using namespace reduce_kernels;
  const int64_t b = (n + kThreads - 1) / kThreads;  // up to one element per thread
  launch(sum_atomic, static_cast<unsigned>(b < 65536 ? b : 65536), dim3(kThreads), 0, stream, n,
         x, out);
}

}  // namespace anvil::cuda
