// The tensor-core tile of GEMM rung 09 (09_tf32_mma.cu, where the fragment
// mapping, the shared-memory layout, the tiling and the pipeline are
// explained): one block computes a 128 x 128 tile of C = op(A) * op(B) (an
// M x N result, reduction length K) with TF32 mma.sync.m16n8k8, FP32
// accumulation, walking K in steps of 8 through two shared-memory stages.
//
// The operands are the accessors of warp_tile.cuh (kMajor, operator()(j, k),
// optional quad(j, k) and `aligned`); the result goes through
// put(m, n, v, valid) with valid 1 or 2: C[m][n], C[m][n+1] are v.x, v.y, of
// which the first `valid` lie inside N, called only for m < M.
#pragma once
#include <cstdint>
#if !defined(__CUDACC__)
#include <bit>
#endif

#include "kernels/cuda/cuda_compat.h"
#include "kernels/cuda/gemm/warp_tile.cuh"
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/vec4.cuh"

namespace anvil::cuda::tf32_tile {

// A block of WarpsM x WarpsN warps, each warp a 64 x 32 sub-tile of C: 4 x 4
// mma tiles of 16 x 8.
template <int WarpsM, int WarpsN, int MinBlocks>
struct Shape {
  static constexpr int kBK = 8;
  static constexpr int kWarpsM = WarpsM, kWarpsN = WarpsN, kThreads = 32 * WarpsM * WarpsN;
  static constexpr int kWarpM = 64, kWarpN = 32;
  static constexpr int kBM = kWarpsM * kWarpM, kBN = kWarpsN * kWarpN;
  static constexpr int kTilesM = kWarpM / 16, kTilesN = kWarpN / 8;  // 4 x 4
  static constexpr int kMinBlocks = MinBlocks;  // __launch_bounds__: resident blocks per SM
};
// GEMM rung 09 and convolution rung 06: 128 x 128, 2 x 4 warps.
using Wide = Shape<2, 4, 2>;
// 64 x 128, 1 x 4 warps (128 threads), for results of at most 64 rows (a
// convolution with 64 or fewer output channels), as warp_tile.cuh's
// DoubleBufferedNarrow.
using Narrow = Shape<1, 4, 3>;

// The bits of a float, and a float rounded to TF32 (cvt.rna.tf32.f32: 13 low
// bits zero), kept as a float so that it can be staged with float stores.
__device__ __forceinline__ uint32_t bits(float x) {
#if defined(__CUDACC__)
  return __float_as_uint(x);
#else
  return std::bit_cast<uint32_t>(x);
#endif
}
__device__ __forceinline__ float round_tf32(float x) {
#if defined(__CUDACC__)
  return __uint_as_float(tc::cvt_rna_tf32(x));
#else
  return std::bit_cast<float>(tc::cvt_rna_tf32(x));
#endif
}

// Where element (j, k) of an operand's BJ x BK stage lies in shared memory,
// following the operand's layout in global memory (09_tf32_mma.cu says why):
// KMajor (contiguous along j): [k][j], rows of BJ + 8 floats; otherwise
// (contiguous along k): [j][k], rows of BK + 4 floats.
template <bool KMajor, int BJ, int BK>
struct Layout {
  static constexpr int kLD = KMajor ? BJ + 8 : BK + 4;
  static constexpr int kFloats = (KMajor ? BK : BJ) * kLD;
  __device__ __forceinline__ static int at(int j, int k) {
    return KMajor ? k * kLD + j : j * kLD + k;
  }
};

// One thread's share of one operand's stage: kQuads quads fetched from
// global memory into registers, then rounded to TF32 and stored into shared
// memory with one 16-byte store each. Quad e covers (j..j+3, k) of a KMajor
// operand, consecutive threads along j, else (j, k..k+3), the BK / 4 quads
// of one j taken by consecutive threads: either way a warp reads runs of
// consecutive floats of the stored matrix, and each quad is contiguous in the
// Layout above.
template <class S, int BJ, class Get>
struct Stager {
  using L = Layout<Get::kMajor, BJ, S::kBK>;
  static constexpr int kQuads = S::kBK * BJ / 4 / S::kThreads;
  static_assert(kQuads >= 1 && kQuads * 4 * S::kThreads == S::kBK * BJ);
  float4 r[kQuads];

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
      r[q] = warp_tile::fetch_quad(get, j0 + quad_j(e), k0 + quad_k(e), J, Kd);
    }
  }
  __device__ __forceinline__ void store(float* tile) const {
    #pragma unroll
    for (int q = 0; q < kQuads; ++q) {
      const int e = int(threadIdx.x) + q * S::kThreads;
      const float4 v = make_float4(round_tf32(r[q].x), round_tf32(r[q].y), round_tf32(r[q].z),
                                   round_tf32(r[q].w));
      vec::store4(tile + L::at(quad_j(e), quad_k(e)), v);
    }
  }
};

// The mma of one BK step: for each 8-long k slice, this warp's kTilesN B
// fragments (columns wn + 8j ..) loaded from the stage, then for each of its
// kTilesM row tiles (rows wm + 16i ..) the A fragment and kTilesN mma (one
// A fragment live at a time, not all four).
template <class S, class LA, class LB>
__device__ __forceinline__ void mma_step(const float* As, const float* Bs, int wm, int wn, int g,
                                         int t, float (&acc)[S::kTilesM][S::kTilesN][4]) {
  #pragma unroll
  for (int kk = 0; kk < S::kBK; kk += 8) {
    uint32_t b[S::kTilesN][2];
    #pragma unroll
    for (int j = 0; j < S::kTilesN; ++j) {
      const int n = wn + j * 8 + g;  // b0 (k = t, n = g), b1 (k = t+4, n = g)
      b[j][0] = bits(Bs[LB::at(n, kk + t)]);
      b[j][1] = bits(Bs[LB::at(n, kk + t + 4)]);
    }
    #pragma unroll
    for (int i = 0; i < S::kTilesM; ++i) {
      const int m = wm + i * 16 + g;  // a0 (g, t), a1 (g+8, t), a2 (g, t+4), a3 (g+8, t+4)
      const uint32_t a[4] = {bits(As[LA::at(m, kk + t)]), bits(As[LA::at(m + 8, kk + t)]),
                             bits(As[LA::at(m, kk + t + 4)]), bits(As[LA::at(m + 8, kk + t + 4)])};
      #pragma unroll
      for (int j = 0; j < S::kTilesN; ++j) tc::mma_m16n8k8_tf32(acc[i][j], a, b[j], acc[i][j]);
    }
  }
}

// C tile (blockIdx.y, blockIdx.x) of the M x N result; launch with grid
// (ceil(N / S::kBN), ceil(M / S::kBM)) and S::kThreads threads. Every lane
// of every warp reaches every mma (the edges are zeros in shared memory, not
// skipped work), as mma.sync requires.
template <class S, class GetA, class GetB, class Put>
__device__ __forceinline__ void multiply(int M, int N, int K, const GetA& ga, const GetB& gb,
                                         const Put& put) {
  using SA = Stager<S, S::kBM, GetA>;
  using SB = Stager<S, S::kBN, GetB>;
  using LA = typename SA::L;
  using LB = typename SB::L;
  alignas(16) __shared__ float As[2][LA::kFloats];
  alignas(16) __shared__ float Bs[2][LB::kFloats];
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
    sa.store(As[0]);
    sb.store(Bs[0]);
  }
  __syncthreads();
  for (int s = 0; s < steps; ++s) {
    const int cur = s & 1;
    const bool more = s + 1 < steps;  // the same for every thread of the block
    if (more) {                       // in flight during the mma below
      sa.fetch(ga, m0, (s + 1) * S::kBK, M, K);
      sb.fetch(gb, n0, (s + 1) * S::kBK, N, K);
    }
    mma_step<S, LA, LB>(As[cur], Bs[cur], wm, wn, g, t, acc);
    if (more) {  // stage cur ^ 1 was last read in step s - 1, before its barrier
      sa.store(As[cur ^ 1]);
      sb.store(Bs[cur ^ 1]);
    }
    __syncthreads();  // publishes stage cur ^ 1 and frees stage cur
  }

  // c0 (g, 2t), c1 (g, 2t+1), c2 (g+8, 2t), c3 (g+8, 2t+1) of each mma tile.
  #pragma unroll
  for (int i = 0; i < S::kTilesM; ++i) {
    #pragma unroll
    for (int j = 0; j < S::kTilesN; ++j) {
      const int m = m0 + wm + i * 16 + g, n = n0 + wn + j * 8 + 2 * t;
      if (n >= N) continue;
      const int valid = N - n < 2 ? N - n : 2;
      if (m < M) put(m, n, make_float4(acc[i][j][0], acc[i][j][1], 0.0f, 0.0f), valid);
      if (m + 8 < M) put(m + 8, n, make_float4(acc[i][j][2], acc[i][j][3], 0.0f, 0.0f), valid);
    }
  }
}

}  // namespace anvil::cuda::tf32_tile
