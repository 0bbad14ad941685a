// The multistage mainloop of the tensor-core rungs on it (GEMM rungs 11 and
// 12, convolution rungs 08 and 09): kStages stages of kBK of k in shared memory,
// filled by cp.async kStages - 1 steps ahead of the mma, the fragments
// loaded from XOR-swizzled rows by ldmatrix. One loop, two kinds of mma:
//   Bf16  bfloat16 as stored, mma.sync.m16n8k16, 32 of k a stage
//   Tf32  float32 as stored, rounded by tc::cvt_tf32 in registers after
//         the fragment load, mma.sync.m16n8k8, 16 of k a stage
//   Tf32Rounded  Tf32 on float32 already rounded to TF32 where it was
//         written (conv rung 09's conversions): the same stages and loads,
//         no cvt
// A stage row along k is 64 bytes in both (four 16-byte chunks), so the
// layouts, the copies and the ldmatrix addresses are the same bytes.
// 12_bf16_pipelined.cu explains the fragment mapping, the layout and why
// every ldmatrix and every 16-byte store is free of bank conflicts;
// 11_tf32_pipelined.cu what TF32 changes (its operands contiguous along j
// are read by 32-bit loads from padded rows); 08_bf16_multistage.cu the
// conv operands.
//
// The mainloop knows nothing of where an operand lies in global memory:
// each operand comes through an iterator (as CUTLASS separates MmaMultistage
// from its tile iterators), one per thread and operand, with
//   using L                  Layout<Kind, kAlongJ, BJ>: the operand's stage
//   static constexpr bool kAlongJ   stored contiguous along j (else along k)
//   void copy(Element* stage) const   this thread's cp.async of the current
//                            k-step into `stage`, zeros outside the operand
//                            (src-size short of 16, or 0); nothing committed
//   void advance()           on to the next k-step
// The mainloop calls copy, then advance, once per k-step in order, so an
// iterator precomputes its addresses and masks once and steps them with
// additions: no division or modulo in the loop (GEMM: mma_ldmatrix.cuh's
// iterator; convolutions: conv/implicit_nhwc.cuh's).
#pragma once
#include <bit>
#include <cstdint>
#include <type_traits>
#if !defined(__CUDACC__)
#include <stdexcept>
#endif

#include "kernels/cuda/cp_async.cuh"
#include "kernels/cuda/cuda_compat.h"
#include "kernels/cuda/gemm/mma_tile.cuh"
#include "kernels/cuda/mma.cuh"

namespace anvil::cuda::multistage {

// The kinds of mma. Element: what shared memory holds (the operand's bits
// as stored); kChunk elements make a 16-byte chunk (kShift its log2); kBK
// elements of k a stage row (4 chunks); kMmaK the k of one mma.
struct Bf16 {
  using Element = uint16_t;
  static constexpr int kChunk = 8, kShift = 3, kBK = 32, kMmaK = 16;
  __device__ __forceinline__ static void mma(float (&acc)[4], const uint32_t (&a)[4],
                                             const uint32_t (&b)[2]) {
    tc::mma_m16n8k16_bf16(acc, a, b, acc);
  }
};
struct Tf32 {
  using Element = float;
  static constexpr int kChunk = 4, kShift = 2, kBK = 16, kMmaK = 8;
  __device__ __forceinline__ static void mma(float (&acc)[4], const uint32_t (&a)[4],
                                             const uint32_t (&b)[2]) {
    tc::mma_m16n8k8_tf32(acc, a, b, acc);
  }
};
struct Tf32Rounded : Tf32 {};

// r0, r1 = p[0], p[1]: one 8-byte shared-memory load (p 8-byte aligned).
__device__ __forceinline__ void load_pair(const float* p, float& r0, float& r1) {
#if defined(__CUDACC__)
  const float2 v = *reinterpret_cast<const float2*>(p);
  r0 = v.x;
  r1 = v.y;
#else
  if (reinterpret_cast<uintptr_t>(p) % 8 != 0)
    throw std::runtime_error("misaligned 64-bit shared-memory load");
  r0 = p[0];
  r1 = p[1];
#endif
}

// One operand's stage in shared memory: 16-byte chunks of kChunk elements
// along the contiguous index, in rows of the other one.
//   along k (both kinds): BJ rows j of kBK elements (4 chunks); chunk k /
//     kChunk of row j at (k / kChunk) ^ (j / 2 % 4). Read by ldmatrix.
//   along j, Bf16: kBK rows k of BJ elements; chunk j / 8 of row k at
//     (j / 8) ^ (k % 8). Read by ldmatrix.trans.
//   along j, Tf32 (kPadded): kBK rows k of BJ + 8 floats, unswizzled. Read
//     by 8-byte (A, its rows permuted: kPermutedRows below) and 4-byte (B)
//     loads: ldmatrix.trans transposes 16-bit elements, not 32-bit ones.
// (12_bf16_pipelined.cu and 11_tf32_pipelined.cu draw them.)
template <class Kind, bool AlongJ, int BJ>
struct Layout {
  using Element = typename Kind::Element;
  static constexpr int kChunk = Kind::kChunk, kShift = Kind::kShift, kBK = Kind::kBK;
  static constexpr int kRowChunks = kBK / kChunk;  // chunks of a row along k: 4
  static_assert(kRowChunks == 4 && kChunk * int(sizeof(Element)) == 16);
  static constexpr bool kTf32 = std::is_base_of_v<Tf32, Kind>;  // float32 stages, m16n8k8
  static constexpr bool kPadded = AlongJ && kTf32;
  static constexpr int kRow = kPadded ? BJ + 8 : AlongJ ? BJ : kBK;  // elements a stored row
  static constexpr int kElems = (AlongJ ? kBK : BJ) * kRow;
  static constexpr int kChunks = BJ * kBK / kChunk;  // the chunks copied into a stage
  // The element offset of the chunk holding (j..j+kChunk-1, k) (AlongJ;
  // j % kChunk == 0) or (j, k..k+kChunk-1) (k % kChunk == 0).
  __device__ __forceinline__ static int chunk(int j, int k) {
    if constexpr (kPadded) return k * kRow + j;
    if constexpr (AlongJ) return k * BJ + ((j >> kShift) ^ (k & 7)) * kChunk;
    return j * kBK + ((k >> kShift) ^ ((j >> 1) & 3)) * kChunk;
  }
  // Copy unit e's chunk: consecutive e along the contiguous index, then the
  // other (a warp reads whole runs of a stored row).
  __device__ __forceinline__ static int unit_j(int e) {
    return AlongJ ? e % (BJ / kChunk) * kChunk : e / kRowChunks;
  }
  __device__ __forceinline__ static int unit_k(int e) {
    return AlongJ ? e / (BJ / kChunk) : e % kRowChunks * kChunk;
  }
  // With Threads threads taking units e, e + Threads, ..., a thread's unit
  // u lies kUnitStride<Threads> elements after its unit 0: the units' rows
  // (k when AlongJ, else j) differ by a multiple of 8, which the swizzle
  // (k % 8, or j / 2 % 4) does not see, or the rows are unswizzled
  // (kPadded). So a copy loop adds constants to one shared-memory address
  // (the cp.async's immediate offsets).
  template <int Threads>
  static constexpr int kUnitStride =
      AlongJ ? Threads / (BJ / kChunk) * kRow : Threads / kRowChunks * kBK;
  template <int Threads>
  static constexpr bool kStridesEvenly =
      AlongJ ? Threads % (BJ / kChunk) == 0 && (kPadded || Threads / (BJ / kChunk) % 8 == 0)
             : Threads / kRowChunks % 8 == 0;

  // The row address this lane gives for 8 x 8 matrix `i` (= lane / 8) of
  // an ldmatrix.x4 covering (j0..j0+15, k0..k0+2 kChunk-1), two chunks
  // along k; the matrices in the order of mma's A registers when JFirst (i
  // % 2 picks the half of j, i / 2 the chunk of k: a[0..3]), else k first
  // (i % 2 the chunk of k, i / 2 the half of j: b[0..1] of two n tiles).
  // Row r = lane % 8 of matrix i is (j, one chunk of k) for an operand
  // contiguous along k, read without .trans; (8 j, k) for a Bf16 one
  // contiguous along j, read with .trans (the fragment's rows then run
  // along j, as mma wants).
  // Tf32 writes the swizzle of row j0 + 8 hj + r as (r / 2) % 4, which it
  // is for j0 a multiple of 8 (every fragment's): the compiler then sees
  // the row tiles at constant offsets from one address per k0. Bf16 keeps
  // chunk()'s form (rung 12's and conv 08's SASS as measured).
  template <bool JFirst>
  __device__ __forceinline__ static const Element* fragment_row(const Element* tile, int lane,
                                                                int j0, int k0) {
    const int i = lane >> 3, r = lane & 7;
    const int hj = JFirst ? (i & 1) : (i >> 1), hk = JFirst ? (i >> 1) : (i & 1);
    if constexpr (AlongJ) return tile + chunk(j0 + 8 * hj, k0 + 8 * hk + r);
    if constexpr (kTf32)
      return tile + (j0 + 8 * hj + r) * kBK + (((k0 >> kShift) + hk) ^ ((r >> 1) & 3)) * kChunk;
    return tile + chunk(j0 + 8 * hj + r, k0 + kChunk * hk);
  }

  // kPermutedRows (kPadded, as A): which row of the block an A fragment's
  // row stands for is permuted so that a lane's two registers along j, a0
  // and a1 (a2 and a3), lie side by side, one 8-byte load: mma rows g and
  // g + 8 of a 16-row tile are its rows 2g and 2g + 1. Each output is
  // still its own row's sum, k in the same order; the epilogue
  // (staged_epilogue.cuh, PermRows) stores it where it belongs. (B's two
  // registers are k apart, in two rows of the stage: 4-byte loads.)
  static constexpr bool kPermutedRows = kPadded;

  // The mma's operand registers, from the register as loaded: Tf32 rounds
  // to TF32 here (nearest even), Bf16 and Tf32Rounded take the bits as
  // they are.
  __device__ __forceinline__ static uint32_t operand(uint32_t bits) {
    if constexpr (std::is_same_v<Kind, Tf32>) return tc::cvt_tf32_bits(bits);
    return bits;
  }
  __device__ __forceinline__ static uint32_t operand(float v) {
    if constexpr (std::is_same_v<Kind, Tf32>) return tc::cvt_tf32(v);
#if defined(__CUDACC__)
    return __float_as_uint(v);
#else
    return std::bit_cast<uint32_t>(v);
#endif
  }

  // a[0..3]: the A fragment of rows j0..j0+15 at k0..k0+kMmaK-1.
  //   ldmatrix: one .x4, its matrices in a[0..3]'s order (JFirst).
  //   kPadded (m16n8k8 .tf32, rows permuted): lane (g, t) reads a0, a1
  //   (rows 2g, 2g + 1, k = t) and a2, a3 (k = t + 4): two 8-byte loads at
  //   one address plus a constant (4 rows).
  __device__ __forceinline__ static void load_a(const Element* tile, int lane, int j0, int k0,
                                                uint32_t (&a)[4]) {
    if constexpr (kPadded) {
      const float* p = tile + (k0 + (lane & 3)) * kRow + j0 + 2 * (lane >> 2);
      float v[4];
      load_pair(p, v[0], v[1]);
      load_pair(p + 4 * kRow, v[2], v[3]);
      #pragma unroll
      for (int r = 0; r < 4; ++r) a[r] = operand(v[r]);
    } else {
      tc::ldmatrix<4, AlongJ>(a, fragment_row<true>(tile, lane, j0, k0));
      #pragma unroll
      for (int r = 0; r < 4; ++r) a[r] = operand(a[r]);
    }
  }
  // b0, b1: the B fragments of columns j0..j0+7 and j0+8..j0+15 at
  // k0..k0+kMmaK-1.
  //   ldmatrix: one .x4, k first (b0[0], b0[1], b1[0], b1[1]).
  //   kPadded: lane (g, t) reads b[0] (k = t, n = g), b[1] (t+4, g) of each
  //   tile: four 4-byte loads at one address plus constants (8 columns, 4
  //   rows).
  __device__ __forceinline__ static void load_b(const Element* tile, int lane, int j0, int k0,
                                                uint32_t (&b0)[2], uint32_t (&b1)[2]) {
    if constexpr (kPadded) {
      const float* p = tile + (k0 + (lane & 3)) * kRow + j0 + (lane >> 2);
      b0[0] = operand(p[0]);
      b0[1] = operand(p[4 * kRow]);
      b1[0] = operand(p[8]);
      b1[1] = operand(p[4 * kRow + 8]);
    } else {
      uint32_t r[4];
      tc::ldmatrix<4, AlongJ>(r, fragment_row<false>(tile, lane, j0, k0));
      b0[0] = operand(r[0]);
      b0[1] = operand(r[1]);
      b1[0] = operand(r[2]);
      b1[1] = operand(r[3]);
    }
  }
};

// Warps of 64 x 64 (4 x 8 mma tiles of 16 x 8), kStages stages; the block's
// shared memory is kStages x (A's stage, B's stage), each operand's room
// that of its larger layout (Tf32's padded rows along j).
template <class KindT, int WarpsM, int WarpsN, int Stages, int MinBlocks>
struct ShapeOf : mma_tile::Blocking<KindT::kBK, WarpsM, WarpsN, 64, Stages, MinBlocks> {
  static_assert(Stages >= 2, "a stage in flight behind the one the mma reads");
  using Kind = KindT;
  using Element = typename Kind::Element;
  template <int BJ>
  static constexpr int kRoom = Layout<Kind, true, BJ>::kElems > Layout<Kind, false, BJ>::kElems
                                   ? Layout<Kind, true, BJ>::kElems
                                   : Layout<Kind, false, BJ>::kElems;
  static constexpr int kStageElems = kRoom<WarpsM * 64> + kRoom<WarpsN * 64>;
  static constexpr int kSharedBytes = Stages * kStageElems * int(sizeof(Element));
};
// The Bf16 shapes under the name their kernels had before Tf32 joined (the
// launch audits and the step model know them by it): conv rung 08's.
template <int WarpsM, int WarpsN, int Stages, int MinBlocks>
struct Shape : ShapeOf<Bf16, WarpsM, WarpsN, Stages, MinBlocks> {};

// The mma of one stage, kMmaK of k at a time: per step this warp's 8 B
// fragments (4 load_b, two n tiles each) and per row tile its A fragment
// (one load_a), and 32 mma.
template <class S, class LA, class LB>
__device__ __forceinline__ void mma_stage(const typename S::Element* As,
                                          const typename S::Element* Bs, int wm, int wn, int lane,
                                          float (&acc)[S::kTilesM][S::kTilesN][4]) {
  using Kind = typename S::Kind;
  #pragma unroll
  for (int kk = 0; kk < S::kBK; kk += Kind::kMmaK) {
    uint32_t b[S::kTilesN][2];
    #pragma unroll
    for (int j = 0; j < S::kTilesN; j += 2) LB::load_b(Bs, lane, wn + 8 * j, kk, b[j], b[j + 1]);
    #pragma unroll
    for (int i = 0; i < S::kTilesM; ++i) {
      uint32_t a[4];
      LA::load_a(As, lane, wm + 16 * i, kk, a);
      #pragma unroll
      for (int j = 0; j < S::kTilesN; ++j) Kind::mma(acc[i][j], a, b[j]);
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
//   mma of step s          kBK / kMmaK x (8 fragment loads, 32 mma) per warp
template <class S, class IA, class IB>
__device__ __forceinline__ void mainloop(int steps, IA& ia, IB& ib, typename S::Element* smem,
                                         int wm, int wn, int lane,
                                         float (&acc)[S::kTilesM][S::kTilesN][4]) {
  using Element = typename S::Element;
  constexpr int kA = IA::L::kElems;
  static_assert(kA + IB::L::kElems <= S::kStageElems, "the iterators' stages fit the Shape's");
  static_assert(std::is_same_v<typename IA::L::Element, Element> &&
                std::is_same_v<typename IB::L::Element, Element>);
  auto fetch = [&](int buffer) {
    Element* stage = smem + buffer * S::kStageElems;
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
    const Element* stage = smem + read * S::kStageElems;
    mma_stage<S, typename IA::L, typename IB::L>(stage, stage + kA, wm, wn, lane, acc);
    read = read + 1 == S::kStages ? 0 : read + 1;
    write = write + 1 == S::kStages ? 0 : write + 1;
  }
}

}  // namespace anvil::cuda::multistage
