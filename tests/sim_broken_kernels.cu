// Kernels for the simulator's own tests, some broken on purpose. Kept out of
// kernels/cuda (never built by nvcc); included by test_sim.cpp.
#include "kernels/cuda/cuda_compat.h"

namespace sim_test_kernels {

// Broken: only half of the block reaches the barrier, the rest return.
// On a GPU this is undefined behaviour (often a hang).
__global__ void divergent_sync(float* out) {
  if (threadIdx.x < 16) {
    __syncthreads();
    out[threadIdx.x] = 1.0f;
  }
}

// Broken: reads dynamic shared memory that no thread has written.
__global__ void read_uninitialised_shared(float* out) {
  float* smem = anvil::cuda::dynamic_shared<float>();
  out[threadIdx.x] = smem[threadIdx.x];
}

// Correct: reverses a block's slice through dynamic shared memory.
__global__ void reverse_through_shared(const float* in, float* out, int n) {
  float* smem = anvil::cuda::dynamic_shared<float>();
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  smem[threadIdx.x] = i < n ? in[i] : 0.0f;
  __syncthreads();
  int base = blockIdx.x * blockDim.x;
  int count = min(static_cast<int>(blockDim.x), n - base);  // the last block may be partial
  if (static_cast<int>(threadIdx.x) < count) out[base + count - 1 - threadIdx.x] = smem[threadIdx.x];
}

// Correct: the block fills n floats of dynamic shared memory with ones and
// thread 0 writes their sum (n, if all n are there).
__global__ void sum_dynamic_shared(float* out, int n) {
  float* smem = anvil::cuda::dynamic_shared<float>();
  for (int i = int(threadIdx.x); i < n; i += int(blockDim.x)) smem[i] = 1.0f;
  __syncthreads();
  if (threadIdx.x == 0) {
    float sum = 0.0f;
    for (int i = 0; i < n; ++i) sum += smem[i];
    out[0] = sum;
  }
}

// Correct: every thread of a 3D grid of 3D blocks counts itself.
__global__ void count_threads(int* counter, float* sum) {
  atomicAdd(counter, 1);
  atomicAdd(sum, 0.5f);
}

}  // namespace sim_test_kernels
