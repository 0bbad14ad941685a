// The multistage mainloop of the BF16 tensor-core rungs (GEMM rung 12,
// convolution rung 08): kStages stages of 32 of k in shared memory, filled
// by cp.async kStages - 1 steps ahead of the mma, the fragments loaded by
// ldmatrix from XOR-swizzled rows. 12_bf16_pipelined.cu explains the
// fragment mapping, the layout and why every ldmatrix and every 16-byte
// store is free of bank conflicts; 08_bf16_multistage.cu the conv operands.
//
// The mainloop knows nothing of where an operand lies in global memory:
// each operand comes through an iterator (as CUTLASS separates MmaMultistage
// from its tile iterators), one per thread and operand, with
//   using L                  Layout<kAlongJ, BJ>: the operand's stage
//   static constexpr bool kAlongJ   stored contiguous along j (else along k)
//   void copy(uint16_t* stage) const   this thread's cp.async of the current
//                            k-step into `stage`, zeros outside the operand
//                            (src-size short of 16, or 0); nothing committed
//   void advance()           on to the next k-step
// The mainloop calls copy, then advance, once per k-step in order, so an
// iterator precomputes its addresses and masks once and steps them with
// additions: no division or modulo in the loop (GEMM: mma_ldmatrix.cuh's
// iterator; convolutions: conv/implicit_nhwc.cuh's).
#pragma once
#include <cstdint>

#include "kernels/cuda/cp_async.cuh"
#include "kernels/cuda/cuda_compat.h"
#include "kernels/cuda/gemm/mma_tile.cuh"
#include "kernels/cuda/mma.cuh"

namespace anvil::cuda::multistage {

constexpr int kBK = 32;  // k per stage: two m16n8k16

// One operand's stage in shared memory: 16-byte chunks of 8 elements along
// the contiguous index, in rows of the other one, each row's chunks XOR-
// swizzled (12_bf16_pipelined.cu draws it).
//   AlongJ (contiguous along j): kBK rows k of BJ elements (BJ / 8 chunks);
//     chunk j / 8 of row k at (j / 8) ^ (k % 8).
//   otherwise: BJ rows j of kBK elements (4 chunks); chunk k / 8 of row j
//     at (k / 8) ^ (j / 2 % 4).
template <bool AlongJ, int BJ>
struct Layout {
  static constexpr int kElems = BJ * kBK;
  static constexpr int kChunks = kElems / 8;
  // The element offset of the chunk holding (j..j+7, k) (AlongJ; j % 8 == 0)
  // or (j, k..k+7) (k % 8 == 0).
  __device__ __forceinline__ static int chunk(int j, int k) {
    if constexpr (AlongJ) return k * BJ + ((j >> 3) ^ (k & 7)) * 8;
    return j * kBK + ((k >> 3) ^ ((j >> 1) & 3)) * 8;
  }
  // Copy unit e's chunk: consecutive e along the contiguous index, then the
  // other (a warp reads whole runs of a stored row).
  __device__ __forceinline__ static int unit_j(int e) {
    return AlongJ ? e % (BJ / 8) * 8 : e / (kBK / 8);
  }
  __device__ __forceinline__ static int unit_k(int e) {
    return AlongJ ? e / (BJ / 8) : e % (kBK / 8) * 8;
  }
  // With Threads threads taking units e, e + Threads, ..., a thread's unit
  // u lies kUnitStride<Threads> elements after its unit 0: the units' rows
  // (k when AlongJ, else j) differ by a multiple of 8, which the swizzle
  // (k % 8, or j / 2 % 4) does not see. So a copy loop adds constants to one
  // shared-memory address (the cp.async's immediate offsets).
  template <int Threads>
  static constexpr int kUnitStride = AlongJ ? Threads / (BJ / 8) * BJ : Threads / 4 * kBK;
  template <int Threads>
  static constexpr bool kStridesEvenly =
      AlongJ ? Threads % (BJ / 8) == 0 && Threads / (BJ / 8) % 8 == 0 : Threads / 4 % 8 == 0;
};

// Warps of 64 x 64 (4 x 8 mma tiles of 16 x 8), kStages stages; the block's
// shared memory is kStages x (A's stage, B's stage).
template <int WarpsM, int WarpsN, int Stages, int MinBlocks>
struct Shape : mma_tile::Blocking<kBK, WarpsM, WarpsN, 64, Stages, MinBlocks> {
  static_assert(Stages >= 2, "a stage in flight behind the one the mma reads");
  static constexpr int kStageElems = (WarpsM * 64 + WarpsN * 64) * kBK;
  static constexpr int kSharedBytes = Stages * kStageElems * 2;
};

// The row address this lane gives for 8 x 8 matrix `i` (= lane / 8) of an
// ldmatrix.x4 covering (j0..j0+15, k0..k0+15) of an operand's stage; the
// matrices in the order of mma's A registers when JFirst (i % 2 picks the
// half of j, i / 2 the half of k: a[0..3]), else k first (i % 2 the half of
// k, i / 2 of j: b[0..1] of two n tiles). Row r = lane % 8 of matrix i is
// (j, k..k+7) for an operand contiguous along k, read without .trans;
// (j..j+7, k) for one contiguous along j, read with .trans (the fragment's
// rows then run along j, as mma wants).
template <class L, bool AlongJ, bool JFirst>
__device__ __forceinline__ const uint16_t* fragment_row(const uint16_t* tile, int lane, int j0,
                                                        int k0) {
  const int i = lane >> 3, r = lane & 7;
  const int hj = JFirst ? (i & 1) : (i >> 1), hk = JFirst ? (i >> 1) : (i & 1);
  if constexpr (AlongJ) return tile + L::chunk(j0 + 8 * hj, k0 + 8 * hk + r);
  return tile + L::chunk(j0 + 8 * hj + r, k0 + 8 * hk);
}

// The mma of one stage, k16 by k16: per k16 this warp's 8 B fragments (4
// ldmatrix.x4, two n tiles each) and per row tile its A fragment (one
// ldmatrix.x4), and 32 mma.
template <class S, class LA, bool AAlongJ, class LB, bool BAlongJ>
__device__ __forceinline__ void mma_stage(const uint16_t* As, const uint16_t* Bs, int wm, int wn,
                                          int lane, float (&acc)[S::kTilesM][S::kTilesN][4]) {
  #pragma unroll
  for (int kk = 0; kk < S::kBK; kk += 16) {
    uint32_t b[S::kTilesN][2];
    #pragma unroll
    for (int j = 0; j < S::kTilesN; j += 2) {
      uint32_t r[4];
      tc::ldmatrix<4, BAlongJ>(r, fragment_row<LB, BAlongJ, false>(Bs, lane, wn + 8 * j, kk));
      b[j][0] = r[0];
      b[j][1] = r[1];
      b[j + 1][0] = r[2];
      b[j + 1][1] = r[3];
    }
    #pragma unroll
    for (int i = 0; i < S::kTilesM; ++i) {
      uint32_t a[4];
      tc::ldmatrix<4, AAlongJ>(a, fragment_row<LA, AAlongJ, true>(As, lane, wm + 16 * i, kk));
      #pragma unroll
      for (int j = 0; j < S::kTilesN; ++j) tc::mma_m16n8k16_bf16(acc[i][j], a, b[j], acc[i][j]);
    }
  }
}

// `steps` k-steps of the iterators' operands into acc, through the kStages
// stages at smem (S::kStageElems each: A's stage, then B's). One commit
// group per k-step, empty past the end, so that wait_group<kStages - 2>
// always means "this thread's copies of the step about to be read have
// landed". Step s:
//   wait_group kStages-2   this thread's copies of step s have landed
//   __syncthreads          publishes them (every thread's); every warp is
//                          past its mma of step s - 1, whose buffer is next
//   copy step s+kStages-1  into that buffer
//   mma of step s          2 x (8 ldmatrix.x4, 32 mma) per warp
template <class S, class IA, class IB>
__device__ __forceinline__ void mainloop(int steps, IA& ia, IB& ib, uint16_t* smem, int wm, int wn,
                                         int lane, float (&acc)[S::kTilesM][S::kTilesN][4]) {
  constexpr int kA = IA::L::kElems;
  static_assert(kA + IB::L::kElems == S::kStageElems, "the iterators' stages fill the Shape's");
  auto fetch = [&](int buffer) {
    uint16_t* stage = smem + buffer * S::kStageElems;
    ia.copy(stage);
    ib.copy(stage + kA);
    ia.advance();
    ib.advance();
  };
  #pragma unroll
  for (int s = 0; s < S::kStages - 1; ++s) {
    if (s < steps) fetch(s);
    cp_async::commit_group();
  }
  int read = 0, write = S::kStages - 1;
  for (int s = 0; s < steps; ++s) {
    cp_async::wait_group<S::kStages - 2>();
    __syncthreads();
    if (s + S::kStages - 1 < steps) fetch(write);
    cp_async::commit_group();
    const uint16_t* stage = smem + read * S::kStageElems;
    mma_stage<S, typename IA::L, IA::kAlongJ, typename IB::L, IB::kAlongJ>(stage, stage + kA, wm,
                                                                            wn, lane, acc);
    read = read + 1 == S::kStages ? 0 : read + 1;
    write = write + 1 == S::kStages ? 0 : write + 1;
  }
}

}  // namespace anvil::cuda::multistage
