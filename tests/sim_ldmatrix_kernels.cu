// Kernels for the ldmatrix tests (test_ldmatrix.cpp): the first one correct,
// the others broken on purpose. Kept out of kernels/cuda; included by
// test_ldmatrix.cpp in the simulator build.
#include "kernels/cuda/mma.cuh"

namespace sim_ldmatrix_kernels {

using anvil::cuda::tc::ldmatrix;

constexpr int kSlots = 64;  // rows of 16 bytes in shared memory

template <int N, bool Trans>
__device__ void load(const uint16_t* row, uint32_t* out) {
  uint32_t d[N];
  ldmatrix<N, Trans>(d, row);
  for (int i = 0; i < N; ++i) out[i] = d[i];
}

// Correct: one warp copies src (kSlots rows of 8 elements) to shared
// memory, then runs ldmatrix.x`count` (.trans if trans) with lane l giving
// the address of row slot[l]; lanes that give no address for the variant
// pass a misaligned one, which must be ignored. Lane l's registers go to
// out[4 l ..].
__global__ void ldmatrix_rows(const uint16_t* src, const int* slot, uint32_t* out, int count,
                              int trans) {
  alignas(16) __shared__ uint16_t tile[kSlots * 8];
  const int lane = int(threadIdx.x);
  for (int i = lane; i < kSlots * 8; i += 32) tile[i] = src[i];
  __syncthreads();
  const uint16_t* row = lane < 8 * count ? tile + 8 * slot[lane] : tile + 1;
  uint32_t* o = out + 4 * lane;
  if (count == 1) trans ? load<1, true>(row, o) : load<1, false>(row, o);
  if (count == 2) trans ? load<2, true>(row, o) : load<2, false>(row, o);
  if (count == 4) trans ? load<4, true>(row, o) : load<4, false>(row, o);
}

// Broken: lanes 0-15 and 16-31 at two different ldmatrix instructions.
__global__ void ldmatrix_diverged(uint32_t* out) {
  alignas(16) __shared__ uint16_t tile[32 * 8];
  uint32_t d[4] = {};
  const uint16_t* row = tile + 8 * threadIdx.x;
  if (threadIdx.x % 32 < 16)
    ldmatrix<4, false>(d, row);
  else
    ldmatrix<4, false>(d, row);
  out[threadIdx.x] = d[0];
}

// Broken: half of the warp in ldmatrix.x4, half in .x4.trans, at one call
// site (a lane-dependent variant).
template <bool Trans>
__device__ void load4(uint32_t (&d)[4], const uint16_t* row) {
  ldmatrix<4, Trans>(d, row);
}
__global__ void ldmatrix_mixed(uint32_t* out) {
  alignas(16) __shared__ uint16_t tile[32 * 8];
  uint32_t d[4] = {};
  const uint16_t* row = tile + 8 * threadIdx.x;
  if (threadIdx.x % 32 < 16)
    load4<false>(d, row);
  else
    load4<true>(d, row);
  out[threadIdx.x] = d[0];
}

// Broken: launched with 48 threads, the second warp has 16 lanes.
__global__ void ldmatrix_partial_warp(uint32_t* out) {
  alignas(16) __shared__ uint16_t tile[64 * 8];
  uint32_t d[1] = {};
  ldmatrix<1, false>(d, tile + 8 * (threadIdx.x % 8));
  out[threadIdx.x] = d[0];
}

// Broken: lane 5 gives a row address 2 bytes past a 16-byte boundary.
__global__ void ldmatrix_unaligned(uint32_t* out) {
  alignas(16) __shared__ uint16_t tile[33 * 8];
  uint32_t d[4] = {};
  ldmatrix<4, false>(d, tile + 8 * threadIdx.x + (threadIdx.x == 5 ? 1 : 0));
  out[threadIdx.x] = d[0];
}

}  // namespace sim_ldmatrix_kernels
