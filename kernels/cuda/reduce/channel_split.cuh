// Per-channel reductions split over several blocks per channel, shared by
// channel_sum rung 02 (reduce/) and BatchNorm rung 02 (batch_norm/).
//
// A channel c of x[N, C, HW] is M = N*HW values: N runs of HW contiguous
// floats, C*HW apart. It is cut into S contiguous slices ("splits"), one
// block each, so a launch has C*S blocks: block b works on channel b / S,
// slice b % S. S comes from the shape alone (split_plan), so every addition
// happens in an order fixed by the shape and the results are bitwise the same
// run to run, on any GPU.
//
// Inside a slice the values are taken in units of V floats: V = 4 (one
// float4, LDG.E.128) when HW is a multiple of 4 and every pointer the pass
// reads or writes is 16-byte aligned, so no float4 straddles two runs; V = 1
// otherwise. Thread t takes the slice's units t, t + 256, t + 512, ...: a
// warp reads 32 consecutive units of a run. Each loop step first computes
// several of the thread's unit addresses (4 scalars, or 2 float4), then
// issues all their loads and only then uses the values, so 4 to 8 floats of
// each tensor read are in flight per thread instead of one.
//
// The per-block results (partials) go to a workspace, [C][S] records (a sum,
// or BatchNorm's few floats); a second kernel merges each channel's S
// records in a fixed order, in double precision, one warp per channel
// (fold_partials). No float atomics anywhere.
//
// Choosing S: 256-thread blocks with at most 32 registers per thread
// (__launch_bounds__(256, 8), int indices) leave 8 blocks resident on each
// of an H100's 132 SMs, kWaveBlocks = 1056 block slots. S = floor(1056 / C) makes the
// launch one full wave (C = 64: 16 splits, 1024 blocks), but never below one
// float4 per thread per slice (S <= ceil(M / 1024)), and at least enough
// splits that a slice's count stays exact in float (below 2^24).
#pragma once
#include <cstdint>

#include "core/bfloat16.h"

#include "kernels/cuda/cuda_compat.h"
#include "kernels/cuda/vec4.cuh"

namespace anvil::cuda::channel_split {

constexpr int kThreads = 256;  // 8 full warps
constexpr int kWarps = kThreads / 32;
constexpr int kMinBlocksPerSM = 8;  // 8 x 256 threads: an SM's 2048
constexpr int64_t kWaveBlocks = 132 * kMinBlocksPerSM;  // an H100's resident 256-thread blocks
// Units whose loads a thread issues together: 4 floats (V = 1), or 2 float4
// (8 floats: with dy and x both read, 16 floats in flight fit in 32 registers).
template <int V>
constexpr int kUnroll = V == 4 ? 2 : 4;
// Blocks per SM __launch_bounds__ asks for: 8 (32 registers) with int
// indices; 4 (64 registers) with int64 ones (tensors of 2^31 floats or more,
// where 1056 blocks are two full waves of 528).
template <typename Index>
constexpr int kMinBlocks = sizeof(Index) == 4 ? kMinBlocksPerSM : kMinBlocksPerSM / 2;
// At least 2 floats a thread per slice: small tensors (LeNet's conv2 at batch
// 128, 50 x 10,368 floats) still get a wave of blocks, each with its loads in
// flight together; a tensor this small is latency-bound on a GPU anyway.
constexpr int64_t kMinSliceFloats = kThreads * 2;
constexpr int64_t kMaxSliceFloats = int64_t{1} << 24;  // counts exact in float
constexpr unsigned kFullMask = 0xffffffffu;

// The split of one launch (host side): S slices of `chunk` units per channel
// (the last one shorter), V floats per unit.
struct Plan {
  int64_t splits = 1, chunk = 0, units = 0;  // units per channel
  int vec = 1;
  int64_t blocks(int64_t C) const { return C * splits; }
};

// Whether a pass over a tensor of `total` floats, C*HW per image, may use
// int indices: the walk's offsets run past the end by at most kUnroll steps
// of (blockDim.x + 1) runs each before the loop sees it has ended.
inline bool int_indices(int64_t total, int64_t CHW) {
  return total + int64_t{4} * (kThreads + 2) * CHW < INT32_MAX;
}

inline bool aligned16(const void* p) {
  return p == nullptr || reinterpret_cast<std::uintptr_t>(p) % 16 == 0;
}

// S from the shape only (not from the alignment), so the choice of V never
// changes how many blocks there are.
inline int64_t split_count(int64_t C, int64_t M) {
  if (C <= 0 || M <= 0) return 1;
  int64_t s = kWaveBlocks / C;
  const int64_t most = (M + kMinSliceFloats - 1) / kMinSliceFloats;
  if (s > most) s = most;
  const int64_t least = (M + kMaxSliceFloats - 1) / kMaxSliceFloats;
  if (s < least) s = least;
  return s < 1 ? 1 : s;
}

inline Plan split_plan(int64_t N, int64_t C, int64_t HW, bool all_aligned) {
  Plan p;
  p.vec = (HW % 4 == 0 && all_aligned) ? 4 : 1;
  p.splits = split_count(C, N * HW);
  p.units = N * HW / p.vec;
  p.chunk = (p.units + p.splits - 1) / p.splits;
  return p;
}

// A split launch's numbers, computed on the host and passed by value as a
// kernel parameter, so that the walk's constants are read from the
// parameter bank instead of occupying registers. Index is int when the
// whole tensor has fewer than 2^31 floats (int_indices; 32-bit arithmetic,
// fewer registers: the kernels stay within 32 per thread), int64_t
// otherwise. Unit q of a channel (q = n*R + r, R = HW/V units per run) sits
// at float offset n*CHW + c*HW + r*V; stepping q by the block size (256)
// moves the offset by `jump` and r by dr, plus one `carry` to the next run
// at most.
template <typename Index>
struct SplitArgs {
  Index C, HW, splits, chunk, units;
  Index R, dr, jump, carry;
  static SplitArgs make(const Plan& p, int64_t C, int64_t HW) {
    SplitArgs a;
    a.C = static_cast<Index>(C), a.HW = static_cast<Index>(HW);
    a.splits = static_cast<Index>(p.splits), a.chunk = static_cast<Index>(p.chunk);
    a.units = static_cast<Index>(p.units);
    const int64_t R = HW / p.vec, dn = R > 0 ? kThreads / R : 0, dr = R > 0 ? kThreads % R : 0;
    a.R = static_cast<Index>(R), a.dr = static_cast<Index>(dr);
    a.jump = static_cast<Index>(dn * C * HW + dr * p.vec);
    a.carry = static_cast<Index>(C * HW - HW);
    return a;
  }
};

// Which channel and slice this block works on, and where the slice's units
// lie: [begin, end) of the channel's units.
template <typename Index>
struct Slice {
  Index c, begin, end;
  __device__ explicit Slice(const SplitArgs<Index>& a) {
    c = static_cast<Index>(blockIdx.x) / a.splits;
    const Index s = static_cast<Index>(blockIdx.x) - c * a.splits;
    begin = s * a.chunk;
    end = begin + a.chunk < a.units ? begin + a.chunk : a.units;
    if (begin > end) begin = end;
  }
};

// Calls body(off, live) for the thread's units of the slice, G (default
// kUnroll<V>) at a time, in the thread's order whatever G: off[k] is the
// float offset of the k-th unit, live[k] whether it is inside the slice. The
// body loads all live units first, then uses them. The walk needs no
// division after its start.
template <int V, int G = kUnroll<V>, typename Index, typename Body>
__device__ __forceinline__ void for_each_unit_group(const SplitArgs<Index>& a,
                                                    const Slice<Index>& sl, Body body) {
  if (sl.begin >= sl.end) return;
  Index q = sl.begin + static_cast<Index>(threadIdx.x);
  const Index n = q / a.R;
  Index r = q - n * a.R;
  Index off = n * a.C * a.HW + sl.c * a.HW + r * V;
  while (q < sl.end) {
    Index offs[G];
    bool live[G];
#pragma unroll
    for (int k = 0; k < G; ++k) {
      live[k] = q < sl.end;
      offs[k] = off;
      q += kThreads;
      r += a.dr;
      off += a.jump;
      if (r >= a.R) {
        r -= a.R;
        off += a.carry;
      }
    }
    body(offs, live);
  }
}

// V floats at p (V = 4: one 16-byte load; p aligned, as the plan checked).
template <int V>
struct Unit {
  float v[V];
};
template <int V>
__device__ __forceinline__ Unit<V> load_unit(const float* __restrict__ p) {
  Unit<V> u;
  if constexpr (V == 4) {
    const float4 q = vec::load4(p);
    u.v[0] = q.x, u.v[1] = q.y, u.v[2] = q.z, u.v[3] = q.w;
  } else {
    u.v[0] = *p;
  }
  return u;
}
// A unit of bfloat16 elements (BatchNorm on autocast's activations): V = 4
// is two 32-bit loads of two elements each (the low half first, as memory
// holds them), widened to float.
template <int V>
__device__ __forceinline__ Unit<V> load_unit(const bfloat16* __restrict__ p) {
  Unit<V> u;
  if constexpr (V == 4) {
    const uint32_t* w = reinterpret_cast<const uint32_t*>(p);
    const uint32_t a = w[0], b = w[1];
    u.v[0] = bf16_bits_to_float(uint16_t(a & 0xffffu));
    u.v[1] = bf16_bits_to_float(uint16_t(a >> 16));
    u.v[2] = bf16_bits_to_float(uint16_t(b & 0xffffu));
    u.v[3] = bf16_bits_to_float(uint16_t(b >> 16));
  } else {
    u.v[0] = p->to_float();
  }
  return u;
}
// The group's units of p, all loaded before any is used (several loads in
// flight per thread); units outside the slice are zeros. T: float or bfloat16.
template <int V, int G, typename Index, typename T>
__device__ __forceinline__ void load_group(Unit<V> (&u)[G], const T* __restrict__ p,
                                           const Index* off, const bool* live) {
#pragma unroll
  for (int k = 0; k < G; ++k) u[k] = live[k] ? load_unit<V>(p + off[k]) : Unit<V>{};
}
template <int V>
__device__ __forceinline__ void store_unit(float* __restrict__ p, const Unit<V>& u) {
  if constexpr (V == 4)
    vec::store4(p, make_float4(u.v[0], u.v[1], u.v[2], u.v[3]));
  else
    *p = u.v[0];
}
// Rounded to nearest even; V = 4 as two 32-bit stores.
template <int V>
__device__ __forceinline__ void store_unit(bfloat16* __restrict__ p, const Unit<V>& u) {
  if constexpr (V == 4) {
    uint32_t* w = reinterpret_cast<uint32_t*>(p);
    w[0] = uint32_t(float_to_bf16_bits(u.v[0])) | (uint32_t(float_to_bf16_bits(u.v[1])) << 16);
    w[1] = uint32_t(float_to_bf16_bits(u.v[2])) | (uint32_t(float_to_bf16_bits(u.v[3])) << 16);
  } else {
    *p = bfloat16(u.v[0]);
  }
}

// ---- what is reduced, and how two of them combine ----

// Sums of two quantities (channel_sum uses one; BatchNorm backward both).
// (Aggregates without member initializers: T{} is all zeros, and CUDA allows
// them in __shared__ memory.)
template <typename Real>
struct Sum2 {
  Real a, b;
};
template <typename Real>
__device__ __forceinline__ Sum2<Real> combine(const Sum2<Real>& x, const Sum2<Real>& y) {
  return {x.a + y.a, x.b + y.b};
}
template <typename Real>
__device__ __forceinline__ Sum2<Real> shfl_down(const Sum2<Real>& x, int offset) {
  return {__shfl_down_sync(kFullMask, x.a, offset), __shfl_down_sync(kFullMask, x.b, offset)};
}

// Count, mean and sum of squared deviations (M2) of some values. Merging
// two sets with Chan et al.'s formula never subtracts two large sums, so a
// large mean with a small spread keeps its precision (unlike E[x^2] - E[x]^2).
template <typename Real>
struct Moments {
  Real n, mean, m2;
};
template <typename Real>
__device__ __forceinline__ Moments<Real> combine(const Moments<Real>& x, const Moments<Real>& y) {
  if (y.n == Real(0)) return x;
  if (x.n == Real(0)) return y;
  const Real n = x.n + y.n, delta = y.mean - x.mean, wy = y.n / n;
  return {n, x.mean + delta * wy, x.m2 + y.m2 + delta * delta * x.n * wy};
}
template <typename Real>
__device__ __forceinline__ Moments<Real> shfl_down(const Moments<Real>& x, int offset) {
  return {__shfl_down_sync(kFullMask, x.n, offset), __shfl_down_sync(kFullMask, x.mean, offset),
          __shfl_down_sync(kFullMask, x.m2, offset)};
}
// The V values of a unit, less `shift`, folded into m: the unit's own (V,
// mean, M2), then Chan's merge (for V = 1, Welford's update): one division
// per unit. The shift (a value of the same channel) keeps the running mean
// near 0: a float mean near 1000 would round each small update to 6e-5.
template <int V>
__device__ __forceinline__ void add_unit(Moments<float>& m, const Unit<V>& u, float shift) {
  float sum = 0.0f;
#pragma unroll
  for (int j = 0; j < V; ++j) sum += u.v[j] - shift;
  const float mean = sum * (1.0f / V);
  float m2 = 0.0f;
#pragma unroll
  for (int j = 0; j < V; ++j) m2 += (u.v[j] - shift - mean) * (u.v[j] - shift - mean);
  const float n = m.n + V, delta = mean - m.mean, w = V / n;
  m.mean += delta * w;
  m.m2 += m2 + delta * delta * m.n * w;
  m.n = n;
}

// Lane 0 gets the combination of the warp's 32 values, in a fixed order.
template <typename T>
__device__ __forceinline__ T warp_reduce(T v) {
  for (int offset = 16; offset > 0; offset /= 2) v = combine(v, shfl_down(v, offset));
  return v;
}

// Thread 0 gets the combination of the block's values: warps first, then
// warp 0 over the 8 warp results. warp_vals: kWarps T of shared memory.
template <typename T>
__device__ __forceinline__ T block_reduce(T v, T* warp_vals) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  v = warp_reduce(v);
  if (lane == 0) warp_vals[warp] = v;
  __syncthreads();
  v = T{};
  if (warp == 0) v = warp_reduce(lane < kWarps ? warp_vals[lane] : T{});
  return v;
}

// One warp per channel (8 channels per 256-thread block): channel `c` of the
// calling warp (c >= C: nothing to do, returns false). Lane 0 of the warp
// gets, in `out`, the combination of partial(0) ... partial(S-1), each lane
// folding partials lane, lane + 32, ... in turn and the warp then combining
// its lanes, all in double: the order is fixed by S.
template <typename T, typename Partial>
__device__ __forceinline__ bool fold_partials(int64_t C, int64_t splits, int64_t& c, T& out,
                                              Partial partial) {
  c = int64_t{blockIdx.x} * kWarps + threadIdx.x / 32;
  if (c >= C) return false;  // the whole warp: c is per warp
  T acc{};
  for (int64_t s = threadIdx.x % 32; s < splits; s += 32) acc = combine(acc, partial(c, s));
  out = warp_reduce(acc);
  return true;
}

inline unsigned fold_blocks(int64_t C) { return static_cast<unsigned>((C + kWarps - 1) / kWarps); }

}  // namespace anvil::cuda::channel_split
