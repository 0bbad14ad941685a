// The tensor-core instructions anvil's kernels use, one function each:
//   mma_m16n8k8_tf32   mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32
//   mma_m16n8k16_bf16  mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32
//   cvt_tf32           float32 to TF32, nearest even (of a float, or of its bits: _bits)
//   pack_bf16x2        cvt.rn.bf16x2.f32 (two floats to bf16, nearest-even)
//   ldmatrix<N, Trans> ldmatrix.sync.aligned.m8n8.xN{.trans}.shared.b16
// and, in the sibling header cp_async.cuh, the asynchronous copies that feed
// them: cp.async.{ca,cg}.shared.global, cp.async.commit_group,
// cp.async.wait_group, cp.async.wait_all.
// Under nvcc (sm_80 and later) each is inline PTX; in the simulator build
// (ANVIL_CUDA_SIM) each calls the emulation (sim/mma_sim.h, core/tf32.h,
// core/bfloat16.h). D = A * B + C with A row-major (m x k), B column-major
// (k x n), C and D float32 (16 x 8). An mma is a collective of the whole
// warp: all 32 lanes, converged, at the same instruction.
//
// Fragment layouts, from the PTX ISA, section 9.7.14.5 (9.7.15.5 in newer
// versions) "Matrix Fragments for mma.m16n8k8" (.tf32) and "Matrix
// Fragments for mma.m16n8k16 with floating point type" (.bf16). With
// g = lane / 4 and t = lane % 4, element (row, col):
//
//   TF32 m16n8k8, one element per 32-bit register:
//     A (16 x 8):  a0 (g, t)    a1 (g+8, t)    a2 (g, t+4)    a3 (g+8, t+4)
//     B (8 x 8):   b0 (k=t, n=g)               b1 (k=t+4, n=g)
//   BF16 m16n8k16, two elements per register along k; the element with the
//   smaller k in the low 16 bits:
//     A (16 x 16): a[0] = (g, 2t)   (g, 2t+1)       a[1] = (g+8, 2t)   (g+8, 2t+1)
//                  a[2] = (g, 2t+8) (g, 2t+9)       a[3] = (g+8, 2t+8) (g+8, 2t+9)
//     B (16 x 8):  b[0] = (k=2t, n=g) (k=2t+1, n=g) b[1] = (k=2t+8, n=g) (k=2t+9, n=g)
//   C and D, float32, both shapes (16 x 8):
//     c0 (g, 2t)   c1 (g, 2t+1)   c2 (g+8, 2t)   c3 (g+8, 2t+1)
//
// The TF32 and BF16 A fragments differ: TF32's a1 is the next row, BF16's
// second register is. A TF32 operand is the top 19 bits of its register: a
// float passed without cvt_tf32 is truncated by the tensor core.
//
// ldmatrix, from the PTX ISA, "Warp-level matrix load instruction:
// ldmatrix": N (1, 2 or 4) 8 x 8 matrices of 16-bit elements, each row 16
// contiguous bytes of shared memory, 16-byte aligned, anywhere. Lanes
// 8i..8i+7 give the addresses of rows 0..7 of matrix i (x1 reads lanes 0-7,
// x2 lanes 0-15; the other lanes' addresses are ignored). Register r[i] of
// lane l receives two elements of matrix i, the first in the low half:
//   without .trans: (row l / 4, cols 2 (l % 4), 2 (l % 4) + 1)
//   with .trans:    (rows 2 (l % 4), 2 (l % 4) + 1, col l / 4), i.e. the
//                   same fragment of the transposed matrix.
// That fragment is the m16n8k16 .bf16 A (and B) fragment's 8 x 8 quarter:
// x4 of A's four quarters (rows 0-7/8-15 x k 0-7/8-15, in a[0..3]'s order)
// is A's fragment; B stored n-major (each n a row of k) gives b[0..1] with
// x2 and no .trans, B stored k-major with .trans.
#pragma once
#include <cstdint>

#include "core/bfloat16.h"
#include "core/tf32.h"
#include "kernels/cuda/cuda_compat.h"
#if !defined(__CUDACC__)
#include <bit>
#include <source_location>

#include "sim/mma_sim.h"
#endif

namespace anvil::cuda::tc {

// In the simulator each call also records where it is, so that lanes at
// different mma call sites (a diverged warp) are told apart.
#if defined(__CUDACC__)
#define ANVIL_MMA_SITE
#define ANVIL_MMA_SITE_ARG
#else
#define ANVIL_MMA_SITE , std::source_location where = std::source_location::current()
#define ANVIL_MMA_SITE_ARG , where
#endif

// D = A * B + C, m16n8k8, TF32 operands (see the layout above). d may be c.
__device__ __forceinline__ void mma_m16n8k8_tf32(float (&d)[4], const uint32_t (&a)[4],
                                                 const uint32_t (&b)[2],
                                                 const float (&c)[4] ANVIL_MMA_SITE) {
#if defined(__CUDACC__)
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%10, %11, %12, %13};\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]),
        "f"(c[2]), "f"(c[3]));
#else
  anvil::sim::mma::mma_sync(anvil::sim::mma::Shape::kM16N8K8Tf32, a, b, c, d ANVIL_MMA_SITE_ARG);
#endif
}

// D = A * B + C, m16n8k16, BF16 operands packed two per register (see the
// layout above; pack_bf16x2 makes a register). d may be c.
__device__ __forceinline__ void mma_m16n8k16_bf16(float (&d)[4], const uint32_t (&a)[4],
                                                  const uint32_t (&b)[2],
                                                  const float (&c)[4] ANVIL_MMA_SITE) {
#if defined(__CUDACC__)
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%10, %11, %12, %13};\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]),
        "f"(c[2]), "f"(c[3]));
#else
  anvil::sim::mma::mma_sync(anvil::sim::mma::Shape::kM16N8K16Bf16, a, b, c, d ANVIL_MMA_SITE_ARG);
#endif
}

// ldmatrix.sync.aligned.m8n8.xN{.trans}.shared.b16 into d[0..N-1]: `row`
// is this lane's row address (see above; a generic pointer into shared
// memory, 16-byte aligned, read only from the lanes that supply one).
template <int N, bool Trans>
__device__ __forceinline__ void ldmatrix(uint32_t (&d)[N], const void* row ANVIL_MMA_SITE) {
  static_assert(N == 1 || N == 2 || N == 4, "ldmatrix loads 1, 2 or 4 matrices");
#if defined(__CUDACC__)
  const unsigned p = static_cast<unsigned>(__cvta_generic_to_shared(row));
  if constexpr (N == 1 && !Trans)
    asm volatile("ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%0}, [%1];\n" : "=r"(d[0]) : "r"(p));
  else if constexpr (N == 1)
    asm volatile("ldmatrix.sync.aligned.m8n8.x1.trans.shared.b16 {%0}, [%1];\n"
                 : "=r"(d[0]) : "r"(p));
  else if constexpr (N == 2 && !Trans)
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
                 : "=r"(d[0]), "=r"(d[1]) : "r"(p));
  else if constexpr (N == 2)
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n"
                 : "=r"(d[0]), "=r"(d[1]) : "r"(p));
  else if constexpr (!Trans)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3]) : "r"(p));
  else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3]) : "r"(p));
#else
  anvil::sim::mma::ldmatrix_sync(N, Trans, row, d ANVIL_MMA_SITE_ARG);
#endif
}

#undef ANVIL_MMA_SITE
#undef ANVIL_MMA_SITE_ARG

// x rounded to TF32 (nearest, ties to even: core/tf32.h), as a TF32 operand
// register: 13 low bits zero. Inf stays Inf, a NaN stays a NaN.
//   sm_90   cvt.rn.tf32.f32, one instruction (F2FP.TF32.F32)
//   sm_80   no cvt.rn.tf32 (its ISA has only cvt.rna, ties away): the same
//           rounding in integer instructions, four (FSETP, LOP3, LEA.HI,
//           IADD3; ptxas drops the AND when an mma reads the register, as
//           it does for cvt.rna's). A NaN keeps its bits there, so one whose
//           payload lies only in the 13 low bits (no arithmetic makes one)
//           would read as Inf.
//   simulator  core/tf32.h's float_to_tf32_bits
__device__ __forceinline__ uint32_t cvt_tf32(float x) {
#if defined(__CUDACC__) && __CUDA_ARCH__ >= 900
  uint32_t r;
  asm("cvt.rn.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
  return r;
#elif defined(__CUDACC__)
  const uint32_t u = __float_as_uint(x);
  const uint32_t r = fabsf(x) < __int_as_float(0x7f800000) ? u + 0xfffu + ((u & 0x2000u) >> 13) : u;
  return r & anvil::kTf32Mask;
#else
  return anvil::float_to_tf32_bits(x);
#endif
}

// The same, of a register holding a float's bits (as ldmatrix loads them).
__device__ __forceinline__ uint32_t cvt_tf32_bits(uint32_t bits) {
#if defined(__CUDACC__)
  return cvt_tf32(__uint_as_float(bits));
#else
  return anvil::float_to_tf32_bits(std::bit_cast<float>(bits));
#endif
}

// Two floats rounded to bf16 (nearest, ties to even) in one register: `lo`
// in the low 16 bits (the element with the smaller k), `hi` in the high.
// Bit-exact with __float2bfloat16_rn for every number; a NaN stays NaN
// (quiet, its payload bits may differ between the GPU and the simulator).
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
#if defined(__CUDACC__)
  uint32_t r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));  // first source: high half
  return r;
#else
  return uint32_t(anvil::float_to_bf16_bits(lo)) | uint32_t(anvil::float_to_bf16_bits(hi)) << 16;
#endif
}

}  // namespace anvil::cuda::tc
