// Kernels for the tensor-core tests (test_mma.cpp): the first ones correct,
// the last ones broken on purpose. Kept out of kernels/cuda; included by
// test_mma.cpp in the simulator build.
#include "kernels/cuda/mma.cuh"

namespace sim_mma_kernels {

using anvil::cuda::tc::cvt_tf32;
using anvil::cuda::tc::mma_m16n8k16_bf16;
using anvil::cuda::tc::mma_m16n8k8_tf32;
using anvil::cuda::tc::pack_bf16x2;

// Correct: warp w of the grid runs one mma on registers the host prepared:
// lane l's A registers are a[(w * 32 + l) * 4 + 0..3], B's b[(w * 32 + l) * 2
// + 0..1], C's c[(w * 32 + l) * 4 + 0..3]; D goes to d likewise. bf16 picks
// the shape (the same for every lane).
__global__ void registers_mma(const uint32_t* a, const uint32_t* b, const float* c, float* d,
                              int bf16) {
  const unsigned id = blockIdx.x * blockDim.x + threadIdx.x;
  const uint32_t ar[4] = {a[id * 4], a[id * 4 + 1], a[id * 4 + 2], a[id * 4 + 3]};
  const uint32_t br[2] = {b[id * 2], b[id * 2 + 1]};
  const float cr[4] = {c[id * 4], c[id * 4 + 1], c[id * 4 + 2], c[id * 4 + 3]};
  float dr[4];
  if (bf16)
    mma_m16n8k16_bf16(dr, ar, br, cr);
  else
    mma_m16n8k8_tf32(dr, ar, br, cr);
  for (int i = 0; i < 4; ++i) d[id * 4 + i] = dr[i];
}

// Correct: one warp computes D (16 x 8) = A (16 x k) * B (k x 8) + C, all
// row-major float32, in steps of 8 along k: each lane loads its fragments by
// the PTX ISA's m16n8k8 .tf32 layout (g = lane / 4, t = lane % 4), rounds
// them with tc::cvt_tf32, and accumulates in place (D is C).
__global__ void tf32_tile(const float* A, const float* B, const float* C, float* D, int k) {
  const int lane = static_cast<int>(threadIdx.x), g = lane / 4, t = lane % 4;
  float acc[4] = {C[g * 8 + 2 * t], C[g * 8 + 2 * t + 1], C[(g + 8) * 8 + 2 * t],
                  C[(g + 8) * 8 + 2 * t + 1]};
  for (int k0 = 0; k0 < k; k0 += 8) {
    const uint32_t a[4] = {cvt_tf32(A[g * k + k0 + t]), cvt_tf32(A[(g + 8) * k + k0 + t]),
                           cvt_tf32(A[g * k + k0 + t + 4]),
                           cvt_tf32(A[(g + 8) * k + k0 + t + 4])};
    const uint32_t b[2] = {cvt_tf32(B[(k0 + t) * 8 + g]),
                           cvt_tf32(B[(k0 + t + 4) * 8 + g])};
    mma_m16n8k8_tf32(acc, a, b, acc);
  }
  D[g * 8 + 2 * t] = acc[0];
  D[g * 8 + 2 * t + 1] = acc[1];
  D[(g + 8) * 8 + 2 * t] = acc[2];
  D[(g + 8) * 8 + 2 * t + 1] = acc[3];
}

// Correct: the same with BF16 operands, steps of 16 along k, by the PTX
// ISA's m16n8k16 .bf16 layout (two elements per register along k, the
// smaller k in the low half).
__global__ void bf16_tile(const float* A, const float* B, const float* C, float* D, int k) {
  const int lane = static_cast<int>(threadIdx.x), g = lane / 4, t = lane % 4;
  float acc[4] = {C[g * 8 + 2 * t], C[g * 8 + 2 * t + 1], C[(g + 8) * 8 + 2 * t],
                  C[(g + 8) * 8 + 2 * t + 1]};
  for (int k0 = 0; k0 < k; k0 += 16) {
    const float* a0 = A + g * k + k0 + 2 * t;  // row g, columns 2t, 2t+1
    const float* a8 = a0 + 8 * k;              // row g + 8
    const uint32_t a[4] = {pack_bf16x2(a0[0], a0[1]), pack_bf16x2(a8[0], a8[1]),
                           pack_bf16x2(a0[8], a0[9]), pack_bf16x2(a8[8], a8[9])};
    const float* b0 = B + (k0 + 2 * t) * 8 + g;  // rows 2t, 2t+1 of column g
    const uint32_t b[2] = {pack_bf16x2(b0[0], b0[8]), pack_bf16x2(b0[64], b0[72])};
    mma_m16n8k16_bf16(acc, a, b, acc);
  }
  D[g * 8 + 2 * t] = acc[0];
  D[g * 8 + 2 * t + 1] = acc[1];
  D[(g + 8) * 8 + 2 * t] = acc[2];
  D[(g + 8) * 8 + 2 * t + 1] = acc[3];
}

// Broken: launched with 48 threads, the second warp has 16 lanes.
__global__ void mma_partial_warp(float* out) {
  const uint32_t a[4] = {}, b[2] = {};
  float c[4] = {};
  mma_m16n8k8_tf32(c, a, b, c);
  out[threadIdx.x] = c[0];
}

// Broken: lanes 0-15 and 16-31 reach two different mma instructions.
__global__ void mma_diverged(float* out) {
  const uint32_t a[4] = {}, b[2] = {};
  float c[4] = {};
  if (threadIdx.x % 32 < 16)
    mma_m16n8k8_tf32(c, a, b, c);
  else
    mma_m16n8k8_tf32(c, a, b, c);
  out[threadIdx.x] = c[0];
}

// Broken: lanes 8-31 have returned when lanes 0-7 reach the mma.
__global__ void mma_after_return(float* out) {
  if (threadIdx.x % 32 >= 8) return;
  const uint32_t a[4] = {}, b[2] = {};
  float c[4] = {};
  mma_m16n8k8_tf32(c, a, b, c);
  out[threadIdx.x] = c[0];
}

// Broken: half of the warp in a TF32 mma, half in a BF16 one.
__global__ void mma_mixed_shapes(float* out) {
  const uint32_t a[4] = {}, b[2] = {};
  float c[4] = {};
  if (threadIdx.x % 32 < 16)
    mma_m16n8k8_tf32(c, a, b, c);
  else
    mma_m16n8k16_bf16(c, a, b, c);
  out[threadIdx.x] = c[0];
}

}  // namespace sim_mma_kernels
