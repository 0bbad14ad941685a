// 2-D convolution (cross-correlation) via im2col + one large GEMM per chunk.
// The batch is processed in chunks of whole images sized so the column
// buffer stays around a few MB (L2/L3 friendly) while the GEMM's N dimension
// (images * P * Q) stays large: per-image GEMMs with N = P*Q (81 for LeNet's
// conv2) leave OpenBLAS starved. Columns are laid out [C*R*S, images*P*Q];
// the GEMM result [K, images*P*Q] is scattered back to NCHW (with the bias
// folded into that copy). im2col (split over column rows), col2im (split
// over input channels), gather and scatter run under OpenMP on disjoint
// outputs, so no atomics; the GEMMs run outside any parallel region
// (OpenBLAS threads them itself).
// Layers with a tiny reduction (C*R*S <= 32, stride_w 1, e.g. LeNet's
// conv1) take the direct kernels in conv_direct.cpp for forward and
// backward-weight instead, where im2col + GEMM would be memory bound.
// Scratch slots used: 0 (columns), 1 (GEMM output / gathered dy) and, in
// the direct kernels, 2 (padded image, per thread).
#include <algorithm>
#include <cstring>
#include <vector>
#ifdef __AVX2__
#include <immintrin.h>
#endif

#include "kernels/cpu/conv_direct.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/parallel_util.h"

namespace anvil::cpu {

namespace {

using detail::ceil_div;
using detail::floor_div;

// Target size of the column buffer for one chunk, in floats (4 MB).
#ifndef ANVIL_CONV_CHUNK_FLOATS
#define ANVIL_CONV_CHUNK_FLOATS (1 << 20)
#endif
constexpr int64_t kChunkFloats = ANVIL_CONV_CHUNK_FLOATS;

// Short-row copy / accumulate (rows of Q floats, 9 for LeNet's conv2):
// inline code instead of memcpy, whose call overhead dominates such rows.
// GCC's loop distribution turns any copy loop (even of intrinsics) back into
// a memmove call, so it is switched off where copy_row's loops land. With
// AVX2 the tail is one overlapping 8- (or 4-) wide copy of the row's last
// elements (the same values, so rewriting a few is harmless).
#define ANVIL_NO_MEMCPY_IDIOM __attribute__((optimize("no-tree-loop-distribute-patterns")))

ANVIL_NO_MEMCPY_IDIOM inline void copy_row(float* __restrict d, const float* __restrict s,
                                           int64_t n) {
#ifdef __AVX2__
  if (n >= 8) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(d + i, _mm256_loadu_ps(s + i));
    if (i < n) _mm256_storeu_ps(d + n - 8, _mm256_loadu_ps(s + n - 8));
    return;
  }
  if (n >= 4) {
    _mm_storeu_ps(d, _mm_loadu_ps(s));
    _mm_storeu_ps(d + n - 4, _mm_loadu_ps(s + n - 4));
    return;
  }
#endif
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) d[i] = s[i];
}

inline void add_row(float* __restrict d, const float* __restrict s, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) d[i] += s[i];
}

struct Range {
  int64_t lo, hi;
};

// Output positions o in [0, out) whose tap k lands inside the input:
// 0 <= o*stride - pad + k < in.
Range valid_range(int64_t out, int64_t in, int64_t stride, int64_t pad, int64_t k) {
  int64_t lo = std::max<int64_t>(0, ceil_div(pad - k, stride));
  int64_t hi = std::min<int64_t>(out, floor_div(in - 1 + pad - k, stride) + 1);
  return {lo, std::max(lo, hi)};
}

int64_t images_per_chunk(const Conv2dShape& s) {
  const int64_t per_image = std::max<int64_t>(1, s.C * s.R * s.S * s.P * s.Q);
  return std::clamp<int64_t>(kChunkFloats / per_image, 1, std::max<int64_t>(1, s.N));
}

// Valid output ranges of every kernel tap, computed once per call (they
// depend only on the geometry, and the divisions are not free). Storage is
// a grow-only per-thread vector, so steady state does not allocate.
struct TapRanges {
  const Range* rows;  // rows[r]: valid p for kernel row r
  const Range* cols;  // cols[t]: valid q for kernel column t
  explicit TapRanges(const Conv2dShape& s) {
    thread_local std::vector<Range> store;
    if (store.size() < static_cast<size_t>(s.R + s.S)) store.resize(s.R + s.S);
    for (int64_t r = 0; r < s.R; ++r) store[r] = valid_range(s.P, s.H, s.stride_h, s.pad_h, r);
    for (int64_t t = 0; t < s.S; ++t)
      store[s.R + t] = valid_range(s.Q, s.W, s.stride_w, s.pad_w, t);
    rows = store.data();
    cols = store.data() + s.R;
  }
};

// One column-matrix row (c, r, t) for images [n0, n0+cnt): dst[cnt*P*Q] is
// written sequentially (friendly to the store path and prefetchers).
ANVIL_NO_MEMCPY_IDIOM void im2col_row(const Conv2dShape& s, const Range& pr, const Range& qr, const float* x,
                int64_t n0, int64_t cnt, int64_t c, int64_t r, int64_t t, float* dst) {
  const int64_t P = s.P, Q = s.Q, W = s.W, HW = s.H * W, CHW = s.C * HW;
  const int64_t off = t - s.pad_w;
  const int64_t nq = qr.hi - qr.lo, step = s.stride_h * W;
  const bool full_q = qr.lo == 0 && qr.hi == Q;  // then off >= 0
  for (int64_t n = 0; n < cnt; ++n, dst += P * Q) {
    if (pr.lo > 0) std::fill(dst, dst + pr.lo * Q, 0.0f);
    if (pr.hi < P) std::fill(dst + pr.hi * Q, dst + P * Q, 0.0f);
    if (pr.lo >= pr.hi) continue;
    // First input row used; column q reads xp[q * stride_w + off].
    const float* xp = x + (n0 + n) * CHW + c * HW + (pr.lo * s.stride_h - s.pad_h + r) * W;
    float* d = dst + pr.lo * Q;
    if (s.stride_w == 1 && full_q) {  // the common case: plain row copies
      for (int64_t p = pr.lo; p < pr.hi; ++p, d += Q, xp += step) copy_row(d, xp + off, Q);
      continue;
    }
    for (int64_t p = pr.lo; p < pr.hi; ++p, d += Q, xp += step) {
      std::fill(d, d + qr.lo, 0.0f);
      if (s.stride_w == 1) {
        copy_row(d + qr.lo, xp + qr.lo + off, nq);
      } else {
        for (int64_t q = qr.lo; q < qr.hi; ++q) d[q] = xp[q * s.stride_w + off];
      }
      std::fill(d + qr.hi, d + Q, 0.0f);
    }
  }
}

// im2col for images [n0, n0+cnt): col is [C*R*S, cnt*P*Q]. Threads split
// the C*R*S rows, each written front to back.
void im2col_chunk(const Conv2dShape& s, const TapRanges& tr, const float* x, int64_t n0,
                  int64_t cnt, float* col) {
  const int64_t RS = s.R * s.S, rows = s.C * RS, cols = cnt * s.P * s.Q;
#pragma omp parallel for schedule(static) if (rows * cols >= detail::kMinParallel)
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t c = i / RS, r = (i % RS) / s.S, t = i % s.S;
    im2col_row(s, tr.rows[r], tr.cols[t], x, n0, cnt, c, r, t, col + i * cols);
  }
}

// Inverse of im2col_chunk: overwrites dx for images [n0, n0+cnt) with the
// sum of every column entry that maps onto each pixel. Threads split the
// channels (disjoint dx planes, no atomics); within a channel each column
// row is read front to back while the cnt small dx planes stay in cache.
void col2im_chunk(const Conv2dShape& s, const TapRanges& tr, const float* col, int64_t n0,
                  int64_t cnt, float* dx) {
  const int64_t P = s.P, Q = s.Q, W = s.W, HW = s.H * W, CHW = s.C * HW, PQ = P * Q;
  const int64_t RS = s.R * s.S, cols = cnt * PQ;
#pragma omp parallel for schedule(static) if (s.C * RS * cols >= detail::kMinParallel)
  for (int64_t c = 0; c < s.C; ++c) {
    for (int64_t n = 0; n < cnt; ++n) {
      float* dxp = dx + (n0 + n) * CHW + c * HW;
      std::fill(dxp, dxp + HW, 0.0f);
    }
    for (int64_t r = 0; r < s.R; ++r) {
      const Range pr = tr.rows[r];
      for (int64_t t = 0; t < s.S; ++t) {
        const Range qr = tr.cols[t];
        const int64_t off = t - s.pad_w, nq = qr.hi - qr.lo, step = s.stride_h * W;
        if (pr.lo >= pr.hi || nq <= 0) continue;
        const float* src = col + ((c * s.R + r) * s.S + t) * cols + pr.lo * Q;
        for (int64_t n = 0; n < cnt; ++n, src += PQ) {
          // First dx row touched; column q lands on row[q * stride_w + off].
          float* row = dx + (n0 + n) * CHW + c * HW + (pr.lo * s.stride_h - s.pad_h + r) * W;
          const float* sp = src;
          for (int64_t p = pr.lo; p < pr.hi; ++p, row += step, sp += Q) {
            if (s.stride_w == 1) {
              add_row(row + qr.lo + off, sp + qr.lo, nq);
            } else {
              for (int64_t q = qr.lo; q < qr.hi; ++q) row[q * s.stride_w + off] += sp[q];
            }
          }
        }
      }
    }
  }
}

// Copies dy for images [n0, n0+cnt) from NCHW into [K, cnt*P*Q].
void gather_dy(const Conv2dShape& s, const float* dy, int64_t n0, int64_t cnt, float* out) {
  const int64_t PQ = s.P * s.Q, cols = cnt * PQ, rows = cnt * s.K;
#pragma omp parallel for schedule(static) if (rows * PQ >= detail::kMinParallel)
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t n = i / s.K, k = i % s.K;
    std::memcpy(out + k * cols + n * PQ, dy + ((n0 + n) * s.K + k) * PQ, PQ * sizeof(float));
  }
}

}  // namespace

void conv2d_forward(const Conv2dShape& s, const float* x, const float* w, const float* bias,
                    float* y) {
  const int64_t PQ = s.P * s.Q, CRS = s.C * s.R * s.S, KPQ = s.K * PQ;
  if (s.N <= 0 || KPQ <= 0) return;
  if (detail::conv_direct_suits(s)) return detail::conv2d_forward_direct(s, x, w, bias, y);
  const int64_t nb = images_per_chunk(s);
  const TapRanges taps(s);
  float* col = scratch(static_cast<size_t>(CRS * nb * PQ), 0);
  float* staged = nb > 1 ? scratch(static_cast<size_t>(KPQ * nb), 1) : nullptr;
  for (int64_t n0 = 0; n0 < s.N; n0 += nb) {
    const int64_t cnt = std::min(nb, s.N - n0), cols = cnt * PQ;
    im2col_chunk(s, taps, x, n0, cnt, col);
    // A single image's GEMM result is already in NCHW order: write it in place.
    float* out = cnt == 1 ? y + n0 * KPQ : staged;
    gemm(false, false, s.K, cols, CRS, 1.0f, w, CRS, col, cols, 0.0f, out, cols);
    const int64_t rows = cnt * s.K;
#pragma omp parallel for schedule(static) if (rows * PQ >= detail::kMinParallel)
    for (int64_t i = 0; i < rows; ++i) {
      const int64_t n = i / s.K, k = i % s.K;
      const float b = bias ? bias[k] : 0.0f;
      const float* src = out + k * cols + n * PQ;
      float* dst = y + ((n0 + n) * s.K + k) * PQ;
      if (src == dst) {
        if (bias)
#pragma omp simd
          for (int64_t j = 0; j < PQ; ++j) dst[j] += b;
      } else {
#pragma omp simd
        for (int64_t j = 0; j < PQ; ++j) dst[j] = src[j] + b;
      }
    }
  }
}

void conv2d_backward_data(const Conv2dShape& s, const float* dy, const float* w, float* dx) {
  const int64_t PQ = s.P * s.Q, RS = s.R * s.S, CRS = s.C * RS, HW = s.H * s.W;
  if (s.N <= 0 || s.C * HW <= 0) return;
  if (PQ <= 0 || s.K <= 0) {
    std::fill(dx, dx + s.N * s.C * HW, 0.0f);
    return;
  }
  const int64_t nb = images_per_chunk(s);
  const TapRanges taps(s);
  float* dcol = scratch(static_cast<size_t>(CRS * nb * PQ), 0);
  float* dyc = nb > 1 ? scratch(static_cast<size_t>(s.K * PQ * nb), 1) : nullptr;
  for (int64_t n0 = 0; n0 < s.N; n0 += nb) {
    const int64_t cnt = std::min(nb, s.N - n0), cols = cnt * PQ;
    const float* g = dy + n0 * s.K * PQ;
    if (cnt > 1) {
      gather_dy(s, dy, n0, cnt, dyc);
      g = dyc;
    }
    gemm(true, false, CRS, cols, s.K, 1.0f, w, CRS, g, cols, 0.0f, dcol, cols);
    col2im_chunk(s, taps, dcol, n0, cnt, dx);
  }
}

void conv2d_backward_weight(const Conv2dShape& s, const float* x, const float* dy, float* dw,
                            float* dbias) {
  const int64_t PQ = s.P * s.Q, CRS = s.C * s.R * s.S;
  if (s.N <= 0 || PQ <= 0) {
    std::fill(dw, dw + s.K * CRS, 0.0f);
    if (dbias) std::fill(dbias, dbias + s.K, 0.0f);
    return;
  }
  if (detail::conv_direct_suits(s)) {
    detail::conv2d_backward_weight_direct(s, x, dy, dw);
    if (dbias) channel_sum(s.N, s.K, PQ, dy, dbias);
    return;
  }
  const int64_t nb = images_per_chunk(s);
  const TapRanges taps(s);
  float* col = scratch(static_cast<size_t>(CRS * nb * PQ), 0);
  float* dyc = nb > 1 ? scratch(static_cast<size_t>(s.K * PQ * nb), 1) : nullptr;
  for (int64_t n0 = 0; n0 < s.N; n0 += nb) {
    const int64_t cnt = std::min(nb, s.N - n0), cols = cnt * PQ;
    im2col_chunk(s, taps, x, n0, cnt, col);
    const float* g = dy + n0 * s.K * PQ;
    if (cnt > 1) {
      gather_dy(s, dy, n0, cnt, dyc);
      g = dyc;
    }
    gemm(false, true, s.K, CRS, cols, 1.0f, g, cols, col, cols, n0 == 0 ? 0.0f : 1.0f, dw, CRS);
  }
  if (dbias) channel_sum(s.N, s.K, PQ, dy, dbias);
}

}  // namespace anvil::cpu
