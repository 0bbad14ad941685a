// Backward-weight as an implicit GEMM on channels-last operands, on the
// multistage mainloop (gemm/mma_multistage.cuh), over its kind of mma:
// convolution rungs 08's (Bf16) and 09's (Tf32Rounded) third direction
// (08_bf16_multistage.cu and 09_tf32_multistage.cu explain the rungs).
//
//   dw[k, c, r, s] = sum over (n, p, q) of x[n, p*sh - ph + r, q*sw - pw + s, c] * dy[n, p, q, k]
//
// x is NHWC with C padded to Cp and dy NHWC with K padded to Kp (multiples
// of kChunk, zeros beyond), in the kind's operand type (bfloat16 or
// float32). The GEMM: M = R*S*Cp rows (A: the activations, row m = (r*S +
// s)*Cp + c), N = K columns (B: the output gradient), reduced over i =
// (n*P + p)*Q + q, kBK (32 or 16) a k-step (one stage), within [begin, end)
// of this block's split (blockIdx.z).
//
// Neither operand is contiguous along the reduction: both are contiguous
// along their own rows (kChunk channels of a pixel, or of dy's k, are one
// 16-byte chunk), so their stages are the Layout's "contiguous along j"
// form: kBK rows i of BJ / kChunk chunks, read by ldmatrix.trans for Bf16
// (as GEMM rung 12's row-major B), by 8-byte (A, its rows permuted) and
// 4-byte (B) shared loads from padded rows for the Tf32 kinds (as GEMM
// rung 11's).
//
// Which chunks a thread copies (RowChunks). With 128 threads, kTpr =
// 128 / kBK (4 or 8) share each of a stage's rows: thread t copies row i =
// t / kTpr, chunks a + kTpr v (a = t % kTpr, v = 0 .. BJ/32 - 1). So a
// thread has one position i per step, and one walk along (n, p, q) serves
// all its chunks. Bf16: the swizzle puts chunk a + 4v of row i at (a ^ (i &
// 3)) + 4 (v ^ (i / 4 % 2)): taking v = u ^ (i / 4 % 2) for unit u, unit u
// lands at unit 0's chunk + 4u, a constant offset. A warp's store (8 rows,
// 32 chunks) hits each of the 8 bank groups 4 times: 4 wavefronts for 512
// bytes, the least there is; its 8 rows' global reads are 64 contiguous
// bytes each (dy). Tf32 kinds: rows unswizzled (padded by 8 floats), v =
// u, unit u at unit 0's chunk + 8u (32 floats on); a warp's store is 4 rows
// of 8 consecutive chunks, each phase of 8 lanes 128 contiguous bytes of one
// row: conflict-free; its global reads 128 contiguous bytes a row.
#pragma once
#include <climits>
#include <cstdint>

#include "core/bfloat16.h"
#include "kernels/cuda/conv/implicit_nhwc.cuh"
#include "kernels/cuda/cp_async.cuh"
#include "kernels/cuda/cuda_compat.h"
#include "kernels/cuda/gemm/mma_multistage.cuh"
#include "kernels/cuda/gemm/mma_tile.cuh"
#include "kernels/cuda/gemm/staged_epilogue.cuh"
#include "kernels/cuda/vec4.cuh"

namespace anvil::cuda::conv_kernels {

// The shape, as the backward-weight kernel sees it (checked to fit int on
// the host); `chunk`: the reduction positions of a split (a multiple of
// kBK, or all of N*P*Q).
struct WgradGeo {
  int N, H, W, C, Cp, K, Kp, R, S, sh, sw, ph, pw, P, Q, chunk;
};

template <class Kind, int Threads, int BJ>
struct RowChunks {
  using L = multistage::Layout<Kind, true, BJ>;
  static constexpr int kTpr = Threads / Kind::kBK;  // threads a row
  static_assert(kTpr * Kind::kChunk == 32, "a unit's kTpr chunks: 32 elements of j");
  static_assert(L::kPadded || BJ % 64 == 0, "an even number of units (u ^ 1 stays a unit)");
  static constexpr int kUnits = BJ / 32;
  __device__ __forceinline__ static int row() { return int(threadIdx.x) / kTpr; }
  // Unit u's first element along j.
  __device__ __forceinline__ static int j(int u) {
    const int v = L::kPadded ? u : u ^ (row() >> 2 & 1);
    return Kind::kChunk * (int(threadIdx.x) % kTpr + kTpr * v);
  }
  // Unit 0's place in a stage, L::chunk(j(0), row()); unit u is 32 u
  // elements (kTpr chunks) further. Bf16 writes the swizzle out ((a + 4 (i
  // / 4 % 2)) ^ (i % 8) = a ^ (i % 4)), the form of rung 08's SASS as
  // measured.
  __device__ __forceinline__ static int first() {
    if constexpr (L::kPadded) return L::chunk(j(0), row());
    return row() * BJ + 8 * ((int(threadIdx.x) % kTpr) ^ (row() & 3));
  }
};

// B: the output gradient, dy [N*P*Q, Kp], row i, columns n0 .. n0 + BJ.
// Precomputed: the row's address and which units lie inside Kp; stepped:
// the address, by 32 rows.
template <class Kind, int Threads, int BJ>
struct GradientIterator {
  using Rows = RowChunks<Kind, Threads, BJ>;
  using L = typename Rows::L;
  using T = Operand<Kind>;
  static constexpr bool kAlongJ = true;
  static constexpr int kUnits = Rows::kUnits;
  const T* row;  // dy + (i, n0)
  int i, end, first;
  int64_t step;
  int column[kUnits];  // unit u's offset along the row
  bool exists[kUnits];  // ... inside Kp

  __device__ __forceinline__ GradientIterator(const WgradGeo& g, const T* dy, int n0, int begin,
                                              int end_)
      : i(begin + Rows::row()), end(end_), first(Rows::first()),
        step(int64_t(Kind::kBK) * g.Kp) {
    row = dy + int64_t(i) * g.Kp + n0;
    #pragma unroll
    for (int u = 0; u < kUnits; ++u) {
      column[u] = Rows::j(u);
      exists[u] = n0 + column[u] < g.Kp;
    }
  }
  __device__ __forceinline__ void copy(typename L::Element* stage) const {
    #pragma unroll
    for (int u = 0; u < kUnits; ++u) {
      const bool inside = i < end && exists[u];
      cp_async::copy_cg(stage + first + 32 * u, row + column[u], inside ? 16 : 0);
    }
  }
  __device__ __forceinline__ void advance() {
    row += step;
    i += Kind::kBK;
  }
};

// A: the activations, row m = (r*S + s)*Cp + c of the column matrix, at
// reduction position i = (n, p, q): x[n, p*sh - ph + r, q*sw - pw + s, c].
// Precomputed per unit (its m is fixed): the tap's offset from the pixel
// (p*sh, q*sw) as (dh, dw) = (r - ph, s - pw) (dh = INT_MIN / 2 past M, so
// that no position is inside) and as an element offset. Stepped, once for
// all units: the position, as (p*sh, q*sw) and the pixel's address, kBK
// positions a step = dn images + dp rows + dq columns, with one carry from
// q into p and one from p into n (each below its bound before the carry).
// Per chunk and step: two adds, two unsigned compares, a 64-bit add. (An
// address outside x, in the padding or past the split, is never read: its
// cp.async has src-size 0.)
template <class Kind, int Threads, int BJ>
struct ColumnIterator {
  using Rows = RowChunks<Kind, Threads, BJ>;
  using L = typename Rows::L;
  using T = Operand<Kind>;
  static constexpr bool kAlongJ = true;
  static constexpr int kUnits = Rows::kUnits;
  const T* x;
  int64_t pixel;  // ((n*H + hp)*W + wq)*Cp
  int hp, wq;     // p*sh, q*sw
  int i, end, first, H, W;
  int dh[kUnits], dw[kUnits], offset[kUnits];
  // Per step: q*sw gains dwq (wrapping at Qsw), p*sh gains dhp (wrapping
  // at Psh); the pixel gains dq_pixel + dpn_pixel, and q_wrap, p_wrap on
  // the carries.
  int dwq, Qsw, dhp, Psh, sh;
  int64_t dq_pixel, dpn_pixel, q_wrap, p_wrap;

  __device__ __forceinline__ ColumnIterator(const WgradGeo& g, const T* x_, int m0, int begin,
                                            int end_)
      : x(x_), i(begin + Rows::row()), end(end_), first(Rows::first()), H(g.H), W(g.W),
        Qsw(g.Q * g.sw), Psh(g.P * g.sh), sh(g.sh) {
    const int PQ = g.P * g.Q, M = g.R * g.S * g.Cp;
    #pragma unroll
    for (int u = 0; u < kUnits; ++u) {
      const int m = m0 + Rows::j(u), tap = m / g.Cp, c = m % g.Cp;
      dh[u] = m < M ? tap / g.S - g.ph : INT_MIN / 2;
      dw[u] = tap % g.S - g.pw;
      offset[u] = m < M ? (dh[u] * g.W + dw[u]) * g.Cp + c : 0;
    }
    const int n = i / PQ, p = i % PQ / g.Q, q = i % g.Q;
    hp = p * g.sh;
    wq = q * g.sw;
    pixel = ((int64_t(n) * g.H + hp) * g.W + wq) * g.Cp;
    constexpr int kStep = Kind::kBK;
    const int dn = kStep / PQ, dp = kStep % PQ / g.Q, dq = kStep % g.Q;
    const int64_t row = int64_t(g.W) * g.Cp, image = int64_t(g.H) * row;
    dwq = dq * g.sw;
    dhp = dp * g.sh;
    dq_pixel = int64_t(dwq) * g.Cp;
    dpn_pixel = dhp * row + dn * image;
    q_wrap = g.sh * row - int64_t(Qsw) * g.Cp;
    p_wrap = image - Psh * row;
  }
  __device__ __forceinline__ void copy(typename L::Element* stage) const {
    #pragma unroll
    for (int u = 0; u < kUnits; ++u) {
      const int h = hp + dh[u], w = wq + dw[u];
      const bool inside = i < end && unsigned(h) < unsigned(H) && unsigned(w) < unsigned(W);
      cp_async::copy_cg(stage + first + 32 * u, x + pixel + offset[u], inside ? 16 : 0);
    }
  }
  __device__ __forceinline__ void advance() {
    i += Kind::kBK;
    wq += dwq;
    pixel += dq_pixel;
    if (wq >= Qsw) {
      wq -= Qsw;
      hp += sh;
      pixel += q_wrap;
    }
    hp += dhp;
    pixel += dpn_pixel;
    if (hp >= Psh) {
      hp -= Psh;
      pixel += p_wrap;
    }
  }
};

// dw (KCRS, float32) of tile (blockIdx.x: rows of R*S*Cp, blockIdx.y:
// columns of K) over split blockIdx.z's positions, into out + z*K*C*R*S
// (out: dw itself when unsplit, else the partials); rows of padded
// channels are dropped. (A Tf32 kind's A stage permutes its rows:
// the staged epilogue puts each sum where it belongs.)
template <class S>
__device__ __forceinline__ void backward_weight_nhwc_tile(
    const WgradGeo& g, const Operand<typename S::Kind>* __restrict__ x,
    const Operand<typename S::Kind>* __restrict__ dy, float* __restrict__ out) {
  using Kind = typename S::Kind;
  using IA = ColumnIterator<Kind, S::kThreads, S::kBM>;
  const int lane = int(threadIdx.x) % 32, warp = int(threadIdx.x) / 32;
  const int wm = warp / S::kWarpsN * S::kWarpM, wn = warp % S::kWarpsN * S::kWarpN;
  const int m0 = int(blockIdx.x) * S::kBM, n0 = int(blockIdx.y) * S::kBN;
  const int NPQ = g.N * g.P * g.Q, begin = int(blockIdx.z) * g.chunk;
  const int end = NPQ - begin < g.chunk ? NPQ : begin + g.chunk;
  IA ia(g, x, m0, begin, end);
  GradientIterator<Kind, S::kThreads, S::kBN> ib(g, dy, n0, begin, end);
  float acc[S::kTilesM][S::kTilesN][4] = {};
  multistage::mainloop<S>((end - begin + Kind::kBK - 1) / Kind::kBK, ia, ib,
                          dynamic_shared<typename S::Element>(), wm, wn, lane, acc);
  const int64_t CRS = int64_t(g.C) * g.R * g.S;
  float* dw = out + int64_t(blockIdx.z) * g.K * CRS;
  // A thread's rows are 4 (tap, channel) pairs, fixed through the
  // epilogue's loop over k: their offsets in dw are found once, before it
  // (-1: a padded channel, dropped).
  epilogue::put_warp_tile<S, IA::L::kPermutedRows, epilogue::Order::kColumns>(
      g.R * g.S * g.Cp, g.K, m0 + wm, n0 + wn, lane, warp, acc, dynamic_shared<float>(),
      [&](int m, int valid) {
        int64_t offset[4];
        #pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int tap = (m + e) / g.Cp, c = (m + e) % g.Cp;
          offset[e] = e < valid && c < g.C ? int64_t(c) * g.R * g.S + tap : -1;
        }
        return [=](int k, const float4& v) {
          float* dwk = dw + int64_t(k) * CRS;
          #pragma unroll
          for (int e = 0; e < 4; ++e)
            if (offset[e] >= 0) dwk[offset[e]] = vec::at(v, e);
        };
      });
}
// One kernel per operand type (its name says the types as written):
// bfloat16 (rung 08) or float32 (rung 09).
template <class S>
__global__ void __launch_bounds__(S::kThreads, S::kMinBlocks)
    backward_weight_nhwc(WgradGeo g, const bfloat16* __restrict__ x,
                         const bfloat16* __restrict__ dy, float* __restrict__ out) {
  static_assert(std::is_same_v<Operand<typename S::Kind>, bfloat16>);
  backward_weight_nhwc_tile<S>(g, x, dy, out);
}
template <class S>
__global__ void __launch_bounds__(S::kThreads, S::kMinBlocks)
    backward_weight_nhwc(WgradGeo g, const float* __restrict__ x, const float* __restrict__ dy,
                         float* __restrict__ out) {
  static_assert(std::is_same_v<Operand<typename S::Kind>, float>);
  backward_weight_nhwc_tile<S>(g, x, dy, out);
}

}  // namespace anvil::cuda::conv_kernels
