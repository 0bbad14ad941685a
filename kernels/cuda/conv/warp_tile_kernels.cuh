// The warp-tiled implicit GEMMs of convolution rungs 04 and 05: the three
// directions on GEMM rung 07's tile (warp_tile::multiply), reading their
// operands through operands.cuh; and of rung 06, the same kernels on GEMM
// rung 09's TF32 tensor-core tile (mma_tile::multiply), picked by the tile
// shape (the Tiles argument of the launchers below); rung 07 on the BF16
// tile, whose kernels also take bfloat16 x, w and dy (T below: the
// operands' element type, float for every other rung) and store bfloat16
// y and dx (TY; partials, dw and the bias stay float32).
//
// Block (x, y, z) reduces the chunk [z*chunk, z*chunk + chunk) of its GEMM's
// K into out + z * (the output's size): rung 04 and unsplit shapes, one chunk
// (chunk = K, grid.z = 1) straight into the output; rung 05's splits,
// partial outputs in the workspace (the forward adds the bias in partial 0
// only).
#pragma once
#include <algorithm>
#include <type_traits>

#include "kernels/cuda/conv/rung.cuh"
#include "kernels/cuda/gemm/split_k.h"
#include "kernels/cuda/gemm/mma_tile.cuh"
#include "kernels/cuda/gemm/tile.cuh"
#include "kernels/cuda/gemm/warp_tile.cuh"
#include "kernels/element.h"

namespace anvil::cuda::conv_kernels {

// The length of blockIdx.z's chunk of a reduction of K.
__device__ __forceinline__ int chunk_length(int K, int chunk) {
  const int k0 = int(blockIdx.z) * chunk;
  return K - k0 < chunk ? K - k0 : chunk;
}

// The tile's multiply: mma_tile's for its shapes (they have mma tiles),
// else warp_tile's. Both take the same operands and put(m, n, acc, valid).
template <class S, class GetA, class GetB, class Put>
__device__ __forceinline__ void tile_multiply(int M, int N, int K, const GetA& a, const GetB& b,
                                              const Put& put) {
  if constexpr (requires { S::kTilesM; })
    mma_tile::multiply<S>(M, N, K, a, b, put);
  else
    warp_tile::multiply<S>(M, N, K, a, b, put);
}

// Forward and backward-data store float32 or bfloat16 (TY): the FP32 sum
// (+ the bias, in FP32) rounded once to nearest even for bfloat16. Each is
// one __device__ body and two __global__ overloads on the output pointer,
// so that a bfloat16 output keeps the kernel's name in the audits; a split
// writes float32 partials and add_partials rounds.
template <class S, class T, class TY>
__device__ __forceinline__ void forward_tile(const Geo& g, const tile::Strided<false, T>& w,
                                             const T* __restrict__ x,
                                             const float* __restrict__ bias, int chunk,
                                             TY* __restrict__ out) {
  const int CRS = g.C * g.RS(), PQ = g.PQ(), k0 = int(blockIdx.z) * chunk;
  TY* y = out + int64_t(blockIdx.z) * g.N * g.K * PQ;
  const float* b0 = blockIdx.z == 0 ? bias : nullptr;
  tile_multiply<S>(g.K, g.N * PQ, chunk_length(CRS, chunk), warp_tile::KSlice(w, k0),
                   warp_tile::KSlice(ColByNpqOf<T>{g, x}, k0),
                   [&](int k, int npq, const float4& acc, int valid) {
                     const float b = b0 ? b0[k] : 0.0f;
#pragma unroll
                     for (int j = 0; j < 4; ++j) {
                       if (j >= valid) break;
                       const int n = (npq + j) / PQ, pq = (npq + j) % PQ;
                       y[(int64_t(n) * g.K + k) * PQ + pq] =
                           anvil::store<TY>(vec::at(acc, j) + b);
                     }
                   });
}
template <class S, class T>
__global__ void __launch_bounds__(S::kThreads, S::kMinBlocks)
    forward_warp_tiled(Geo g, tile::Strided<false, T> w, const T* __restrict__ x,
                       const float* __restrict__ bias, int chunk, float* __restrict__ out) {
  forward_tile<S>(g, w, x, bias, chunk, out);
}
template <class S, class T>
__global__ void __launch_bounds__(S::kThreads, S::kMinBlocks)
    forward_warp_tiled(Geo g, tile::Strided<false, T> w, const T* __restrict__ x,
                       const float* __restrict__ bias, int chunk, bfloat16* __restrict__ out) {
  forward_tile<S>(g, w, x, bias, chunk, out);
}

template <class S, class T, class TY>
__device__ __forceinline__ void backward_data_tile(const Geo& g, const T* __restrict__ dy,
                                                   const T* __restrict__ w, int chunk,
                                                   TY* __restrict__ out) {
  const int HW = g.H * g.W, k0 = int(blockIdx.z) * chunk;
  TY* dx = out + int64_t(blockIdx.z) * g.N * g.C * HW;
  tile_multiply<S>(g.C, g.N * HW, chunk_length(g.K * g.RS(), chunk),
                   warp_tile::KSlice(WeightTOf<T>{g, w}, k0),
                   warp_tile::KSlice(DyTapsOf<T>{g, dy}, k0),
                   [&](int c, int nhw, const float4& acc, int valid) {
#pragma unroll
                     for (int j = 0; j < 4; ++j) {
                       if (j >= valid) break;
                       const int n = (nhw + j) / HW, hw = (nhw + j) % HW;
                       dx[(int64_t(n) * g.C + c) * HW + hw] =
                           anvil::store<TY>(vec::at(acc, j));
                     }
                   });
}
template <class S, class T>
__global__ void __launch_bounds__(S::kThreads, S::kMinBlocks)
    backward_data_warp_tiled(Geo g, const T* __restrict__ dy, const T* __restrict__ w, int chunk,
                             float* __restrict__ out) {
  backward_data_tile<S>(g, dy, w, chunk, out);
}
template <class S, class T>
__global__ void __launch_bounds__(S::kThreads, S::kMinBlocks)
    backward_data_warp_tiled(Geo g, const T* __restrict__ dy, const T* __restrict__ w, int chunk,
                             bfloat16* __restrict__ out) {
  backward_data_tile<S>(g, dy, w, chunk, out);
}

template <class S, class T>
__global__ void __launch_bounds__(S::kThreads, S::kMinBlocks)
    backward_weight_warp_tiled(Geo g, const T* __restrict__ x, const T* __restrict__ dy, int chunk,
                               float* __restrict__ out) {
  const int CRS = g.C * g.RS(), k0 = int(blockIdx.z) * chunk;
  float* dw = out + int64_t(blockIdx.z) * g.K * CRS;
  tile_multiply<S>(
      g.K, CRS, chunk_length(g.N * g.PQ(), chunk), warp_tile::KSlice(DyRowsOf<T>{g, dy}, k0),
      warp_tile::KSlice(ColByCrsOf<T>{g, x}, k0), [&](int k, int crs, const float4& acc, int valid) {
#pragma unroll
        for (int j = 0; j < 4; ++j)
          if (j < valid) dw[int64_t(k) * CRS + crs + j] = vec::at(acc, j);
      });
}

// Calls f(S{}) with the tile shape S for a result of M rows: the 128x128
// tile of 256 threads, or for 64 rows or fewer the 64x128 tile of 128 threads
// (DoubleBufferedNarrow), so that a 64-channel layer does not leave half of
// every tile empty.
template <class F>
void with_warp_tile(int64_t M, F&& f) {
  if (M <= warp_tile::DoubleBufferedNarrow::kBM)
    f(warp_tile::DoubleBufferedNarrow{});
  else
    f(warp_tile::DoubleBuffered{});
}

// with_warp_tile as a type (FP32 rungs 04, 05), and its tensor-core
// counterpart (rungs 06 and 07, Math mma_tile::Tf32 or Bf16): mma_tile's
// 128 x 128 tile, or its 64 x 128 Narrow one for 64 rows or fewer.
struct Fp32Tiles {
  template <class F>
  void operator()(int64_t M, F&& f) const {
    with_warp_tile(M, f);
  }
};
template <class Math>
struct MmaTiles {
  template <class F>
  void operator()(int64_t M, F&& f) const {
    if (M <= mma_tile::Narrow<Math>::kBM)
      f(mma_tile::Narrow<Math>{});
    else
      f(mma_tile::Wide<Math>{});
  }
};

template <class S>
dim3 warp_tile_grid(int64_t M, int64_t N) {
  return dim3(static_cast<unsigned>((N + S::kBN - 1) / S::kBN),
              static_cast<unsigned>((M + S::kBM - 1) / S::kBM));
}

// kernel(args..., chunk, out) over the tiles of S and plan.splits chunks:
// unsplit, to_out straight into `out` (M*N elements of TY, in whatever
// layout the kernel writes); split, to_partials into the workspace's float
// partials, then added (and for a bfloat16 out rounded) into `out`.
template <class S, class ToPartials, class ToOut, class TY, typename... Args>
void launch_split(ToPartials to_partials, ToOut to_out, const Gemm& m, const split_k::Plan& plan,
                  float* ws, TY* out, cudaStream_t stream, Args... args) {
  dim3 grid = warp_tile_grid<S>(m.M, m.N);
  grid.z = static_cast<unsigned>(plan.splits);
  if (plan.splits == 1) {
    launch(to_out, grid, dim3(S::kThreads), 0, stream, args..., int(plan.chunk), out);
    return;
  }
  launch(to_partials, grid, dim3(S::kThreads), 0, stream, args..., int(plan.chunk), ws);
  split_k::sum_split_k(plan.splits, 1, int(m.M * m.N), ws, 1.0f, 0.0f, nullptr, out, m.M * m.N,
                       stream);
}

// The forward and backward-data kernels of tile S and operands T that store
// TY (the overload on the output pointer).
template <class S, class T, class TY>
auto forward_kernel() {
  void (*k)(Geo, tile::Strided<false, T>, const T*, const float*, int, TY*) =
      forward_warp_tiled<S, T>;
  return k;
}
template <class S, class T, class TY>
auto backward_data_kernel() {
  void (*k)(Geo, const T*, const T*, int, TY*) = backward_data_warp_tiled<S, T>;
  return k;
}

// The split of rungs 05 and 06 (split_k.h): where a GEMM's tiles on S fill
// less than one wave, the fewest chunks whose blocks best fill whole waves.
struct SplitByWaves {
  template <class S>
  split_k::Plan operator()(S, const Gemm& m) const {
    const dim3 grid = warp_tile_grid<S>(m.M, m.N);
    return split_k::plan(m.M, m.N, m.K, int64_t(grid.x) * grid.y, S::kMinBlocks);
  }
};

// The partials (floats) of whichever direction of `s` splits most on the
// tiles `tiles` picks; 0 where none splits.
template <class Tiles>
size_t split_workspace(const Conv2dShape& s, Tiles tiles) {
  size_t most = 0;
  for (const Gemm& m : {forward_gemm(s), backward_data_gemm(s), backward_weight_gemm(s)})
    tiles(m.M, [&](auto shape) {
      most = std::max(most,
                      size_t(split_k::workspace_floats(SplitByWaves{}(shape, m), m.M, m.N)));
    });
  return most;
}

// w [K, C*R*S] as A of the forward GEMM, with one load a quad where aligned.
template <class T>
tile::Strided<false, T> weights(const Conv2dShape& s, const T* w) {
  return tile::strided<false>(w, s.C * s.R * s.S);
}

// The three directions on the tile tiles(M) picks, each cut into
// plan(S, gemm) chunks; operands of T, y and dx of TY (float, or bfloat16).
template <class T, class TY, class Plan, class Tiles = Fp32Tiles>
void warp_tile_forward(const Conv2dShape& s, const T* x, const T* w, const float* bias, TY* y,
                       float* ws, cudaStream_t stream, Plan plan, Tiles tiles = {}) {
  const Gemm m = forward_gemm(s);
  tiles(m.M, [&](auto shape) {
    using S = decltype(shape);
    launch_split<S>(forward_kernel<S, T, float>(), forward_kernel<S, T, TY>(), m, plan(S{}, m), ws,
                    y, stream, geo(s), weights(s, w), x, bias);
  });
}

template <class T, class TY, class Plan, class Tiles = Fp32Tiles>
void warp_tile_backward_data(const Conv2dShape& s, const T* dy, const T* w, TY* dx, float* ws,
                             cudaStream_t stream, Plan plan, Tiles tiles = {}) {
  const Gemm m = backward_data_gemm(s);
  tiles(m.M, [&](auto shape) {
    using S = decltype(shape);
    launch_split<S>(backward_data_kernel<S, T, float>(), backward_data_kernel<S, T, TY>(), m,
                    plan(S{}, m), ws, dx, stream, geo(s), dy, w);
  });
}

template <class T, class Plan, class Tiles = Fp32Tiles>
void warp_tile_backward_weight(const Conv2dShape& s, const T* x, const T* dy, float* dw,
                               float* ws, cudaStream_t stream, Plan plan, Tiles tiles = {}) {
  const Gemm m = backward_weight_gemm(s);
  tiles(m.M, [&](auto shape) {
    using S = decltype(shape);
    const auto kernel = backward_weight_warp_tiled<S, T>;
    launch_split<S>(kernel, kernel, m, plan(S{}, m), ws, dw, stream, geo(s), x, dy);
  });
}

// A tensor-core rung (06 TF32, 07 BF16): the three directions of rung 05
// (its split by waves) on MmaTiles<Math>, for operands of T (float; for
// Bf16 also bfloat16: the same plan, so the same workspace).
template <class Math>
struct MmaRung {
  using Tiles = MmaTiles<Math>;
  static size_t workspace(const Conv2dShape& s) { return split_workspace(s, Tiles{}); }
  template <class T, class TY>
  static void forward(const Conv2dShape& s, const T* x, const T* w, const float* bias, TY* y,
                      float* ws, cudaStream_t stream) {
    warp_tile_forward(s, x, w, bias, y, ws, stream, SplitByWaves{}, Tiles{});
  }
  template <class T, class TY>
  static void backward_data(const Conv2dShape& s, const T* dy, const T* w, TY* dx, float* ws,
                            cudaStream_t stream) {
    warp_tile_backward_data(s, dy, w, dx, ws, stream, SplitByWaves{}, Tiles{});
  }
  template <class T>
  static void backward_weight(const Conv2dShape& s, const T* x, const T* dy, float* dw,
                              float* ws, cudaStream_t stream) {
    warp_tile_backward_weight(s, x, dy, dw, ws, stream, SplitByWaves{}, Tiles{});
  }
  // The rung's entry in the ladder (conv.h's conv_rungs::Rung); the
  // bfloat16 launchers (float32 and bfloat16 y, dx) where Math reads
  // bfloat16 (mma_tile::Bf16).
  static constexpr conv_rungs::Rung rung(const char* name, gemm_rungs::Math math) {
    conv_rungs::Rung r{name, workspace, forward<float, float>, backward_data<float, float>,
                       backward_weight<float>, math};
    if constexpr (std::is_same_v<Math, mma_tile::Bf16>) {
      r.forward_bf16 = forward<bfloat16, float>;
      r.backward_data_bf16 = backward_data<bfloat16, float>;
      r.backward_weight_bf16 = backward_weight<bfloat16>;
      r.forward_bf16_out = forward<bfloat16, bfloat16>;
      r.backward_data_bf16_out = backward_data<bfloat16, bfloat16>;
    }
    return r;
  }
};

}  // namespace anvil::cuda::conv_kernels
