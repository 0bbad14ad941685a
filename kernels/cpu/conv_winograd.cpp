// Winograd F(4x4, 3x3) convolution (minimal filtering, Lavin & Gray 2015)
// for 3x3 stride-1 layers. Each 4x4 block of outputs ("tile") is computed
// from the 6x6 input patch under it as
//   Y = A^T [ (G g G^T) .* (B^T d B) ] A
// so a tile costs 36 multiplications per (input, output) channel pair
// instead of 144: 4x fewer. Across channels the 36 elementwise products are
// 36 independent matrix products, which is where the time goes:
//   M[xi] (Co x T) = U[xi] (Co x Ci) * V[xi] (Ci x T)
// with U the transformed weights, V the transformed input tiles and T the
// number of tiles. The three training directions share that structure:
//   forward        y  = A^T M A,  U from w
//   backward-data  dx = the same forward on dy, with w's channels swapped,
//                  its taps rotated 180 degrees, and padding 2 - pad
//   backward-wt    dU[xi] (K x C) = dM[xi] (K x T) * V[xi]^T (T x C), with
//                  dM = A dy A^T per tile (the adjoint of the output
//                  transform); dw = G^T dU G (the adjoint of the weight one)
// The matrices use the interpolation points 0, +-1, +-2 and infinity; in
// float the results differ from a direct sum by about 1e-6 of their scale.
//
// Tiles are transformed kL = 8 at a time, one per vector lane: the patches
// are gathered from zero-padded copies of the planes (so edge tiles need no
// bounds checks) into [36][8] staging arrays, and every transform is a
// fixed sequence of lane-wise adds and multiplies that GCC vectorises. The
// tile index t runs over (image, tile row, tile column) of a chunk of
// images, so lanes span images when planes hold few tiles (ResNet's 4x4
// planes are one tile each). Layouts: V[c][xi][t], M and dM [k][xi][t] (the
// GEMMs step through them with a row stride of 36 rows), U [xi][k][c]; rows
// of t are padded to a multiple of 8. A channel's 36 rows are contiguous,
// so each transform reads or writes one compact block instead of 36 rows
// far apart (which left the output transform waiting on cache misses).
// Lanes past the last tile repeat it (V) or are zero (dM), and their
// columns are dropped.
//
// Threading, chosen per call (see the drivers): when the batch gives each
// thread a few chunks of at least ~128 tiles, threads take whole chunks
// (transform, 36 single-threaded GEMMs, inverse transform) inside one
// parallel region with a dynamic schedule, as conv.cpp does for im2col.
// Otherwise (big weights, few tiles: ResNet's last stage) all threads work
// on one chunk at a time: the transforms split over channels and the 36
// GEMMs over xi, with a barrier between the phases. Backward-weight sums
// over tiles: with small weights, chunks are dealt to a fixed number of
// groups (2-8 per thread) that keep partial dU and are added in group order;
// with large weights the xi-split form accumulates each dU[xi] over chunks
// in order. Either way the result is the same on every run with the same
// thread count (the number of groups depends on it).
// Scratch slots: 0 (V), 1 (M or dM), 2 (padded planes, per thread), 3 (U or
// dU, on the calling thread).
#include "kernels/cpu/conv_winograd.h"

#include <algorithm>
#include <cstring>
#include <omp.h>
#ifdef __AVX2__
#include <immintrin.h>
#endif

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/parallel_util.h"

namespace anvil::cpu::detail {

namespace {

constexpr int64_t kM = 4;          // outputs per tile side
constexpr int64_t kA = 6;          // input patch side, kM + 3 - 1
constexpr int64_t kXi = kA * kA;   // transform positions per tile
constexpr int64_t kL = 8;          // tiles per vector of lanes
// Tiles per chunk when threads take whole chunks: a chunk's V and M (36
// rows of 128 tiles per channel) then stay close to the L2 cache, which
// measured faster than 256 or 512 despite the smaller GEMMs.
constexpr int64_t kTilesPerChunk = 128;
// Floats of V plus M (or dM) for one shared chunk (32 MB).
constexpr int64_t kSharedChunkFloats = int64_t{1} << 23;
// Partial dU of all groups together at most this many floats (16 MB).
constexpr int64_t kGroupPartialFloats = int64_t{1} << 22;

using Lanes = float[kL];

int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

// ---------------------------------------------------------------- transforms
// Each 1-D transform reads n values at in[0], in[is], ... and writes its
// outputs at out[0], out[os], ..., lane by lane.

// B^T d: 6 -> 6.
inline void input_1d(const Lanes* in, int64_t is, Lanes* out, int64_t os) {
#pragma omp simd
  for (int64_t l = 0; l < kL; ++l) {
    const float d0 = in[0][l], d1 = in[is][l], d2 = in[2 * is][l], d3 = in[3 * is][l],
                d4 = in[4 * is][l], d5 = in[5 * is][l];
    const float a = d4 - d2, b = d3 - d1;
    out[0][l] = 4.0f * d0 - 5.0f * d2 + d4;
    out[os][l] = (d4 + d3) - 4.0f * (d1 + d2);
    out[2 * os][l] = (d4 - d3) + 4.0f * (d1 - d2);
    out[3 * os][l] = a + 2.0f * b;
    out[4 * os][l] = a - 2.0f * b;
    out[5 * os][l] = 4.0f * d1 - 5.0f * d3 + d5;
  }
}

// A^T m: 6 -> 4.
inline void output_1d(const Lanes* in, int64_t is, Lanes* out, int64_t os) {
#pragma omp simd
  for (int64_t l = 0; l < kL; ++l) {
    const float m0 = in[0][l], m1 = in[is][l], m2 = in[2 * is][l], m3 = in[3 * is][l],
                m4 = in[4 * is][l], m5 = in[5 * is][l];
    const float a = m1 + m2, b = m1 - m2, c = m3 + m4, e = m3 - m4;
    out[0][l] = m0 + a + c;
    out[os][l] = b + 2.0f * e;
    out[2 * os][l] = a + 4.0f * c;
    out[3 * os][l] = b + 8.0f * e + m5;
  }
}

// G g: 3 -> 6.
inline void weight_1d(const Lanes* in, int64_t is, Lanes* out, int64_t os) {
#pragma omp simd
  for (int64_t l = 0; l < kL; ++l) {
    const float g0 = in[0][l], g1 = in[is][l], g2 = in[2 * is][l];
    const float even = g0 + g2;
    out[0][l] = 0.25f * g0;
    out[os][l] = -(even + g1) * (1.0f / 6.0f);
    out[2 * os][l] = -(even - g1) * (1.0f / 6.0f);
    out[3 * os][l] = g0 * (1.0f / 24.0f) + g1 * (1.0f / 12.0f) + g2 * (1.0f / 6.0f);
    out[4 * os][l] = g0 * (1.0f / 24.0f) - g1 * (1.0f / 12.0f) + g2 * (1.0f / 6.0f);
    out[5 * os][l] = g2;
  }
}

// A v (the adjoint of output_1d): 4 -> 6.
inline void grad_1d(const Lanes* in, int64_t is, Lanes* out, int64_t os) {
#pragma omp simd
  for (int64_t l = 0; l < kL; ++l) {
    const float v0 = in[0][l], v1 = in[is][l], v2 = in[2 * is][l], v3 = in[3 * is][l];
    const float even = v0 + v2, odd = v1 + v3, even4 = v0 + 4.0f * v2, odd8 = 2.0f * v1 + 8.0f * v3;
    out[0][l] = v0;
    out[os][l] = even + odd;
    out[2 * os][l] = even - odd;
    out[3 * os][l] = even4 + odd8;
    out[4 * os][l] = even4 - odd8;
    out[5 * os][l] = v3;
  }
}

// G^T u (the adjoint of weight_1d): 6 -> 3.
inline void weight_grad_1d(const Lanes* in, int64_t is, Lanes* out, int64_t os) {
#pragma omp simd
  for (int64_t l = 0; l < kL; ++l) {
    const float u0 = in[0][l], u1 = in[is][l], u2 = in[2 * is][l], u3 = in[3 * is][l],
                u4 = in[4 * is][l], u5 = in[5 * is][l];
    out[0][l] = 0.25f * u0 - (u1 + u2) * (1.0f / 6.0f) + (u3 + u4) * (1.0f / 24.0f);
    out[os][l] = (u2 - u1) * (1.0f / 6.0f) + (u3 - u4) * (1.0f / 12.0f);
    out[2 * os][l] = (u3 + u4 - u1 - u2) * (1.0f / 6.0f) + u5;
  }
}

// 2-D forms: the 1-D transform down every column, then along every row of
// the intermediate (rows of `n` entries, row-major).
template <int64_t In, int64_t Out, void (*F)(const Lanes*, int64_t, Lanes*, int64_t)>
inline void transform_2d(const Lanes* in, Lanes* out) {
  alignas(32) Lanes mid[Out * In];
  for (int64_t j = 0; j < In; ++j) F(in + j, In, mid + j, In);      // columns
  for (int64_t i = 0; i < Out; ++i) F(mid + i * In, 1, out + i * Out, 1);  // rows
}

// ---------------------------------------------------------------- geometry

// A stride-1 3x3 convolution of in[N, Ci, H, W] with padding (ph, pw)
// giving out[N, Co, P, Q], and its tiling.
struct Geom {
  int64_t N, Ci, H, W, Co, ph, pw, P, Q;
  int64_t tiles_h, tiles_w, tpi;  // tiles down, across, per image
  int64_t Hp, Wp;                 // padded plane covering every tile's patch
};

Geom make_geom(int64_t N, int64_t Ci, int64_t H, int64_t W, int64_t Co, int64_t ph,
               int64_t pw) {
  Geom g{N, Ci, H, W, Co, ph, pw, H + 2 * ph - 2, W + 2 * pw - 2, 0, 0, 0, 0, 0};
  g.tiles_h = ceil_div(g.P, kM);
  g.tiles_w = ceil_div(g.Q, kM);
  g.tpi = g.tiles_h * g.tiles_w;
  g.Hp = g.tiles_h * kM + 2;
  g.Wp = g.tiles_w * kM + 2;
  return g;
}

// Walks the tiles of a chunk in t order, (image, tile row, tile column),
// without divisions (each lane's position is needed for every tile).
struct TileCursor {
  const Geom& g;
  int64_t n = 0, r = 0, q = 0;
  explicit TileCursor(const Geom& geom) : g(geom) {}
  void next() {
    if (++q < g.tiles_w) return;
    q = 0;
    if (++r < g.tiles_h) return;
    r = 0;
    ++n;
  }
  // Top-left corner in a stack of planes of rows x cols, tiles kM apart.
  int64_t offset(int64_t rows, int64_t cols) const { return (n * rows + r * kM) * cols + q * kM; }
};

#ifdef __AVX2__
// In-register transposes: rows in, columns out.
inline void transpose8x8(__m256 r[8]) {
  const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
  const __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
  const __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
  const __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
  const __m256 s0 = _mm256_shuffle_ps(t0, t2, 0x44), s1 = _mm256_shuffle_ps(t0, t2, 0xEE);
  const __m256 s2 = _mm256_shuffle_ps(t1, t3, 0x44), s3 = _mm256_shuffle_ps(t1, t3, 0xEE);
  const __m256 s4 = _mm256_shuffle_ps(t4, t6, 0x44), s5 = _mm256_shuffle_ps(t4, t6, 0xEE);
  const __m256 s6 = _mm256_shuffle_ps(t5, t7, 0x44), s7 = _mm256_shuffle_ps(t5, t7, 0xEE);
  r[0] = _mm256_permute2f128_ps(s0, s4, 0x20);
  r[1] = _mm256_permute2f128_ps(s1, s5, 0x20);
  r[2] = _mm256_permute2f128_ps(s2, s6, 0x20);
  r[3] = _mm256_permute2f128_ps(s3, s7, 0x20);
  r[4] = _mm256_permute2f128_ps(s0, s4, 0x31);
  r[5] = _mm256_permute2f128_ps(s1, s5, 0x31);
  r[6] = _mm256_permute2f128_ps(s2, s6, 0x31);
  r[7] = _mm256_permute2f128_ps(s3, s7, 0x31);
}

// Two 4x4 transposes, one per 128-bit half: v[j] = (a_j, b_j, c_j, d_j | ...)
// for rows a..d in r[0..3], the halves independent.
inline void transpose4x4_halves(__m256 r[4]) {
  const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
  const __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
  r[0] = _mm256_shuffle_ps(t0, t2, 0x44);
  r[1] = _mm256_shuffle_ps(t0, t2, 0xEE);
  r[2] = _mm256_shuffle_ps(t1, t3, 0x44);
  r[3] = _mm256_shuffle_ps(t1, t3, 0xEE);
}
#endif

// d[i*kA + j][l] = patch row i, column j of lane l's tile, whose rows start
// ld floats apart at p[l]. Reads 8 floats per row (2 past the patch).
inline void gather_patches(const float* const p[kL], int64_t ld, Lanes* d) {
#ifdef __AVX2__
  for (int64_t i = 0; i < kA; ++i) {
    __m256 r[8];
    for (int64_t l = 0; l < kL; ++l) r[l] = _mm256_loadu_ps(p[l] + i * ld);
    transpose8x8(r);
    for (int64_t j = 0; j < kA; ++j) _mm256_store_ps(d[i * kA + j], r[j]);
  }
#else
  for (int64_t l = 0; l < kL; ++l)
    for (int64_t i = 0; i < kA; ++i)
      for (int64_t j = 0; j < kA; ++j) d[i * kA + j][l] = p[l][i * ld + j];
#endif
}

// d[i*kM + j][l] = row i, column j of lane l's 4x4 block at p[l] (rows ld apart).
inline void gather_blocks(const float* const p[kL], int64_t ld, Lanes* d) {
#ifdef __AVX2__
  for (int64_t i = 0; i < kM; ++i) {
    __m256 r[4];
    for (int64_t l = 0; l < 4; ++l)
      r[l] = _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_loadu_ps(p[l] + i * ld)),
                                  _mm_loadu_ps(p[l + 4] + i * ld), 1);
    transpose4x4_halves(r);  // r[j] = column j of lanes 0-3 | lanes 4-7
    for (int64_t j = 0; j < kM; ++j) _mm256_store_ps(d[i * kM + j], r[j]);
  }
#else
  for (int64_t l = 0; l < kL; ++l)
    for (int64_t i = 0; i < kM; ++i)
      for (int64_t j = 0; j < kM; ++j) d[i * kM + j][l] = p[l][i * ld + j];
#endif
}

// The inverse of gather_blocks for the lanes whose tile lies wholly inside
// the output (full[l]); y[i*kM + j][l] + bias goes to p[l][i*ld + j].
// Returns nothing for the other lanes, which the caller writes clipped.
inline void scatter_full_blocks(const Lanes* y, float bias, float* const p[kL],
                                const bool full[kL], int64_t ld) {
#ifdef __AVX2__
  const __m256 b = _mm256_set1_ps(bias);
  for (int64_t i = 0; i < kM; ++i) {
    __m256 r[4];
    for (int64_t j = 0; j < kM; ++j) r[j] = _mm256_add_ps(_mm256_load_ps(y[i * kM + j]), b);
    transpose4x4_halves(r);  // r[l] = row i of lane l (low half) and lane l + 4 (high half)
    for (int64_t l = 0; l < 4; ++l) {
      if (full[l]) _mm_storeu_ps(p[l] + i * ld, _mm256_castps256_ps128(r[l]));
      if (full[l + 4]) _mm_storeu_ps(p[l + 4] + i * ld, _mm256_extractf128_ps(r[l], 1));
    }
  }
#else
  for (int64_t l = 0; l < kL; ++l)
    if (full[l])
      for (int64_t i = 0; i < kM; ++i)
        for (int64_t j = 0; j < kM; ++j) p[l][i * ld + j] = y[i * kM + j][l] + bias;
#endif
}

// ---------------------------------------------------------------- per channel

// dst[Hp][Wp] = zeros with src's rows x cols (rows ld apart) placed at
// (top, left). Inline loops rather than fill + memcpy per row: the rows are
// 4-28 floats, where the calls cost more than the copies. GCC's loop
// distribution would turn the loops back into those calls.
__attribute__((optimize("no-tree-loop-distribute-patterns"))) void copy_padded(
    const float* src, int64_t ld, int64_t rows, int64_t cols, int64_t top, int64_t left,
    int64_t Hp, int64_t Wp, float* dst) {
  for (int64_t i = 0; i < Hp; ++i) {
    float* d = dst + i * Wp;
    const int64_t h = i - top;
    if (h < 0 || h >= rows) {
#pragma omp simd
      for (int64_t j = 0; j < Wp; ++j) d[j] = 0.0f;
      continue;
    }
    const float* s = src + h * ld;
    for (int64_t j = 0; j < left; ++j) d[j] = 0.0f;
#pragma omp simd
    for (int64_t j = 0; j < cols; ++j) d[left + j] = s[j];
    for (int64_t j = left + cols; j < Wp; ++j) d[j] = 0.0f;
  }
}

// V[c][xi][t] (v points at V[c][0][0], xi rows ldv apart) for the tiles of
// images [n0, n0+cnt) of channel c of in. planes: plane_floats(g, cnt).
void input_channel(const Geom& g, const float* in, int64_t n0, int64_t cnt, int64_t c,
                   int64_t Tp, int64_t ldv, float* v, float* planes) {
  const int64_t plane = g.Hp * g.Wp, HW = g.H * g.W;
  for (int64_t n = 0; n < cnt; ++n) {
    float* dst = planes + n * plane;
    const float* src = in + ((n0 + n) * g.Ci + c) * HW;
    // Input rows/cols beyond the padded plane (possible with pad 0) belong to no tile.
    const int64_t rows = std::min(g.H, g.Hp - g.ph), cols = std::min(g.W, g.Wp - g.pw);
    copy_padded(src, g.W, rows, cols, g.ph, g.pw, g.Hp, g.Wp, dst);
  }
  std::fill(planes + cnt * plane, planes + cnt * plane + kL, 0.0f);  // over-read slack
  const int64_t T = cnt * g.tpi;
  alignas(32) Lanes d[kXi], out[kXi];
  TileCursor cur(g);
  const float* last = planes;
  for (int64_t t0 = 0; t0 < Tp; t0 += kL) {
    const float* p[kL];
    // Lanes past the last tile repeat it: finite values whose columns are dropped.
    for (int64_t l = 0; l < kL; ++l, cur.next())
      p[l] = last = t0 + l < T ? planes + cur.offset(g.Hp, g.Wp) : last;
    gather_patches(p, g.Wp, d);
    transform_2d<kA, kA, input_1d>(d, out);
    for (int64_t xi = 0; xi < kXi; ++xi) std::memcpy(v + xi * ldv + t0, out[xi], sizeof(Lanes));
  }
}

// dM[k][xi][t] (m points at dM[k][0][0], xi rows ldm apart) for channel k of dy over images
// [n0, n0+cnt); lanes past the last tile are zero. planes: plane_floats(g, cnt).
void grad_channel(const Geom& g, const float* dy, int64_t n0, int64_t cnt, int64_t k,
                  int64_t Tp, int64_t ldm, float* m, float* planes) {
  // dy planes zero-padded to whole tiles, then one all-zero tile for the
  // lanes past the last tile.
  const int64_t P4 = g.tiles_h * kM, Q4 = g.tiles_w * kM, plane = P4 * Q4, PQ = g.P * g.Q;
  for (int64_t n = 0; n < cnt; ++n) {
    float* dst = planes + n * plane;
    const float* src = dy + ((n0 + n) * g.Co + k) * PQ;
    copy_padded(src, g.Q, g.P, g.Q, 0, 0, P4, Q4, dst);
  }
  float* zero_tile = planes + cnt * plane;
  std::fill(zero_tile, zero_tile + kM * Q4, 0.0f);
  const int64_t T = cnt * g.tpi;
  alignas(32) Lanes d[kM * kM], out[kXi];
  TileCursor cur(g);
  for (int64_t t0 = 0; t0 < Tp; t0 += kL) {
    const float* p[kL];
    for (int64_t l = 0; l < kL; ++l, cur.next())
      p[l] = t0 + l < T ? planes + cur.offset(P4, Q4) : zero_tile;
    gather_blocks(p, Q4, d);
    transform_2d<kM, kA, grad_1d>(d, out);
    for (int64_t xi = 0; xi < kXi; ++xi) std::memcpy(m + xi * ldm + t0, out[xi], sizeof(Lanes));
  }
}

// Floats of per-thread plane buffer input_channel and grad_channel need.
int64_t plane_floats(const Geom& g, int64_t cnt) {
  const int64_t P4 = g.tiles_h * kM, Q4 = g.tiles_w * kM;
  return std::max(cnt * g.Hp * g.Wp, (cnt + 1) * P4 * Q4) + kL;
}

// out[n0+n, k] for the T tiles of M[k][xi][t] (m points at M[k][0][0]),
// plus bias, clipped to P x Q.
void output_channel(const Geom& g, const float* m, int64_t ldm, int64_t T, float bias,
                    int64_t n0, int64_t k, float* out) {
  const int64_t PQ = g.P * g.Q;
  alignas(32) Lanes in[kXi], y[kM * kM];
  TileCursor cur(g);
  for (int64_t t0 = 0; t0 < T; t0 += kL) {
    for (int64_t xi = 0; xi < kXi; ++xi) std::memcpy(in[xi], m + xi * ldm + t0, sizeof(Lanes));
    transform_2d<kA, kM, output_1d>(in, y);
    float* p[kL];
    bool full[kL];
    int64_t rows[kL], cols[kL];
    for (int64_t l = 0; l < kL; ++l, cur.next()) {
      const bool real = t0 + l < T;
      rows[l] = real ? std::min(kM, g.P - cur.r * kM) : 0;
      cols[l] = real ? std::min(kM, g.Q - cur.q * kM) : 0;
      full[l] = rows[l] == kM && cols[l] == kM;
      p[l] = real ? out + ((n0 + cur.n) * g.Co + k) * PQ + cur.r * kM * g.Q + cur.q * kM : nullptr;
    }
    scatter_full_blocks(y, bias, p, full, g.Q);
    for (int64_t l = 0; l < kL; ++l) {
      if (full[l]) continue;
      for (int64_t i = 0; i < rows[l]; ++i)
        for (int64_t j = 0; j < cols[l]; ++j) p[l][i * g.Q + j] = y[i * kM + j][l] + bias;
    }
  }
}

// U[xi][i][j] = G g G^T for rows i in [i0, i1) and every column j < cols,
// where kernel (i, j) is the 3x3 block at w + i*si + j*sj, turned 180
// degrees when `rotate`.
void weight_rows(const float* w, int64_t i0, int64_t i1, int64_t rows, int64_t cols, int64_t si,
                 int64_t sj, bool rotate, float* U) {
  alignas(32) Lanes gk[9], out[kXi];
  for (int64_t i = i0; i < i1; ++i) {
    for (int64_t j0 = 0; j0 < cols; j0 += kL) {
      const int64_t lanes = std::min(kL, cols - j0);
      for (int64_t l = 0; l < kL; ++l)
        for (int64_t e = 0; e < 9; ++e)
          gk[e][l] = l < lanes ? w[i * si + (j0 + l) * sj + (rotate ? 8 - e : e)] : 0.0f;
      transform_2d<3, kA, weight_1d>(gk, out);
      for (int64_t xi = 0; xi < kXi; ++xi)
        std::memcpy(U + (xi * rows + i) * cols + j0, out[xi], lanes * sizeof(float));
    }
  }
}

// dw[k][c] = G^T dU[.][k][c] G for k in [k0, k1).
void weight_grad_rows(const float* dU, int64_t k0, int64_t k1, int64_t K, int64_t C, float* dw) {
  alignas(32) Lanes in[kXi], out[9];
  for (int64_t k = k0; k < k1; ++k) {
    for (int64_t c0 = 0; c0 < C; c0 += kL) {
      const int64_t lanes = std::min(kL, C - c0);
      for (int64_t xi = 0; xi < kXi; ++xi) {
        const float* src = dU + (xi * K + k) * C + c0;
        for (int64_t l = 0; l < kL; ++l) in[xi][l] = l < lanes ? src[l] : 0.0f;
      }
      transform_2d<kA, 3, weight_grad_1d>(in, out);
      for (int64_t l = 0; l < lanes; ++l)
        for (int64_t e = 0; e < 9; ++e) dw[(k * C + c0 + l) * 9 + e] = out[e][l];
    }
  }
}

// ---------------------------------------------------------------- drivers

int available_threads() { return omp_in_parallel() ? 1 : omp_get_max_threads(); }

// Whether threads should take whole chunks: each of them gets at least two
// chunks of a useful number of tiles (always, with one thread).
bool chunks_per_thread(const Geom& g, int threads) {
  return threads == 1 || g.N * g.tpi >= 2 * int64_t{threads} * 128;
}

// Images per chunk when threads take whole chunks.
int64_t private_chunk_images(const Geom& g, int threads) {
  int64_t nb = std::max<int64_t>(1, ceil_div(kTilesPerChunk, g.tpi));
  if (threads > 1) nb = std::min(nb, std::max<int64_t>(1, ceil_div(g.N, 2 * int64_t{threads})));
  return std::min(nb, g.N);
}

// Images per chunk when all threads share one chunk: V and M within budget.
int64_t shared_chunk_images(const Geom& g) {
  const int64_t per_image = kXi * (g.Ci + g.Co) * g.tpi;
  const int64_t most = std::max<int64_t>(1, kSharedChunkFloats / per_image);
  const int64_t chunks = ceil_div(g.N, most);
  return ceil_div(g.N, chunks);  // even chunks
}

// out = conv(in) given U[xi][Co][Ci].
void forward_tiles(const Geom& g, const float* in, const float* U, const float* bias,
                   float* out) {
  const int threads = available_threads();
  if (chunks_per_thread(g, threads)) {
    const int64_t nb = private_chunk_images(g, threads), chunks = ceil_div(g.N, nb);
#pragma omp parallel for schedule(dynamic, 1) if (threads > 1)
    for (int64_t ch = 0; ch < chunks; ++ch) {
      const int64_t n0 = ch * nb, cnt = std::min(nb, g.N - n0), T = cnt * g.tpi;
      const int64_t Tp = round_up(T, kL);
      float* V = scratch(static_cast<size_t>(kXi * g.Ci * Tp), 0);
      float* M = scratch(static_cast<size_t>(kXi * g.Co * Tp), 1);
      float* planes = scratch(static_cast<size_t>(plane_floats(g, cnt)), 2);
      for (int64_t c = 0; c < g.Ci; ++c)
        input_channel(g, in, n0, cnt, c, Tp, Tp, V + c * kXi * Tp, planes);
      for (int64_t xi = 0; xi < kXi; ++xi)
        gemm(false, false, g.Co, Tp, g.Ci, 1.0f, U + xi * g.Co * g.Ci, g.Ci, V + xi * Tp,
             kXi * Tp, 0.0f, M + xi * Tp, kXi * Tp);
      for (int64_t k = 0; k < g.Co; ++k)
        output_channel(g, M + k * kXi * Tp, Tp, T, bias ? bias[k] : 0.0f, n0, k, out);
    }
    return;
  }
  const int64_t nb = shared_chunk_images(g), TpMax = round_up(nb * g.tpi, kL);
  float* V = scratch(static_cast<size_t>(kXi * g.Ci * TpMax), 0);
  float* M = scratch(static_cast<size_t>(kXi * g.Co * TpMax), 1);
#pragma omp parallel
  {
    for (int64_t n0 = 0; n0 < g.N; n0 += nb) {
      const int64_t cnt = std::min(nb, g.N - n0), T = cnt * g.tpi, Tp = round_up(T, kL);
      float* planes = scratch(static_cast<size_t>(plane_floats(g, cnt)), 2);
#pragma omp for schedule(dynamic, 4)
      for (int64_t c = 0; c < g.Ci; ++c)
        input_channel(g, in, n0, cnt, c, Tp, Tp, V + c * kXi * Tp, planes);
#pragma omp for schedule(dynamic, 1)
      for (int64_t xi = 0; xi < kXi; ++xi)
        gemm(false, false, g.Co, Tp, g.Ci, 1.0f, U + xi * g.Co * g.Ci, g.Ci, V + xi * Tp,
             kXi * Tp, 0.0f, M + xi * Tp, kXi * Tp);
      // No barrier after the inverse transform: the next chunk's input
      // transform writes V, not M, and its GEMMs wait at that loop's barrier.
#pragma omp for schedule(dynamic, 4) nowait
      for (int64_t k = 0; k < g.Co; ++k)
        output_channel(g, M + k * kXi * Tp, Tp, T, bias ? bias[k] : 0.0f, n0, k, out);
    }
  }
}

// U[xi][rows][cols] from weights (see weight_rows), rows split over threads.
float* transform_weights(const float* w, int64_t rows, int64_t cols, int64_t si, int64_t sj,
                         bool rotate) {
  float* U = scratch(static_cast<size_t>(kXi * rows * cols), 3);
  constexpr int64_t kRowsPerTask = 8;
  const int64_t tasks = ceil_div(rows, kRowsPerTask);
#pragma omp parallel for schedule(dynamic, 1) if (rows * cols >= 4096)
  for (int64_t b = 0; b < tasks; ++b)
    weight_rows(w, b * kRowsPerTask, std::min(rows, (b + 1) * kRowsPerTask), rows, cols, si, sj,
                rotate, U);
  return U;
}

}  // namespace

bool conv_winograd_suits(const Conv2dShape& s) {
  if (s.R != 3 || s.S != 3 || s.stride_h != 1 || s.stride_w != 1) return false;
  // Backward-data pads dy by 2 - pad.
  if (s.pad_h > 2 || s.pad_w > 2) return false;
  // Below ~16 channels the transforms cost more than the products they save.
  if (s.C < 16 || s.K < 16 || s.N <= 0) return false;
  // Demand at least 1.5x fewer multiplications than the 9 per output of a
  // direct sum, in both the forward and the backward-data tiling (partial
  // edge tiles waste some): 36 * tiles * 1.5 <= 9 * outputs.
  const auto enough = [](int64_t P, int64_t Q) {
    return P > 0 && Q > 0 && 6 * ceil_div(P, kM) * ceil_div(Q, kM) <= P * Q;
  };
  return enough(s.P, s.Q) && enough(s.H, s.W);
}

void conv2d_forward_winograd(const Conv2dShape& s, const float* x, const float* w,
                             const float* bias, float* y) {
  const Geom g = make_geom(s.N, s.C, s.H, s.W, s.K, s.pad_h, s.pad_w);
  // U[xi][k][c]: kernel (k, c) at w + (k*C + c)*9.
  const float* U = transform_weights(w, s.K, s.C, s.C * 9, 9, false);
  forward_tiles(g, x, U, bias, y);
}

void conv2d_backward_data_winograd(const Conv2dShape& s, const float* dy, const float* w,
                                   float* dx) {
  // dx[c] = sum_k dy[k] correlated with w[k][c] turned 180 degrees, padding 2 - pad.
  const Geom g = make_geom(s.N, s.K, s.P, s.Q, s.C, 2 - s.pad_h, 2 - s.pad_w);
  const float* U = transform_weights(w, s.C, s.K, 9, s.C * 9, true);
  forward_tiles(g, dy, U, nullptr, dx);
}

void conv2d_backward_weight_winograd(const Conv2dShape& s, const float* x, const float* dy,
                                     float* dw) {
  const Geom g = make_geom(s.N, s.C, s.H, s.W, s.K, s.pad_h, s.pad_w);
  const int64_t K = s.K, C = s.C, KC = K * C;
  const int threads = available_threads();
  if (chunks_per_thread(g, threads) && kXi * KC * 2 * threads <= kGroupPartialFloats) {
    // Chunks dealt round-robin to groups; each group sums its own dU. 2 to
    // 8 groups per thread, as many as the partials' budget allows: more
    // groups even out threads that run at different speeds.
    const int64_t nb = private_chunk_images(g, threads), chunks = ceil_div(g.N, nb);
    const int64_t fit = kGroupPartialFloats / (kXi * KC);
    const int64_t groups = std::min(chunks, std::clamp<int64_t>(fit, 2 * threads, 8 * threads));
    float* dU = scratch(static_cast<size_t>(groups * kXi * KC), 3);
#pragma omp parallel if (threads > 1)
    {
#pragma omp for schedule(dynamic, 1)
      for (int64_t grp = 0; grp < groups; ++grp) {
        float* acc = dU + grp * kXi * KC;
        for (int64_t ch = grp; ch < chunks; ch += groups) {
          const int64_t n0 = ch * nb, cnt = std::min(nb, g.N - n0);
          const int64_t Tp = round_up(cnt * g.tpi, kL);
          float* V = scratch(static_cast<size_t>(kXi * C * Tp), 0);
          float* dM = scratch(static_cast<size_t>(kXi * K * Tp), 1);
          float* planes = scratch(static_cast<size_t>(plane_floats(g, cnt)), 2);
          for (int64_t c = 0; c < C; ++c) input_channel(g, x, n0, cnt, c, Tp, Tp, V + c * kXi * Tp, planes);
          for (int64_t k = 0; k < K; ++k) grad_channel(g, dy, n0, cnt, k, Tp, Tp, dM + k * kXi * Tp, planes);
          for (int64_t xi = 0; xi < kXi; ++xi)
            gemm(false, true, K, C, Tp, 1.0f, dM + xi * Tp, kXi * Tp, V + xi * Tp, kXi * Tp,
                 ch == grp ? 0.0f : 1.0f, acc + xi * KC, C);
        }
      }
      // Per output channel: add the groups' dU in group order, then G^T dU G.
#pragma omp for schedule(static)
      for (int64_t k = 0; k < K; ++k) {
        for (int64_t grp = 1; grp < groups; ++grp)
          for (int64_t xi = 0; xi < kXi; ++xi) {
            float* dst = dU + xi * KC + k * C;
            const float* src = dU + grp * kXi * KC + xi * KC + k * C;
#pragma omp simd
            for (int64_t c = 0; c < C; ++c) dst[c] += src[c];
          }
        weight_grad_rows(dU, k, k + 1, K, C, dw);
      }
    }
    return;
  }
  // Shared chunks: transforms split over channels, the GEMMs over xi, each
  // dU[xi] accumulated over the chunks in order.
  const int64_t nb = shared_chunk_images(g), TpMax = round_up(nb * g.tpi, kL);
  float* V = scratch(static_cast<size_t>(kXi * C * TpMax), 0);
  float* dM = scratch(static_cast<size_t>(kXi * K * TpMax), 1);
  float* dU = scratch(static_cast<size_t>(kXi * KC), 3);
#pragma omp parallel
  {
    for (int64_t n0 = 0; n0 < g.N; n0 += nb) {
      const int64_t cnt = std::min(nb, g.N - n0), Tp = round_up(cnt * g.tpi, kL);
      float* planes = scratch(static_cast<size_t>(plane_floats(g, cnt)), 2);
#pragma omp for schedule(dynamic, 4) nowait
      for (int64_t c = 0; c < C; ++c) input_channel(g, x, n0, cnt, c, Tp, Tp, V + c * kXi * Tp, planes);
#pragma omp for schedule(dynamic, 4)
      for (int64_t k = 0; k < K; ++k) grad_channel(g, dy, n0, cnt, k, Tp, Tp, dM + k * kXi * Tp, planes);
#pragma omp for schedule(dynamic, 1)
      for (int64_t xi = 0; xi < kXi; ++xi)
        gemm(false, true, K, C, Tp, 1.0f, dM + xi * Tp, kXi * Tp, V + xi * Tp, kXi * Tp,
             n0 == 0 ? 0.0f : 1.0f, dU + xi * KC, C);
    }
#pragma omp for schedule(static)
    for (int64_t k = 0; k < K; ++k) weight_grad_rows(dU, k, k + 1, K, C, dw);
  }
}

}  // namespace anvil::cpu::detail
