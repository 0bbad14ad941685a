// The implicit GEMMs' view of a convolution (rungs 01 and 03-07 of conv.h):
// the shape as the kernels see it, the element accessors of x, the column
// matrix and dy, and the operand readers that tile::register_blocked (gemm
// rung 4's tile) and warp_tile::multiply read the three GEMMs through.
// Nothing here stores a column matrix: each reader computes an element's
// address from (row, column) on the fly, which is what makes the GEMMs
// implicit. A reader's kMajor says which of its two indices consecutive
// threads walk (the one whose loads coalesce), and quad() reads four
// consecutive elements along it with one set of divisions (Walk). Every
// rung reads float32 tensors; rung 07 also bfloat16 ones, through the same
// readers instantiated for that element type.
#pragma once

#include <cstdint>

#include "kernels/cuda/cuda_compat.h"
#include "kernels/cuda/vec4.cuh"

namespace anvil::cuda::conv_kernels {

// The shape, as the kernels see it (checked to fit int on the host).
struct Geo {
  int N, C, H, W, K, R, S, sh, sw, ph, pw, P, Q;
  __device__ __forceinline__ int PQ() const { return P * Q; }
  __device__ __forceinline__ int RS() const { return R * S; }
};

// x[n, c, p*sh - ph + r, q*sw - pw + s], or 0 in the padding.
template <class T>
__device__ __forceinline__ T x_at(const Geo& g, const T* x, int n, int c, int p, int q, int r,
                                  int s) {
  const int h = p * g.sh - g.ph + r, w = q * g.sw - g.pw + s;
  if (h < 0 || h >= g.H || w < 0 || w >= g.W) return T{};
  return x[((int64_t(n) * g.C + c) * g.H + h) * g.W + w];
}

// Column-matrix element col[crs, npq].
template <class T>
__device__ __forceinline__ T col_at(const Geo& g, const T* x, int crs, int npq) {
  const int PQ = g.PQ(), RS = g.RS();
  const int n = npq / PQ, pq = npq % PQ, c = crs / RS, rs = crs % RS;
  return x_at(g, x, n, c, pq / g.Q, pq % g.Q, rs / g.S, rs % g.S);
}

// dy[n, k, (h+ph-r)/sh, (w+pw-s)/sw] when that is an output position whose
// window tap (r, s) reads pixel (h, w), else 0.
template <class T>
__device__ __forceinline__ T dy_tap(const Geo& g, const T* dy, int n, int k, int h, int w, int r,
                                    int s) {
  const int hp = h + g.ph - r, wp = w + g.pw - s;
  if (hp < 0 || wp < 0 || hp % g.sh != 0 || wp % g.sw != 0) return T{};
  const int p = hp / g.sh, q = wp / g.sw;
  if (p >= g.P || q >= g.Q) return T{};
  return dy[((int64_t(n) * g.K + k) * g.P + p) * g.Q + q];
}

// Four consecutive positions of an index space [n][a][b] (sizes A and B
// inside), from the flat index of the first: one set of divisions, then
// carries. The quad() members below use it so that the four elements of a
// quad (rung 4) share their index arithmetic.
struct Walk {
  int n, a, b, A, B;
  __device__ __forceinline__ Walk(int flat, int A_, int B_)
      : n(flat / (A_ * B_)), a(flat / B_ % A_), b(flat % B_), A(A_), B(B_) {}
  __device__ __forceinline__ void next() {
    if (++b == B) {
      b = 0;
      if (++a == A) {
        a = 0;
        ++n;
      }
    }
  }
};

// The readers below are templates on the element type T of x, w and dy:
// float (every rung; the aliases after each), or bfloat16 (rung 07, whose
// stager moves the bits without conversion). An element is returned as T,
// a quad as vec::quad_of makes it (float4 or vec::Bf16x4); T{} is +0 in
// both.

// The column matrix as B of the forward GEMM: (j = npq, k = crs); threads
// take consecutive npq (consecutive q: x read with stride sw).
template <class T>
struct ColByNpqOf {
  static constexpr bool kMajor = true;
  static constexpr bool aligned = true;  // quad() serves any whole quad
  Geo g;
  const T* x;
  __device__ __forceinline__ T operator()(int npq, int crs) const {
    return col_at(g, x, crs, npq);
  }
  // (npq..npq+3, crs)
  __device__ __forceinline__ auto quad(int npq, int crs) const {
    const int RS = g.RS(), c = crs / RS, r = crs % RS / g.S, s = crs % g.S;
    Walk at(npq, g.P, g.Q);
    T v[4];
#pragma unroll
    for (int i = 0; i < 4; ++i, at.next()) v[i] = x_at(g, x, at.n, c, at.a, at.b, r, s);
    return vec::quad_of(v);
  }
};
using ColByNpq = ColByNpqOf<float>;

// col^T as B of the backward-weight GEMM: (j = crs, k = npq); threads again
// take consecutive npq.
template <class T>
struct ColByCrsOf {
  static constexpr bool kMajor = false;
  static constexpr bool aligned = true;
  Geo g;
  const T* x;
  __device__ __forceinline__ T operator()(int crs, int npq) const {
    return col_at(g, x, crs, npq);
  }
  // (crs, npq..npq+3)
  __device__ __forceinline__ auto quad(int crs, int npq) const {
    return ColByNpqOf<T>{g, x}.quad(npq, crs);
  }
};
using ColByCrs = ColByCrsOf<float>;

// w as A of the backward-data GEMM, W^T[c, krs] = w[k, c, rs]; threads take
// consecutive krs (runs of R*S consecutive elements).
template <class T>
struct WeightTOf {
  static constexpr bool kMajor = false;
  static constexpr bool aligned = true;
  Geo g;
  const T* w;
  __device__ __forceinline__ T operator()(int c, int krs) const {
    const int RS = g.RS(), k = krs / RS, rs = krs % RS;
    return w[(int64_t(k) * g.C + c) * RS + rs];
  }
  // (c, krs..krs+3)
  __device__ __forceinline__ auto quad(int c, int krs) const {
    Walk at(krs, g.R, g.S);
    T v[4];
#pragma unroll
    for (int i = 0; i < 4; ++i, at.next())
      v[i] = w[(int64_t(at.n) * g.C + c) * g.RS() + at.a * g.S + at.b];
    return vec::quad_of(v);
  }
};
using WeightT = WeightTOf<float>;

// B of the backward-data GEMM: (j = nhw, k = krs) -> dy tap or 0.
template <class T>
struct DyTapsOf {
  static constexpr bool kMajor = true;
  static constexpr bool aligned = true;
  Geo g;
  const T* dy;
  __device__ __forceinline__ T operator()(int nhw, int krs) const {
    const int wi = nhw % g.W, t = nhw / g.W, h = t % g.H, n = t / g.H;
    const int s = krs % g.S, u = krs / g.S, r = u % g.R, k = u / g.R;
    return dy_tap(g, dy, n, k, h, wi, r, s);
  }
  // (nhw..nhw+3, krs)
  __device__ __forceinline__ auto quad(int nhw, int krs) const {
    const int s = krs % g.S, u = krs / g.S, r = u % g.R, k = u / g.R;
    Walk at(nhw, g.H, g.W);
    T v[4];
#pragma unroll
    for (int i = 0; i < 4; ++i, at.next()) v[i] = dy_tap(g, dy, at.n, k, at.a, at.b, r, s);
    return vec::quad_of(v);
  }
};
using DyTaps = DyTapsOf<float>;

// dy as A of the backward-weight GEMM, [k, npq]; threads along npq.
template <class T>
struct DyRowsOf {
  static constexpr bool kMajor = false;
  static constexpr bool aligned = true;
  Geo g;
  const T* dy;
  __device__ __forceinline__ T operator()(int k, int npq) const {
    const int PQ = g.PQ(), n = npq / PQ, pq = npq % PQ;
    return dy[(int64_t(n) * g.K + k) * PQ + pq];
  }
  // (k, npq..npq+3)
  __device__ __forceinline__ auto quad(int k, int npq) const {
    Walk at(npq, 1, g.PQ());
    T v[4];
#pragma unroll
    for (int i = 0; i < 4; ++i, at.next()) v[i] = dy[(int64_t(at.n) * g.K + k) * g.PQ() + at.b];
    return vec::quad_of(v);
  }
};
using DyRows = DyRowsOf<float>;

}  // namespace anvil::cuda::conv_kernels
