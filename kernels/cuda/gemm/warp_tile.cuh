// The tiles of GEMM rungs 05-08 (gemm/) and of the implicit-GEMM
// convolution rungs 04-05 (conv/): one block computes a BM x BN tile of
// C = op(A) * op(B) (an M x N result, reduction length K), walking K in steps
// of BK through shared memory. Three ideas, each one rung of the GEMM ladder,
// all set by the Shape below:
//
// 128-bit accesses (rung 5 on). Global memory is read four floats at a
//   time with one 16-byte load (vec4.cuh) wherever the operand allows it (an
//   aligned strided matrix: tile::Strided::aligned) and the four lie inside
//   the matrix; otherwise, at ragged edges, misaligned strides, and for the
//   convolution's gathered column matrix, as four scalar loads (zeros
//   outside). Shared memory is read the same way: each thread owns runs of 4
//   consecutive rows and 4 consecutive columns of its block's C tile, so the
//   4 A values it needs for one k are one LDS.128 from the [k][m] tile, the 4
//   B values one from the [k][n] tile. Rung 4 issued 8 scalar shared loads
//   per 16 multiply-adds; this issues 2.
//
// Warp tiles (rung 6 on). The block's threads are grouped by warp: each of
//   the WarpsM x WarpsN warps owns a WarpM x WarpN sub-tile of C, and within
//   it each lane owns SubM x SubN quads of 4x4 outputs, spaced LanesM*4 rows
//   and LanesN*4 columns apart (lane = lane_m * LanesN + lane_n). Rung 6's
//   128x128 tile has 2 x 4 warps of 64 x 32, 8 x 4 lanes, 2 x 2 quads: an 8x8
//   register block per thread, so each k costs 4 LDS.128 for 64 multiply-
//   adds, and each element staged in shared memory is used by 128 threads'
//   FMAs instead of 64. The lanes of a warp read 8 different A quads
//   (128 consecutive bytes) and 4 different B quads, the rest broadcast: no
//   bank conflicts.
//
// Double buffering (rung 7). Two shared-memory stages. While the threads
//   multiply the tiles of step t from one stage, the loads of step t+1 are
//   already in flight into registers; they are stored into the other stage
//   after the multiply-adds, and one __syncthreads per step (not two) both
//   publishes them and frees the stage just read. The latency of the global
//   loads hides behind BK*64 multiply-adds per thread.
//
// Staging. Each operand's BK x BJ tile is stored [k][j] (j = m for A, n for
// B), rows padded by 4 floats (so each row starts on a 16-byte boundary).
// Every thread fetches Quads = BK*BJ/4/threads quads of it. For a KMajor
// operand (contiguous along j) quad e covers (j..j+3, k) with consecutive
// threads along j: a warp reads consecutive 16-byte pieces of a stored row
// and stores them with STS.128. Otherwise the quad covers (j, k..k+3),
// threads taking the BK/4 quads of one j in turn: with BK = 8 a warp reads 16
// rows, 32 bytes each (whole sectors), and writes 4 scalars per quad down a
// column of the tile; the padding (a row of BJ + 4 floats, 4 mod 32 banks)
// puts a warp's 32 stores in 32 different banks. (With BK = 16, rung 5,
// two quads of a warp share each bank: a 2-way conflict on those stores.)
//
// The operands are accessors as in tile.cuh (kMajor, operator()(j, k)),
// with an optional quad(j, k): the four elements along the contiguous index,
// used for quads wholly inside the matrix when the operand's `aligned` is
// true (a strided matrix: one 16-byte load, where its address allows; a
// gathered one, the convolutions': four loads sharing their index arithmetic). The result
// goes through put(m, n, v, valid): a float4 of C[m][n..n+3] of which the
// first `valid` (1-4) lie inside N, called only for m < M.
//
// Every loop over a thread's registers is unrolled (#pragma unroll), so that
// acc, a and b are indexed only by constants and stay in registers: a loop
// left rolled puts the 8x8 accumulators in local memory (a stack frame in
// ptxas -v, LDL/STL in the SASS; the kernel table checks for both).
#pragma once
#include <cstdint>
#include <type_traits>
#include <utility>

#include "kernels/cuda/cuda_compat.h"
#include "kernels/cuda/vec4.cuh"

namespace anvil::cuda::warp_tile {

// How a block's threads cover its tile (see the top of this file).
template <int BK, int WarpsM, int WarpsN, int LanesM, int SubM, int SubN, int Stages,
          int MinBlocks>
struct Shape {
  static constexpr int kBK = BK, kWarpsM = WarpsM, kWarpsN = WarpsN;
  static constexpr int kLanesM = LanesM, kLanesN = 32 / LanesM;
  static constexpr int kSubM = SubM, kSubN = SubN;
  static constexpr int kWarpM = SubM * LanesM * 4, kWarpN = SubN * kLanesN * 4;
  static constexpr int kBM = WarpsM * kWarpM, kBN = WarpsN * kWarpN;
  static constexpr int kThreads = 32 * WarpsM * WarpsN;
  static constexpr int kStages = Stages;        // 2: double-buffered
  static constexpr int kMinBlocks = MinBlocks;  // __launch_bounds__: resident blocks per SM
  static constexpr int kPad = 4;
  static_assert(32 % LanesM == 0 && BK % 4 == 0 && (Stages == 1 || Stages == 2));
};

// Rung 5: rung 4's 64x64 tile and BK = 16, with 16-byte loads; 8 warps
// of 8 x 64 (2 x 16 lanes), one 4x4 quad per thread.
using Vectorised = Shape<16, 8, 1, 2, 1, 1, 1, 4>;
// Rung 6: a 128x128 tile, BK = 8, 2 x 4 warps of 64 x 32, 8x8 per thread.
using WarpTiled = Shape<8, 2, 4, 8, 2, 2, 1, 2>;
// Rung 7: rung 6, double-buffered.
using DoubleBuffered = Shape<8, 2, 4, 8, 2, 2, 2, 2>;
// Rung 7's tile cut to 64 rows (1 x 4 warps, 128 threads), for results
// of at most 64 rows (a convolution with 64 or fewer output channels).
using DoubleBufferedNarrow = Shape<8, 1, 4, 8, 2, 2, 2, 3>;

// The type of an operand's elements: float, or bfloat16 (read only by the
// BF16 tensor-core tile, mma_tile.cuh).
template <class Get>
using ElementOf = std::remove_cvref_t<decltype(std::declval<const Get&>()(0, 0))>;

// Four elements of an operand in registers: a float4, or a vec::Bf16x4 for
// bfloat16 (named here, not deduced: host code takes the type too).
template <class T> struct QuadType { using type = float4; };
template <> struct QuadType<bfloat16> { using type = vec::Bf16x4; };
template <class Get>
using QuadOf = typename QuadType<ElementOf<Get>>::type;

// Elements (j..j+3, k) of a KMajor operand, else (j, k..k+3), zero outside
// J x Kd: one load (16 bytes of float, 8 of bfloat16) when the operand has
// quad() and all four are inside, else four scalar loads.
template <class Get>
__device__ __forceinline__ QuadOf<Get> fetch_quad(const Get& get, int j, int k, int J, int Kd) {
  using T = ElementOf<Get>;
  constexpr bool kAlongJ = Get::kMajor;
  if constexpr (requires { get.quad(j, k); }) {
    const bool whole = kAlongJ ? (j + 3 < J && k < Kd) : (j < J && k + 3 < Kd);
    if (whole && get.aligned) return get.quad(j, k);
  }
  T v[4];
  #pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int jj = kAlongJ ? j + i : j, kk = kAlongJ ? k : k + i;
    v[i] = (jj < J && kk < Kd) ? get(jj, kk) : T{};  // T{}: +0 in either type
  }
  return vec::quad_of(v);
}

// One thread's share of one operand's BK x BJ tile, held in registers
// between the global loads and the shared-memory stores.
template <class S, int BJ, class Get>
struct Stager {
  static constexpr int kLD = BJ + S::kPad;
  static constexpr int kQuads = S::kBK * BJ / 4 / S::kThreads;
  static_assert(kQuads >= 1 && kQuads * 4 * S::kThreads == S::kBK * BJ,
                "the block's threads must share the tile's quads evenly");
  float4 r[kQuads];

  // Quad e's first element, (j, k) within the tile.
  __device__ __forceinline__ static int quad_j(int e) {
    return Get::kMajor ? e % (BJ / 4) * 4 : e / (S::kBK / 4);
  }
  __device__ __forceinline__ static int quad_k(int e) {
    return Get::kMajor ? e / (BJ / 4) : e % (S::kBK / 4) * 4;
  }
  __device__ __forceinline__ void fetch(const Get& get, int j0, int k0, int J, int Kd) {
    #pragma unroll
    for (int q = 0; q < kQuads; ++q) {
      const int e = int(threadIdx.x) + q * S::kThreads;
      r[q] = fetch_quad(get, j0 + quad_j(e), k0 + quad_k(e), J, Kd);
    }
  }
  __device__ __forceinline__ void store(float (*tile)[kLD]) const {
    #pragma unroll
    for (int q = 0; q < kQuads; ++q) {
      const int e = int(threadIdx.x) + q * S::kThreads, j = quad_j(e), k = quad_k(e);
      if (Get::kMajor) {
        vec::store4(&tile[k][j], r[q]);
      } else {
        #pragma unroll
        for (int i = 0; i < 4; ++i) tile[k + i][j] = vec::at(r[q], i);
      }
    }
  }
};

// The multiply-adds of one BK step: acc += As[:, rows] x Bs[:, cols] for
// this thread's quads (rows row0 + sm*LanesM*4 .., columns col0 + sn*LanesN*4 ..).
template <class S>
__device__ __forceinline__ void multiply_step(const float (*As)[S::kBM + S::kPad],
                                              const float (*Bs)[S::kBN + S::kPad], int row0,
                                              int col0,
                                              float (&acc)[S::kSubM * 4][S::kSubN * 4]) {
  #pragma unroll
  for (int k = 0; k < S::kBK; ++k) {
    float a[S::kSubM * 4], b[S::kSubN * 4];
    #pragma unroll
    for (int sm = 0; sm < S::kSubM; ++sm) {
      const float4 v = vec::load4(&As[k][row0 + sm * S::kLanesM * 4]);
      #pragma unroll
      for (int i = 0; i < 4; ++i) a[sm * 4 + i] = vec::at(v, i);
    }
    #pragma unroll
    for (int sn = 0; sn < S::kSubN; ++sn) {
      const float4 v = vec::load4(&Bs[k][col0 + sn * S::kLanesN * 4]);
      #pragma unroll
      for (int j = 0; j < 4; ++j) b[sn * 4 + j] = vec::at(v, j);
    }
    #pragma unroll
    for (int i = 0; i < S::kSubM * 4; ++i)
      #pragma unroll
      for (int j = 0; j < S::kSubN * 4; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
  }
}

// C tile (blockIdx.y, blockIdx.x) of the M x N result; launch with grid
// (ceil(N / S::kBN), ceil(M / S::kBM)) and S::kThreads threads.
template <class S, class GetA, class GetB, class Put>
__device__ __forceinline__ void multiply(int M, int N, int K, const GetA& ga, const GetB& gb,
                                         const Put& put) {
  alignas(16) __shared__ float As[S::kStages][S::kBK][S::kBM + S::kPad];  // As[k][m]
  alignas(16) __shared__ float Bs[S::kStages][S::kBK][S::kBN + S::kPad];  // Bs[k][n]
  const int lane = int(threadIdx.x) % 32, warp = int(threadIdx.x) / 32;
  const int row0 = warp / S::kWarpsN * S::kWarpM + lane / S::kLanesN * 4;
  const int col0 = warp % S::kWarpsN * S::kWarpN + lane % S::kLanesN * 4;
  const int m0 = int(blockIdx.y) * S::kBM, n0 = int(blockIdx.x) * S::kBN;
  const int steps = (K + S::kBK - 1) / S::kBK;

  Stager<S, S::kBM, GetA> sa;
  Stager<S, S::kBN, GetB> sb;
  float acc[S::kSubM * 4][S::kSubN * 4] = {};
  if constexpr (S::kStages == 1) {
    for (int t = 0; t < steps; ++t) {
      sa.fetch(ga, m0, t * S::kBK, M, K);
      sb.fetch(gb, n0, t * S::kBK, N, K);
      sa.store(As[0]);
      sb.store(Bs[0]);
      __syncthreads();
      multiply_step<S>(As[0], Bs[0], row0, col0, acc);
      __syncthreads();  // the next stores must not overwrite tiles still being read
    }
  } else {
    if (steps > 0) {
      sa.fetch(ga, m0, 0, M, K);
      sb.fetch(gb, n0, 0, N, K);
      sa.store(As[0]);
      sb.store(Bs[0]);
    }
    __syncthreads();
    for (int t = 0; t < steps; ++t) {
      const int cur = t & 1;
      const bool more = t + 1 < steps;  // the same for every thread of the block
      if (more) {                       // in flight during the multiply-adds below
        sa.fetch(ga, m0, (t + 1) * S::kBK, M, K);
        sb.fetch(gb, n0, (t + 1) * S::kBK, N, K);
      }
      multiply_step<S>(As[cur], Bs[cur], row0, col0, acc);
      if (more) {  // stage cur ^ 1 was last read in step t - 1, before its barrier
        sa.store(As[cur ^ 1]);
        sb.store(Bs[cur ^ 1]);
      }
      __syncthreads();  // publishes stage cur ^ 1 and frees stage cur
    }
  }

  #pragma unroll
  for (int sm = 0; sm < S::kSubM; ++sm) {
    #pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int m = m0 + row0 + sm * S::kLanesM * 4 + i;
      if (m >= M) continue;
      #pragma unroll
      for (int sn = 0; sn < S::kSubN; ++sn) {
        const int n = n0 + col0 + sn * S::kLanesN * 4;
        if (n >= N) continue;
        const float(&r)[S::kSubN * 4] = acc[sm * 4 + i];
        put(m, n, make_float4(r[sn * 4], r[sn * 4 + 1], r[sn * 4 + 2], r[sn * 4 + 3]),
            N - n < 4 ? N - n : 4);
      }
    }
  }
}

// Columns [k0, k0 + length) of an operand's reduction, as an operand of its
// own (k counted from k0): split-K (split_k.h) gives each blockIdx.z one
// such slice and multiply() the slice's length as K. k0 is a multiple of 16
// (split_k::kChunkAlign), so a slice of an aligned operand is aligned.
template <class Get>
struct KSlice {
  static constexpr bool kMajor = Get::kMajor;
  Get get;
  int k0;
  bool aligned;
  __device__ __forceinline__ KSlice(const Get& g, int k0_) : get(g), k0(k0_), aligned(g.aligned) {}
  __device__ __forceinline__ auto operator()(int j, int k) const { return get(j, k0 + k); }
  __device__ __forceinline__ auto quad(int j, int k) const { return get.quad(j, k0 + k); }
  __device__ __forceinline__ auto at(int j, int k) const { return get.at(j, k0 + k); }
};

}  // namespace anvil::cuda::warp_tile
