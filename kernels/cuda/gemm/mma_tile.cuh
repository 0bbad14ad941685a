// The tensor-core tile of GEMM rungs 09 (TF32) and 10 (BF16) and of
// convolution rung 06 (09_tf32_mma.cu explains the fragment mapping, the
// shared-memory layouts, the tiling and the pipeline; 10_bf16_mma.cu what
// BF16 changes): one block computes a BM x BN tile of C = op(A) * op(B) (an
// M x N result, reduction length K) with mma.sync and FP32 accumulation,
// walking K one mma deep at a time (8 for TF32, 16 for BF16) through two
// shared-memory stages.
//
// Shared memory holds 32-bit operand words, 8 rows of them along k per
// stage for both kinds: a TF32 word is one element (k), a BF16 word two
// (k = 2p in the low half, 2p + 1 in the high, as the mma's registers hold
// them). So a fragment register is one word in both, at the same place:
// word row t or t + 4 of the stage, and the fragment loads are the same code.
//
// The operands are the accessors of warp_tile.cuh (kMajor, operator()(j, k),
// optional quad(j, k) and `aligned`), of float32 elements, or for Bf16 also
// of bfloat16 ones, which are staged without conversion; the result goes through
// put(m, n, v, valid) with valid 1 or 2: C[m][n], C[m][n+1] are v.x, v.y, of
// which the first `valid` lie inside N, called only for m < M.
#pragma once
#include <cstdint>
#include <type_traits>
#include <utility>
#if !defined(__CUDACC__)
#include <cstring>
#endif

#include "kernels/cuda/cuda_compat.h"
#include "kernels/cuda/gemm/staged_epilogue.cuh"
#include "kernels/cuda/gemm/warp_tile.cuh"
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/vec4.cuh"

namespace anvil::cuda::mma_tile {

constexpr int kWordRows = 8;  // rows of operand words along k in a stage

// p[0..N-1] = w[0..N-1], one 16-byte (N = 4) or 8-byte (N = 2) store; p
// aligned to it.
template <int N>
__device__ __forceinline__ void store_words(uint32_t* p, const uint32_t (&w)[N]) {
  static_assert(N == 2 || N == 4);
#if defined(__CUDACC__)
  if constexpr (N == 4)
    *reinterpret_cast<uint4*>(p) = make_uint4(w[0], w[1], w[2], w[3]);
  else
    *reinterpret_cast<uint2*>(p) = make_uint2(w[0], w[1]);
#else
  if constexpr (N == 4) vec::require_aligned(p, "store");
  std::memcpy(p, w, sizeof w);
#endif
}

// Where word (j, p) of an operand's stage lies (p: the word row along k),
// following the operand's layout in global memory (09_tf32_mma.cu says why):
// KMajor (contiguous along j): [p][j], rows of BJ + 8 words; otherwise
// (contiguous along k): [j][p], rows of 8 + 4 words.
template <bool KMajor, int BJ>
struct Layout {
  static constexpr int kLD = KMajor ? BJ + 8 : kWordRows + 4;
  static constexpr int kWords = (KMajor ? kWordRows : BJ) * kLD;
  __device__ __forceinline__ static int at(int j, int p) {
    return KMajor ? p * kLD + j : j * kLD + p;
  }
};

// TF32: each element rounded by tc::cvt_tf32 (nearest even) into its own word.
// One thread's share of one operand's stage: kQuads quads fetched from
// global memory into registers, then converted and stored into shared
// memory with one 16-byte store each. Quad e covers (j..j+3, k) of a KMajor
// operand, consecutive threads along j, else (j, k..k+3), the two quads of
// one j taken by consecutive threads: either way a warp reads runs of
// consecutive floats of the stored matrix, and each quad is 4 consecutive
// words of the Layout above.
struct Tf32 {
  static constexpr int kBK = kWordRows;  // k per stage: one m16n8k8
  template <int Threads, int BJ, class Get>
  struct Stager {
    using L = Layout<Get::kMajor, BJ>;
    static_assert(std::is_same_v<warp_tile::ElementOf<Get>, float>,
                  "TF32 rounds float32 operands: bfloat16 ones are for Bf16");
    static constexpr int kQuads = kBK * BJ / 4 / Threads;
    static_assert(kQuads >= 1 && kQuads * 4 * Threads == kBK * BJ);
    float4 r[kQuads];

    __device__ __forceinline__ static int quad_j(int e) {
      return Get::kMajor ? e % (BJ / 4) * 4 : e / (kBK / 4);
    }
    __device__ __forceinline__ static int quad_k(int e) {
      return Get::kMajor ? e / (BJ / 4) : e % (kBK / 4) * 4;
    }
    __device__ __forceinline__ void fetch(const Get& get, int j0, int k0, int J, int Kd) {
      #pragma unroll
      for (int q = 0; q < kQuads; ++q) {
        const int e = int(threadIdx.x) + q * Threads;
        r[q] = warp_tile::fetch_quad(get, j0 + quad_j(e), k0 + quad_k(e), J, Kd);
      }
    }
    __device__ __forceinline__ void store(uint32_t* tile) const {
      #pragma unroll
      for (int q = 0; q < kQuads; ++q) {
        const int e = int(threadIdx.x) + q * Threads;
        const uint32_t w[4] = {tc::cvt_tf32(r[q].x), tc::cvt_tf32(r[q].y),
                               tc::cvt_tf32(r[q].z), tc::cvt_tf32(r[q].w)};
        store_words(tile + L::at(quad_j(e), quad_k(e)), w);
      }
    }
  };
  __device__ __forceinline__ static void mma(float (&acc)[4], const uint32_t (&a)[4],
                                             const uint32_t (&b)[2]) {
    tc::mma_m16n8k8_tf32(acc, a, b, acc);
  }
};

// BF16: two elements per word along k, the smaller k in the low half. A
// float32 operand is rounded to nearest even as it is packed
// (cvt.rn.bf16x2.f32); a bfloat16 one (ElementOf<Get> = bfloat16) is read
// as it is stored, 8 bytes a quad, and its bits are moved without
// arithmetic. For a KMajor operand a unit is (j..j+3, k..k+1): two quads
// fetched along j (consecutive threads along j, as for TF32), packed into 4
// words of word row k / 2, one 16-byte store. Otherwise a unit is one quad
// (j, k..k+3), packed into 2 words (row j, word rows k/2, k/2 + 1), one
// 8-byte store; a bfloat16 quad along k is those 2 words as it lies in
// memory.
struct Bf16 {
  static constexpr int kBK = 2 * kWordRows;  // k per stage: one m16n8k16

  // The word of elements (k, k + 1).
  __device__ __forceinline__ static uint32_t pack(float lo, float hi) {
    return tc::pack_bf16x2(lo, hi);
  }
  __device__ __forceinline__ static uint32_t pack(bfloat16 lo, bfloat16 hi) {
    return uint32_t(lo.bits) | uint32_t(hi.bits) << 16;
  }
  // The two words of a quad along k: (k, k+1) and (k+2, k+3).
  __device__ __forceinline__ static void pack_along_k(const float4& q, uint32_t (&w)[2]) {
    w[0] = pack(q.x, q.y);
    w[1] = pack(q.z, q.w);
  }
  __device__ __forceinline__ static void pack_along_k(const vec::Bf16x4& q, uint32_t (&w)[2]) {
    w[0] = q.lo;
    w[1] = q.hi;
  }

  template <int Threads, int BJ, class Get>
  struct Stager {
    using L = Layout<Get::kMajor, BJ>;
    using Quad = warp_tile::QuadOf<Get>;
    static constexpr int kUnits = kBK * BJ / 8 / Threads;  // 8 elements a unit
    static constexpr int kQuads = 2 * kUnits;
    static_assert(kUnits >= 1 && kUnits * 8 * Threads == kBK * BJ);
    Quad r[kQuads];

    // Unit e's first element (j, k) within the stage; KMajor: units of 2
    // quads (k, k+1), else 2 units of one quad each per "e" slot.
    __device__ __forceinline__ static int quad_j(int e) {
      return Get::kMajor ? e % (BJ / 4) * 4 : e / (kBK / 4);
    }
    __device__ __forceinline__ static int quad_k(int e) {
      return Get::kMajor ? e / (BJ / 4) * 2 : e % (kBK / 4) * 4;
    }
    __device__ __forceinline__ void fetch(const Get& get, int j0, int k0, int J, int Kd) {
      #pragma unroll
      for (int q = 0; q < kQuads; ++q) {
        if constexpr (Get::kMajor) {  // quad q: unit q / 2, k + q % 2
          const int e = int(threadIdx.x) + q / 2 * Threads;
          r[q] = warp_tile::fetch_quad(get, j0 + quad_j(e), k0 + quad_k(e) + q % 2, J, Kd);
        } else {  // quad q: unit q
          const int e = int(threadIdx.x) + q * Threads;
          r[q] = warp_tile::fetch_quad(get, j0 + quad_j(e), k0 + quad_k(e), J, Kd);
        }
      }
    }
    __device__ __forceinline__ void store(uint32_t* tile) const {
      #pragma unroll
      for (int u = 0; u < (Get::kMajor ? kUnits : kQuads); ++u) {
        const int e = int(threadIdx.x) + u * Threads;
        if constexpr (Get::kMajor) {
          const Quad& lo = r[2 * u];  // k
          const Quad& hi = r[2 * u + 1];  // k + 1
          uint32_t w[4];
          #pragma unroll
          for (int i = 0; i < 4; ++i) w[i] = pack(vec::at(lo, i), vec::at(hi, i));
          store_words(tile + L::at(quad_j(e), quad_k(e) / 2), w);
        } else {
          uint32_t w[2];
          pack_along_k(r[u], w);
          store_words(tile + L::at(quad_j(e), quad_k(e) / 2), w);
        }
      }
    }
  };
  __device__ __forceinline__ static void mma(float (&acc)[4], const uint32_t (&a)[4],
                                             const uint32_t (&b)[2]) {
    tc::mma_m16n8k16_bf16(acc, a, b, acc);
  }
};

// The blocking of every mma rung: a block of WarpsM x WarpsN warps, each
// warp a 64 x WarpN sub-tile of C made of 4 x (WarpN / 8) mma tiles of
// 16 x 8; BK along k per stage, Stages stages of shared memory. Each rung's
// Shape adds its main loop, multiply(), for mma_rung.cuh's kernel.
template <int BK, int WarpsM, int WarpsN, int WarpN, int Stages, int MinBlocks>
struct Blocking {
  static constexpr int kBK = BK, kStages = Stages;
  static constexpr int kWarpsM = WarpsM, kWarpsN = WarpsN, kThreads = 32 * WarpsM * WarpsN;
  static constexpr int kWarpM = 64, kWarpN = WarpN;
  static constexpr int kBM = kWarpsM * kWarpM, kBN = kWarpsN * kWarpN;
  static constexpr int kTilesM = kWarpM / 16, kTilesN = kWarpN / 8;
  static constexpr int kMinBlocks = MinBlocks;  // __launch_bounds__: resident blocks per SM
};

// Warps of 64 x 32 (4 x 4 mma tiles), two stages; Math is Tf32 or Bf16.
template <class MathT, int WarpsM, int WarpsN, int MinBlocks>
struct Shape : Blocking<MathT::kBK, WarpsM, WarpsN, 32, 2, MinBlocks> {
  using Math = MathT;
  template <class GetA, class GetB, class Put>
  __device__ __forceinline__ static void multiply(int M, int N, int K, const GetA& ga,
                                                  const GetB& gb, const Put& put);
};
// GEMM rungs 09, 10 and convolution rung 06: 128 x 128, 2 x 4 warps.
template <class Math>
using Wide = Shape<Math, 2, 4, 2>;
// 64 x 128, 1 x 4 warps (128 threads), for results of at most 64 rows (a
// convolution with 64 or fewer output channels), as warp_tile.cuh's
// DoubleBufferedNarrow.
template <class Math>
using Narrow = Shape<Math, 1, 4, 3>;

// The mma of one stage: this warp's kTilesN B fragments (columns wn + 8j ..)
// loaded from the stage, then for each of its kTilesM row tiles (rows
// wm + 16i ..) the A fragment and kTilesN mma (one A fragment live at a
// time, not all four). Lane (g, t) loads, in word rows p:
//   A  a0 (row g, p = t)   a1 (g+8, t)   a2 (g, t+4)   a3 (g+8, t+4)
//   B  b0 (col g, p = t)   b1 (g, t+4)
// which is the PTX ISA's m16n8k8 .tf32 layout (p = k) and its m16n8k16 .bf16
// layout (p = the pair k = 2p, 2p+1) alike.
template <class S, class LA, class LB>
__device__ __forceinline__ void mma_step(const uint32_t* As, const uint32_t* Bs, int wm, int wn,
                                         int g, int t, float (&acc)[S::kTilesM][S::kTilesN][4]) {
  uint32_t b[S::kTilesN][2];
  #pragma unroll
  for (int j = 0; j < S::kTilesN; ++j) {
    const int n = wn + j * 8 + g;
    b[j][0] = Bs[LB::at(n, t)];
    b[j][1] = Bs[LB::at(n, t + 4)];
  }
  #pragma unroll
  for (int i = 0; i < S::kTilesM; ++i) {
    const int m = wm + i * 16 + g;
    const uint32_t a[4] = {As[LA::at(m, t)], As[LA::at(m + 8, t)], As[LA::at(m, t + 4)],
                           As[LA::at(m + 8, t + 4)]};
    #pragma unroll
    for (int j = 0; j < S::kTilesN; ++j) S::Math::mma(acc[i][j], a, b[j]);
  }
}

// C tile (blockIdx.y, blockIdx.x) of the M x N result; launch with grid
// (ceil(N / S::kBN), ceil(M / S::kBM)) and S::kThreads threads. Every lane
// of every warp reaches every mma (the edges are zeros in shared memory, not
// skipped work), as mma.sync requires.
template <class S, class GetA, class GetB, class Put>
__device__ __forceinline__ void multiply(int M, int N, int K, const GetA& ga, const GetB& gb,
                                         const Put& put) {
  using SA = typename S::Math::template Stager<S::kThreads, S::kBM, GetA>;
  using SB = typename S::Math::template Stager<S::kThreads, S::kBN, GetB>;
  using LA = typename SA::L;
  using LB = typename SB::L;
  // Both stages of A, then both of B: one array, which the epilogue reuses.
  constexpr int kWords = 2 * LA::kWords + 2 * LB::kWords;
  alignas(16) __shared__ uint32_t stages[kWords];
  auto As = [&](int i) { return stages + i * LA::kWords; };
  auto Bs = [&](int i) { return stages + 2 * LA::kWords + i * LB::kWords; };
  const int lane = int(threadIdx.x) % 32, warp = int(threadIdx.x) / 32;
  const int g = lane / 4, t = lane % 4;
  const int wm = warp / S::kWarpsN * S::kWarpM, wn = warp % S::kWarpsN * S::kWarpN;
  const int m0 = int(blockIdx.y) * S::kBM, n0 = int(blockIdx.x) * S::kBN;
  const int steps = (K + S::kBK - 1) / S::kBK;

  SA sa;
  SB sb;
  float acc[S::kTilesM][S::kTilesN][4] = {};
  if (steps > 0) {
    sa.fetch(ga, m0, 0, M, K);
    sb.fetch(gb, n0, 0, N, K);
    sa.store(As(0));
    sb.store(Bs(0));
  }
  __syncthreads();
  for (int s = 0; s < steps; ++s) {
    const int cur = s & 1;
    const bool more = s + 1 < steps;  // the same for every thread of the block
    if (more) {                       // in flight during the mma below
      sa.fetch(ga, m0, (s + 1) * S::kBK, M, K);
      sb.fetch(gb, n0, (s + 1) * S::kBK, N, K);
    }
    mma_step<S, LA, LB>(As(cur), Bs(cur), wm, wn, g, t, acc);
    if (more) {  // stage cur ^ 1 was last read in step s - 1, before its barrier
      sa.store(As(cur ^ 1));
      sb.store(Bs(cur ^ 1));
    }
    __syncthreads();  // publishes stage cur ^ 1 and frees stage cur
  }

  // Through shared memory (staged_epilogue.cuh, 16 rows of every warp a
  // pass), the columns fixed per thread: C's store (gemm/rung.cuh's
  // StoreCOf) takes them once, any other put per element.
  epilogue::put_warp_tile<S, false, epilogue::Order::kRows, int(sizeof(stages))>(
      M, N, m0 + wm, n0 + wn, lane, warp, acc, stages, [&](int n, int valid) {
        if constexpr (requires { put.columns(n, valid); })
          return put.columns(n, valid);
        else
          return [&put, n, valid](int m, const float4& v) { put(m, n, v, valid); };
      });
}

template <class MathT, int WarpsM, int WarpsN, int MinBlocks>
template <class GetA, class GetB, class Put>
__device__ __forceinline__ void Shape<MathT, WarpsM, WarpsN, MinBlocks>::multiply(
    int M, int N, int K, const GetA& ga, const GetB& gb, const Put& put) {
  mma_tile::multiply<Shape>(M, N, K, ga, gb, put);
}

}  // namespace anvil::cuda::mma_tile
