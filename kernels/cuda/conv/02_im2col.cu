// Convolution rung 02, explicit im2col + GEMM. The column matrix is
// materialised in the caller's workspace for a chunk of images at a time (as
// many whole images as fit in ANVIL_CUDA_CONV_CHUNK_FLOATS floats of columns;
// the chunk multiplies the GEMM's N dimension, which a GPU needs large), one
// thread per column element, consecutive threads along (n, p, q) so that
// writes are coalesced and reads of x nearly so. The product then runs as GEMM
// rung 4 (register-blocked, gemm/) with the transposes above: forward W * col
// (into y directly for a one-image chunk, else into a staging matrix that a
// copy kernel scatters to NCHW, bias included); backward-data W^T * dy
// (trans_a) into dcol, then col2im as a gather, one thread per dx element
// summing its dcol entries (no atomics, deterministic); backward- weight dy *
// col^T (trans_b), accumulating over chunks with beta = 1, as GEMM rung 08: M x
// N = K x C*R*S is often a handful of tiles while the chunk's K = images*P*Q
// is long, so that GEMM splits its reduction over grid.z when the tiles cannot
// fill the GPU (its partials follow the columns in the workspace). For chunks
// of several images dy is first gathered into [K, images*P*Q]. All the
// arithmetic now runs in the GEMM's shared-memory and register tiles; the
// price is the workspace and one write + one read of the column matrix (R*S
// times the size of x) through global memory.
//   build/sim/bench_cuda_kernels conv 2
#include <algorithm>

#include "kernels/cuda/conv/rung.cuh"
#include "kernels/cuda/gemm/gemm.h"

// Target size of rung 2's column buffer per chunk, in floats. The
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

namespace {

int64_t images_per_chunk(const Conv2dShape& s) {
  const int64_t per_image = std::max<int64_t>(1, s.C * s.R * s.S * s.P * s.Q);
  return std::clamp<int64_t>(ANVIL_CUDA_CONV_CHUNK_FLOATS / per_image, 1,
                             std::max<int64_t>(1, s.N));
}

// backward-weight GEMM, dw[K, C*R*S] (+)= dy * col^T over a chunk
// of nb images, and its workspace (split-K partials).
constexpr int kWeightGemm = 8;
size_t weight_gemm_workspace(const Conv2dShape& s, int64_t nb) {
  return gemm_workspace_floats(kWeightGemm, s.K, s.C * s.R * s.S, nb * s.P * s.Q);
}

// Columns [C*R*S, nb*P*Q] plus a [K, nb*P*Q] matrix (staged output for
// forward, gathered dy for the backward passes), then the weight GEMM's
// split-K partials.
size_t workspace(const Conv2dShape& s) {
  const int64_t nb = images_per_chunk(s);
  return static_cast<size_t>(nb * s.P * s.Q * (s.C * s.R * s.S + s.K)) +
         weight_gemm_workspace(s, nb);
}

void forward(const Conv2dShape& s, const float* x, const float* w, const float* bias, float* y,
             float* ws, cudaStream_t stream) {
  const Geo g = geo(s);
  const int64_t PQ = s.P * s.Q, CRS = s.C * s.R * s.S, KPQ = s.K * PQ;
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
}

void backward_data(const Conv2dShape& s, const float* dy, const float* w, float* dx, float* ws,
                   cudaStream_t stream) {
  const Geo g = geo(s);
  const int64_t PQ = s.P * s.Q, CRS = s.C * s.R * s.S, HW = s.H * s.W;
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
}

void backward_weight(const Conv2dShape& s, const float* x, const float* dy, float* dw, float* ws,
                     cudaStream_t stream) {
  const Geo g = geo(s);
  const int64_t PQ = s.P * s.Q, CRS = s.C * s.R * s.S;
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
}

}  // namespace
}  // namespace conv_kernels

const conv_rungs::Rung conv_rungs::kIm2col = {"im2col", conv_kernels::workspace,
                                              conv_kernels::forward, conv_kernels::backward_data,
                                              conv_kernels::backward_weight};

}  // namespace anvil::cuda
