// 2-D convolution (cross-correlation) via im2col + GEMM over chunks of whole
// images. Columns are laid out [C*R*S, images*P*Q], so one GEMM covers a
// chunk and its N dimension (images * P * Q) stays large even for small
// planes (16 for ResNet's last stage, 81 for LeNet's conv2); the GEMM result
// [K, images*P*Q] is scattered back to NCHW (with the bias folded into that
// copy).
//
// How the work is split (split_batch): with several threads and at least as
// many chunks as threads, one OpenMP region per call hands whole chunks to
// the threads (dynamic schedule), and each thread does im2col, a
// single-threaded GEMM (OpenBLAS runs on one thread inside a parallel
// region) and the scatter / col2im for its images in its own scratch space.
// A call then has one synchronisation point instead of three per chunk (the
// threaded im2col, the threaded GEMM, the threaded scatter), which matters
// because on a busy machine each barrier can wait out a whole scheduler time
// slice of a descheduled thread; the dynamic schedule lets a thread that
// runs take the chunks of one that does not. With fewer images than threads
// (one large image, say) the chunks run one after another instead, each
// step threaded on its own, as before.
// Backward-weight sums over images: chunks are dealt round-robin to a fixed
// number of groups (2 per thread), each group accumulates its own partial
// dw with beta = 1, and the partials are added in group order, so the result
// is the same on every run with the same thread count.
//
// Layers with a tiny reduction (C*R*S <= 32, stride_w 1, e.g. LeNet's
// conv1) take the direct kernels in conv_direct.cpp for forward and
// backward-weight instead, where im2col + GEMM would be memory bound.
// 3x3 stride-1 layers with 16+ channels each way (ResNet's) take the
// Winograd kernels in conv_winograd.cpp in all three directions: 4x fewer
// multiplications. ConvAlgo::kExact (the highest-precision setting,
// core/precision.h) turns that off for a call; ANVIL_CPU_CONV=im2col in the
// environment for the whole process (read once). ConvAlgo::kBf16 (operands
// holding bfloat16 values: BF16 autocast and its emulation) takes im2col
// with gemm_bf16, on the CPU's BF16 dot-product instructions where present;
// on bfloat16 tensors (autocast's) the same code runs on bfloat16 elements:
// the columns and the gathered dy are bfloat16, packed for the GEMM as they
// are, and a bfloat16 y or dx is the FP32 result rounded once as it is
// stored.
// Scratch slots used: 0 (columns), 1 (GEMM output / gathered dy), 2 (in the
// direct kernels, padded image, per thread; a bfloat16 dx's FP32 sums) and 3
// (backward-weight's partial sums, on the calling thread).
#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>
#include <omp.h>
#ifdef __AVX2__
#include <immintrin.h>
#endif

#include <cstdlib>

#include "core/ops_util.h"
#include "kernels/cpu/conv_direct.h"
#include "kernels/cpu/conv_winograd.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/parallel_util.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/element.h"
#include "core/precision.h"

namespace anvil::cpu {

namespace {

using detail::ceil_div;
using detail::floor_div;

// Target size of the column buffer for one chunk, in floats (4 MB).
#ifndef ANVIL_CONV_CHUNK_FLOATS
#define ANVIL_CONV_CHUNK_FLOATS (1 << 20)
#endif
constexpr int64_t kChunkFloats = ANVIL_CONV_CHUNK_FLOATS;

// Short-row copy / accumulate (rows of Q elements, 9 for LeNet's conv2):
// inline code instead of memcpy, whose call overhead dominates such rows.
// GCC's loop distribution turns any copy loop (even of intrinsics) back into
// a memmove call, so it is switched off where copy_row's loops land. With
// AVX2 the row is copied 32 (16, 8) bytes at a time and the tail is one
// overlapping copy of the row's last bytes (the same values, so rewriting a
// few is harmless). T: float or bfloat16.
#define ANVIL_NO_MEMCPY_IDIOM __attribute__((optimize("no-tree-loop-distribute-patterns")))

template <class T>
ANVIL_NO_MEMCPY_IDIOM inline void copy_row(T* __restrict d, const T* __restrict s, int64_t n) {
#ifdef __AVX2__
  const int64_t bytes = n * int64_t{sizeof(T)};
  char* dc = reinterpret_cast<char*>(d);
  const char* sc = reinterpret_cast<const char*>(s);
  if (bytes >= 32) {
    int64_t i = 0;
    for (; i + 32 <= bytes; i += 32)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dc + i),
                          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(sc + i)));
    if (i < bytes)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dc + bytes - 32),
                          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(sc + bytes - 32)));
    return;
  }
  if (bytes >= 16) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dc),
                     _mm_loadu_si128(reinterpret_cast<const __m128i*>(sc)));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dc + bytes - 16),
                     _mm_loadu_si128(reinterpret_cast<const __m128i*>(sc + bytes - 16)));
    return;
  }
  if (bytes >= 8) {
    _mm_storel_epi64(reinterpret_cast<__m128i*>(dc),
                     _mm_loadl_epi64(reinterpret_cast<const __m128i*>(sc)));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(dc + bytes - 8),
                     _mm_loadl_epi64(reinterpret_cast<const __m128i*>(sc + bytes - 8)));
    return;
  }
#endif
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) d[i] = s[i];
}

// Scratch slot `slot` as n elements of T.
template <class T>
T* scratch_of(int64_t n, int slot) {
  return reinterpret_cast<T*>(scratch(static_cast<size_t>((n * int64_t{sizeof(T)} + 3) / 4), slot));
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
template <class T>
ANVIL_NO_MEMCPY_IDIOM void im2col_row(const Conv2dShape& s, const Range& pr, const Range& qr,
                                      const T* x, int64_t n0, int64_t cnt, int64_t c, int64_t r,
                                      int64_t t, T* dst) {
  const int64_t P = s.P, Q = s.Q, W = s.W, HW = s.H * W, CHW = s.C * HW;
  const int64_t off = t - s.pad_w;
  const int64_t nq = qr.hi - qr.lo, step = s.stride_h * W;
  const bool full_q = qr.lo == 0 && qr.hi == Q;  // then off >= 0
  for (int64_t n = 0; n < cnt; ++n, dst += P * Q) {
    if (pr.lo > 0) std::fill(dst, dst + pr.lo * Q, T{});
    if (pr.hi < P) std::fill(dst + pr.hi * Q, dst + P * Q, T{});
    if (pr.lo >= pr.hi) continue;
    // First input row used; column q reads xp[q * stride_w + off].
    const T* xp = x + (n0 + n) * CHW + c * HW + (pr.lo * s.stride_h - s.pad_h + r) * W;
    T* d = dst + pr.lo * Q;
    if (s.stride_w == 1 && full_q) {  // the common case: plain row copies
      for (int64_t p = pr.lo; p < pr.hi; ++p, d += Q, xp += step) copy_row(d, xp + off, Q);
      continue;
    }
    for (int64_t p = pr.lo; p < pr.hi; ++p, d += Q, xp += step) {
      std::fill(d, d + qr.lo, T{});
      if (s.stride_w == 1) {
        copy_row(d + qr.lo, xp + qr.lo + off, nq);
      } else {
        for (int64_t q = qr.lo; q < qr.hi; ++q) d[q] = xp[q * s.stride_w + off];
      }
      std::fill(d + qr.hi, d + Q, T{});
    }
  }
}

// im2col for images [n0, n0+cnt): col is [C*R*S, cnt*P*Q]. When `threaded`,
// threads split the C*R*S rows, each written front to back.
template <class T>
void im2col_chunk(const Conv2dShape& s, const TapRanges& tr, const T* x, int64_t n0, int64_t cnt,
                  T* col, bool threaded) {
  const int64_t RS = s.R * s.S, rows = s.C * RS, cols = cnt * s.P * s.Q;
#pragma omp parallel for schedule(static) if (threaded && rows * cols >= detail::kMinParallel)
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t c = i / RS, r = (i % RS) / s.S, t = i % s.S;
    im2col_row(s, tr.rows[r], tr.cols[t], x, n0, cnt, c, r, t, col + i * cols);
  }
}

// Inverse of im2col_chunk: overwrites the cnt images at dx (the chunk's
// first) with the sum of every column entry that maps onto each pixel. When
// `threaded`, threads split the channels (disjoint dx planes, no atomics);
// within a channel each column row is read front to back while the cnt
// small dx planes stay in cache.
void col2im_chunk(const Conv2dShape& s, const TapRanges& tr, const float* col, int64_t cnt,
                  float* dx, bool threaded) {
  const int64_t P = s.P, Q = s.Q, W = s.W, HW = s.H * W, CHW = s.C * HW, PQ = P * Q;
  const int64_t RS = s.R * s.S, cols = cnt * PQ;
#pragma omp parallel for schedule(static) if (threaded && s.C * RS * cols >= detail::kMinParallel)
  for (int64_t c = 0; c < s.C; ++c) {
    for (int64_t n = 0; n < cnt; ++n) {
      float* dxp = dx + n * CHW + c * HW;
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
          float* row = dx + n * CHW + c * HW + (pr.lo * s.stride_h - s.pad_h + r) * W;
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
template <class T>
void gather_dy(const Conv2dShape& s, const T* dy, int64_t n0, int64_t cnt, T* out, bool threaded) {
  const int64_t PQ = s.P * s.Q, cols = cnt * PQ, rows = cnt * s.K;
#pragma omp parallel for schedule(static) if (threaded && rows * PQ >= detail::kMinParallel)
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t n = i / s.K, k = i % s.K;
    std::memcpy(out + k * cols + n * PQ, dy + ((n0 + n) * s.K + k) * PQ, PQ * sizeof(T));
  }
}

bool use_winograd(const Conv2dShape& s) {
  static const bool allowed = [] {
    const char* v = std::getenv("ANVIL_CPU_CONV");
    return v == nullptr || std::strcmp(v, "im2col") != 0;
  }();
  return allowed && detail::conv_winograd_suits(s);
}

// How a call divides the batch: chunks of nb images (the last may be short).
// by_image: the chunks are shared out to the threads of one parallel region
// (each chunk's work single-threaded); otherwise they run in turn, each step
// threaded inside.
struct Split {
  int64_t nb, chunks;
  bool by_image;
  int threads;
};

Split split_batch(const Conv2dShape& s) {
  const int threads = omp_in_parallel() ? 1 : omp_get_max_threads();
  int64_t nb = images_per_chunk(s);
  if (threads > 1 && s.N >= threads) {
    // At least two chunks per thread (when there are images for them), so
    // the dynamic schedule can even out threads that run at different speeds.
    nb = std::min(nb, std::max<int64_t>(1, ceil_div(s.N, 2 * int64_t{threads})));
  }
  const int64_t chunks = ceil_div(s.N, nb);
  return {nb, chunks, threads > 1 && chunks >= threads, threads};
}

// A chunk's GEMM: on the BF16 dot-product instructions for kBf16's operands
// (bfloat16 elements are kBf16's by definition).
void product(ConvAlgo algo, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
             const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
             int64_t ldc) {
  if (algo == ConvAlgo::kBf16) gemm_bf16(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  else gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}
void product(ConvAlgo, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
             const bfloat16* A, int64_t lda, const bfloat16* B, int64_t ldb, float beta, float* C,
             int64_t ldc) {
  gemm_bf16(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

// y for images [n0, n0+cnt): im2col, one GEMM into a staging buffer, then
// the scatter to NCHW with the bias, each output rounded once to Y.
template <class T, class Y>
void forward_chunk(const Conv2dShape& s, const TapRanges& taps, const T* x, const T* w,
                   const float* bias, Y* y, int64_t n0, int64_t cnt, bool threaded,
                   ConvAlgo algo) {
  const int64_t PQ = s.P * s.Q, CRS = s.C * s.R * s.S, KPQ = s.K * PQ, cols = cnt * PQ;
  T* col = scratch_of<T>(CRS * cols, 0);
  im2col_chunk(s, taps, x, n0, cnt, col, threaded);
  // A single image's float32 GEMM result is already in NCHW order: written in place.
  float* out = nullptr;
  if constexpr (std::is_same_v<Y, float>) out = cnt == 1 ? y + n0 * KPQ : nullptr;
  if (out == nullptr) out = scratch(static_cast<size_t>(s.K * cols), 1);
  product(algo, false, false, s.K, cols, CRS, 1.0f, w, CRS, col, cols, 0.0f, out, cols);
  const int64_t rows = cnt * s.K;
#pragma omp parallel for schedule(static) if (threaded && rows * PQ >= detail::kMinParallel)
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t n = i / s.K, k = i % s.K;
    const float b = bias ? bias[k] : 0.0f;
    float* src = out + k * cols + n * PQ;
    Y* dst = y + ((n0 + n) * s.K + k) * PQ;
    if (static_cast<void*>(src) == static_cast<void*>(dst)) {
      if (bias)
#pragma omp simd
        for (int64_t j = 0; j < PQ; ++j) src[j] += b;
    } else {
#pragma omp simd
      for (int64_t j = 0; j < PQ; ++j) dst[j] = store<Y>(src[j] + b);
    }
  }
}

// dx for images [n0, n0+cnt): dcol = W^T * dy, then col2im, into dx itself
// (float32) or into FP32 sums rounded once as they are stored (bfloat16).
template <class T, class Y>
void backward_data_chunk(const Conv2dShape& s, const TapRanges& taps, const T* dy, const T* w,
                         Y* dx, int64_t n0, int64_t cnt, bool threaded, ConvAlgo algo) {
  const int64_t PQ = s.P * s.Q, CRS = s.C * s.R * s.S, cols = cnt * PQ;
  const int64_t CHW = s.C * s.H * s.W, n = cnt * CHW;
  float* dcol = scratch(static_cast<size_t>(CRS * cols), 0);
  const T* g = dy + n0 * s.K * PQ;
  if (cnt > 1) {
    T* dyc = scratch_of<T>(s.K * cols, 1);
    gather_dy(s, dy, n0, cnt, dyc, threaded);
    g = dyc;
  }
  product(algo, true, false, CRS, cols, s.K, 1.0f, w, CRS, g, cols, 0.0f, dcol, cols);
  if constexpr (std::is_same_v<Y, float>) {
    col2im_chunk(s, taps, dcol, cnt, dx + n0 * CHW, threaded);
  } else {
    float* sums = scratch(static_cast<size_t>(n), 2);
    col2im_chunk(s, taps, dcol, cnt, sums, threaded);
    Y* d = dx + n0 * CHW;
#pragma omp parallel for simd schedule(static) if (threaded && n >= detail::kMinParallel)
    for (int64_t i = 0; i < n; ++i) d[i] = store<Y>(sums[i]);
  }
}

// acc (+)= dy * col^T for images [n0, n0+cnt); overwrites acc when !accumulate.
template <class T>
void backward_weight_chunk(const Conv2dShape& s, const TapRanges& taps, const T* x, const T* dy,
                           float* acc, int64_t n0, int64_t cnt, bool accumulate, bool threaded,
                           ConvAlgo algo) {
  const int64_t PQ = s.P * s.Q, CRS = s.C * s.R * s.S, cols = cnt * PQ;
  T* col = scratch_of<T>(CRS * cols, 0);
  im2col_chunk(s, taps, x, n0, cnt, col, threaded);
  const T* g = dy + n0 * s.K * PQ;
  if (cnt > 1) {
    T* dyc = scratch_of<T>(s.K * cols, 1);
    gather_dy(s, dy, n0, cnt, dyc, threaded);
    g = dyc;
  }
  product(algo, false, true, s.K, CRS, cols, 1.0f, g, cols, col, cols, accumulate ? 1.0f : 0.0f,
          acc, CRS);
}

// im2col + GEMM over the batch's chunks (split_batch), in each direction.
template <class T, class Y>
void forward_im2col(const Conv2dShape& s, const T* x, const T* w, const float* bias, Y* y,
                    ConvAlgo algo) {
  const Split sp = split_batch(s);
  const TapRanges taps(s);
  if (sp.by_image) {
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t c = 0; c < sp.chunks; ++c)
      forward_chunk(s, taps, x, w, bias, y, c * sp.nb, std::min(sp.nb, s.N - c * sp.nb), false,
                    algo);
    return;
  }
  for (int64_t n0 = 0; n0 < s.N; n0 += sp.nb)
    forward_chunk(s, taps, x, w, bias, y, n0, std::min(sp.nb, s.N - n0), true, algo);
}

template <class T, class Y>
void backward_data_im2col(const Conv2dShape& s, const T* dy, const T* w, Y* dx, ConvAlgo algo) {
  const Split sp = split_batch(s);
  const TapRanges taps(s);
  if (sp.by_image) {
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t c = 0; c < sp.chunks; ++c)
      backward_data_chunk(s, taps, dy, w, dx, c * sp.nb, std::min(sp.nb, s.N - c * sp.nb), false,
                          algo);
    return;
  }
  for (int64_t n0 = 0; n0 < s.N; n0 += sp.nb)
    backward_data_chunk(s, taps, dy, w, dx, n0, std::min(sp.nb, s.N - n0), true, algo);
}

template <class T>
void backward_weight_im2col(const Conv2dShape& s, const T* x, const T* dy, float* dw,
                            ConvAlgo algo) {
  const int64_t KCRS = s.K * s.C * s.R * s.S;
  const Split sp = split_batch(s);
  const TapRanges taps(s);
  if (!sp.by_image) {
    for (int64_t n0 = 0; n0 < s.N; n0 += sp.nb)
      backward_weight_chunk(s, taps, x, dy, dw, n0, std::min(sp.nb, s.N - n0), n0 > 0, true,
                            algo);
    return;
  }
  // Group g owns chunks g, g + groups, ...; group 0 accumulates straight
  // into dw, the others into partials that are then added in group order.
  const int64_t groups = std::min<int64_t>(sp.chunks, 2 * int64_t{sp.threads});
  float* partial = scratch(static_cast<size_t>((groups - 1) * KCRS), 3);
#pragma omp parallel
  {
#pragma omp for schedule(dynamic, 1)
    for (int64_t g = 0; g < groups; ++g) {
      float* acc = g == 0 ? dw : partial + (g - 1) * KCRS;
      for (int64_t c = g; c < sp.chunks; c += groups)
        backward_weight_chunk(s, taps, x, dy, acc, c * sp.nb, std::min(sp.nb, s.N - c * sp.nb),
                              c != g, false, algo);
    }
    // Row blocks of dw, each summed over the partials in group order.
    constexpr int64_t kBlock = 4096;
#pragma omp for schedule(static)
    for (int64_t b = 0; b < ceil_div(KCRS, kBlock); ++b) {
      const int64_t lo = b * kBlock, hi = std::min(KCRS, lo + kBlock);
      for (int64_t g = 1; g < groups; ++g) {
        const float* src = partial + (g - 1) * KCRS;
#pragma omp simd
        for (int64_t i = lo; i < hi; ++i) dw[i] += src[i];
      }
    }
  }
}

// The shapes without products, for either element type: true when dx (or
// dw and dbias) has been written.
template <class Y>
bool backward_data_trivial(const Conv2dShape& s, Y* dx) {
  const int64_t HW = s.H * s.W;
  if (s.N <= 0 || s.C * HW <= 0) return true;
  if (s.P * s.Q > 0 && s.K > 0) return false;
  std::fill(dx, dx + s.N * s.C * HW, Y{});
  return true;
}
bool backward_weight_trivial(const Conv2dShape& s, float* dw, float* dbias) {
  if (s.N > 0 && s.P * s.Q > 0) return false;
  std::fill(dw, dw + s.K * s.C * s.R * s.S, 0.0f);
  if (dbias) std::fill(dbias, dbias + s.K, 0.0f);
  return true;
}

}  // namespace

void conv2d_forward(const Conv2dShape& s, const float* x, const float* w, const float* bias,
                    float* y, ConvAlgo algo) {
  if (s.N <= 0 || s.K * s.P * s.Q <= 0) return;
  if (detail::conv_direct_suits(s)) return detail::conv2d_forward_direct(s, x, w, bias, y);
  if (algo == ConvAlgo::kFastest && use_winograd(s))
    return detail::conv2d_forward_winograd(s, x, w, bias, y);
  forward_im2col(s, x, w, bias, y, algo);
}

template <class Y>
void conv2d_forward_bf16(const Conv2dShape& s, const bfloat16* x, const bfloat16* w,
                         const float* bias, Y* y) {
  if (s.N <= 0 || s.K * s.P * s.Q <= 0) return;
  forward_im2col(s, x, w, bias, y, ConvAlgo::kBf16);
}

void conv2d_backward_data(const Conv2dShape& s, const float* dy, const float* w, float* dx,
                          ConvAlgo algo) {
  if (backward_data_trivial(s, dx)) return;
  if (algo == ConvAlgo::kFastest && use_winograd(s))
    return detail::conv2d_backward_data_winograd(s, dy, w, dx);
  backward_data_im2col(s, dy, w, dx, algo);
}

template <class Y>
void conv2d_backward_data_bf16(const Conv2dShape& s, const bfloat16* dy, const bfloat16* w,
                               Y* dx) {
  if (!backward_data_trivial(s, dx)) backward_data_im2col(s, dy, w, dx, ConvAlgo::kBf16);
}

template void conv2d_forward_bf16<float>(const Conv2dShape&, const bfloat16*, const bfloat16*,
                                         const float*, float*);
template void conv2d_forward_bf16<bfloat16>(const Conv2dShape&, const bfloat16*, const bfloat16*,
                                            const float*, bfloat16*);
template void conv2d_backward_data_bf16<float>(const Conv2dShape&, const bfloat16*,
                                               const bfloat16*, float*);
template void conv2d_backward_data_bf16<bfloat16>(const Conv2dShape&, const bfloat16*,
                                                  const bfloat16*, bfloat16*);

void conv2d_backward_weight(const Conv2dShape& s, const float* x, const float* dy, float* dw,
                            float* dbias, ConvAlgo algo) {
  if (backward_weight_trivial(s, dw, dbias)) return;
  if (detail::conv_direct_suits(s)) detail::conv2d_backward_weight_direct(s, x, dy, dw);
  else if (algo == ConvAlgo::kFastest && use_winograd(s))
    detail::conv2d_backward_weight_winograd(s, x, dy, dw);
  else backward_weight_im2col(s, x, dy, dw, algo);
  if (dbias) channel_sum(s.N, s.K, s.P * s.Q, dy, dbias);
}

void conv2d_backward_weight_bf16(const Conv2dShape& s, const bfloat16* x, const bfloat16* dy,
                                 float* dw, float* dbias) {
  if (backward_weight_trivial(s, dw, dbias)) return;
  backward_weight_im2col(s, x, dy, dw, ConvAlgo::kBf16);
  if (dbias) channel_sum(s.N, s.K, s.P * s.Q, dy, dbias);
}

// ---- CpuBackend (cpu_backend.h): the algorithm by core/precision.h ----

namespace {
Fp32Math conv_math() { return fp32_math(OpFamily::kConv, DeviceType::CPU); }
ConvAlgo conv_algo(Fp32Math m) {
  if (m == Fp32Math::kBf16) return ConvAlgo::kBf16;
  return m == Fp32Math::kFp32Fast ? ConvAlgo::kFastest : ConvAlgo::kExact;
}
}  // namespace

// Both operands bfloat16 (autocast's): the bfloat16 kernels read them as
// stored and write a bfloat16 y or dx directly. Otherwise the operands are
// float32 copies (rounded_operand) and a bfloat16 output is staged in
// float32 and rounded once (Float32Io): the same bits. The direct kernels'
// shapes (LeNet's conv1) take the float32 copies too.
namespace {
bool both_bf16(const Tensor& a, const Tensor& b) {
  return a.dtype() == DType::BFloat16 && b.dtype() == DType::BFloat16;
}
}  // namespace

void CpuBackend::conv2d_forward(const Conv2dShape& s, const Tensor& x, const Tensor& w,
                                const Tensor& bias, const Tensor& y_out) {
  if (both_bf16(x, w) && !detail::conv_direct_suits(s)) {
    return visit_float_dtype(y_out.dtype(), "conv2d_forward", [&](auto t) {
      using Y = decltype(t);
      cpu::conv2d_forward_bf16(s, x.data<bfloat16>(), w.data<bfloat16>(), floats(bias),
                               y_out.data<Y>());
    });
  }
  ops_detail::Float32Io io;
  const Tensor y = io.out(y_out);
  const Fp32Math m = operand_math(conv_math(), x, w);
  if (rounds_operands(m))
    cpu::conv2d_forward(s, rounded_operand(x, 0, m), rounded_operand(w, 1, m), floats(bias),
                        floats(y), conv_algo(m));
  else
    cpu::conv2d_forward(s, floats(x), floats(w), floats(bias), floats(y), conv_algo(m));
  io.finish();
}

void CpuBackend::conv2d_backward_data(const Conv2dShape& s, const Tensor& dy, const Tensor& w,
                                      const Tensor& dx_out) {
  if (both_bf16(dy, w)) {
    return visit_float_dtype(dx_out.dtype(), "conv2d_backward_data", [&](auto t) {
      using Y = decltype(t);
      cpu::conv2d_backward_data_bf16(s, dy.data<bfloat16>(), w.data<bfloat16>(),
                                     dx_out.data<Y>());
    });
  }
  ops_detail::Float32Io io;
  const Tensor dx = io.out(dx_out);
  const Fp32Math m = operand_math(conv_math(), dy, w);
  if (rounds_operands(m))
    cpu::conv2d_backward_data(s, rounded_operand(dy, 0, m), rounded_operand(w, 1, m), floats(dx),
                              conv_algo(m));
  else
    cpu::conv2d_backward_data(s, floats(dy), floats(w), floats(dx), conv_algo(m));
  io.finish();
}

// The bias gradient sums dy unrounded (FP32, as on the GPU), a bfloat16 dy
// as stored.
void CpuBackend::conv2d_backward_weight(const Conv2dShape& s, const Tensor& x, const Tensor& dy,
                                        const Tensor& dw, const Tensor& dbias) {
  if (both_bf16(x, dy) && !detail::conv_direct_suits(s))
    return cpu::conv2d_backward_weight_bf16(s, x.data<bfloat16>(), dy.data<bfloat16>(),
                                            floats(dw), floats(dbias));
  const Fp32Math m = operand_math(conv_math(), x, dy);
  if (rounds_operands(m)) {
    cpu::conv2d_backward_weight(s, rounded_operand(x, 0, m), rounded_operand(dy, 1, m),
                                floats(dw), nullptr, conv_algo(m));
    if (dbias.defined()) channel_sum(s.N, s.K, s.P * s.Q, dy, dbias);
    return;
  }
  cpu::conv2d_backward_weight(s, floats(x), floats(dy), floats(dw), floats(dbias), conv_algo(m));
}

}  // namespace anvil::cpu
