// The tile of GEMM rung 11 (11_tf32_pipelined.cu explains the mapping, the
// layouts and the pipeline): one block computes a 128 x 128 tile of
// C = op(A) * op(B) on mma.sync.m16n8k8 with TF32 operands, its operands
// brought from global to shared memory by cp.async through kStages stages,
// one mma deep (BK = 8) each.
//
// The operands are the accessors of warp_tile.cuh (kMajor, operator()(j, k),
// at(j, k): the element's address, and `aligned`); the result goes through
// put(m, n, v, valid) as for mma_tile.cuh.
#pragma once
#include <cstdint>
#if !defined(__CUDACC__)
#include <stdexcept>
#endif

#include "kernels/cuda/cp_async.cuh"
#include "kernels/cuda/cuda_compat.h"
#include "kernels/cuda/gemm/mma_tile.cuh"
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/vec4.cuh"

namespace anvil::cuda::mma_pipeline {

constexpr int kBK = 8;  // k per stage: one m16n8k8

// Where the words of one operand's stage lie (11_tf32_pipelined.cu draws
// them). Words come in pairs that one 8-byte load brings to a fragment:
// PairJ (A): rows j and j + 8 of each 16 at the same k, (a0, a1) and
// (a2, a3); otherwise (B): k and k + 4 at the same j, (b0, b1). A unit is
// 4 pairs (8 words) that one thread copies as two quads of the stored
// matrix, x at (j, k) and y at (j + kDJ, k + kDK), each 4 elements along
// the contiguous index (j if KMajor, else k), and then rounds in place as
// x0 y0 x1 y1 x2 y2 x3 y3.
template <bool KMajor, bool PairJ, int BJ>
struct Layout {
  static constexpr int kDJ = PairJ ? 8 : 0, kDK = PairJ ? 0 : 4;
  static constexpr int kLD = KMajor ? (PairJ ? BJ + 8 : 2 * BJ + 8) : (PairJ ? 16 : 8);
  static constexpr int kRows = KMajor ? (PairJ ? kBK : kBK / 2) : (PairJ ? BJ / 2 : BJ);
  static constexpr int kWords = kRows * kLD;
  static constexpr int kUnits = BJ * kBK / 8;
  // PairJ: the pair row of j (j % 16 < 8).
  __device__ __forceinline__ static int row(int j) { return PairJ ? j / 16 * 8 + j % 8 : j; }
  // The first word of the pair holding (j, k) (PairJ: j % 16 < 8; else k < 4).
  __device__ __forceinline__ static int pair(int j, int k) {
    if constexpr (KMajor) return PairJ ? k * kLD + 2 * row(j) : k * kLD + 2 * j;
    // Contiguous along k, PairJ: rows of 8 pairs, the two halves of k swapped
    // in pair rows 2 and 3 of every 4 (the swizzle that spreads a fragment
    // load's lanes over all 32 banks).
    const int r = row(j);
    return PairJ ? r * kLD + 2 * (k ^ ((r & 2) * 2)) : r * kLD + 2 * k;
  }
  // Unit e's x quad, (j, k) in the stage. KMajor: consecutive e along j (a
  // warp copies 512 contiguous bytes of stored rows); else consecutive e
  // along k, then j (runs of 32 bytes).
  __device__ __forceinline__ static int unit_j(int e) {
    if constexpr (KMajor) return PairJ ? e % (BJ / 8) / 2 * 16 + e % 2 * 4 : e % (BJ / 4) * 4;
    return PairJ ? e / 2 / 8 * 16 + e / 2 % 8 : e;
  }
  __device__ __forceinline__ static int unit_k(int e) {
    if constexpr (KMajor) return PairJ ? e / (BJ / 8) : e / (BJ / 4);
    return PairJ ? e % 2 * 4 : 0;
  }
  __device__ __forceinline__ static int unit_word(int e) { return pair(unit_j(e), unit_k(e)); }
};

// Copies quad (j..j+3, k) of a KMajor operand, else (j, k..k+3), from src
// to dst (4 words), its first n elements inside the matrix: one 16-byte
// cp.async (Aligned), else one 4-byte cp.async per element; src-size the
// bytes inside, zeros after them. A copy of nothing reads from `nothing`, a
// valid address (src-size 0 reads no byte of it).
template <bool Aligned>
__device__ __forceinline__ void copy_quad(uint32_t* dst, const float* src, int n,
                                          const float* nothing) {
  if constexpr (Aligned) {
    cp_async::copy_cg(dst, n > 0 ? src : nothing, 4 * n);
  } else {
    #pragma unroll
    for (int i = 0; i < 4; ++i)
      cp_async::copy_ca<4>(dst + i, i < n ? src + i : nothing, i < n ? 4 : 0);
  }
}

// min(4, max(0, v)): the elements of a quad inside, given how many are left.
__device__ __forceinline__ int clamp4(int v) { return v <= 0 ? 0 : v < 4 ? v : 4; }

// This thread's share of one operand's stage: unit threadIdx.x, quads x at
// (j, k) and y at (j + kDJ, k + kDK), copied into its 8 words of the stage
// and rounded there. The stage's k advances by 8 per copy.
template <int Threads, bool PairJ, int BJ, class Get>
struct Stager {
  using L = Layout<Get::kMajor, PairJ, BJ>;
  static_assert(L::kUnits == Threads, "one unit per thread and operand");
  static constexpr bool kAlongJ = Get::kMajor;
  const float* src;  // x's first element at the current stage (the address only)
  const float* nothing;
  int64_t step;      // floats from one stage's element to the next's (8 along k)
  int64_t to_y;      // floats from x's first element to y's
  int k;             // x's k at the current stage
  // Along j, the elements of x and y inside J (at most 4); along k, 4 if
  // the quad's row j is inside J, else 0.
  int room_x, room_y;

  __device__ __forceinline__ Stager(const Get& get, int j0, int J) {
    const int e = int(threadIdx.x), j = j0 + L::unit_j(e);
    k = L::unit_k(e);
    src = get.at(j, k);
    nothing = get.at(0, 0);
    step = get.at(0, kBK) - get.at(0, 0);
    to_y = get.at(j + L::kDJ, k + L::kDK) - src;
    room_x = kAlongJ ? clamp4(J - j) : j < J ? 4 : 0;
    room_y = kAlongJ ? clamp4(J - j - L::kDJ) : j + L::kDJ < J ? 4 : 0;
  }
  __device__ __forceinline__ static uint32_t* words(uint32_t* tile) {
    return tile + L::unit_word(int(threadIdx.x));
  }
  // The elements inside J x Kd of a quad with `room` at k.
  __device__ __forceinline__ static int inside(int room, int k, int Kd) {
    if constexpr (kAlongJ) return k < Kd ? room : 0;
    const int left = clamp4(Kd - k);
    return room < left ? room : left;
  }
  // Copies the next stage into tile.
  template <bool Aligned>
  __device__ __forceinline__ void copy(uint32_t* tile, int Kd) {
    uint32_t* w = words(tile);
    copy_quad<Aligned>(w, src, inside(room_x, k, Kd), nothing);
    copy_quad<Aligned>(w + 4, src + to_y, inside(room_y, k + L::kDK, Kd), nothing);
    src += step;
    k += kBK;
  }
  // The unit as copied (quads x, y of floats), rounded by cvt.rna.tf32.f32
  // and interleaved in place. Only this thread's copies are touched, so its
  // own wait_group is all it needs before.
  __device__ __forceinline__ static void round(uint32_t* tile) {
    uint32_t* w = words(tile);
    const float4 a = vec::load4(reinterpret_cast<const float*>(w));
    const float4 b = vec::load4(reinterpret_cast<const float*>(w + 4));
    const uint32_t lo[4] = {tc::cvt_rna_tf32(a.x), tc::cvt_rna_tf32(b.x), tc::cvt_rna_tf32(a.y),
                            tc::cvt_rna_tf32(b.y)};
    const uint32_t hi[4] = {tc::cvt_rna_tf32(a.z), tc::cvt_rna_tf32(b.z), tc::cvt_rna_tf32(a.w),
                            tc::cvt_rna_tf32(b.w)};
    mma_tile::store_words(w, lo);
    mma_tile::store_words(w + 4, hi);
  }
};

// r0, r1 = p[0], p[1], one 8-byte load; p 8-byte aligned.
__device__ __forceinline__ void load_pair(const uint32_t* p, uint32_t& r0, uint32_t& r1) {
#if defined(__CUDACC__)
  const uint2 v = *reinterpret_cast<const uint2*>(p);
  r0 = v.x;
  r1 = v.y;
#else
  if (reinterpret_cast<uintptr_t>(p) % 8 != 0)
    throw std::runtime_error("misaligned 64-bit shared-memory load");
  r0 = p[0];
  r1 = p[1];
#endif
}

// Warps of 64 x 64 (4 x 8 mma tiles of 16 x 8), with this file's main loop.
template <int WarpsM, int WarpsN, int Stages, int MinBlocks>
struct Shape : mma_tile::Blocking<kBK, WarpsM, WarpsN, 64, Stages, MinBlocks> {
  template <class GetA, class GetB, class Put>
  __device__ __forceinline__ static void multiply(int M, int N, int K, const GetA& ga,
                                                  const GetB& gb, const Put& put);
};
// GEMM rung 11: 128 x 128, 2 x 2 warps (128 threads), 4 stages.
using Tf32 = Shape<2, 2, 4, 2>;

// The mma of one stage: this warp's 8 B fragments (one 8-byte load each,
// b0 b1 = (n, t), (n, t+4) with n = wn + 8j + g), then per row tile i its A
// fragment (two: a0 a1 = (m, t), (m+8, t) and a2 a3 = (m, t+4), (m+8, t+4)
// with m = wm + 16i + g) and 8 mma.
template <class S, class LA, class LB>
__device__ __forceinline__ void mma_stage(const uint32_t* As, const uint32_t* Bs, int wm, int wn,
                                          int g, int t, float (&acc)[S::kTilesM][S::kTilesN][4]) {
  uint32_t b[S::kTilesN][2];
  #pragma unroll
  for (int j = 0; j < S::kTilesN; ++j)
    load_pair(Bs + LB::pair(wn + j * 8 + g, t), b[j][0], b[j][1]);
  #pragma unroll
  for (int i = 0; i < S::kTilesM; ++i) {
    const int m = wm + i * 16 + g;
    uint32_t a[4];
    load_pair(As + LA::pair(m, t), a[0], a[1]);
    load_pair(As + LA::pair(m, t + 4), a[2], a[3]);
    #pragma unroll
    for (int j = 0; j < S::kTilesN; ++j) tc::mma_m16n8k8_tf32(acc[i][j], a, b[j], acc[i][j]);
  }
}

// The main loop (11_tf32_pipelined.cu explains it), for Aligned operands
// (16-byte copies) or not (4-byte copies).
template <class S, bool Aligned, class SA, class SB>
__device__ __forceinline__ void pipeline(int K, SA& sa, SB& sb,
                                         uint32_t (*As)[SA::L::kWords],
                                         uint32_t (*Bs)[SB::L::kWords], int wm, int wn, int g,
                                         int t, float (&acc)[S::kTilesM][S::kTilesN][4]) {
  using LA = typename SA::L;
  using LB = typename SB::L;
  const int steps = (K + S::kBK - 1) / S::kBK;
  auto copy = [&](int s) {  // stage s into buffer s % kStages, one commit group
    if (s < steps) {
      sa.template copy<Aligned>(As[s % S::kStages], K);
      sb.template copy<Aligned>(Bs[s % S::kStages], K);
    }
    cp_async::commit_group();  // empty past the end: one group per stage, always
  };
  #pragma unroll
  for (int s = 0; s < S::kStages - 1; ++s) copy(s);
  for (int s = 0; s < steps; ++s) {
    const int cur = s % S::kStages;
    cp_async::wait_group<S::kStages - 2>();  // this thread's copies of stage s have landed
    SA::round(As[cur]);
    SB::round(Bs[cur]);
    // Publishes stage s, and every warp is past its mma of stage s - 1,
    // whose buffer the copy below refills.
    __syncthreads();
    copy(s + S::kStages - 1);
    mma_stage<S, LA, LB>(As[cur], Bs[cur], wm, wn, g, t, acc);
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
  const int g = lane / 4, t = lane % 4;
  const int wm = warp / S::kWarpsN * S::kWarpM, wn = warp % S::kWarpsN * S::kWarpN;
  const int m0 = int(blockIdx.y) * S::kBM, n0 = int(blockIdx.x) * S::kBN;
  using SA = Stager<S::kThreads, true, S::kBM, GetA>;  // A: pairs of rows m, m + 8
  using SB = Stager<S::kThreads, false, S::kBN, GetB>;  // B: pairs of k, k + 4
  alignas(16) __shared__ uint32_t As[S::kStages][SA::L::kWords];
  alignas(16) __shared__ uint32_t Bs[S::kStages][SB::L::kWords];
  SA sa(ga, m0, M);
  SB sb(gb, n0, N);
  float acc[S::kTilesM][S::kTilesN][4] = {};
  if (ga.aligned && gb.aligned)  // the same for the whole launch
    pipeline<S, true>(K, sa, sb, As, Bs, wm, wn, g, t, acc);
  else
    pipeline<S, false>(K, sa, sb, As, Bs, wm, wn, g, t, acc);
  mma_tile::put_warp_tile(M, N, m0 + wm, n0 + wn, g, t, acc, put);
}

}  // namespace anvil::cuda::mma_pipeline
