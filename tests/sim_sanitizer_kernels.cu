// Kernels for tests/test_sim_sanitizers.cpp, two broken on purpose: the
// sanitizer builds must catch them. Kept out of kernels/cuda (never built by
// nvcc).
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

}  // namespace sim_test_kernels
