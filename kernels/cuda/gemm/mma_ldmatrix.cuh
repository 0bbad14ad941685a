// The tile of GEMM rung 12 (12_bf16_pipelined.cu explains the mapping, the
// layout and the pipeline): one block computes a 128 x 128 tile of
// C = op(A) * op(B) on mma.sync.m16n8k16 with bfloat16 operands, brought
// from global to shared memory by cp.async through kStages stages of
// kBK = 32 along k, and from shared memory to fragments by ldmatrix.
//
// The operands are the accessors of warp_tile.cuh (kMajor: contiguous along
// j; at(j, k): the element's address; operator()(j, k)) of bfloat16; the
// result goes through put(m, n, v, valid) as for mma_tile.cuh.
#pragma once
#include <cstdint>

#include "core/bfloat16.h"
#include "kernels/cuda/cp_async.cuh"
#include "kernels/cuda/cuda_compat.h"
#include "kernels/cuda/gemm/mma_tile.cuh"
#include "kernels/cuda/mma.cuh"

namespace anvil::cuda::mma_ldmatrix {

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
};

__device__ __forceinline__ int clamp8(int v) { return v <= 0 ? 0 : v < 8 ? v : 8; }

// This thread's share of one operand's stages: kUnits chunks per stage,
// units threadIdx.x + u * Threads.
template <int Threads, int BJ, class Get>
struct Copier {
  static constexpr bool kAlongJ = Get::kMajor;
  using L = Layout<kAlongJ, BJ>;
  static constexpr int kUnits = L::kChunks / Threads;
  static_assert(kUnits * Threads == L::kChunks, "the threads share the chunks evenly");
  Get get;
  int j0, J;
  bool aligned;  // 16-byte copies: the operand's chunks start 16-byte aligned

  __device__ __forceinline__ Copier(const Get& g, int j0_, int J_) : get(g), j0(j0_), J(J_) {
    const bfloat16* base = get.at(0, 0);
    const int64_t stride = kAlongJ ? get.at(0, 1) - base : get.at(1, 0) - base;
    aligned = reinterpret_cast<uintptr_t>(base) % 16 == 0 && stride % 8 == 0;
  }
  // The elements of unit (j, k)'s chunk inside J x Kd (the rest are zeros).
  __device__ __forceinline__ int inside(int j, int k, int Kd) const {
    if constexpr (kAlongJ) return k < Kd ? clamp8(J - j) : 0;
    return j < J ? clamp8(Kd - k) : 0;
  }
  // Stage k0.. into tile: 16-byte cp.async per chunk, src-size the bytes
  // inside (Aligned); else element by element with ordinary loads and
  // stores (an operand whose chunks are not 16-byte aligned).
  template <bool Aligned>
  __device__ __forceinline__ void copy(uint16_t* tile, int k0, int Kd) const {
    #pragma unroll
    for (int u = 0; u < kUnits; ++u) {
      const int e = int(threadIdx.x) + u * Threads;
      const int j = L::unit_j(e), k = L::unit_k(e);
      const int n = inside(j0 + j, k0 + k, Kd);
      uint16_t* dst = tile + L::chunk(j, k);
      if constexpr (Aligned) {
        cp_async::copy_cg(dst, n > 0 ? get.at(j0 + j, k0 + k) : get.at(0, 0), 2 * n);
      } else {
        #pragma unroll
        for (int i = 0; i < 8; ++i)
          dst[i] = i < n ? (kAlongJ ? get(j0 + j + i, k0 + k) : get(j0 + j, k0 + k + i)).bits
                         : uint16_t(0);
      }
    }
  }
};

// Warps of 64 x 64 (4 x 8 mma tiles of 16 x 8), with this file's main loop.
template <int WarpsM, int WarpsN, int Stages, int MinBlocks>
struct Shape : mma_tile::Blocking<kBK, WarpsM, WarpsN, 64, Stages, MinBlocks> {
  template <class GetA, class GetB, class Put>
  __device__ __forceinline__ static void multiply(int M, int N, int K, const GetA& ga,
                                                  const GetB& gb, const Put& put);
};
// GEMM rung 12: 128 x 128, 2 x 2 warps (128 threads), 3 stages (48 KB).
using Bf16 = Shape<2, 2, 3, 2>;

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

// The main loop (12_bf16_pipelined.cu explains it).
template <class S, bool Aligned, class CA, class CB>
__device__ __forceinline__ void pipeline(int K, const CA& ca, const CB& cb,
                                         uint16_t (*As)[CA::L::kElems],
                                         uint16_t (*Bs)[CB::L::kElems], int wm, int wn, int lane,
                                         float (&acc)[S::kTilesM][S::kTilesN][4]) {
  const int steps = (K + S::kBK - 1) / S::kBK;
  auto copy = [&](int s) {  // stage s into buffer s % kStages, one commit group
    if (s < steps) {
      ca.template copy<Aligned>(As[s % S::kStages], s * S::kBK, K);
      cb.template copy<Aligned>(Bs[s % S::kStages], s * S::kBK, K);
    }
    cp_async::commit_group();  // empty past the end: one group per stage, always
  };
  #pragma unroll
  for (int s = 0; s < S::kStages - 1; ++s) copy(s);
  for (int s = 0; s < steps; ++s) {
    const int cur = s % S::kStages;
    cp_async::wait_group<S::kStages - 2>();  // this thread's copies of stage s have landed
    // Publishes stage s (every thread's copies), and every warp is past its
    // mma of stage s - 1, whose buffer the copy below refills.
    __syncthreads();
    copy(s + S::kStages - 1);
    mma_stage<S, typename CA::L, CA::kAlongJ, typename CB::L, CB::kAlongJ>(As[cur], Bs[cur], wm,
                                                                            wn, lane, acc);
  }
}

// C tile (blockIdx.y, blockIdx.x) of the M x N result; launch with grid
// (ceil(N / S::kBN), ceil(M / S::kBM)) and S::kThreads threads.
template <int WarpsM, int WarpsN, int Stages, int MinBlocks>
template <class GetA, class GetB, class Put>
__device__ __forceinline__ void Shape<WarpsM, WarpsN, Stages, MinBlocks>::multiply(
    int M, int N, int K, const GetA& ga, const GetB& gb, const Put& put) {
  using S = Shape;
  const int lane = int(threadIdx.x) % 32, warp = int(threadIdx.x) / 32;
  const int wm = warp / S::kWarpsN * S::kWarpM, wn = warp % S::kWarpsN * S::kWarpN;
  const int m0 = int(blockIdx.y) * S::kBM, n0 = int(blockIdx.x) * S::kBN;
  using CA = Copier<S::kThreads, S::kBM, GetA>;
  using CB = Copier<S::kThreads, S::kBN, GetB>;
  alignas(16) __shared__ uint16_t As[S::kStages][CA::L::kElems];
  alignas(16) __shared__ uint16_t Bs[S::kStages][CB::L::kElems];
  const CA ca(ga, m0, M);
  const CB cb(gb, n0, N);
  float acc[S::kTilesM][S::kTilesN][4] = {};
  if (ca.aligned && cb.aligned)  // the same for the whole block
    pipeline<S, true>(K, ca, cb, As, Bs, wm, wn, lane, acc);
  else
    pipeline<S, false>(K, ca, cb, As, Bs, wm, wn, lane, acc);
  mma_tile::put_warp_tile(M, N, m0 + wm, n0 + wn, lane / 4, lane % 4, acc, put);
}

}  // namespace anvil::cuda::mma_ldmatrix
