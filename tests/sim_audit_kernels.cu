// Kernels for tests/test_sim_launch_audit.cpp: launches whose predicted SM
// utilisation is known, and blocks that say they ran. Kept out of kernels/cuda (never built by nvcc).
#include "kernels/cuda/cuda_compat.h"

namespace sim_audit_kernels {

// The same serial arithmetic in every thread of every block, so that every
// block takes about the same time; block b writes out[b].
__global__ void equal_blocks(float* out, int iterations) {
  float v = static_cast<float>(threadIdx.x);
  for (int i = 0; i < iterations; ++i) v = v * 0.999f + 1.0f;
  if (threadIdx.x == 0) out[blockIdx.x] = v;
}

// The same work launched as a single block (its own kernel, so that the
// audit gives it its own row): the GPU's other SMs would idle.
__global__ void lone_block(float* out, int iterations) {
  float v = static_cast<float>(threadIdx.x) + 0.5f;
  for (int i = 0; i < iterations; ++i) v = v * 0.999f + 1.0f;
  if (threadIdx.x == 0) out[0] = v;
}

// Block (x, y, z) writes its linear number + 1 to out[that number]: which
// blocks ran (tests/test_sim_launch_audit.cpp's BlockFilter case).
__global__ void mark_blocks(float* out) {
  const unsigned b = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  if (threadIdx.x == 0) out[b] = static_cast<float>(b + 1);
}

// The same, under another name (a kernel the filter does not name).
__global__ void mark_all_blocks(float* out) {
  const unsigned b = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  if (threadIdx.x == 0) out[b] = static_cast<float>(b + 1);
}

}  // namespace sim_audit_kernels
