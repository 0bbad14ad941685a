// Max and average pooling over NCHW planes.
// Each (n, c) plane is independent, so OpenMP splits the work over planes
// (no write conflicts, also in the backward scatter-adds). Per output the
// window is clipped to the real input once, so the inner loops carry no
// padding branches: padding is -inf for max (never chosen) and 0 for avg
// (which still divides by kernel_h*kernel_w, count_include_pad=True).
// The common non-overlapping 2x2/stride-2/no-padding max pool has its own
// branch-light loop since it dominates small CNNs such as LeNet.
// Max ties: the first maximum in row-major scan order wins; NaN propagates
// (a NaN in the window is selected, as in PyTorch). A window lying entirely
// in padding (only possible when pad >= kernel) yields -inf and argmax -1,
// which the backward skips.
#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/parallel_util.h"

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

}  // namespace

void max_pool2d_forward(const Pool2dShape& s, const float* x, float* y, int64_t* argmax) {
  const int64_t planes = s.N * s.C, HW = s.H * s.W, PQ = s.P * s.Q;
  const bool fast2x2 = s.kernel_h == 2 && s.kernel_w == 2 && s.stride_h == 2 && s.stride_w == 2 &&
                       s.pad_h == 0 && s.pad_w == 0 && 2 * s.P <= s.H && 2 * s.Q <= s.W;
#pragma omp parallel for schedule(static) if (parallel_worth(s))
  for (int64_t i = 0; i < planes; ++i) {
    const float* xp = x + i * HW;
    float* yp = y + i * PQ;
    int64_t* ap = argmax + i * PQ;
    if (fast2x2) {
      max_pool_2x2_plane(s, xp, yp, ap);
      continue;
    }
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
}

void max_pool2d_backward(const Pool2dShape& s, const float* dy, const int64_t* argmax, float* dx) {
  const int64_t planes = s.N * s.C, HW = s.H * s.W, PQ = s.P * s.Q;
#pragma omp parallel for schedule(static) if (parallel_worth(s))
  for (int64_t i = 0; i < planes; ++i) {
    float* dxp = dx + i * HW;
    const float* dyp = dy + i * PQ;
    const int64_t* ap = argmax + i * PQ;
    std::fill(dxp, dxp + HW, 0.0f);
    for (int64_t j = 0; j < PQ; ++j)
      if (ap[j] >= 0) dxp[ap[j]] += dyp[j];
  }
}

void avg_pool2d_forward(const Pool2dShape& s, const float* x, float* y) {
  const int64_t planes = s.N * s.C, HW = s.H * s.W, PQ = s.P * s.Q;
  const float inv = 1.0f / static_cast<float>(s.kernel_h * s.kernel_w);
#pragma omp parallel for schedule(static) if (parallel_worth(s))
  for (int64_t i = 0; i < planes; ++i) {
    const float* xp = x + i * HW;
    float* yp = y + i * PQ;
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
}

void avg_pool2d_backward(const Pool2dShape& s, const float* dy, float* dx) {
  const int64_t planes = s.N * s.C, HW = s.H * s.W, PQ = s.P * s.Q;
  const float inv = 1.0f / static_cast<float>(s.kernel_h * s.kernel_w);
#pragma omp parallel for schedule(static) if (parallel_worth(s))
  for (int64_t i = 0; i < planes; ++i) {
    float* dxp = dx + i * HW;
    const float* dyp = dy + i * PQ;
    std::fill(dxp, dxp + HW, 0.0f);
    for (int64_t p = 0; p < s.P; ++p) {
      for (int64_t q = 0; q < s.Q; ++q) {
        const Window wd = window(s, p, q);
        const float g = dyp[p * s.Q + q] * inv;
        for (int64_t h = wd.h0; h < wd.h1; ++h)
          for (int64_t w = wd.w0; w < wd.w1; ++w) dxp[h * s.W + w] += g;
      }
    }
  }
}

}  // namespace anvil::cpu
