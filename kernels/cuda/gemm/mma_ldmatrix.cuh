// GEMM rung 12 (12_bf16_pipelined.cu explains the mapping, the layout and
// the pipeline): one block computes a 128 x 128 tile of C = op(A) * op(B)
// on mma.sync.m16n8k16 with bfloat16 operands, on the multistage mainloop
// (mma_multistage.cuh) fed by this file's GEMM iterator.
//
// The operands are the accessors of warp_tile.cuh (kMajor: contiguous along
// j; at(j, k): the element's address; operator()(j, k)) of bfloat16; the
// result goes through put(m, n, v, valid) as for mma_tile.cuh.
#pragma once
#include <cstdint>

#include "core/bfloat16.h"
#include "kernels/cuda/cp_async.cuh"
#include "kernels/cuda/cuda_compat.h"
#include "kernels/cuda/gemm/mma_multistage.cuh"
#include "kernels/cuda/gemm/mma_tile.cuh"

namespace anvil::cuda::mma_ldmatrix {

using multistage::kBK;

__device__ __forceinline__ int clamp8(int v) { return v <= 0 ? 0 : v < 8 ? v : 8; }

// The GEMM iterator: this thread's share of one operand's stages, kUnits
// 16-byte chunks per stage (units threadIdx.x + u * Threads of the Layout).
// Precomputed: each unit's address at k = 0 and what it holds of the rows
// (along j, constant); stepped: the addresses by kBK along k (one 64-bit
// add each) and the k left. Aligned: 16-byte cp.async per chunk, src-size
// the bytes inside; otherwise element by element with ordinary loads and
// stores (an operand whose chunks are not 16-byte aligned).
template <int Threads, int BJ, class Get, bool Aligned>
struct GemmIterator {
  static constexpr bool kAlongJ = Get::kMajor;
  using L = multistage::Layout<kAlongJ, BJ>;
  static constexpr int kUnits = L::kChunks / Threads;
  static_assert(kUnits * Threads == L::kChunks, "the threads share the chunks evenly");
  static_assert(L::template kStridesEvenly<Threads>);
  Get get;
  int j0, J;
  int k_left;       // K - (this step's k0)
  int k0 = 0;       // this step's k0 (the element-by-element path)
  int64_t step;     // elements from (j, k) to (j, k + kBK)
  int first;        // unit 0's chunk in a stage
  const bfloat16* src[kUnits];
  // What the units hold of the rows, the same for a whole step: AlongJ, the
  // elements of each chunk inside J (every unit has the same j); else how
  // many of the units (rows j, j + Threads / 4, ...) lie inside J.
  int rows;

  __device__ __forceinline__ GemmIterator(const Get& g, int j0_, int J_, int K)
      : get(g), j0(j0_), J(J_), k_left(K) {
    step = get.at(0, kBK) - get.at(0, 0);
    first = L::chunk(L::unit_j(int(threadIdx.x)), L::unit_k(int(threadIdx.x)));
    #pragma unroll
    for (int u = 0; u < kUnits; ++u) {
      const int e = int(threadIdx.x) + u * Threads, j = L::unit_j(e), k = L::unit_k(e);
      src[u] = get.at(j0 + j, k);
    }
    const int j = L::unit_j(int(threadIdx.x));
    if constexpr (kAlongJ) {
      rows = clamp8(J - j0 - j);
    } else {
      const int left = J - j0 - j, apart = Threads / 4;
      rows = left <= 0 ? 0 : (left + apart - 1) / apart;
    }
  }
  // Whether an operand of these strides has 16-byte aligned chunks.
  __device__ __forceinline__ static bool aligned(const Get& get) {
    const bfloat16* base = get.at(0, 0);
    const int64_t stride = kAlongJ ? get.at(0, 1) - base : get.at(1, 0) - base;
    return reinterpret_cast<uintptr_t>(base) % 16 == 0 && stride % 8 == 0;
  }
  // The elements of unit u's chunk inside the operand (the rest are zeros);
  // along k, every unit of a thread has the same k (Threads % 4 == 0), so
  // its elements inside K are worked out once a step (along_k).
  __device__ __forceinline__ int along_k() const {
    return kAlongJ ? 0 : clamp8(k_left - L::unit_k(int(threadIdx.x)));
  }
  __device__ __forceinline__ int inside(int u, int along_k) const {
    if constexpr (kAlongJ) return L::unit_k(int(threadIdx.x) + u * Threads) < k_left ? rows : 0;
    return u < rows ? along_k : 0;
  }
  __device__ __forceinline__ void copy(uint16_t* tile) const {
    const int k_inside = along_k();
    #pragma unroll
    for (int u = 0; u < kUnits; ++u) {
      const int e = int(threadIdx.x) + u * Threads;
      const int j = L::unit_j(e), k = L::unit_k(e), n = inside(u, k_inside);
      uint16_t* dst = tile + first + u * L::template kUnitStride<Threads>;
      if constexpr (Aligned) {
        cp_async::copy_cg(dst, src[u], 2 * n);  // n = 0: zeros, nothing read
      } else {
        #pragma unroll
        for (int i = 0; i < 8; ++i)
          dst[i] = i < n ? (kAlongJ ? get(j0 + j + i, k0 + k) : get(j0 + j, k0 + k + i)).bits
                         : uint16_t(0);
      }
    }
  }
  __device__ __forceinline__ void advance() {
    #pragma unroll
    for (int u = 0; u < kUnits; ++u) src[u] += step;
    k_left -= kBK;
    k0 += kBK;
  }
};

// Warps of 64 x 64 on the multistage mainloop, static shared memory.
template <int WarpsM, int WarpsN, int Stages, int MinBlocks>
struct Shape : multistage::Shape<WarpsM, WarpsN, Stages, MinBlocks> {
  template <class GetA, class GetB, class Put>
  __device__ __forceinline__ static void multiply(int M, int N, int K, const GetA& ga,
                                                  const GetB& gb, const Put& put);
};
// GEMM rung 12: 128 x 128, 2 x 2 warps (128 threads), 3 stages (48 KB).
using Bf16 = Shape<2, 2, 3, 2>;

template <class S, bool Aligned, class GetA, class GetB>
__device__ __forceinline__ void gemm_mainloop(int M, int N, int K, const GetA& ga, const GetB& gb,
                                              int m0, int n0, uint16_t* smem, int wm, int wn,
                                              int lane, float (&acc)[S::kTilesM][S::kTilesN][4]) {
  GemmIterator<S::kThreads, S::kBM, GetA, Aligned> ia(ga, m0, M, K);
  GemmIterator<S::kThreads, S::kBN, GetB, Aligned> ib(gb, n0, N, K);
  multistage::mainloop<S>((K + S::kBK - 1) / S::kBK, ia, ib, smem, wm, wn, lane, acc);
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
  alignas(16) __shared__ uint16_t smem[S::kStages * S::kStageElems];
  float acc[S::kTilesM][S::kTilesN][4] = {};
  using IA = GemmIterator<S::kThreads, S::kBM, GetA, true>;
  using IB = GemmIterator<S::kThreads, S::kBN, GetB, true>;
  if (IA::aligned(ga) && IB::aligned(gb))  // the same for the whole block
    gemm_mainloop<S, true>(M, N, K, ga, gb, m0, n0, smem, wm, wn, lane, acc);
  else
    gemm_mainloop<S, false>(M, N, K, ga, gb, m0, n0, smem, wm, wn, lane, acc);
  mma_tile::put_warp_tile(M, N, m0 + wm, n0 + wn, lane / 4, lane % 4, acc, put);
}

}  // namespace anvil::cuda::mma_ldmatrix
