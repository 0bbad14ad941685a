// The forward convolution as an implicit GEMM on channels-last operands, on
// the multistage mainloop (gemm/mma_multistage.cuh), over its kind of mma:
// convolution rungs 08 (Bf16, 08_bf16_multistage.cu explains the rung) and
// 09 (Tf32Rounded, 09_tf32_multistage.cu); nhwc_rung.cuh launches them.
//
//   y[(n,p,q), k] = sum over (r, s, c) of x[n, p*sh - ph + r, q*sw - pw + s, c] * w[k, r, s, c]
//
// x is NHWC and w KRSC, in the kind's operand type (Operand<Kind>: bfloat16
// for Bf16, float32 for the Tf32 kinds), with C padded with zeros to Cp, a
// multiple of kChunk (8 bfloat16 or 4 floats): then kChunk consecutive
// channels of one pixel (or one tap of one filter) are one whole, 16-byte
// aligned chunk, what a cp.async moves. The GEMM: M = N*P*Q rows (A: the activations), N =
// K columns (B: the filters), reduction over the taps (r, s) and, within
// each tap, channel blocks of kBK (32 or 16: one stage): k-step t = (r * S +
// s) * Cb + cb, Cb = ceil(Cp / kBK). Channels past Cp in the last block are
// zeros on both sides.
//
// A chunk outside the operand (padding, rows or channels past the end) is
// a cp.async of src-size 0: it writes zeros and reads nothing, so its
// address, which may lie outside the tensor, is never dereferenced.
//
// Both operands are contiguous along the reduction (the Layout's rows are
// their rows j, 4 chunks of kChunk channels each), so unit e of a stage is
// row j = e / 4, chunk e % 4: with Threads a multiple of 32, thread t always
// copies chunk t % 4 (channels cb*kBK + kChunk*(t % 4) ..) of rows
// t / 4 + u * Threads / 4, u = 0 .. kUnits - 1.
#pragma once
#include <bit>
#include <climits>
#include <cstdint>
#include <type_traits>

#include "core/bfloat16.h"
#include "kernels/cuda/cp_async.cuh"
#include "kernels/cuda/cuda_compat.h"
#include "kernels/cuda/gemm/mma_multistage.cuh"
#include "kernels/cuda/gemm/staged_epilogue.cuh"
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/vec4.cuh"
#include "kernels/element.h"

namespace anvil::cuda::conv_kernels {

// What a kind's operands are in global memory: bfloat16 (Bf16) or float32
// (Tf32, Tf32Rounded), the bits the stages hold.
template <class Kind>
using Operand =
    std::conditional_t<std::is_same_v<typename Kind::Element, float>, float, bfloat16>;

// The shape, as the kernels see it (checked to fit int on the host).
// Where output (n, k, p, q) is stored: y[n, k, oh0 + osh * p, ow0 + osw * q]
// of an NCHW tensor of OH x OW images: the forward's own (OH, OW = P, Q;
// offsets 0, steps 1), or one residue class of a strided backward-data's dx.
struct NhwcGeo {
  int N, H, W, Cp, K, R, S, sh, sw, ph, pw, P, Q;
  int Cb;  // channel blocks of kBK per tap
  int OH, OW, oh0, ow0, osh, osw;
  __device__ __forceinline__ int steps() const { return R * S * Cb; }
};

// The rows a thread copies, and where their chunks go in a stage.
template <class Kind, int Threads, int BJ>
struct ChunkRows {
  using L = multistage::Layout<Kind, false, BJ>;
  static constexpr int kUnits = L::kChunks / Threads;
  static_assert(kUnits * Threads == L::kChunks && Threads % 32 == 0);
  __device__ __forceinline__ static int chunk() { return int(threadIdx.x) % 4; }
  __device__ __forceinline__ static int row(int u) {
    return int(threadIdx.x) / 4 + u * (Threads / 4);
  }
  // Unit u's chunk in a stage: unit 0's plus u * kUnitStride (the Layout
  // says why).
  static constexpr int kUnitStride = L::template kUnitStride<Threads>;
  static_assert(L::template kStridesEvenly<Threads>);
  __device__ __forceinline__ static int first() {
    return L::chunk(row(0), Kind::kChunk * chunk());
  }
};

// The channel blocks of the k-steps, as both iterators step them: this
// thread's first channel c of the step (its chunk's) and the offset into a
// row's data, kBK channels a step; past a tap's last block, channel block 0
// of the next tap, Cp further on from the tap's start (taps are Cp apart in
// NHWC pixels and in KRSC filters alike).
template <class Kind>
struct ChannelBlocks {
  static constexpr int kBK = Kind::kBK;
  int Cp, Cb, cb = 0, c;
  int64_t offset = 0;
  __device__ __forceinline__ ChannelBlocks(const NhwcGeo& g, int chunk)
      : Cp(g.Cp), Cb(g.Cb), c(Kind::kChunk * chunk) {}
  __device__ __forceinline__ bool inside() const { return c < Cp; }
  // On to the next step; true when it starts the next tap.
  __device__ __forceinline__ bool next() {
    c += kBK;
    offset += kBK;
    if (++cb < Cb) return false;
    cb = 0;
    c -= kBK * Cb;
    offset += Cp - kBK * Cb;
    return true;
  }
};

// A: the activations, row j = output position m0 + j. Precomputed per row:
// the address of its top-left tap's pixel (which may lie in the padding,
// outside x: it is read only where the tap is inside) and that pixel's
// (h, w), h = INT_MIN / 2 past M so that no tap is inside. Stepped: the
// channel block, the tap (r, s), and the one offset all rows share,
// (r * W + s) * Cp + kBK cb. Per chunk and step: two adds, two unsigned
// compares, a 64-bit add.
template <class Kind, int Threads, int BJ>
struct ActivationIterator {
  using Rows = ChunkRows<Kind, Threads, BJ>;
  using L = typename Rows::L;
  using T = Operand<Kind>;
  static constexpr bool kAlongJ = false;
  static constexpr int kUnits = Rows::kUnits;
  const T* pixel[kUnits];  // x + (n, h0, w0, this thread's chunk)
  int h0[kUnits], w0[kUnits];
  int H, W, S;
  int r = 0, s = 0;
  int first;                // unit 0's chunk in a stage
  ChannelBlocks<Kind> blocks;
  int64_t next_row;         // what the offset gains when s wraps

  __device__ __forceinline__ ActivationIterator(const NhwcGeo& g, const T* x, int m0)
      : H(g.H), W(g.W), S(g.S), first(Rows::first()), blocks(g, Rows::chunk()),
        next_row(int64_t(g.W - g.S) * g.Cp) {
    const int M = g.N * g.P * g.Q, PQ = g.P * g.Q;
    #pragma unroll
    for (int u = 0; u < kUnits; ++u) {
      const int m = m0 + Rows::row(u);
      const int n = m / PQ, pq = m % PQ;
      h0[u] = m < M ? pq / g.Q * g.sh - g.ph : INT_MIN / 2;
      w0[u] = pq % g.Q * g.sw - g.pw;
      pixel[u] = x + ((int64_t(n) * g.H + h0[u]) * g.W + w0[u]) * g.Cp + blocks.c;
    }
  }
  __device__ __forceinline__ void copy(typename L::Element* stage) const {
    #pragma unroll
    for (int u = 0; u < kUnits; ++u) {
      const int h = h0[u] + r, w = w0[u] + s;
      const bool inside = blocks.inside() && unsigned(h) < unsigned(H) && unsigned(w) < unsigned(W);
      cp_async::copy_cg(stage + first + u * Rows::kUnitStride, pixel[u] + blocks.offset,
                        inside ? 16 : 0);
    }
  }
  __device__ __forceinline__ void advance() {
    if (blocks.next() && ++s == S) {
      s = 0;
      ++r;
      blocks.offset += next_row;
    }
  }
};

// B: the filters, row j = output channel n0 + j. Precomputed per row: its
// filter's address, and whether it exists; stepped: the channel block (in
// KRSC a filter's taps follow each other, so that is all).
template <class Kind, int Threads, int BJ>
struct FilterIterator {
  using Rows = ChunkRows<Kind, Threads, BJ>;
  using L = typename Rows::L;
  using T = Operand<Kind>;
  static constexpr bool kAlongJ = false;
  static constexpr int kUnits = Rows::kUnits;
  const T* filter[kUnits];  // w + (k, this thread's chunk)
  bool exists[kUnits];
  int first;
  ChannelBlocks<Kind> blocks;

  __device__ __forceinline__ FilterIterator(const NhwcGeo& g, const T* w, int n0)
      : first(Rows::first()), blocks(g, Rows::chunk()) {
    #pragma unroll
    for (int u = 0; u < kUnits; ++u) {
      const int k = n0 + Rows::row(u);
      exists[u] = k < g.K;
      filter[u] = w + int64_t(k) * g.R * g.S * g.Cp + blocks.c;
    }
  }
  __device__ __forceinline__ void copy(typename L::Element* stage) const {
    #pragma unroll
    for (int u = 0; u < kUnits; ++u) {
      const bool inside = exists[u] && blocks.inside();
      cp_async::copy_cg(stage + first + u * Rows::kUnitStride, filter[u] + blocks.offset,
                        inside ? 16 : 0);
    }
  }
  __device__ __forceinline__ void advance() { blocks.next(); }
};

// y (NCHW, float32 or bfloat16) of tile (blockIdx.x: rows of N*P*Q,
// blockIdx.y: columns of K): the FP32 sum plus the bias, rounded once.
template <class S, class TY>
__device__ __forceinline__ void forward_nhwc_tile(const NhwcGeo& g,
                                                  const Operand<typename S::Kind>* __restrict__ x,
                                                  const Operand<typename S::Kind>* __restrict__ w,
                                                  const float* __restrict__ bias,
                                                  TY* __restrict__ y) {
  using Kind = typename S::Kind;
  const int lane = int(threadIdx.x) % 32, warp = int(threadIdx.x) / 32;
  const int wm = warp / S::kWarpsN * S::kWarpM, wn = warp % S::kWarpsN * S::kWarpN;
  const int m0 = int(blockIdx.x) * S::kBM, n0 = int(blockIdx.y) * S::kBN;
  ActivationIterator<Kind, S::kThreads, S::kBM> ia(g, x, m0);
  FilterIterator<Kind, S::kThreads, S::kBN> ib(g, w, n0);
  float acc[S::kTilesM][S::kTilesN][4] = {};
  multistage::mainloop<S>(g.steps(), ia, ib, dynamic_shared<typename S::Element>(), wm, wn, lane,
                          acc);
  // A thread's rows are 4 pixels, fixed through the epilogue's loop over
  // channels: their offsets in y are found once, before it.
  const int PQ = g.P * g.Q, plane = g.OH * g.OW;
  epilogue::put_warp_tile<S, false, epilogue::Order::kColumns>(
      g.N * PQ, g.K, m0 + wm, n0 + wn, lane, warp, acc, dynamic_shared<float>(),
      [&](int m, int valid) {
        int64_t offset[4];
        #pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int pixel = m + (e < valid ? e : 0), n = pixel / PQ, p = pixel % PQ / g.Q;
          offset[e] = int64_t(n) * g.K * plane + (g.oh0 + g.osh * p) * g.OW + g.ow0 +
                      g.osw * (pixel % g.Q);
        }
        return [=](int k, const float4& v) {
          const float b = bias ? bias[k] : 0.0f;
          TY* yk = y + int64_t(k) * plane;
          #pragma unroll
          for (int e = 0; e < 4; ++e)
            if (e < valid) yk[offset[e]] = anvil::store<TY>(vec::at(v, e) + b);
        };
      });
}
// The kernels, one overload per operand type, so that a kernel's name
// says its types as written (bfloat16 operands: rung 08, float32 y or
// bfloat16 y; float32 operands: rung 09); each checks its shape's kind.
template <class S>
__global__ void __launch_bounds__(S::kThreads, S::kMinBlocks)
    forward_nhwc(NhwcGeo g, const bfloat16* __restrict__ x, const bfloat16* __restrict__ w,
                 const float* __restrict__ bias, float* __restrict__ y) {
  static_assert(std::is_same_v<Operand<typename S::Kind>, bfloat16>);
  forward_nhwc_tile<S>(g, x, w, bias, y);
}
template <class S>
__global__ void __launch_bounds__(S::kThreads, S::kMinBlocks)
    forward_nhwc(NhwcGeo g, const bfloat16* __restrict__ x, const bfloat16* __restrict__ w,
                 const float* __restrict__ bias, bfloat16* __restrict__ y) {
  static_assert(std::is_same_v<Operand<typename S::Kind>, bfloat16>);
  forward_nhwc_tile<S>(g, x, w, bias, y);
}
template <class S>
__global__ void __launch_bounds__(S::kThreads, S::kMinBlocks)
    forward_nhwc(NhwcGeo g, const float* __restrict__ x, const float* __restrict__ w,
                 const float* __restrict__ bias, float* __restrict__ y) {
  static_assert(std::is_same_v<Operand<typename S::Kind>, float>);
  forward_nhwc_tile<S>(g, x, w, bias, y);
}

// An operand element as the conversions below write it: bfloat16 rounded
// to nearest even (rung 08's operands, as rung 07 stages them), or float32
// rounded to TF32 by tc::cvt_tf32, nearest even (rung 09's:
// the mainloop's Tf32Rounded kind feeds them to the mma as loaded; the
// rounding the Tf32 kind does per fragment register, done once per element
// here).
template <class TO>
__device__ __forceinline__ TO to_operand(float v) {
  if constexpr (std::is_same_v<TO, float>) {
#if defined(__CUDACC__)
    return __uint_as_float(tc::cvt_tf32(v));
#else
    return std::bit_cast<float>(tc::cvt_tf32(v));
#endif
  } else {
    return bfloat16(v);
  }
}

// out[n, hw, c] (c < Cp) = in[n, c, hw] as an operand (to_operand), zeros
// for c >= C: x [N, C, H*W] into NHWC, or w [K, C, R*S] into KRSC (n = k,
// hw = the tap). Each image's C x HW matrix is transposed through shared
// memory, 32 x 32 elements a block of 32 x 8 threads (blockIdx.x = n *
// tiles_hw + the hw tile, blockIdx.y the channel tile): a warp loads 32
// consecutive hw of one channel and stores 32 consecutive channels of one
// pixel, so both sides coalesce (one thread per output element would read
// H*W apart). The tile's rows are 33 floats, so a warp reading a column of
// it hits 32 banks. One kernel per output type (to_channels_last below).
constexpr int kTransposeTile = 32, kTransposeRows = 8;
using TransposeTile = float[kTransposeTile][kTransposeTile + 1];
template <class T, class TO>
__device__ __forceinline__ void transpose_to_channels_last(TransposeTile& tile, int C, int HW,
                                                           int Cp, int tiles_hw,
                                                           const T* __restrict__ in,
                                                           TO* __restrict__ out) {
  const int n = int(blockIdx.x) / tiles_hw, hw0 = int(blockIdx.x) % tiles_hw * kTransposeTile;
  const int c0 = int(blockIdx.y) * kTransposeTile;
  const int tx = int(threadIdx.x), ty = int(threadIdx.y);
  #pragma unroll
  for (int i = ty; i < kTransposeTile; i += kTransposeRows) {
    const int c = c0 + i, hw = hw0 + tx;
    tile[i][tx] = c < C && hw < HW ? anvil::load(in[(int64_t(n) * C + c) * HW + hw]) : 0.0f;
  }
  __syncthreads();
  #pragma unroll
  for (int i = ty; i < kTransposeTile; i += kTransposeRows) {
    const int hw = hw0 + i, c = c0 + tx;
    if (hw < HW && c < Cp) out[(int64_t(n) * HW + hw) * Cp + c] = to_operand<TO>(tile[tx][i]);
  }
}
template <class T>
__global__ void __launch_bounds__(kTransposeTile * kTransposeRows)
    to_channels_last(int C, int HW, int Cp, int tiles_hw, const T* __restrict__ in,
                     bfloat16* __restrict__ out) {
  __shared__ TransposeTile tile;
  transpose_to_channels_last(tile, C, HW, Cp, tiles_hw, in, out);
}
template <class T>
__global__ void __launch_bounds__(kTransposeTile * kTransposeRows)
    to_channels_last(int C, int HW, int Cp, int tiles_hw, const T* __restrict__ in,
                     float* __restrict__ out) {
  __shared__ TransposeTile tile;
  transpose_to_channels_last(tile, C, HW, Cp, tiles_hw, in, out);
}

// The taps of one residue class of backward-data: filter rows r0, r0 + sh,
// ... (T of them) and columns s0, s0 + sw, ... (U), of w [K, C, R, S].
struct ClassTaps {
  int K, C, R, S, r0, s0, sh, sw, T, U, Kp;
};
// out[c, t, u, k] (k < Kp) = w[k, c, r0 + sh (T-1-t), s0 + sw (U-1-u)] as
// an operand (to_operand), zeros for k >= K: the filter of a backward-data
// class as a forward convolution (its taps flipped, input and output
// channels swapped), KRSC with the roles of K and C exchanged. One thread
// per output element; one kernel per output type.
template <class T, class TO>
__device__ __forceinline__ void flip_to_channels_last(const ClassTaps& f, const T* __restrict__ w,
                                                      TO* __restrict__ out) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= int64_t(f.C) * f.T * f.U * f.Kp) return;
  const int k = int(i % f.Kp);
  const int64_t tu = i / f.Kp;
  const int u = int(tu % f.U), t = int(tu / f.U % f.T), c = int(tu / f.U / f.T);
  const int r = f.r0 + f.sh * (f.T - 1 - t), s = f.s0 + f.sw * (f.U - 1 - u);
  out[i] = to_operand<TO>(k < f.K ? anvil::load(w[((int64_t(k) * f.C + c) * f.R + r) * f.S + s])
                                  : 0.0f);
}
template <class T>
__global__ void flipped_to_channels_last(ClassTaps f, const T* __restrict__ w,
                                         bfloat16* __restrict__ out) {
  flip_to_channels_last(f, w, out);
}
template <class T>
__global__ void flipped_to_channels_last(ClassTaps f, const T* __restrict__ w,
                                         float* __restrict__ out) {
  flip_to_channels_last(f, w, out);
}

}  // namespace anvil::cuda::conv_kernels
