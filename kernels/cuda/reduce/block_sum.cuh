// What the reductions share: 256-thread blocks, a warp's sum by shuffles, a
// block's sum through 8 floats of shared memory, and a thread's grid-stride
// slice summed in a register.
#pragma once
#include <cstdint>

#include "kernels/cuda/cuda_compat.h"
#include "kernels/cuda/reduce/reduce.h"

namespace anvil::cuda::reduce_kernels {

constexpr int kThreads = 256;  // every kernel here: 8 full warps
constexpr int kWarps = kThreads / 32;
constexpr int64_t kMaxBlocks = 1024;
constexpr unsigned kFullMask = 0xffffffffu;

// The sum of the warp's 32 values, in lane 0 (the other lanes hold partials).
__device__ __forceinline__ float warp_sum(float v) {
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_down_sync(kFullMask, v, offset);
  return v;
}

// The sum of v over the block (kThreads threads), valid in thread 0.
// warp_sums: kWarps floats of shared memory, not in use by anyone else.
__device__ __forceinline__ float block_sum(float v, float* warp_sums) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  v = warp_sum(v);
  if (lane == 0) warp_sums[warp] = v;
  __syncthreads();
  v = 0.0f;
  if (warp == 0) v = warp_sum(lane < kWarps ? warp_sums[lane] : 0.0f);
  return v;
}

// This thread's grid-stride slice of x, summed in a register.
__device__ __forceinline__ float thread_slice_sum(int64_t n, const float* __restrict__ x) {
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  float acc = 0.0f;
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += stride) acc += x[i];
  return acc;
}

// Blocks for a grid-stride pass over n elements (n > 0).
inline int64_t blocks_for(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return b < kMaxBlocks ? b : kMaxBlocks;
}

}  // namespace anvil::cuda::reduce_kernels
