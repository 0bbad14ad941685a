// Kernels for tests/test_sim_sanitizers.cpp, some broken on purpose: the
// sanitizer builds must catch them. Kept out of kernels/cuda (never built by
// nvcc).
#include "kernels/cuda/cp_async.cuh"
#include "kernels/cuda/cuda_compat.h"

namespace sim_test_kernels {

// Broken: `i <= n` reads in[n], one element past the end of a cudaMalloc block
// of n floats. AddressSanitizer must report a heap-buffer-overflow here.
__global__ void read_one_past_the_end(const float* in, float* out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i <= n) out[i] = in[i];
}

// Broken: the block writes a shared tile and reads another thread's element
// without __syncthreads in between. ThreadSanitizer must report a data race.
__global__ void missing_syncthreads(const float* in, float* out) {
  __shared__ float tile[64];
  tile[threadIdx.x] = in[threadIdx.x];
  out[threadIdx.x] = tile[63 - threadIdx.x];
}

// Correct: the same with the barrier, which must not be reported.
__global__ void with_syncthreads(const float* in, float* out) {
  __shared__ float tile[64];
  tile[threadIdx.x] = in[threadIdx.x];
  __syncthreads();
  out[threadIdx.x] = tile[63 - threadIdx.x];
}

// Broken: each thread copies its element to shared memory with cp.async and
// waits for it, then reads another thread's copy without a __syncthreads:
// that copy is the other thread's write, made at its wait (sim/
// cp_async_sim.h). ThreadSanitizer must report a data race.
__global__ void cp_async_missing_syncthreads(const float* in, float* out) {
  alignas(16) __shared__ float tile[64];
  anvil::cuda::cp_async::copy_ca<4>(&tile[threadIdx.x], &in[threadIdx.x]);
  anvil::cuda::cp_async::wait_all();
  out[threadIdx.x] = tile[63 - threadIdx.x];
}

// Correct: the same with the barrier after the wait.
__global__ void cp_async_with_syncthreads(const float* in, float* out) {
  alignas(16) __shared__ float tile[64];
  anvil::cuda::cp_async::copy_ca<4>(&tile[threadIdx.x], &in[threadIdx.x]);
  anvil::cuda::cp_async::wait_all();
  __syncthreads();
  out[threadIdx.x] = tile[63 - threadIdx.x];
}

// Broken: lanes of one warp exchange through shared memory with no
// __syncwarp. (A shuffle would move the value without shared memory.)
__global__ void missing_syncwarp(const float* in, float* out) {
  __shared__ float lanes[32];
  lanes[threadIdx.x] = in[threadIdx.x];
  out[threadIdx.x] = lanes[31 - threadIdx.x];
}

// Correct: __syncwarp orders the warp's shared-memory accesses.
__global__ void with_syncwarp(const float* in, float* out) {
  __shared__ float lanes[32];
  lanes[threadIdx.x] = in[threadIdx.x];
  __syncwarp();
  out[threadIdx.x] = lanes[31 - threadIdx.x];
}

// Each block counts itself in and waits (polling a relaxed atomic, which
// orders nothing) until every block of the grid has come: so the blocks run
// at the same time, on different worker threads.
__device__ void wait_for_all_blocks(int* arrived) {
  atomicAdd(arrived, 1);
  const int all = static_cast<int>(gridDim.x);
  for (long poll = 0; poll < (1L << 40) && atomicAdd(arrived, 0) < all; ++poll) {
  }
}

// Broken: two blocks write one global element without an atomic.
// ThreadSanitizer must report a data race between the worker threads.
__global__ void blocks_write_one_element(int* arrived, float* out) {
  wait_for_all_blocks(arrived);
  out[0] = static_cast<float>(blockIdx.x);
}

// Correct: the same with atomicAdd, which must not be reported.
__global__ void blocks_add_atomically(int* arrived, float* out) {
  wait_for_all_blocks(arrived);
  atomicAdd(out, 1.0f);
}

}  // namespace sim_test_kernels
