// The GEMM iterator of the multistage mainloop (mma_multistage.cuh) and the
// tile of GEMM rungs 11 (Tf32: float32 operands, 11_tf32_pipelined.cu) and
// 12 (Bf16: bfloat16 operands, 12_bf16_pipelined.cu): one block computes a
// 128 x 128 tile of C = op(A) * op(B) on the mainloop fed by this file's
// iterator. The rung files explain the mapping, the layouts and the
// pipeline.
//
// The operands are the accessors of warp_tile.cuh (kMajor: contiguous along
// j; at(j, k): the element's address; operator()(j, k)) of bfloat16 (Bf16)
// or float (Tf32); the result goes through put(m, n, v, valid) as for
// mma_tile.cuh.
#pragma once
#include <climits>
#include <cstdint>
#include <type_traits>

#include "core/bfloat16.h"
#include "kernels/cuda/cp_async.cuh"
#include "kernels/cuda/cuda_compat.h"
#include "kernels/cuda/gemm/mma_multistage.cuh"
#include "kernels/cuda/gemm/staged_epilogue.cuh"
#include "kernels/cuda/gemm/mma_tile.cuh"
#include "kernels/cuda/gemm/warp_tile.cuh"

namespace anvil::cuda::mma_ldmatrix {

// min(C, max(0, v)): the elements of a chunk of C inside, given how many are left.
template <int C>
__device__ __forceinline__ int clamp(int v) { return v <= 0 ? 0 : v < C ? v : C; }

// The GEMM iterator: this thread's share of one operand's stages, kUnits
// 16-byte chunks per stage (units threadIdx.x + u * Threads of the Layout).
// Precomputed: each unit's address at k = 0 and what it holds of the rows
// (along j, constant); stepped: the addresses by kBK along k (one 64-bit
// add each) and the k left. A 16-byte cp.async per chunk, src-size the
// bytes inside: the operand's chunks are 16-byte aligned (aligned() below;
// the rungs' launchers copy other operands to aligned ones, aligned_copy.h).
template <class Kind, int Threads, int BJ, class Get>
struct GemmIterator {
  static constexpr bool kAlongJ = Get::kMajor;
  using L = multistage::Layout<Kind, kAlongJ, BJ>;
  using T = warp_tile::ElementOf<Get>;  // as stored in global memory
  using Element = typename L::Element;
  static constexpr int kBK = L::kBK, kChunk = L::kChunk;
  static_assert(sizeof(T) == sizeof(Element), "the kind's element is the operand's");
  static constexpr int kUnits = L::kChunks / Threads;
  static_assert(kUnits * Threads == L::kChunks, "the threads share the chunks evenly");
  static_assert(L::template kStridesEvenly<Threads>);
  Get get;
  int j0, J;
  int k_left;       // K - (this step's k0)
  int64_t step;     // elements from (j, k) to (j, k + kBK)
  int first;        // unit 0's chunk in a stage
  const T* src[kUnits];
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
      rows = clamp<kChunk>(J - j0 - j);
    } else {
      const int left = J - j0 - j, apart = Threads / L::kRowChunks;
      rows = left <= 0 ? 0 : (left + apart - 1) / apart;
    }
  }
  // Whether an operand of these strides has 16-byte aligned chunks.
  __device__ __forceinline__ static bool aligned(const Get& get) {
    const T* base = get.at(0, 0);
    const int64_t stride = kAlongJ ? get.at(0, 1) - base : get.at(1, 0) - base;
    return reinterpret_cast<uintptr_t>(base) % 16 == 0 && stride % kChunk == 0;
  }
  // The elements of unit u's chunk inside the operand (the rest are zeros);
  // along k, every unit of a thread has the same k (Threads % 4 == 0), so
  // its elements inside K are worked out once a step (along_k).
  __device__ __forceinline__ int along_k() const {
    return kAlongJ ? 0 : clamp<kChunk>(k_left - L::unit_k(int(threadIdx.x)));
  }
  __device__ __forceinline__ int inside(int u, int along_k) const {
    if constexpr (kAlongJ) return L::unit_k(int(threadIdx.x) + u * Threads) < k_left ? rows : 0;
    return u < rows ? along_k : 0;
  }
  __device__ __forceinline__ void copy(Element* tile) const {
    const int k_inside = along_k();
    #pragma unroll
    for (int u = 0; u < kUnits; ++u) {
      const int n = inside(u, k_inside);
      Element* dst = tile + first + u * L::template kUnitStride<Threads>;
      cp_async::copy_cg(dst, src[u], int(sizeof(T)) * n);  // n = 0: zeros, nothing read
    }
  }
  __device__ __forceinline__ void advance() {
    #pragma unroll
    for (int u = 0; u < kUnits; ++u) src[u] += step;
    k_left -= kBK;
  }
};

// The iterator of a block all of whose chunks lie inside the operand in
// every step (Tf32): the block's rows inside J, K (its K-slice) a multiple
// of kBK, 16-byte aligned chunks; full() says when. Every copy is 16
// bytes, unpredicated, and a thread's units lie D elements apart in global
// memory (D (kUnits - 1) fits int, which full() checks), so one pointer
// per operand is stepped and each copy's address is one multiply-add.
template <class Kind, int Threads, int BJ, class Get>
struct FullIterator {
  static constexpr bool kAlongJ = Get::kMajor;
  using L = multistage::Layout<Kind, kAlongJ, BJ>;
  using T = warp_tile::ElementOf<Get>;
  using Element = typename L::Element;
  static constexpr int kBK = L::kBK, kUnits = L::kChunks / Threads;
  static_assert(sizeof(T) == sizeof(Element) && kUnits * Threads == L::kChunks);
  static_assert(L::template kStridesEvenly<Threads>);
  const T* src;  // unit 0's chunk at the current step
  int64_t step;  // elements from (j, k) to (j, k + kBK)
  int D;         // elements from unit u's chunk to unit u + 1's
  int first;     // unit 0's chunk in a stage

  // Elements from unit u's chunk to unit u + 1's (the same for every u).
  __device__ __forceinline__ static int64_t apart(const Get& get) {
    const int e = int(threadIdx.x);
    return get.at(L::unit_j(e + Threads), L::unit_k(e + Threads)) -
           get.at(L::unit_j(e), L::unit_k(e));
  }
  __device__ __forceinline__ static bool full(const Get& get, int j0, int J, int K) {
    const int64_t d = apart(get) < 0 ? -apart(get) : apart(get);
    return GemmIterator<Kind, Threads, BJ, Get>::aligned(get) && j0 + BJ <= J &&
           K % kBK == 0 && d * (kUnits - 1) <= INT32_MAX;
  }
  __device__ __forceinline__ FullIterator(const Get& get, int j0)
      : src(get.at(j0 + L::unit_j(int(threadIdx.x)), L::unit_k(int(threadIdx.x)))),
        step(get.at(0, kBK) - get.at(0, 0)),
        D(int(apart(get))),
        first(L::chunk(L::unit_j(int(threadIdx.x)), L::unit_k(int(threadIdx.x)))) {}
  __device__ __forceinline__ void copy(Element* tile) const {
    #pragma unroll
    for (int u = 0; u < kUnits; ++u)
      cp_async::copy_cg(tile + first + u * L::template kUnitStride<Threads>, src + u * D, 16);
  }
  __device__ __forceinline__ void advance() { src += step; }
};

// Warps of 64 x 64 on the multistage mainloop. Shared memory: static up to
// the 48 KB a kernel gets without opting in; past it dynamic, of
// kDynamicSharedBytes, which the launcher (mma_rung.cuh) opts in to.
template <class Kind, int WarpsM, int WarpsN, int Stages, int MinBlocks>
struct ShapeOf : multistage::ShapeOf<Kind, WarpsM, WarpsN, Stages, MinBlocks> {
  using Base = multistage::ShapeOf<Kind, WarpsM, WarpsN, Stages, MinBlocks>;
  static constexpr int kDynamicSharedBytes =
      Base::kSharedBytes > 48 * 1024 ? Base::kSharedBytes : 0;
  template <class GetA, class GetB, class Put>
  __device__ __forceinline__ static void multiply(int M, int N, int K, const GetA& ga,
                                                  const GetB& gb, const Put& put);
};
// The Bf16 shapes under the name rung 12's kernels had before Tf32 joined
// (the launch audits and the step model know them by it).
template <int WarpsM, int WarpsN, int Stages, int MinBlocks>
struct Shape : ShapeOf<multistage::Bf16, WarpsM, WarpsN, Stages, MinBlocks> {};
// GEMM rung 11: 128 x 128, 2 x 2 warps (128 threads), 4 stages of 16 of k
// (68 KB, dynamic).
using Tf32 = ShapeOf<multistage::Tf32, 2, 2, 4, 2>;
// GEMM rung 12: 128 x 128, 2 x 2 warps (128 threads), 4 stages of 32 of k
// (64 KB, dynamic).
using Bf16 = Shape<2, 2, 4, 2>;

template <class S, class GetA, class GetB>
__device__ __forceinline__ void gemm_mainloop(int M, int N, int K, const GetA& ga, const GetB& gb,
                                              int m0, int n0, typename S::Element* smem, int wm,
                                              int wn, int lane,
                                              float (&acc)[S::kTilesM][S::kTilesN][4]) {
  using Kind = typename S::Kind;
  GemmIterator<Kind, S::kThreads, S::kBM, GetA> ia(ga, m0, M, K);
  GemmIterator<Kind, S::kThreads, S::kBN, GetB> ib(gb, n0, N, K);
  multistage::mainloop<S>((K + S::kBK - 1) / S::kBK, ia, ib, smem, wm, wn, lane, acc);
}

// The block's stages: static shared memory, or the launch's dynamic one.
template <class S>
__device__ __forceinline__ typename S::Element* stages() {
  if constexpr (S::kDynamicSharedBytes > 0) {
    return dynamic_shared<typename S::Element>();
  } else {
    alignas(16) __shared__ typename S::Element smem[S::kStages * S::kStageElems];
    return smem;
  }
}

// C tile (blockIdx.y, blockIdx.x) of the M x N result; launch with grid
// (ceil(N / S::kBN), ceil(M / S::kBM)) and S::kThreads threads.
template <class Kind, int WarpsM, int WarpsN, int Stages, int MinBlocks>
template <class GetA, class GetB, class Put>
__device__ __forceinline__ void ShapeOf<Kind, WarpsM, WarpsN, Stages, MinBlocks>::multiply(
    int M, int N, int K, const GetA& ga, const GetB& gb, const Put& put) {
  using S = ShapeOf;
  const int lane = int(threadIdx.x) % 32, warp = int(threadIdx.x) / 32;
  const int wm = warp / S::kWarpsN * S::kWarpM, wn = warp % S::kWarpsN * S::kWarpN;
  const int m0 = int(blockIdx.y) * S::kBM, n0 = int(blockIdx.x) * S::kBN;
  typename S::Element* smem = stages<S>();
  float acc[S::kTilesM][S::kTilesN][4] = {};
  using IA = GemmIterator<Kind, S::kThreads, S::kBM, GetA>;
  // One branch for the block. Tf32 has a second loop, for blocks whose
  // chunks all lie inside (FullIterator). Operands whose chunks are not
  // 16-byte aligned never come here: the rungs' launchers copy them to
  // aligned ones first (aligned_copy.h).
  if constexpr (std::is_same_v<Kind, multistage::Tf32>) {
    using FA = FullIterator<Kind, S::kThreads, S::kBM, GetA>;
    using FB = FullIterator<Kind, S::kThreads, S::kBN, GetB>;
    if (FA::full(ga, m0, M, K) && FB::full(gb, n0, N, K)) {
      FA ia(ga, m0);
      FB ib(gb, n0);
      multistage::mainloop<S>(K / S::kBK, ia, ib, smem, wm, wn, lane, acc);
    } else {
      gemm_mainloop<S>(M, N, K, ga, gb, m0, n0, smem, wm, wn, lane, acc);
    }
  } else {
    gemm_mainloop<S>(M, N, K, ga, gb, m0, n0, smem, wm, wn, lane, acc);
  }
  epilogue::put_warp_tile<S, IA::L::kPermutedRows, epilogue::Order::kRows>(
      M, N, m0 + wm, n0 + wn, lane, warp, acc, smem,
      [&](int n, int valid) { return put.columns(n, valid); });
}

}  // namespace anvil::cuda::mma_ldmatrix
