// Kernels for the simulator's warp tests (test_sim_warp.cpp), the first ones
// correct, the last ones broken on purpose. Kept out of kernels/cuda (never
// built by nvcc); included by test_sim_warp.cpp. Lanes are linear thread ids
// mod 32, so a 40-thread block has a full warp and a warp of 8 lanes.
#include "kernels/cuda/cuda_compat.h"

namespace sim_warp_kernels {

__device__ __forceinline__ unsigned linear_tid() {
  return threadIdx.x + threadIdx.y * blockDim.x + threadIdx.z * blockDim.x * blockDim.y;
}

// The lanes of this thread's warp that exist in the block.
__device__ __forceinline__ unsigned existing_lanes() {
  const unsigned threads = blockDim.x * blockDim.y * blockDim.z;
  const unsigned count = min(32u, threads - linear_tid() / 32 * 32);
  return count == 32 ? 0xffffffffu : (1u << count) - 1;
}

// Correct: out[tid] = the shuffle `op` (0 idx, 1 up, 2 down, 3 xor) of
// in[tid] for the lanes in `mask`; the others copy their input.
__global__ void shuffle_lanes(const int* in, int* out, int op, int arg, int width, unsigned mask) {
  const unsigned tid = linear_tid(), lane = tid % 32;
  int v = in[tid];
  if (mask >> lane & 1u) {
    if (op == 0) v = __shfl_sync(mask, v, arg, width);
    if (op == 1) v = __shfl_up_sync(mask, v, static_cast<unsigned>(arg), width);
    if (op == 2) v = __shfl_down_sync(mask, v, static_cast<unsigned>(arg), width);
    if (op == 3) v = __shfl_xor_sync(mask, v, arg, width);
  }
  out[tid] = v;
}

// Correct: per warp, the sum of its lanes' inputs by a __shfl_down_sync
// tree, written by lane 0; a partial warp skips partners it does not have.
__global__ void warp_sum_down(const float* in, float* out) {
  const unsigned tid = linear_tid(), lane = tid % 32;
  const unsigned mask = existing_lanes();
  const unsigned count = static_cast<unsigned>(__popc(mask));
  float v = in[tid];
  for (unsigned offset = 16; offset > 0; offset /= 2) {
    const float other = __shfl_down_sync(mask, v, offset);
    if (lane + offset < count) v += other;
  }
  if (lane == 0) out[tid / 32] = v;
}

// Correct: every lane gets the sum of its segment of `width` lanes by an
// xor butterfly (the segments must exist whole).
__global__ void segment_sum_xor(const float* in, float* out, int width) {
  const unsigned tid = linear_tid();
  float v = in[tid];
  for (int offset = width / 2; offset > 0; offset /= 2)
    v += __shfl_xor_sync(0xffffffffu, v, offset, width);
  out[tid] = v;
}

// Correct: inclusive prefix sums within segments of `width` lanes
// (Hillis-Steele with __shfl_up_sync).
__global__ void segment_scan_up(const int* in, int* out, int width) {
  const unsigned tid = linear_tid(), lane = tid % 32;
  const unsigned mask = existing_lanes();
  int v = in[tid];
  for (int offset = 1; offset < width; offset *= 2) {
    const int other = __shfl_up_sync(mask, v, static_cast<unsigned>(offset), width);
    if (static_cast<int>(lane) % width >= offset) v += other;
  }
  out[tid] = v;
}

// Correct: every lane gets lane 7's value (of its segment of `width`), as an
// 8-byte type.
__global__ void broadcast_lane7(const double* in, double* out, int width) {
  const unsigned tid = linear_tid();
  out[tid] = __shfl_sync(existing_lanes(), in[tid], 7, width);
}

// Correct: the votes of every lane on in[tid] != 0, with the full mask
// (lanes the block does not have take no part).
__global__ void votes(const int* in, unsigned* ballot, int* any, int* all, unsigned* active) {
  const unsigned tid = linear_tid();
  const int p = in[tid];
  ballot[tid] = __ballot_sync(0xffffffffu, p);
  any[tid] = __any_sync(0xffffffffu, p);
  all[tid] = __all_sync(0xffffffffu, p);
  __syncwarp();
  active[tid] = __activemask();
}

// Correct: the two half-warps shuffle apart, each with a mask of its own
// lanes (disjoint masks are legal), then meet at __syncwarp.
__global__ void disjoint_half_warps(const int* in, int* out) {
  const unsigned tid = linear_tid(), lane = tid % 32;
  int v = in[tid];
  if (lane < 16)
    v = __shfl_sync(0x0000ffffu, v, 0);
  else
    v = __shfl_sync(0xffff0000u, v, 16);
  __syncwarp();
  out[tid] = v;
}

// Broken: half of the warp returns, the other half shuffles with a mask
// naming every lane.
__global__ void shuffle_after_return(float* out) {
  const unsigned lane = threadIdx.x % 32;
  if (lane >= 16) return;
  out[threadIdx.x] = __shfl_sync(0xffffffffu, 1.0f, 0);
}

// Broken: half of the warp shuffles while the other half waits at
// __syncthreads.
__global__ void shuffle_against_syncthreads(float* out) {
  const unsigned lane = threadIdx.x % 32;
  float v = 1.0f;
  if (lane < 16)
    v = __shfl_xor_sync(0xffffffffu, v, 1);
  else
    __syncthreads();
  out[threadIdx.x] = v;
}

// Broken: lanes of one warp in collectives whose masks overlap but differ.
__global__ void mismatched_masks(float* out) {
  const unsigned lane = threadIdx.x % 32;
  const unsigned mask = lane < 16 ? 0xffffffffu : 0xffff0000u;
  out[threadIdx.x] = __shfl_sync(mask, 1.0f, 0);
}

// Broken: a mask that does not name the calling lane.
__global__ void mask_without_self(float* out) {
  out[threadIdx.x] = __shfl_sync(0x1u, 1.0f, 0);
}

// Broken: the same mask, different collectives.
__global__ void mismatched_ops(float* out) {
  const unsigned lane = threadIdx.x % 32;
  if (lane < 16)
    out[threadIdx.x] = static_cast<float>(__ballot_sync(0xffffffffu, 1));
  else
    out[threadIdx.x] = __shfl_sync(0xffffffffu, 1.0f, 0);
}

// Broken: a width that is not a power of two.
__global__ void bad_width(float* out) {
  out[threadIdx.x] = __shfl_down_sync(0xffffffffu, 1.0f, 1, 12);
}

}  // namespace sim_warp_kernels
