// Max and average pooling over NCHW planes.
// Each (n, c) plane is independent, so OpenMP splits the work over planes
// (no write conflicts, also in the backward scatter-adds). Per output the
// window is clipped to the real input once, so the inner loops carry no
// padding branches: padding is -inf for max (never chosen) and 0 for avg
// (which still divides by kernel_h*kernel_w, count_include_pad=True).
// The common non-overlapping 2x2/stride-2/no-padding max pool has its own
// branch-light loop since it dominates small CNNs such as LeNet; the same
// geometry has an AVX2 average pool (forward and backward), which writes each
// dx 2x2 block directly instead of zero-fill + scattered adds.
// Max ties: the first maximum in row-major scan order wins; NaN propagates
// (a NaN in the window is selected, as in PyTorch). A window lying entirely
// in padding (only possible when pad >= kernel) yields -inf and argmax -1,
// which the backward skips.
// bfloat16 tensors (autocast's activations) are read as stored: each plane
// is widened into per-thread float32 scratch that stays in cache, the
// float32 code runs on it, and a bfloat16 result plane is rounded once into
// the tensor. So the results are the float32 kernels' on the same values,
// bit for bit, without float32 copies of whole tensors. Global average
// pooling reads a bfloat16 x into a float32 y, and a float32 dy into a
// bfloat16 dx.
#include <algorithm>
#include <vector>
#ifdef __AVX2__
#include <immintrin.h>
#endif
#include <cmath>
#include <limits>
#include <type_traits>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/parallel_util.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/element.h"

namespace anvil::cpu {

namespace {

struct Window {
  int64_t h0, h1, w0, w1;  // clipped to [0,H) x [0,W)
};

inline Window window(const Pool2dShape& s, int64_t p, int64_t q) {
  const int64_t hs = p * s.stride_h - s.pad_h, ws = q * s.stride_w - s.pad_w;
  return {std::max<int64_t>(hs, 0), std::min(hs + s.kernel_h, s.H), std::max<int64_t>(ws, 0),
          std::min(ws + s.kernel_w, s.W)};
}

// Max of one clipped window: first maximum in scan order, first NaN wins.
inline void max_in_window(const float* xp, int64_t W, const Window& wd, float& best, int64_t& arg) {
  best = -std::numeric_limits<float>::infinity();
  arg = -1;
  if (wd.h0 >= wd.h1 || wd.w0 >= wd.w1) return;
  arg = wd.h0 * W + wd.w0;
  best = xp[arg];
  if (std::isnan(best)) return;
  for (int64_t h = wd.h0; h < wd.h1; ++h) {
    for (int64_t w = wd.w0; w < wd.w1; ++w) {
      const float v = xp[h * W + w];
      if (v > best) {
        best = v;
        arg = h * W + w;
      } else if (std::isnan(v)) {
        best = v;
        arg = h * W + w;
        return;
      }
    }
  }
}

bool parallel_worth(const Pool2dShape& s) {
  return s.N * s.C * std::max(s.H * s.W, s.P * s.Q) >= detail::kMinParallel;
}

// Branch-free so GCC vectorises it (stride-2 loads, selects); the window
// offsets 0, 1, W, W+1 are tried in scan order, replacing the running best
// on a strictly larger value or on the first NaN.
void max_pool_2x2_plane(const Pool2dShape& s, const float* xp, float* yp, int64_t* ap) {
  const int64_t W = s.W, Q = s.Q;
  for (int64_t p = 0; p < s.P; ++p) {
    const float* r0 = xp + 2 * p * W;
    const float* r1 = r0 + W;
    float* yr = yp + p * Q;
    int64_t* ar = ap + p * Q;
    const int64_t base = 2 * p * W;
#pragma omp simd
    for (int64_t q = 0; q < Q; ++q) {
      const float a = r0[2 * q], b = r0[2 * q + 1], c = r1[2 * q], d = r1[2 * q + 1];
      float best = a;
      int64_t off = 0;
      bool take = b > best || (b != b && best == best);
      best = take ? b : best;
      off = take ? 1 : off;
      take = c > best || (c != c && best == best);
      best = take ? c : best;
      off = take ? W : off;
      take = d > best || (d != d && best == best);
      best = take ? d : best;
      off = take ? W + 1 : off;
      yr[q] = best;
      ar[q] = base + 2 * q + off;
    }
  }
}

bool is_2x2_s2(const Pool2dShape& s) {
  return s.kernel_h == 2 && s.kernel_w == 2 && s.stride_h == 2 && s.stride_w == 2 &&
         s.pad_h == 0 && s.pad_w == 0 && 2 * s.P <= s.H && 2 * s.Q <= s.W;
}

// y = ((a + b) + c) + d) / 4 per 2x2 window: the generic loop's scan-order
// sum, so both paths round identically.
void avg_pool_2x2_plane(const Pool2dShape& s, const float* xp, float* yp) {
  const int64_t W = s.W, Q = s.Q;
  for (int64_t p = 0; p < s.P; ++p) {
    const float* r0 = xp + 2 * p * W;
    const float* r1 = r0 + W;
    float* yr = yp + p * Q;
    int64_t q = 0;
#ifdef __AVX2__
    const __m256 quarter = _mm256_set1_ps(0.25f);
    for (; q + 8 <= Q; q += 8) {  // reads x[2q .. 2q+15] of both rows
      const __m256 a0 = _mm256_loadu_ps(r0 + 2 * q), a1 = _mm256_loadu_ps(r0 + 2 * q + 8);
      const __m256 b0 = _mm256_loadu_ps(r1 + 2 * q), b1 = _mm256_loadu_ps(r1 + 2 * q + 8);
      // shuffle_ps keeps 128-bit lanes: evens/odds come out as q0145|q2367,
      // fixed by one cross-lane permute at the end.
      __m256 acc = _mm256_add_ps(_mm256_shuffle_ps(a0, a1, 0x88), _mm256_shuffle_ps(a0, a1, 0xDD));
      acc = _mm256_add_ps(acc, _mm256_shuffle_ps(b0, b1, 0x88));
      acc = _mm256_add_ps(acc, _mm256_shuffle_ps(b0, b1, 0xDD));
      acc = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(acc), 0xD8));
      _mm256_storeu_ps(yr + q, _mm256_mul_ps(acc, quarter));
    }
#endif
    for (; q < Q; ++q) yr[q] = (((r0[2 * q] + r0[2 * q + 1]) + r1[2 * q]) + r1[2 * q + 1]) * 0.25f;
  }
}

// dx block (2p..2p+1, 2q..2q+1) = dy[p, q] / 4; rows/columns past 2P / 2Q
// (odd H / W) belong to no window and get 0.
void avg_pool_2x2_backward_plane(const Pool2dShape& s, const float* dyp, float* dxp) {
  const int64_t W = s.W, Q = s.Q;
  for (int64_t p = 0; p < s.P; ++p) {
    const float* g = dyp + p * Q;
    float* d0 = dxp + 2 * p * W;
    float* d1 = d0 + W;
    int64_t q = 0;
#ifdef __AVX2__
    const __m256 quarter = _mm256_set1_ps(0.25f);
    for (; q + 8 <= Q; q += 8) {
      const __m256 v = _mm256_mul_ps(_mm256_loadu_ps(g + q), quarter);
      const __m256 lo = _mm256_unpacklo_ps(v, v), hi = _mm256_unpackhi_ps(v, v);  // g0g0g1g1|g4g4g5g5
      const __m256 first = _mm256_permute2f128_ps(lo, hi, 0x20);   // g0..g3 doubled
      const __m256 second = _mm256_permute2f128_ps(lo, hi, 0x31);  // g4..g7 doubled
      _mm256_storeu_ps(d0 + 2 * q, first);
      _mm256_storeu_ps(d0 + 2 * q + 8, second);
      _mm256_storeu_ps(d1 + 2 * q, first);
      _mm256_storeu_ps(d1 + 2 * q + 8, second);
    }
#endif
    for (; q < Q; ++q) {
      const float v = g[q] * 0.25f;
      d0[2 * q] = d0[2 * q + 1] = d1[2 * q] = d1[2 * q + 1] = v;
    }
    for (int64_t w = 2 * Q; w < W; ++w) d0[w] = d1[w] = 0.0f;
  }
  std::fill(dxp + 2 * s.P * W, dxp + s.H * W, 0.0f);
}

// Generic backward for windows that cannot overlap (stride >= kernel): each
// dx element gets at most one window's gradient, so it is written once (0
// where no window covers it) instead of zero-fill + scattered adds.
void avg_pool_disjoint_backward_plane(const Pool2dShape& s, const int64_t* qmap, const float* dyp,
                                      float inv, float* dxp) {
  for (int64_t h = 0; h < s.H; ++h) {
    float* row = dxp + h * s.W;
    // The only window row p that can cover h: the last one starting at or before h.
    const int64_t p = detail::floor_div(h + s.pad_h, s.stride_h);
    if (p >= s.P || h + s.pad_h - p * s.stride_h >= s.kernel_h) {
      std::fill(row, row + s.W, 0.0f);
      continue;
    }
    const float* g = dyp + p * s.Q;
    for (int64_t w = 0; w < s.W; ++w) row[w] = qmap[w] >= 0 ? g[qmap[w]] * inv : 0.0f;
  }
}

// n elements of T as float32: the data itself for float, else widened into
// the calling thread's scratch `slot` (cpu::scratch; slots 0 and 1, one
// per view alive at once).
template <class T>
const float* widened(const T* src, int64_t n, int slot) {
  if constexpr (std::is_same_v<T, float>) {
    return src;
  } else {
    float* f = scratch(static_cast<size_t>(n), slot);
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) f[i] = load(src[i]);
    return f;
  }
}

// A float32 plane that finish() stores into n elements of T: the
// destination itself for float, else scratch `slot`, rounded once.
template <class T>
class Narrowed {
 public:
  Narrowed(T* dst, int64_t n, int slot) : dst_(dst), n_(n) {
    if constexpr (std::is_same_v<T, float>)
      f_ = dst;
    else
      f_ = scratch(static_cast<size_t>(n), slot);
  }
  float* data() const { return f_; }
  void finish() const {
    if constexpr (!std::is_same_v<T, float>) {
#pragma omp simd
      for (int64_t i = 0; i < n_; ++i) dst_[i] = store<T>(f_[i]);
    }
  }

 private:
  T* dst_;
  int64_t n_;
  float* f_;
};

// One (n, c) plane of each pass, in float32.

void max_pool_plane(const Pool2dShape& s, bool fast2x2, const float* xp, float* yp,
                    int64_t* ap) {
  if (fast2x2) return max_pool_2x2_plane(s, xp, yp, ap);
  for (int64_t p = 0; p < s.P; ++p) {
    for (int64_t q = 0; q < s.Q; ++q) {
      float best;
      int64_t arg;
      max_in_window(xp, s.W, window(s, p, q), best, arg);
      yp[p * s.Q + q] = best;
      ap[p * s.Q + q] = arg;
    }
  }
}

void max_pool_backward_plane(const Pool2dShape& s, const float* dyp, const int64_t* ap,
                             float* dxp) {
  const int64_t PQ = s.P * s.Q;
  std::fill(dxp, dxp + s.H * s.W, 0.0f);
  for (int64_t j = 0; j < PQ; ++j)
    if (ap[j] >= 0) dxp[ap[j]] += dyp[j];
}

void avg_pool_plane(const Pool2dShape& s, bool fast2x2, float inv, const float* xp, float* yp) {
  if (fast2x2) return avg_pool_2x2_plane(s, xp, yp);
  for (int64_t p = 0; p < s.P; ++p) {
    for (int64_t q = 0; q < s.Q; ++q) {
      const Window wd = window(s, p, q);
      float acc = 0.0f;
      for (int64_t h = wd.h0; h < wd.h1; ++h)
        for (int64_t w = wd.w0; w < wd.w1; ++w) acc += xp[h * s.W + w];
      yp[p * s.Q + q] = acc * inv;
    }
  }
}

// qmap: for windows that cannot overlap (disjoint), null otherwise.
void avg_pool_backward_plane(const Pool2dShape& s, bool fast2x2, const int64_t* qmap, float inv,
                             const float* dyp, float* dxp) {
  if (fast2x2) return avg_pool_2x2_backward_plane(s, dyp, dxp);
  if (qmap) return avg_pool_disjoint_backward_plane(s, qmap, dyp, inv, dxp);
  std::fill(dxp, dxp + s.H * s.W, 0.0f);
  for (int64_t p = 0; p < s.P; ++p) {
    for (int64_t q = 0; q < s.Q; ++q) {
      const Window wd = window(s, p, q);
      const float g = dyp[p * s.Q + q] * inv;
      for (int64_t h = wd.h0; h < wd.h1; ++h)
        for (int64_t w = wd.w0; w < wd.w1; ++w) dxp[h * s.W + w] += g;
    }
  }
}

}  // namespace

template <class T>
void max_pool2d_forward(const Pool2dShape& s, const T* x, T* y, int64_t* argmax) {
  const int64_t planes = s.N * s.C, HW = s.H * s.W, PQ = s.P * s.Q;
  const bool fast2x2 = is_2x2_s2(s);
#pragma omp parallel for schedule(static) if (parallel_worth(s))
  for (int64_t i = 0; i < planes; ++i) {
    const Narrowed<T> yp(y + i * PQ, PQ, 1);  // exact: each is one of x's values, or -inf
    max_pool_plane(s, fast2x2, widened(x + i * HW, HW, 0), yp.data(), argmax + i * PQ);
    yp.finish();
  }
}

template <class T>
void max_pool2d_backward(const Pool2dShape& s, const T* dy, const int64_t* argmax, T* dx) {
  const int64_t planes = s.N * s.C, HW = s.H * s.W, PQ = s.P * s.Q;
#pragma omp parallel for schedule(static) if (parallel_worth(s))
  for (int64_t i = 0; i < planes; ++i) {
    const Narrowed<T> dxp(dx + i * HW, HW, 1);
    max_pool_backward_plane(s, widened(dy + i * PQ, PQ, 0), argmax + i * PQ, dxp.data());
    dxp.finish();
  }
}

template <class Tx, class Ty>
void avg_pool2d_forward(const Pool2dShape& s, const Tx* x, Ty* y) {
  const int64_t planes = s.N * s.C, HW = s.H * s.W, PQ = s.P * s.Q;
  const float inv = 1.0f / static_cast<float>(s.kernel_h * s.kernel_w);
  const bool fast2x2 = is_2x2_s2(s);
#pragma omp parallel for schedule(static) if (parallel_worth(s))
  for (int64_t i = 0; i < planes; ++i) {
    const Narrowed<Ty> yp(y + i * PQ, PQ, 1);
    avg_pool_plane(s, fast2x2, inv, widened(x + i * HW, HW, 0), yp.data());
    yp.finish();
  }
}

template <class Tdy, class Tdx>
void avg_pool2d_backward(const Pool2dShape& s, const Tdy* dy, Tdx* dx) {
  const int64_t planes = s.N * s.C, HW = s.H * s.W, PQ = s.P * s.Q;
  const float inv = 1.0f / static_cast<float>(s.kernel_h * s.kernel_w);
  const bool fast2x2 = is_2x2_s2(s);
  const bool disjoint = !fast2x2 && s.stride_h >= s.kernel_h && s.stride_w >= s.kernel_w;
  // Column -> covering window column (or -1), shared read-only by all threads.
  thread_local std::vector<int64_t> qmap_store;
  if (disjoint) {
    qmap_store.assign(static_cast<size_t>(s.W), -1);
    for (int64_t q = 0; q < s.Q; ++q) {
      const Window wd = window(s, 0, q);
      for (int64_t w = wd.w0; w < wd.w1; ++w) qmap_store[w] = q;
    }
  }
  const int64_t* qmap = disjoint ? qmap_store.data() : nullptr;
#pragma omp parallel for schedule(static) if (parallel_worth(s))
  for (int64_t i = 0; i < planes; ++i) {
    const Narrowed<Tdx> dxp(dx + i * HW, HW, 1);
    avg_pool_backward_plane(s, fast2x2, qmap, inv, widened(dy + i * PQ, PQ, 0), dxp.data());
    dxp.finish();
  }
}

#define ANVIL_POOL(T)                                                                       \
  template void max_pool2d_forward(const Pool2dShape&, const T*, T*, int64_t*);             \
  template void max_pool2d_backward(const Pool2dShape&, const T*, const int64_t*, T*);      \
  template void avg_pool2d_forward(const Pool2dShape&, const T*, T*);                       \
  template void avg_pool2d_backward(const Pool2dShape&, const T*, T*);
ANVIL_POOL(float)
ANVIL_POOL(bfloat16)
#undef ANVIL_POOL
template void avg_pool2d_forward(const Pool2dShape&, const bfloat16*, float*);
template void avg_pool2d_backward(const Pool2dShape&, const float*, bfloat16*);

// ---- CpuBackend (cpu_backend.h) ----

void CpuBackend::max_pool2d_forward(const Pool2dShape& s, const Tensor& x, const Tensor& y,
                                    const Tensor& argmax) {
  visit_float_dtype(x.dtype(), "max_pool2d_forward", [&](auto t) {
    using T = decltype(t);
    cpu::max_pool2d_forward(s, x.data<T>(), y.data<T>(), argmax.data<int64_t>());
  });
}
void CpuBackend::max_pool2d_backward(const Pool2dShape& s, const Tensor& dy,
                                     const Tensor& argmax, const Tensor& dx) {
  visit_float_dtype(dy.dtype(), "max_pool2d_backward", [&](auto t) {
    using T = decltype(t);
    cpu::max_pool2d_backward(s, dy.data<T>(), int64s(argmax), dx.data<T>());
  });
}
void CpuBackend::avg_pool2d_forward(const Pool2dShape& s, const Tensor& x, const Tensor& y) {
  if (x.dtype() == DType::BFloat16 && y.dtype() == DType::Float32)  // global average pooling
    return cpu::avg_pool2d_forward(s, x.data<bfloat16>(), floats(y));
  visit_float_dtype(x.dtype(), "avg_pool2d_forward", [&](auto t) {
    using T = decltype(t);
    cpu::avg_pool2d_forward(s, x.data<T>(), y.data<T>());
  });
}
void CpuBackend::avg_pool2d_backward(const Pool2dShape& s, const Tensor& dy, const Tensor& dx) {
  if (dy.dtype() == DType::Float32 && dx.dtype() == DType::BFloat16)  // global average pooling
    return cpu::avg_pool2d_backward(s, floats(dy), dx.data<bfloat16>());
  visit_float_dtype(dy.dtype(), "avg_pool2d_backward", [&](auto t) {
    using T = decltype(t);
    cpu::avg_pool2d_backward(s, dy.data<T>(), dx.data<T>());
  });
}

}  // namespace anvil::cpu
