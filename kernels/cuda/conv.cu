// 2-D convolution (cross-correlation, as PyTorch and cpu::conv2d_*), NCHW:
//   y[n,k,p,q] = bias[k] + sum_{c,r,s} w[k,c,r,s] * x[n, c, p*sh - ph + r, q*sw - pw + s]
// with zeros outside the image. Three directions (forward, backward-data,
// backward-weight), five numbered variants each; every one overwrites its
// output. All three directions are GEMMs in disguise over the "column
// matrix" col[(c,r,s), (n,p,q)] = x[n, c, p*sh - ph + r, q*sw - pw + s]:
//   forward          y[k, (n,p,q)]   = W[k, (c,r,s)] * col
//   backward-data    dcol            = W^T * dy[k, (n,p,q)], then each pixel
//                                      sums the dcol entries that read it
//   backward-weight  dw[k, (c,r,s)]  = dy[k, (n,p,q)] * col^T
//
// 1 naive direct. One thread per output element, computing it straight from
//   the definition with bounds checks: forward, one thread per y element
//   looping over c, r, s; backward-data, one thread per dx element gathering
//   every (k, r, s) whose output position (p, q) read this pixel (its
//   h + ph - r must be a multiple of the stride and land inside P); backward-
//   weight, one thread per dw element looping over n, p, q. No shared memory
//   and no atomics (each thread owns its output), so it is deterministic, but
//   every thread reads its inputs from global memory on its own: the same x
//   and w values are fetched again by many threads, and for backward-weight a
//   few hundred threads each walk the whole batch.
//
// 2 explicit im2col + GEMM. The column matrix is materialised in the caller's
//   workspace for a chunk of images at a time (as many whole images as fit in
//   ANVIL_CUDA_CONV_CHUNK_FLOATS floats of columns; the chunk multiplies the
//   GEMM's N dimension, which a GPU needs large), one thread per column
//   element, consecutive threads along (n, p, q) so that writes are
//   coalesced and reads of x nearly so. The product then runs as GEMM
//   variant 4 (register-blocked, gemm.cu) with the transposes above: forward
//   W * col (into y directly for a one-image chunk, else into a staging
//   matrix that a copy kernel scatters to NCHW, bias included); backward-data
//   W^T * dy (trans_a) into dcol, then col2im as a gather, one thread per dx
//   element summing its dcol entries (no atomics, deterministic); backward-
//   weight dy * col^T (trans_b), accumulating over chunks with beta = 1, as
//   GEMM variant 8: M x N = K x C*R*S is often a handful of tiles while the
//   chunk's K = images*P*Q is long, so that GEMM splits its reduction over
//   grid.z when the tiles cannot fill the GPU (its partials follow the
//   columns in the workspace). For chunks of several images dy is first
//   gathered into [K, images*P*Q]. All
//   the arithmetic now runs in the GEMM's shared-memory and register tiles;
//   the price is the workspace and one write + one read of the column matrix
//   (R*S times the size of x) through global memory.
//
// 3 implicit GEMM. The same register-blocked GEMM (tile::register_blocked,
//   gemm_tile.cuh: 256 threads, a 64x64 output tile, 4x4 outputs per thread
//   in registers, 16-deep K steps through shared memory), but the operands
//   are index functions: when a block stages its 16x64 tile of the column
//   matrix (or of dy, for backward-data) into shared memory, each thread
//   computes the image coordinates of its elements and loads them straight
//   from x (or dy), zero where the window hangs over the padding. The column
//   matrix never exists: no workspace, and no extra global-memory round trip.
//   Shared memory holds exactly what GEMM variant 4's does (the A and B tiles,
//   [k][j], padded by 2 floats per row against bank conflicts). As GEMMs:
//     forward          M = K, N = N*P*Q, K = C*R*S; B gathered from x, threads
//                      along (n,p,q): runs of consecutive q read x with stride sw
//     backward-data    M = C, N = N*H*W, K = K*R*S; the output is dx itself:
//                      B[(k,r,s), (n,h,w)] = dy[n, k, (h+ph-r)/sh, (w+pw-s)/sw]
//                      where that divides exactly and lands inside P x Q, else
//                      0. This turns col2im's scatter into a gather, so each
//                      thread owns its dx values: deterministic, no atomics;
//                      with stride > 1 most of B is zeros (wasted work).
//     backward-weight  M = K, N = C*R*S, K = N*P*Q; A = dy read as [k, (n,p,q)],
//                      B gathered from x, threads along (n,p,q). The long
//                      reduction runs inside one block per 64x64 dw tile
//                      (deterministic, but few blocks for small layers:
//                      LeNet's first layer is one block; variant 5 splits it).
//   The index arithmetic (divisions by P*Q, Q, R*S, S per element) is what a
//   production kernel would precompute per tile; here it is left plain.
//
// 4 implicit GEMM on the warp tile. Variant 3's operands (the same index
//   functions, the same three GEMMs) on GEMM variant 7's tile
//   (warp_tile::multiply, gemm_warp_tile.cuh): 8x8 outputs per thread in
//   warp sub-tiles, K steps of 8 through two shared-memory stages, the
//   gathers of step t+1 in flight during the multiply-adds of step t. Results
//   of more than 64 rows (forward and backward-weight: K output channels;
//   backward-data: C input channels) use the 128x128 tile of 256 threads;
//   64 rows or fewer the 64x128 tile of 128 threads (DoubleBufferedNarrow),
//   so that a 64-channel layer does not leave half of every tile empty. The
//   weights, when they are A as stored (forward: w is [K, C*R*S]), are read
//   with 16-byte loads where C*R*S is a multiple of 4 and w is 16-byte
//   aligned. The gathered operands have no aligned vector (a window crosses
//   the padding and row ends); each reads its quad as four scalar loads that
//   share one set of index divisions (the Walk helper carries from one
//   position to the next), where variant 3 divides afresh for every element.
//   The output is written through the same index functions as variant 3's.
//
// 5 variant 4 with split-K. Variant 4's threads and tiles; what changes is
//   how many blocks share a GEMM. Backward-weight is a GEMM of K x C*R*S
//   outputs, a few tiles (LeNet's layers: 1 to 4; ResNet-18's 64-channel 3x3
//   layers: 5), over a reduction of N*P*Q, hundreds of thousands of terms at
//   batch 256: variant 4 leaves most of an H100's 132 SMs idle. Variant 5
//   launches grid.z = splits copies of variant 4's tile grid, block (tile, z)
//   reducing the chunk [z*chunk, (z+1)*chunk) of the GEMM's K (a
//   warp_tile::KSlice of both operands; within a chunk threads map to data
//   exactly as in variant 4) into its own partial output in the workspace
//   (partial z at z * the output's size, in the output's layout); then GEMM's
//   add_partials (one thread per output element; from 32 splits one warp)
//   sums the partials in a fixed order (no atomics: bitwise the same from
//   run to run). The split count comes from the shape (split_k.h): where the
//   tiles fill less than one wave (132 SMs x the tile's resident blocks),
//   the fewest splits whose blocks best fill whole waves (at most 4), chunks
//   at least 128 long and multiples of 16 (so a slice of the weights keeps
//   its 16-byte loads). LeNet's conv1 at batch 256: 1 block -> 387 of the 64x128
//   tile's 396 slots; ResNet-18's 64-channel layers: 5 -> 395. The same applies to
//   forward and backward-data, whose K (C*R*S, K*R*S) is shorter but whose
//   128x128 tiles can be too few at small batches (ResNet-18's 512-channel
//   layers at batch 128: 64 blocks); the forward adds the bias in partial 0
//   only. A GEMM whose tiles fill the GPU, or whose K is short, runs
//   unsplit: variant 4 exactly, no workspace.
//
// dbias (backward-weight, all variants, when dbias is non-null) is
// channel_sum (reduce.cu) over dy [N, K, P*Q]: deterministic, a fixed
// summation order.
//
// Every kernel declares __launch_bounds__ with the block size it is launched
// with (and, for the warp tiles, the resident blocks they are sized for).
//
// Limits: every dimension, and each GEMM dimension above (N*P*Q, N*H*W,
// C*R*S, K*R*S), below 2^31; element counts and addresses are 64-bit. The
// implicit GEMM's grid puts K (forward, backward-weight) and C (backward-
// data) in blockIdx.y, 64 per block: up to 65535*64 (a launch error beyond).
// Shapes are checked (std::invalid_argument): sizes >= 0, R, S, strides >= 1,
// pads >= 0, P and Q as Conv2dShape::out_size gives them.
#include <algorithm>
#include <source_location>
#include <stdexcept>
#include <string>
#include <utility>

#include "kernels/cuda/cuda_compat.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/conv_operands.cuh"
#include "kernels/cuda/gemm_tile.cuh"
#include "kernels/cuda/gemm_warp_tile.cuh"
#include "kernels/cuda/split_k.h"

// Target size of variant 2's column buffer per chunk, in floats. The
// simulator build uses a small one so that the tests exercise chunks of
// several images and a short last chunk on small shapes.
#ifndef ANVIL_CUDA_CONV_CHUNK_FLOATS
#if defined(ANVIL_CUDA_SIM)
#define ANVIL_CUDA_CONV_CHUNK_FLOATS (1 << 15)
#else
#define ANVIL_CUDA_CONV_CHUNK_FLOATS (1 << 22)
#endif
#endif

namespace anvil::cuda {

namespace conv_kernels {

constexpr int kThreads = 256;  // block size of the one-thread-per-element kernels

__device__ __forceinline__ int64_t global_index() {
  return int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
}

// ---- shared by all variants ----

__global__ void __launch_bounds__(kThreads) fill_zero(int64_t count, float* out) {
  const int64_t i = global_index();
  if (i < count) out[i] = 0.0f;
}

// ---- variant 1: naive direct ----

__global__ void __launch_bounds__(kThreads)
    forward_naive(Geo g, const float* __restrict__ x, const float* __restrict__ w,
                  const float* __restrict__ bias, float* __restrict__ y) {
  const int64_t i = global_index();
  if (i >= int64_t(g.N) * g.K * g.PQ()) return;
  const int q = int(i % g.Q), p = int(i / g.Q % g.P), k = int(i / g.PQ() % g.K);
  const int n = int(i / (int64_t(g.K) * g.PQ()));
  float acc = 0.0f;
  for (int c = 0; c < g.C; ++c)
    for (int r = 0; r < g.R; ++r)
      for (int s = 0; s < g.S; ++s)
        acc += w[((int64_t(k) * g.C + c) * g.R + r) * g.S + s] * x_at(g, x, n, c, p, q, r, s);
  y[i] = bias ? acc + bias[k] : acc;
}

__global__ void __launch_bounds__(kThreads)
    backward_data_naive(Geo g, const float* __restrict__ dy, const float* __restrict__ w,
                        float* __restrict__ dx) {
  const int64_t i = global_index();
  if (i >= int64_t(g.N) * g.C * g.H * g.W) return;
  const int wi = int(i % g.W), h = int(i / g.W % g.H), c = int(i / (int64_t(g.H) * g.W) % g.C);
  const int n = int(i / (int64_t(g.C) * g.H * g.W));
  float acc = 0.0f;
  for (int k = 0; k < g.K; ++k)
    for (int r = 0; r < g.R; ++r)
      for (int s = 0; s < g.S; ++s)
        acc += w[((int64_t(k) * g.C + c) * g.R + r) * g.S + s] * dy_tap(g, dy, n, k, h, wi, r, s);
  dx[i] = acc;
}

__global__ void __launch_bounds__(kThreads)
    backward_weight_naive(Geo g, const float* __restrict__ x, const float* __restrict__ dy,
                          float* __restrict__ dw) {
  const int64_t i = global_index();
  if (i >= int64_t(g.K) * g.C * g.RS()) return;
  const int s = int(i % g.S), r = int(i / g.S % g.R), c = int(i / g.RS() % g.C);
  const int k = int(i / (int64_t(g.C) * g.RS()));
  float acc = 0.0f;
  for (int n = 0; n < g.N; ++n)
    for (int p = 0; p < g.P; ++p)
      for (int q = 0; q < g.Q; ++q)
        acc += dy[((int64_t(n) * g.K + k) * g.P + p) * g.Q + q] * x_at(g, x, n, c, p, q, r, s);
  dw[i] = acc;
}

// ---- variant 2: explicit im2col / col2im + GEMM variant 4 ----

// col[crs, j] for images [n0, n0 + cnt), j = (n - n0)*PQ + pq; one thread
// per element, consecutive threads along j.
__global__ void __launch_bounds__(kThreads)
    im2col(Geo g, const float* __restrict__ x, int n0, int cnt, float* __restrict__ col) {
  const int64_t i = global_index(), cols = int64_t(cnt) * g.PQ();
  if (i >= cols * g.C * g.RS()) return;
  const int crs = int(i / cols), j = int(i % cols);
  col[i] = col_at(g, x + int64_t(n0) * g.C * g.H * g.W, crs, j);
}

// dx for images [n0, n0 + cnt) from dcol[crs, j]: each pixel sums the column
// entries that were read from it (a gather: no atomics).
__global__ void __launch_bounds__(kThreads)
    col2im(Geo g, const float* __restrict__ dcol, int n0, int cnt, float* __restrict__ dx) {
  const int64_t i = global_index(), HW = int64_t(g.H) * g.W, PQ = g.PQ();
  if (i >= int64_t(cnt) * g.C * HW) return;
  const int wi = int(i % g.W), h = int(i / g.W % g.H), c = int(i / HW % g.C);
  const int n = int(i / (HW * g.C));
  const int64_t cols = int64_t(cnt) * PQ;
  float acc = 0.0f;
  for (int r = 0; r < g.R; ++r) {
    const int hp = h + g.ph - r;
    if (hp < 0 || hp % g.sh != 0 || hp / g.sh >= g.P) continue;
    for (int s = 0; s < g.S; ++s) {
      const int wp = wi + g.pw - s;
      if (wp < 0 || wp % g.sw != 0 || wp / g.sw >= g.Q) continue;
      const int64_t row = (int64_t(c) * g.R + r) * g.S + s;
      acc += dcol[row * cols + n * PQ + (hp / g.sh) * g.Q + wp / g.sw];
    }
  }
  dx[int64_t(n0) * g.C * HW + i] = acc;
}

// out[k, j] = dy[n0 + j / PQ, k, j % PQ] for a chunk of cnt images.
__global__ void __launch_bounds__(kThreads)
    gather_dy(Geo g, const float* __restrict__ dy, int n0, int cnt, float* __restrict__ out) {
  const int64_t i = global_index(), PQ = g.PQ(), cols = cnt * PQ;
  if (i >= cols * g.K) return;
  const int64_t k = i / cols, j = i % cols;
  out[i] = dy[((n0 + j / PQ) * g.K + k) * PQ + j % PQ];
}

// y[n, k, pq] (cnt images from y) = staged[k, n*PQ + pq] + bias[k]; either
// may be null (no staged: y = bias).
__global__ void __launch_bounds__(kThreads)
    to_nchw(Geo g, const float* __restrict__ staged, const float* __restrict__ bias, int cnt,
            float* __restrict__ y) {
  const int64_t i = global_index(), PQ = g.PQ();
  if (i >= int64_t(cnt) * g.K * PQ) return;
  const int64_t pq = i % PQ, k = i / PQ % g.K, n = i / (PQ * g.K);
  float v = staged ? staged[k * cnt * PQ + n * PQ + pq] : 0.0f;
  y[i] = bias ? v + bias[k] : v;
}

// ---- variant 3: implicit GEMM (tile::register_blocked on conv_operands.cuh readers) ----

__global__ void __launch_bounds__(tile::kThreads)
    forward_implicit(Geo g, const float* __restrict__ x, const float* __restrict__ w,
                     const float* __restrict__ bias, float* __restrict__ y) {
  const int CRS = g.C * g.RS(), PQ = g.PQ();
  tile::register_blocked(g.K, g.N * PQ, CRS, tile::Strided<false>{w, CRS}, ColByNpq{g, x},
                         [&](int k, int npq, float acc) {
                           const int n = npq / PQ, pq = npq % PQ;
                           y[(int64_t(n) * g.K + k) * PQ + pq] = bias ? acc + bias[k] : acc;
                         });
}

__global__ void __launch_bounds__(tile::kThreads)
    backward_data_implicit(Geo g, const float* __restrict__ dy, const float* __restrict__ w,
                           float* __restrict__ dx) {
  const int HW = g.H * g.W;
  tile::register_blocked(g.C, g.N * HW, g.K * g.RS(), WeightT{g, w}, DyTaps{g, dy},
                         [&](int c, int nhw, float acc) {
                           const int n = nhw / HW, hw = nhw % HW;
                           dx[(int64_t(n) * g.C + c) * HW + hw] = acc;
                         });
}

__global__ void __launch_bounds__(tile::kThreads)
    backward_weight_implicit(Geo g, const float* __restrict__ x, const float* __restrict__ dy,
                             float* __restrict__ dw) {
  const int CRS = g.C * g.RS();
  tile::register_blocked(g.K, CRS, g.N * g.PQ(), DyRows{g, dy}, ColByCrs{g, x},
                         [&](int k, int crs, float acc) { dw[int64_t(k) * CRS + crs] = acc; });
}

// ---- variants 4 and 5: implicit GEMM on the warp tile (tile shape S) ----
//
// Block (x, y, z) reduces the chunk [z*chunk, z*chunk + chunk) of its GEMM's
// K into out + z * (the output's size): variant 4 and unsplit shapes, one
// chunk (chunk = K, grid.z = 1) straight into the output; variant 5's splits,
// partial outputs in the workspace (the forward adds the bias in partial 0
// only).

// The length of blockIdx.z's chunk of a reduction of K.
__device__ __forceinline__ int chunk_length(int K, int chunk) {
  const int k0 = int(blockIdx.z) * chunk;
  return K - k0 < chunk ? K - k0 : chunk;
}

template <class S>
__global__ void __launch_bounds__(S::kThreads, S::kMinBlocks)
    forward_warp_tiled(Geo g, tile::Strided<false> w, const float* __restrict__ x,
                       const float* __restrict__ bias, int chunk, float* __restrict__ out) {
  const int CRS = g.C * g.RS(), PQ = g.PQ(), k0 = int(blockIdx.z) * chunk;
  float* y = out + int64_t(blockIdx.z) * g.N * g.K * PQ;
  const float* b0 = blockIdx.z == 0 ? bias : nullptr;
  warp_tile::multiply<S>(g.K, g.N * PQ, chunk_length(CRS, chunk), warp_tile::KSlice(w, k0),
                         warp_tile::KSlice(ColByNpq{g, x}, k0),
                         [&](int k, int npq, const float4& acc, int valid) {
                           const float b = b0 ? b0[k] : 0.0f;
#pragma unroll
                           for (int j = 0; j < 4; ++j) {
                             if (j >= valid) break;
                             const int n = (npq + j) / PQ, pq = (npq + j) % PQ;
                             y[(int64_t(n) * g.K + k) * PQ + pq] = vec::at(acc, j) + b;
                           }
                         });
}

template <class S>
__global__ void __launch_bounds__(S::kThreads, S::kMinBlocks)
    backward_data_warp_tiled(Geo g, const float* __restrict__ dy, const float* __restrict__ w,
                             int chunk, float* __restrict__ out) {
  const int HW = g.H * g.W, k0 = int(blockIdx.z) * chunk;
  float* dx = out + int64_t(blockIdx.z) * g.N * g.C * HW;
  warp_tile::multiply<S>(g.C, g.N * HW, chunk_length(g.K * g.RS(), chunk),
                         warp_tile::KSlice(WeightT{g, w}, k0), warp_tile::KSlice(DyTaps{g, dy}, k0),
                         [&](int c, int nhw, const float4& acc, int valid) {
#pragma unroll
                           for (int j = 0; j < 4; ++j) {
                             if (j >= valid) break;
                             const int n = (nhw + j) / HW, hw = (nhw + j) % HW;
                             dx[(int64_t(n) * g.C + c) * HW + hw] = vec::at(acc, j);
                           }
                         });
}

template <class S>
__global__ void __launch_bounds__(S::kThreads, S::kMinBlocks)
    backward_weight_warp_tiled(Geo g, const float* __restrict__ x, const float* __restrict__ dy,
                               int chunk, float* __restrict__ out) {
  const int CRS = g.C * g.RS(), k0 = int(blockIdx.z) * chunk;
  float* dw = out + int64_t(blockIdx.z) * g.K * CRS;
  warp_tile::multiply<S>(
      g.K, CRS, chunk_length(g.N * g.PQ(), chunk), warp_tile::KSlice(DyRows{g, dy}, k0),
      warp_tile::KSlice(ColByCrs{g, x}, k0), [&](int k, int crs, const float4& acc, int valid) {
#pragma unroll
        for (int j = 0; j < 4; ++j)
          if (j < valid) dw[int64_t(k) * CRS + crs + j] = vec::at(acc, j);
      });
}

// ---- host side ----

namespace {

// An element count that remembers where the launch was written (as GridArg).
struct Count {
  int64_t n;
  std::source_location where;
  Count(int64_t v, std::source_location w = std::source_location::current()) : n(v), where(w) {}
};

// One thread per element, kThreads per block; nothing to launch for no
// elements (a grid of 0 blocks is an error).
template <typename... KArgs, typename... Args>
void launch_1d(void (*kernel)(KArgs...), Count count, cudaStream_t stream, Args&&... args) {
  if (count.n <= 0) return;
  const auto blocks = static_cast<unsigned>((count.n + kThreads - 1) / kThreads);
  launch(kernel, GridArg(dim3(blocks), count.where), dim3(kThreads), 0, stream,
         std::forward<Args>(args)...);
}

int64_t images_per_chunk(const Conv2dShape& s) {
  const int64_t per_image = std::max<int64_t>(1, s.C * s.R * s.S * s.P * s.Q);
  return std::clamp<int64_t>(ANVIL_CUDA_CONV_CHUNK_FLOATS / per_image, 1,
                             std::max<int64_t>(1, s.N));
}

[[noreturn]] void bad_shape(const char* fn, const std::string& what) {
  throw std::invalid_argument(std::string("cuda::") + fn + ": " + what);
}

// Checks the shape and the variant; returns the kernels' view of the shape.
Geo checked(const char* fn, int variant, const Conv2dShape& s) {
  if (variant < 1 || variant > kConvVariants)
    bad_shape(fn, "no variant " + std::to_string(variant) + " (there are 1 to " +
                      std::to_string(kConvVariants) + ")");
  struct Field {
    const char* name;
    int64_t value, lo;
  };
  const Field fields[] = {
      {"N", s.N, 0},         {"C", s.C, 0},         {"H", s.H, 0},
      {"W", s.W, 0},         {"K", s.K, 0},         {"R", s.R, 1},
      {"S", s.S, 1},         {"stride_h", s.stride_h, 1}, {"stride_w", s.stride_w, 1},
      {"pad_h", s.pad_h, 0}, {"pad_w", s.pad_w, 0}, {"P", s.P, 0},
      {"Q", s.Q, 0}};
  for (const Field& f : fields)
    if (f.value < f.lo || f.value > INT32_MAX)
      bad_shape(fn, std::string(f.name) + " = " + std::to_string(f.value) + " is out of range [" +
                        std::to_string(f.lo) + ", 2^31)");
  if (s.P != Conv2dShape::out_size(s.H, s.R, s.stride_h, s.pad_h))
    bad_shape(fn, "P = " + std::to_string(s.P) + " does not match H, R, stride_h, pad_h");
  if (s.Q != Conv2dShape::out_size(s.W, s.S, s.stride_w, s.pad_w))
    bad_shape(fn, "Q = " + std::to_string(s.Q) + " does not match W, S, stride_w, pad_w");
  const std::pair<const char*, double> gemm_dims[] = {
      {"N*P*Q", double(s.N) * s.P * s.Q},
      {"N*H*W", double(s.N) * s.H * s.W},
      {"C*R*S", double(s.C) * s.R * s.S},
      {"K*R*S", double(s.K) * s.R * s.S}};
  for (const auto& [name, v] : gemm_dims)
    if (v > double(INT32_MAX)) bad_shape(fn, std::string(name) + " is 2^31 or more");
  return Geo{int(s.N),        int(s.C),        int(s.H),     int(s.W),     int(s.K),
             int(s.R),        int(s.S),        int(s.stride_h), int(s.stride_w),
             int(s.pad_h),    int(s.pad_w),    int(s.P),     int(s.Q)};
}

size_t direction_workspace(int variant, const Conv2dShape& s);

float* checked_workspace(const char* fn, int variant, const Conv2dShape& s, float* workspace) {
  if (direction_workspace(variant, s) > 0 && workspace == nullptr)
    bad_shape(fn, "variant " + std::to_string(variant) + " needs a workspace (null given)");
  return workspace;
}

dim3 tile_grid(int64_t M, int64_t N) {
  return dim3(static_cast<unsigned>((N + tile::kBN - 1) / tile::kBN),
              static_cast<unsigned>((M + tile::kBM - 1) / tile::kBM));
}

// Variant 4: calls f(S{}) with the tile shape S for a result of M rows (see
// the top of this file).
template <class F>
void with_warp_tile(int64_t M, F&& f) {
  if (M <= warp_tile::DoubleBufferedNarrow::kBM)
    f(warp_tile::DoubleBufferedNarrow{});
  else
    f(warp_tile::DoubleBuffered{});
}

template <class S>
dim3 warp_tile_grid(int64_t M, int64_t N) {
  return dim3(static_cast<unsigned>((N + S::kBN - 1) / S::kBN),
              static_cast<unsigned>((M + S::kBM - 1) / S::kBM));
}

// The three GEMMs (M x N over a reduction of K) of variants 4 and 5.
struct Gemm {
  int64_t M, N, K;
};
Gemm forward_gemm(const Conv2dShape& s) { return {s.K, s.N * s.P * s.Q, s.C * s.R * s.S}; }
Gemm backward_data_gemm(const Conv2dShape& s) { return {s.C, s.N * s.H * s.W, s.K * s.R * s.S}; }
Gemm backward_weight_gemm(const Conv2dShape& s) {
  return {s.K, s.C * s.R * s.S, s.N * s.P * s.Q};
}

// Variant 5's split of a GEMM on tile S (variant 4: one chunk).
template <class S>
split_k::Plan split(int variant, const Gemm& m) {
  if (variant != 5) return {1, m.K};
  const dim3 grid = warp_tile_grid<S>(m.M, m.N);
  return split_k::plan(m.M, m.N, m.K, int64_t(grid.x) * grid.y, S::kMinBlocks);
}

// Variant 5's partials for a GEMM (0 where it does not split).
size_t split_workspace(const Gemm& m) {
  size_t floats = 0;
  with_warp_tile(m.M, [&](auto shape) {
    floats = size_t(split_k::workspace_floats(split<decltype(shape)>(5, m), m.M, m.N));
  });
  return floats;
}

// Variants 4 and 5: kernel(args..., chunk, out) over the tiles of S and
// plan.splits chunks, into `out` (M*N floats, in whatever layout the kernel
// writes) or, split, into the workspace's partials, then added into `out`.
template <class S, typename... KArgs, typename... Args>
void launch_split(void (*kernel)(KArgs...), const Gemm& m, const split_k::Plan& plan, float* ws,
                  float* out, cudaStream_t stream, Args... args) {
  dim3 grid = warp_tile_grid<S>(m.M, m.N);
  grid.z = static_cast<unsigned>(plan.splits);
  const bool is_split = plan.splits > 1;
  launch(kernel, grid, dim3(S::kThreads), 0, stream, args..., int(plan.chunk), is_split ? ws : out);
  if (is_split)
    split_k::sum_split_k(plan.splits, 1, int(m.M * m.N), ws, 1.0f, 0.0f, out, m.M * m.N, stream);
}

// Variant 2's backward-weight GEMM, dw[K, C*R*S] (+)= dy * col^T over a chunk
// of nb images, and its workspace (split-K partials).
constexpr int kWeightGemm = 8;
size_t weight_gemm_workspace(const Conv2dShape& s, int64_t nb) {
  return gemm_workspace_floats(kWeightGemm, s.K, s.C * s.R * s.S, nb * s.P * s.Q);
}

// w [K, C*R*S] as A of the forward GEMM, with 16-byte loads where aligned.
tile::Strided<false> weights(const Conv2dShape& s, const float* w) {
  return tile::strided<false>(w, s.C * s.R * s.S);
}

size_t direction_workspace(int variant, const Conv2dShape& s) {
  if (variant == 5)  // the partials of whichever direction splits most
    return std::max({split_workspace(forward_gemm(s)), split_workspace(backward_data_gemm(s)),
                     split_workspace(backward_weight_gemm(s))});
  if (variant != 2) return 0;
  // Columns [C*R*S, nb*P*Q] plus a [K, nb*P*Q] matrix (staged output for
  // forward, gathered dy for the backward passes), then the weight GEMM's
  // split-K partials.
  const int64_t nb = images_per_chunk(s);
  return static_cast<size_t>(nb * s.P * s.Q * (s.C * s.R * s.S + s.K)) +
         weight_gemm_workspace(s, nb);
}

}  // namespace

}  // namespace conv_kernels

size_t conv2d_workspace_floats(int variant, const Conv2dShape& s) {
  conv_kernels::checked("conv2d_workspace_floats", variant, s);
  // Backward-weight's dbias (channel_sum's partials) runs first on the same
  // stream, so it can reuse the space the direction's own work needs after it.
  return std::max(conv_kernels::direction_workspace(variant, s),
                  channel_sum_workspace_floats(kBestChannelSum, s.N, s.K, s.P * s.Q));
}

void conv2d_forward(int variant, const Conv2dShape& s, const float* x, const float* w,
                    const float* bias, float* y, float* workspace, cudaStream_t stream) {
  using namespace conv_kernels;
  const Geo g = checked("conv2d_forward", variant, s);
  float* ws = checked_workspace("conv2d_forward", variant, s, workspace);
  const int64_t PQ = s.P * s.Q, CRS = s.C * s.R * s.S, KPQ = s.K * PQ;
  if (s.N * KPQ == 0) return;  // y is empty
  if (variant == 1) {
    launch_1d(forward_naive, s.N * KPQ, stream, g, x, w, bias, y);
  } else if (variant == 2) {
    const int64_t nb = images_per_chunk(s);
    float* col = ws;
    float* staged = ws + CRS * nb * PQ;
    for (int64_t n0 = 0; n0 < s.N; n0 += nb) {
      const int64_t cnt = std::min(nb, s.N - n0), cols = cnt * PQ;
      float* yc = y + n0 * KPQ;
      launch_1d(im2col, CRS * cols, stream, g, x, int(n0), int(cnt), col);
      if (cnt == 1) {  // [K, P*Q] is already NCHW: the GEMM writes y, onto the bias
        if (bias) launch_1d(to_nchw, KPQ, stream, g, nullptr, bias, 1, yc);
        gemm(4, false, false, s.K, cols, CRS, 1.0f, w, CRS, col, cols, bias ? 1.0f : 0.0f, yc,
             cols, stream);
      } else {
        gemm(4, false, false, s.K, cols, CRS, 1.0f, w, CRS, col, cols, 0.0f, staged, cols, stream);
        launch_1d(to_nchw, cnt * KPQ, stream, g, staged, bias, int(cnt), yc);
      }
    }
  } else if (variant == 3) {
    launch(forward_implicit, tile_grid(s.K, s.N * PQ), dim3(tile::kThreads), 0, stream, g, x, w,
           bias, y);
  } else {
    const Gemm m = forward_gemm(s);
    with_warp_tile(m.M, [&](auto shape) {
      using S = decltype(shape);
      launch_split<S>(forward_warp_tiled<S>, m, split<S>(variant, m), ws, y, stream, g,
                      weights(s, w), x, bias);
    });
  }
}

void conv2d_backward_data(int variant, const Conv2dShape& s, const float* dy, const float* w,
                          float* dx, float* workspace, cudaStream_t stream) {
  using namespace conv_kernels;
  const Geo g = checked("conv2d_backward_data", variant, s);
  float* ws = checked_workspace("conv2d_backward_data", variant, s, workspace);
  const int64_t PQ = s.P * s.Q, CRS = s.C * s.R * s.S, HW = s.H * s.W;
  if (s.N * s.C * HW == 0) return;  // dx is empty
  if (s.K * PQ == 0) {              // nothing flows back: dx = 0
    launch_1d(fill_zero, s.N * s.C * HW, stream, s.N * s.C * HW, dx);
    return;
  }
  if (variant == 1) {
    launch_1d(backward_data_naive, s.N * s.C * HW, stream, g, dy, w, dx);
  } else if (variant == 2) {
    const int64_t nb = images_per_chunk(s);
    float* dcol = ws;
    float* dyc = ws + CRS * nb * PQ;
    for (int64_t n0 = 0; n0 < s.N; n0 += nb) {
      const int64_t cnt = std::min(nb, s.N - n0), cols = cnt * PQ;
      const float* dyp = dy + n0 * s.K * PQ;  // one image: already [K, P*Q]
      if (cnt > 1) {
        launch_1d(gather_dy, s.K * cols, stream, g, dy, int(n0), int(cnt), dyc);
        dyp = dyc;
      }
      // dcol[C*R*S, cols] = W^T * dy: W is stored [K, C*R*S].
      gemm(4, true, false, CRS, cols, s.K, 1.0f, w, CRS, dyp, cols, 0.0f, dcol, cols, stream);
      launch_1d(col2im, cnt * s.C * HW, stream, g, dcol, int(n0), int(cnt), dx);
    }
  } else if (variant == 3) {
    launch(backward_data_implicit, tile_grid(s.C, s.N * HW), dim3(tile::kThreads), 0, stream, g,
           dy, w, dx);
  } else {
    const Gemm m = backward_data_gemm(s);
    with_warp_tile(m.M, [&](auto shape) {
      using S = decltype(shape);
      launch_split<S>(backward_data_warp_tiled<S>, m, split<S>(variant, m), ws, dx, stream, g, dy,
                      w);
    });
  }
}

void conv2d_backward_weight(int variant, const Conv2dShape& s, const float* x, const float* dy,
                            float* dw, float* dbias, float* workspace, cudaStream_t stream) {
  using namespace conv_kernels;
  const Geo g = checked("conv2d_backward_weight", variant, s);
  float* ws = checked_workspace("conv2d_backward_weight", variant, s, workspace);
  const int64_t PQ = s.P * s.Q, CRS = s.C * s.R * s.S;
  if (dbias) {
    if (channel_sum_workspace_floats(kBestChannelSum, s.N, s.K, PQ) > 0 && workspace == nullptr)
      bad_shape("conv2d_backward_weight", "dbias needs a workspace (null given)");
    channel_sum(kBestChannelSum, s.N, s.K, PQ, dy, dbias, workspace, stream);
  }
  if (s.K * CRS == 0) return;  // dw is empty
  if (s.N * PQ == 0) {         // an empty sum
    launch_1d(fill_zero, s.K * CRS, stream, s.K * CRS, dw);
    return;
  }
  if (variant == 1) {
    launch_1d(backward_weight_naive, s.K * CRS, stream, g, x, dy, dw);
  } else if (variant == 2) {
    const int64_t nb = images_per_chunk(s);
    float* col = ws;
    float* dyc = ws + CRS * nb * PQ;
    float* partials = weight_gemm_workspace(s, nb) > 0 ? dyc + s.K * nb * PQ : nullptr;
    for (int64_t n0 = 0; n0 < s.N; n0 += nb) {
      const int64_t cnt = std::min(nb, s.N - n0), cols = cnt * PQ;
      launch_1d(im2col, CRS * cols, stream, g, x, int(n0), int(cnt), col);
      const float* dyp = dy + n0 * s.K * PQ;
      if (cnt > 1) {
        launch_1d(gather_dy, s.K * cols, stream, g, dy, int(n0), int(cnt), dyc);
        dyp = dyc;
      }
      // dw[K, C*R*S] (+)= dy[K, cols] * col^T; col is stored [C*R*S, cols].
      gemm(kWeightGemm, false, true, s.K, CRS, cols, 1.0f, dyp, cols, col, cols,
           n0 == 0 ? 0.0f : 1.0f, dw, CRS, partials, stream);
    }
  } else if (variant == 3) {
    launch(backward_weight_implicit, tile_grid(s.K, CRS), dim3(tile::kThreads), 0, stream, g, x,
           dy, dw);
  } else {
    const Gemm m = backward_weight_gemm(s);
    with_warp_tile(m.M, [&](auto shape) {
      using S = decltype(shape);
      launch_split<S>(backward_weight_warp_tiled<S>, m, split<S>(variant, m), ws, dw, stream, g, x,
                      dy);
    });
  }
}

}  // namespace anvil::cuda
