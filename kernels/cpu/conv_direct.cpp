// Direct convolution for tiny reductions (C*R*S <= 32, stride_w == 1), such
// as LeNet's conv1 (1 -> 20 channels, 3x3). There im2col + GEMM is memory
// bound: im2col writes C*R*S copies of the input and a GEMM with an inner
// dimension of 9 cannot reuse anything. Instead each image's input planes
// are copied once into a zero-padded per-thread buffer (so no tap needs
// bounds checks), and outputs are computed 8 columns at a time in vector
// registers: forward keeps a block of 8/4/1 output channels' accumulators
// and broadcasts each weight; backward-weight keeps a block of 8/4/1 taps'
// accumulators and reuses each dy load. Threads split the images;
// backward-weight sums its per-thread partials (double) in thread order,
// so results are reproducible for a given thread count.
#include <algorithm>
#include <cstring>
#include <vector>
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif
#include <omp.h>

#include "kernels/cpu/conv_direct.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/parallel_util.h"

namespace anvil::cpu::detail {

namespace {

constexpr int64_t kMaxTaps = 32;
constexpr int64_t kLanes = 8;
constexpr int64_t kSlack = 2 * kLanes;  // over-read room after the padded planes

// An 8-float vector: an AVX2 register (with FMA), or a plain array the
// compiler can still vectorise elsewhere. Partial vectors use masked loads
// and stores, which never touch the masked-off lanes.
#if defined(__AVX2__) && defined(__FMA__)
using V = __m256;
inline __m256i lane_mask(int64_t n) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n)),
                            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
inline V vzero() { return _mm256_setzero_ps(); }
inline V vset1(float a) { return _mm256_set1_ps(a); }
inline V vload(const float* p) { return _mm256_loadu_ps(p); }
inline V vloadn(const float* p, int64_t n) {
  return n == kLanes ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, lane_mask(n));
}
inline void vstoren(float* p, V v, int64_t n) {
  if (n == kLanes) return _mm256_storeu_ps(p, v);
  alignas(32) float tmp[kLanes];  // masked stores are slow on some cores
  _mm256_store_ps(tmp, v);
  for (int64_t i = 0; i < n; ++i) p[i] = tmp[i];
}
inline V vfma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
inline float vsum(V v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
#else
struct V {
  float v[kLanes];
};
inline V vzero() { return V{}; }
inline V vset1(float a) {
  V r;
  for (float& e : r.v) e = a;
  return r;
}
inline V vload(const float* p) {
  V r;
  std::memcpy(r.v, p, sizeof r.v);
  return r;
}
inline V vloadn(const float* p, int64_t n) {
  V r{};
  for (int64_t i = 0; i < n; ++i) r.v[i] = p[i];
  return r;
}
inline void vstoren(float* p, V v, int64_t n) {
  for (int64_t i = 0; i < n; ++i) p[i] = v.v[i];
}
inline V vfma(V a, V b, V c) {
  for (int64_t i = 0; i < kLanes; ++i) c.v[i] += a.v[i] * b.v[i];
  return c;
}
inline float vsum(V v) {
  float s = 0.0f;
  for (float e : v.v) s += e;
  return s;
}
#endif

struct Padded {
  int64_t Hp, Wp;
  const float* data;  // [C, Hp, Wp] followed by kSlack zeros
};

// Copies image x_n[C, H, W] into a zero-padded per-thread buffer.
Padded pad_image(const Conv2dShape& s, const float* xn) {
  const int64_t Hp = s.H + 2 * s.pad_h, Wp = s.W + 2 * s.pad_w, plane = Hp * Wp;
  float* buf = scratch(static_cast<size_t>(s.C * plane + kSlack), 2);
  if (s.pad_h == 0 && s.pad_w == 0) {
    std::memcpy(buf, xn, s.C * plane * sizeof(float));
  } else {
    std::fill(buf, buf + s.C * plane, 0.0f);
    for (int64_t c = 0; c < s.C; ++c)
      for (int64_t h = 0; h < s.H; ++h)
        std::memcpy(buf + (c * Hp + h + s.pad_h) * Wp + s.pad_w, xn + (c * s.H + h) * s.W,
                    s.W * sizeof(float));
  }
  std::fill(buf + s.C * plane, buf + s.C * plane + kSlack, 0.0f);
  return {Hp, Wp, buf};
}

// Output channels [k0, k0+KB) of one image, 8 output columns at a time,
// the KB accumulators held in registers across all C*R*S taps.
template <int KB>
void forward_block(const Conv2dShape& s, const Padded& xp, const float* w, const float* bias,
                   int64_t k0, float* yn) {
  const int64_t RS = s.R * s.S, CRS = s.C * RS, PQ = s.P * s.Q;
  for (int64_t p = 0; p < s.P; ++p) {
    for (int64_t q0 = 0; q0 < s.Q; q0 += kLanes) {
      V acc[KB];
#pragma GCC unroll 8
      for (int kk = 0; kk < KB; ++kk) acc[kk] = vset1(bias ? bias[k0 + kk] : 0.0f);
      for (int64_t c = 0; c < s.C; ++c) {
        for (int64_t r = 0; r < s.R; ++r) {
          const float* xr = xp.data + (c * xp.Hp + p * s.stride_h + r) * xp.Wp + q0;
          const float* wr = w + k0 * CRS + (c * s.R + r) * s.S;
          for (int64_t t = 0; t < s.S; ++t) {
            const V xv = vload(xr + t);
#pragma GCC unroll 8
            for (int kk = 0; kk < KB; ++kk) acc[kk] = vfma(vset1(wr[kk * CRS + t]), xv, acc[kk]);
          }
        }
      }
      const int64_t lanes = std::min(kLanes, s.Q - q0);
#pragma GCC unroll 8
      for (int kk = 0; kk < KB; ++kk) vstoren(yn + (k0 + kk) * PQ + p * s.Q + q0, acc[kk], lanes);
    }
  }
}

// dw partial sums of one (image, output channel) for taps [j0, j0+TB):
// off[j] is tap j's offset in the padded image, g the channel's dy plane.
template <int TB>
void weight_block(const Conv2dShape& s, const Padded& xp, const int64_t* off, int64_t j0,
                  const float* g, double* out) {
  V acc[TB];
#pragma GCC unroll 8
  for (int jj = 0; jj < TB; ++jj) acc[jj] = vzero();
  for (int64_t p = 0; p < s.P; ++p) {
    const float* base = xp.data + p * s.stride_h * xp.Wp;
    for (int64_t q0 = 0; q0 < s.Q; q0 += kLanes) {
      const int64_t lanes = std::min(kLanes, s.Q - q0);
      const V gv = vloadn(g + p * s.Q + q0, lanes);
#pragma GCC unroll 8
      for (int jj = 0; jj < TB; ++jj)
        acc[jj] = vfma(gv, vloadn(base + off[j0 + jj] + q0, lanes), acc[jj]);
    }
  }
#pragma GCC unroll 8
  for (int jj = 0; jj < TB; ++jj) out[j0 + jj] += vsum(acc[jj]);
}

}  // namespace

bool conv_direct_suits(const Conv2dShape& s) {
  return s.stride_w == 1 && s.C * s.R * s.S <= kMaxTaps && s.Q >= 8 && s.K >= 1;
}

void conv2d_forward_direct(const Conv2dShape& s, const float* x, const float* w,
                           const float* bias, float* y) {
  const int64_t CHW = s.C * s.H * s.W, KPQ = s.K * s.P * s.Q;
#pragma omp parallel for schedule(static) if (s.N * KPQ >= kMinParallel)
  for (int64_t n = 0; n < s.N; ++n) {
    const Padded xp = pad_image(s, x + n * CHW);
    float* yn = y + n * KPQ;
    int64_t k = 0;
    for (; k + 8 <= s.K; k += 8) forward_block<8>(s, xp, w, bias, k, yn);
    for (; k + 4 <= s.K; k += 4) forward_block<4>(s, xp, w, bias, k, yn);
    for (; k < s.K; ++k) forward_block<1>(s, xp, w, bias, k, yn);
  }
}

void conv2d_backward_weight_direct(const Conv2dShape& s, const float* x, const float* dy,
                                   float* dw) {
  const int64_t CHW = s.C * s.H * s.W, PQ = s.P * s.Q, KPQ = s.K * PQ;
  const int64_t RS = s.R * s.S, CRS = s.C * RS, KCRS = s.K * CRS;
  const int max_threads = omp_get_max_threads();
  thread_local std::vector<double> partial;  // [threads, K*C*R*S], on the calling thread
  if (partial.size() < static_cast<size_t>(max_threads * KCRS)) partial.resize(max_threads * KCRS);
  double* part = partial.data();
  int used = 1;
#pragma omp parallel if (s.N * KPQ * CRS >= kMinParallel) num_threads(max_threads)
  {
    const int tid = omp_get_thread_num();
#pragma omp single
    used = omp_get_num_threads();
    double* mine = part + tid * KCRS;
    std::fill(mine, mine + KCRS, 0.0);
#pragma omp for schedule(static)
    for (int64_t n = 0; n < s.N; ++n) {
      const Padded xp = pad_image(s, x + n * CHW);
      int64_t off[kMaxTaps];  // tap (c, r, t) -> offset in the padded image
      for (int64_t j = 0; j < CRS; ++j)
        off[j] = ((j / RS) * xp.Hp + (j % RS) / s.S) * xp.Wp + j % s.S;
      for (int64_t k = 0; k < s.K; ++k) {
        const float* g = dy + n * KPQ + k * PQ;
        double* out = mine + k * CRS;
        int64_t j = 0;
        for (; j + 8 <= CRS; j += 8) weight_block<8>(s, xp, off, j, g, out);
        for (; j + 4 <= CRS; j += 4) weight_block<4>(s, xp, off, j, g, out);
        for (; j < CRS; ++j) weight_block<1>(s, xp, off, j, g, out);
      }
    }
  }
  for (int64_t i = 0; i < KCRS; ++i) {
    double total = 0.0;
    for (int t = 0; t < used; ++t) total += part[t * KCRS + i];
    dw[i] = static_cast<float>(total);
  }
}

}  // namespace anvil::cpu::detail
