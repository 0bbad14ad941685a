// Kernels for tests/test_sim_streams.cpp: the simulator's deferred streams and
// its worker threads. Kept out of kernels/cuda (never built by nvcc).
#include <stdexcept>

#include "kernels/cuda/cuda_compat.h"

namespace sim_stream_kernels {

__global__ void fill_value(float* out, int n, float value) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = value;
}

// Each block sums its 64 elements through a __shared__ tile (a per-worker
// static in the simulator) with a barrier per step, and writes the sum.
__global__ void block_sums(const float* in, float* out) {
  __shared__ float tile[64];
  tile[threadIdx.x] = in[blockIdx.x * 64 + threadIdx.x];
  __syncthreads();
  for (int half = 32; half > 0; half /= 2) {
    if (static_cast<int>(threadIdx.x) < half) tile[threadIdx.x] += tile[threadIdx.x + half];
    __syncthreads();
  }
  if (threadIdx.x == 0) out[blockIdx.x] = tile[0];
}

// Every block counts itself in, then waits (up to `patience` polls) until all
// blocks of the grid have come. met[b] says whether block b saw them all: on
// a GPU, or with a worker per block, every block does; with blocks one after
// another, every block but the last gives up.
__global__ void meet_all_blocks(int* arrived, int* met, long patience) {
  atomicAdd(arrived, 1);
  const int all = static_cast<int>(gridDim.x);
  bool seen = false;
  for (long poll = 0; poll < patience && !seen; ++poll) seen = atomicAdd(arrived, 0) >= all;
  met[blockIdx.x] = seen || atomicAdd(arrived, 0) >= all ? 1 : 0;
}

// Broken from block `first_bad` on: half of each such block returns before
// the barrier the other half waits at. The good blocks write 1.
__global__ void fail_from_block(float* out, int first_bad) {
  if (static_cast<int>(blockIdx.x) >= first_bad && threadIdx.x < 16) return;
  __syncthreads();
  if (threadIdx.x == 0) out[blockIdx.x] = 1.0f;
}

// Broken: one CUDA thread throws (possible only in the simulator).
__global__ void throw_in_thread(int block, int thread) {
  if (static_cast<int>(blockIdx.x) == block && static_cast<int>(threadIdx.x) == thread)
    throw std::runtime_error("thrown on purpose");
}

}  // namespace sim_stream_kernels
