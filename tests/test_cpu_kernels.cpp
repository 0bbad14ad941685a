// CPU kernels against naive double-precision references written here, on
// ragged shapes (odd sizes, stride 2, padding, non-square kernels, N = 1 and
// N > 1, C = 1 and C = 3) and on sizes large enough to take the OpenMP and
// multi-chunk paths; convolution also at several thread counts, since its
// kernels choose how to split the work from the count. Output buffers are pre-filled with NaN so a kernel that
// fails to overwrite every element is caught.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <omp.h>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"

using namespace anvil;
using Vec = std::vector<float>;
using DVec = std::vector<double>;

namespace {

const float kNaN = std::numeric_limits<float>::quiet_NaN();

Vec random_vec(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  Vec v(n);
  for (auto& x : v) x = d(gen);
  return v;
}

// Small integers: plenty of exact ties for max pooling.
Vec random_ints(size_t n, uint32_t seed, int lo, int hi) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int> d(lo, hi);
  Vec v(n);
  for (auto& x : v) x = static_cast<float>(d(gen));
  return v;
}

// Passes when |got - want| <= rel*|want| + floor_frac*max|want| everywhere.
// Also requires the reference to be non-trivial, so a test cannot pass by
// comparing zeros with zeros.
template <class G, class W>
void expect_close(const G& got, const W& want, double rel = 1e-4, double floor_frac = 1e-5) {
  REQUIRE(got.size() == want.size());
  double maxabs = 0.0;
  for (auto w : want) maxabs = std::max(maxabs, std::fabs(static_cast<double>(w)));
  const double floor = floor_frac * maxabs;
  int64_t bad = -1;
  for (size_t i = 0; i < got.size() && bad < 0; ++i) {
    const double g = got[i], w = want[i];
    if (!(std::fabs(g - w) <= rel * std::fabs(w) + floor)) bad = static_cast<int64_t>(i);
  }
  INFO("first mismatch at " << bad << ": got "
                            << (bad >= 0 ? static_cast<double>(got[bad]) : 0.0) << " want "
                            << (bad >= 0 ? static_cast<double>(want[bad]) : 0.0));
  CHECK(bad == -1);
  CHECK(maxabs > 0.0);
}

// ---------------------------------------------------------------- GEMM
DVec ref_gemm(bool ta, bool tb, int M, int N, int K, double alpha, const Vec& A, int lda,
              const Vec& B, int ldb, double beta, const Vec& C, int ldc) {
  DVec out(C.begin(), C.end());
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j) {
      double acc = 0.0;
      for (int k = 0; k < K; ++k) {
        const double a = ta ? A[k * lda + i] : A[i * lda + k];
        const double b = tb ? B[j * ldb + k] : B[k * ldb + j];
        acc += a * b;
      }
      out[i * ldc + j] = alpha * acc + beta * C[i * ldc + j];
    }
  return out;
}

// ---------------------------------------------------------------- conv
Conv2dShape conv_shape(int64_t N, int64_t C, int64_t H, int64_t W, int64_t K, int64_t R,
                       int64_t S, int64_t sh, int64_t sw, int64_t ph, int64_t pw) {
  Conv2dShape s{N, C, H, W, K, R, S, sh, sw, ph, pw, 0, 0};
  s.P = Conv2dShape::out_size(H, R, sh, ph);
  s.Q = Conv2dShape::out_size(W, S, sw, pw);
  return s;
}

// Calls f(n, k, c, p, q, r, t, x_index) for every in-bounds tap.
template <class F>
void for_each_tap(const Conv2dShape& s, F f) {
  for (int64_t n = 0; n < s.N; ++n)
    for (int64_t k = 0; k < s.K; ++k)
      for (int64_t c = 0; c < s.C; ++c)
        for (int64_t p = 0; p < s.P; ++p)
          for (int64_t q = 0; q < s.Q; ++q)
            for (int64_t r = 0; r < s.R; ++r)
              for (int64_t t = 0; t < s.S; ++t) {
                const int64_t h = p * s.stride_h - s.pad_h + r, w = q * s.stride_w - s.pad_w + t;
                if (h < 0 || h >= s.H || w < 0 || w >= s.W) continue;
                f(((n * s.K + k) * s.P + p) * s.Q + q, ((k * s.C + c) * s.R + r) * s.S + t,
                  ((n * s.C + c) * s.H + h) * s.W + w);
              }
}

// ---------------------------------------------------------------- pooling
Pool2dShape pool_shape(int64_t N, int64_t C, int64_t H, int64_t W, int64_t kh, int64_t kw,
                       int64_t sh, int64_t sw, int64_t ph, int64_t pw) {
  return {N, C, H, W, kh, kw, sh, sw, ph, pw, (H + 2 * ph - kh) / sh + 1,
          (W + 2 * pw - kw) / sw + 1};
}

}  // namespace

TEST_CASE("scratch gives aligned, per-slot, grow-only buffers", "[cpu][scratch]") {
  float* a = cpu::scratch(100, 0);
  float* b = cpu::scratch(100, 1);
  REQUIRE(a != nullptr);
  REQUIRE(b != nullptr);
  CHECK(a != b);
  CHECK(reinterpret_cast<uintptr_t>(a) % 64 == 0);
  std::fill(a, a + 100, 1.0f);
  std::fill(b, b + 100, 2.0f);
  CHECK(a[99] == 1.0f);
  CHECK(cpu::scratch(50, 0) == a);  // smaller request: no reallocation
  float* big = cpu::scratch(1 << 20, 0);
  big[(1 << 20) - 1] = 3.0f;
  CHECK(cpu::scratch(1000, 0) == big);
  CHECK_THROWS(cpu::scratch(10, 4));
}

TEST_CASE("gemm matches reference in all transpose combos", "[cpu][gemm]") {
  const int M = 7, N = 5, K = 9;
  for (int combo = 0; combo < 4; ++combo) {
    const bool ta = combo & 1, tb = combo & 2;
    DYNAMIC_SECTION("trans_a=" << ta << " trans_b=" << tb) {
      // Leading dimensions larger than minimal; padding columns must survive.
      const int lda = (ta ? M : K) + 3, ldb = (tb ? K : N) + 2, ldc = N + 4;
      const Vec A = random_vec((ta ? K : M) * lda, 1 + combo);
      const Vec B = random_vec((tb ? N : K) * ldb, 11 + combo);
      Vec C = random_vec(M * ldc, 21 + combo);
      const DVec want = ref_gemm(ta, tb, M, N, K, 0.7, A, lda, B, ldb, 0.3, C, ldc);
      cpu::gemm(ta, tb, M, N, K, 0.7f, A.data(), lda, B.data(), ldb, 0.3f, C.data(), ldc);
      expect_close(C, want);
    }
  }
  SECTION("beta = 0 overwrites NaN, K = 0 scales C") {
    const Vec A = random_vec(3 * 4, 5), B = random_vec(4 * 2, 6);
    Vec C(3 * 2, kNaN);
    cpu::gemm(false, false, 3, 2, 4, 1.0f, A.data(), 4, B.data(), 2, 0.0f, C.data(), 2);
    const DVec want = ref_gemm(false, false, 3, 2, 4, 1.0, A, 4, B, 2, 0.0, Vec(6, 0.0f), 2);
    expect_close(C, want);
    Vec D = {1, 2, 3, 4};
    cpu::gemm(false, false, 2, 2, 0, 1.0f, A.data(), 1, B.data(), 2, 0.5f, D.data(), 2);
    CHECK(D == Vec{0.5f, 1.0f, 1.5f, 2.0f});
  }
}

namespace {

// Runs forward (with and without bias), backward-data and backward-weight
// (with and without dbias) of shape s against double-precision direct
// sums. floor_frac: see expect_close (Winograd's transforms round more
// than a direct sum; its errors are about 1e-5 of the output's scale).
void check_conv(const Conv2dShape& s, uint32_t seed, double floor_frac = 1e-5) {
  const size_t nx = s.N * s.C * s.H * s.W, nw = s.K * s.C * s.R * s.S, ny = s.N * s.K * s.P * s.Q;
  const Vec x = random_vec(nx, 100 + seed), w = random_vec(nw, 200 + seed),
            bias = random_vec(s.K, 300 + seed), dy = random_vec(ny, 400 + seed);
  DVec y_ref(ny, 0.0), dx_ref(nx, 0.0), dw_ref(nw, 0.0), db_ref(s.K, 0.0);
  for_each_tap(s, [&](int64_t yi, int64_t wi, int64_t xi) {
    y_ref[yi] += static_cast<double>(x[xi]) * w[wi];
    dx_ref[xi] += static_cast<double>(dy[yi]) * w[wi];
    dw_ref[wi] += static_cast<double>(dy[yi]) * x[xi];
  });
  const int64_t PQ = s.P * s.Q;
  for (size_t i = 0; i < ny; ++i) db_ref[(i / PQ) % s.K] += dy[i];

  Vec y(ny, kNaN);
  cpu::conv2d_forward(s, x.data(), w.data(), nullptr, y.data());
  expect_close(y, y_ref, 1e-4, floor_frac);
  DVec yb_ref(y_ref);
  for (size_t i = 0; i < ny; ++i) yb_ref[i] += bias[(i / PQ) % s.K];
  std::fill(y.begin(), y.end(), kNaN);
  cpu::conv2d_forward(s, x.data(), w.data(), bias.data(), y.data());
  expect_close(y, yb_ref, 1e-4, floor_frac);

  Vec dx(nx, kNaN);
  cpu::conv2d_backward_data(s, dy.data(), w.data(), dx.data());
  expect_close(dx, dx_ref, 1e-4, floor_frac);

  Vec dw(nw, kNaN), db(s.K, kNaN);
  cpu::conv2d_backward_weight(s, x.data(), dy.data(), dw.data(), db.data());
  expect_close(dw, dw_ref, 1e-4, floor_frac);
  expect_close(db, db_ref);
  std::fill(dw.begin(), dw.end(), kNaN);
  cpu::conv2d_backward_weight(s, x.data(), dy.data(), dw.data(), nullptr);
  expect_close(dw, dw_ref, 1e-4, floor_frac);
}

std::string describe(const Conv2dShape& s) {
  std::ostringstream o;
  o << "N" << s.N << " C" << s.C << " " << s.H << "x" << s.W << " K" << s.K << " " << s.R << "x"
    << s.S << " s" << s.stride_h << s.stride_w << " p" << s.pad_h << s.pad_w;
  return o.str();
}

// Sets the OpenMP thread count for a scope (the kernels pick their
// threading from it), restoring the previous one after.
struct ThreadCount {
  int saved;
  explicit ThreadCount(int n) : saved(omp_get_max_threads()) { omp_set_num_threads(n); }
  ~ThreadCount() { omp_set_num_threads(saved); }
};

}  // namespace

TEST_CASE("conv2d forward and backward match the direct loops", "[cpu][conv]") {
  const std::vector<Conv2dShape> shapes = {
      conv_shape(1, 1, 7, 9, 2, 3, 3, 1, 1, 0, 0),
      conv_shape(5, 3, 11, 10, 4, 3, 2, 2, 1, 1, 1),  // non-square kernel, stride 2, pad
      conv_shape(2, 3, 8, 8, 5, 5, 5, 1, 1, 2, 2),
      conv_shape(5, 1, 13, 13, 3, 3, 3, 2, 2, 1, 0),
      conv_shape(1, 3, 6, 5, 2, 1, 1, 1, 1, 0, 0),    // 1x1
      conv_shape(3, 2, 9, 7, 3, 4, 3, 3, 2, 1, 2),    // uneven strides and pads
      conv_shape(2, 3, 4, 5, 2, 5, 6, 1, 1, 2, 3),    // kernel wider than the input
      conv_shape(26, 20, 13, 13, 8, 5, 5, 1, 1, 0, 0),  // several chunks + a 1-image tail
      conv_shape(9, 1, 28, 28, 20, 3, 3, 1, 1, 0, 0),   // LeNet conv1 geometry (direct path)
      // Direct path (C*R*S <= 32, stride_w 1): padding, stride_h 2, ragged K and Q tails.
      conv_shape(5, 3, 12, 17, 13, 3, 2, 2, 1, 1, 1),
      conv_shape(1, 2, 9, 12, 7, 4, 4, 1, 1, 2, 0),
      conv_shape(3, 1, 10, 8, 9, 5, 1, 1, 1, 0, 0),
      conv_shape(7, 24, 9, 9, 20, 1, 1, 2, 2, 0, 0),    // ResNet's 1x1 stride-2 shortcut
      conv_shape(6, 16, 10, 9, 24, 3, 3, 2, 2, 1, 1),   // ResNet's strided 3x3
  };
  for (size_t si = 0; si < shapes.size(); ++si) {
    DYNAMIC_SECTION("shape " << si << ": " << describe(shapes[si])) {
      check_conv(shapes[si], static_cast<uint32_t>(si));
    }
  }
}

// 3x3 stride-1 layers with 16+ channels each way take the Winograd F(4x4,
// 3x3) kernels (kernels/cpu/conv_winograd.cpp): partial edge tiles (sizes
// not multiples of 4), every padding 0-2 and unequal ones, channel counts
// that are not multiples of the 8 lanes, one tile per image (ResNet's 4x4
// planes), and batches large enough for each threading form: threads
// taking whole chunks (many tiles), threads sharing each chunk (few tiles,
// N = 1 included), and, for backward-weight, partial sums per group (small
// weights) or per transform position (large weights: 36*K*C*groups > 2^22).
TEST_CASE("conv2d Winograd path matches the direct loops", "[cpu][conv][winograd]") {
  const std::vector<Conv2dShape> shapes = {
      conv_shape(3, 16, 9, 11, 17, 3, 3, 1, 1, 1, 1),   // ragged tiles, K % 8 != 0
      conv_shape(2, 19, 10, 13, 16, 3, 3, 1, 1, 0, 0),  // pad 0: backward-data pads by 2
      conv_shape(2, 16, 7, 6, 21, 3, 3, 1, 1, 2, 2),    // pad 2: backward-data pads by 0
      conv_shape(2, 17, 8, 9, 16, 3, 3, 1, 1, 1, 0),    // unequal paddings
      conv_shape(1, 24, 4, 4, 32, 3, 3, 1, 1, 1, 1),    // one tile, one image
      conv_shape(40, 16, 14, 14, 16, 3, 3, 1, 1, 1, 1), // 640 tiles: chunks per thread
      conv_shape(2, 176, 6, 5, 168, 3, 3, 1, 1, 1, 1),  // large weights: per-xi partial sums
  };
  for (int threads : {1, 2, 3}) {
    ThreadCount tc(threads);
    for (size_t si = 0; si < shapes.size(); ++si) {
      DYNAMIC_SECTION(threads << " threads, shape " << si << ": " << describe(shapes[si])) {
        check_conv(shapes[si], static_cast<uint32_t>(50 + si), 5e-5);
      }
    }
  }
}

// The im2col path with chunks shared out to threads (several images per
// thread) and run in turn (fewer images than threads), at several counts.
TEST_CASE("conv2d im2col path agrees at any thread count", "[cpu][conv]") {
  const std::vector<Conv2dShape> shapes = {
      conv_shape(11, 5, 9, 8, 7, 3, 3, 2, 2, 1, 1),
      conv_shape(2, 6, 7, 7, 9, 3, 2, 1, 1, 1, 0),
      conv_shape(13, 24, 6, 6, 40, 3, 3, 2, 2, 1, 1),
  };
  for (int threads : {1, 3, 4}) {
    ThreadCount tc(threads);
    for (size_t si = 0; si < shapes.size(); ++si) {
      DYNAMIC_SECTION(threads << " threads, shape " << si << ": " << describe(shapes[si])) {
        check_conv(shapes[si], static_cast<uint32_t>(80 + si));
      }
    }
  }
}

TEST_CASE("max pool picks the first maximum and routes gradients", "[cpu][pool]") {
  const std::vector<Pool2dShape> shapes = {
      pool_shape(1, 1, 6, 6, 2, 2, 2, 2, 0, 0),  // LeNet-style 2x2/2 fast path
      pool_shape(2, 3, 7, 9, 2, 2, 2, 2, 0, 0),  // fast path, odd sizes (floor)
      pool_shape(5, 3, 7, 9, 3, 3, 2, 2, 1, 1),  // overlapping k3 s2 with padding
      pool_shape(2, 3, 5, 7, 2, 3, 1, 2, 0, 1),  // non-square window
      pool_shape(3, 2, 8, 6, 3, 2, 2, 1, 1, 0),
      pool_shape(8, 16, 28, 28, 3, 3, 2, 2, 1, 1),  // parallel path
  };
  for (size_t si = 0; si < shapes.size(); ++si) {
    const Pool2dShape& s = shapes[si];
    DYNAMIC_SECTION("shape " << si) {
      const size_t nx = s.N * s.C * s.H * s.W, ny = s.N * s.C * s.P * s.Q;
      const Vec x = random_ints(nx, 500 + si, -3, 3);
      const Vec dy = random_vec(ny, 600 + si);
      std::vector<int64_t> arg_ref(ny);
      Vec y_ref(ny);
      DVec dx_ref(nx, 0.0);
      for (int64_t pl = 0; pl < s.N * s.C; ++pl)
        for (int64_t p = 0; p < s.P; ++p)
          for (int64_t q = 0; q < s.Q; ++q) {
            float best = -std::numeric_limits<float>::infinity();
            int64_t arg = -1;
            for (int64_t i = 0; i < s.kernel_h; ++i)
              for (int64_t j = 0; j < s.kernel_w; ++j) {
                const int64_t h = p * s.stride_h - s.pad_h + i, w = q * s.stride_w - s.pad_w + j;
                if (h < 0 || h >= s.H || w < 0 || w >= s.W) continue;
                const float v = x[pl * s.H * s.W + h * s.W + w];
                if (arg < 0 || v > best) best = v, arg = h * s.W + w;
              }
            const int64_t o = (pl * s.P + p) * s.Q + q;
            y_ref[o] = best;
            arg_ref[o] = arg;
            dx_ref[pl * s.H * s.W + arg] += dy[o];
          }
      Vec y(ny, kNaN);
      std::vector<int64_t> arg(ny, -7);
      cpu::max_pool2d_forward(s, x.data(), y.data(), arg.data());
      CHECK(y == y_ref);
      CHECK(arg == arg_ref);
      Vec dx(nx, kNaN);
      cpu::max_pool2d_backward(s, dy.data(), arg.data(), dx.data());
      expect_close(dx, dx_ref);
    }
  }
  SECTION("windows of -inf still select a real element; NaN propagates") {
    const Pool2dShape s = pool_shape(1, 1, 3, 3, 2, 2, 2, 2, 1, 1);
    const float inf = std::numeric_limits<float>::infinity();
    Vec x(9, -inf);
    x[4] = kNaN;
    Vec y(4);
    std::vector<int64_t> arg(4);
    cpu::max_pool2d_forward(s, x.data(), y.data(), arg.data());
    CHECK(arg == std::vector<int64_t>{0, 1, 3, 4});
    CHECK(y[0] == -inf);
    CHECK(std::isnan(y[3]));
    // Same on the 2x2/stride-2 fast path: the first NaN in scan order wins.
    const Pool2dShape f = pool_shape(1, 1, 2, 4, 2, 2, 2, 2, 0, 0);
    const Vec xf = {1.0f, kNaN, 7.0f, 2.0f, kNaN, 5.0f, -inf, 3.0f};
    Vec yf(2);
    std::vector<int64_t> af(2);
    cpu::max_pool2d_forward(f, xf.data(), yf.data(), af.data());
    CHECK(af == std::vector<int64_t>{1, 2});
    CHECK(std::isnan(yf[0]));
    CHECK(yf[1] == 7.0f);
  }
}

TEST_CASE("avg pool divides by the whole window including padding", "[cpu][pool]") {
  const std::vector<Pool2dShape> shapes = {
      pool_shape(1, 1, 6, 6, 2, 2, 2, 2, 0, 0),     // 2x2/2 fast path, scalar tail only
      pool_shape(1, 3, 7, 9, 2, 2, 2, 2, 0, 0),     // fast path, odd H/W: last row/col get 0
      pool_shape(2, 3, 35, 37, 2, 2, 2, 2, 0, 0),   // fast path, SIMD body + tail, odd H/W
      pool_shape(8, 20, 26, 26, 2, 2, 2, 2, 0, 0),  // LeNet pool1 geometry, parallel
      pool_shape(5, 3, 7, 9, 3, 3, 2, 2, 1, 1),
      pool_shape(2, 1, 5, 8, 3, 2, 1, 2, 1, 1),
      pool_shape(8, 16, 28, 28, 3, 3, 2, 2, 1, 1),
      pool_shape(1, 3, 11, 10, 3, 2, 3, 3, 0, 0),   // disjoint windows with gaps
      pool_shape(2, 3, 9, 8, 2, 3, 3, 3, 1, 1),     // disjoint windows, padding
      pool_shape(1, 1, 5, 5, 2, 2, 3, 3, 2, 2),     // window entirely in padding
  };
  for (size_t si = 0; si < shapes.size(); ++si) {
    const Pool2dShape& s = shapes[si];
    DYNAMIC_SECTION("shape " << si) {
      const size_t nx = s.N * s.C * s.H * s.W, ny = s.N * s.C * s.P * s.Q;
      const Vec x = random_vec(nx, 700 + si), dy = random_vec(ny, 800 + si);
      DVec y_ref(ny, 0.0), dx_ref(nx, 0.0);
      const double area = static_cast<double>(s.kernel_h * s.kernel_w);
      for (int64_t pl = 0; pl < s.N * s.C; ++pl)
        for (int64_t p = 0; p < s.P; ++p)
          for (int64_t q = 0; q < s.Q; ++q)
            for (int64_t i = 0; i < s.kernel_h; ++i)
              for (int64_t j = 0; j < s.kernel_w; ++j) {
                const int64_t h = p * s.stride_h - s.pad_h + i, w = q * s.stride_w - s.pad_w + j;
                if (h < 0 || h >= s.H || w < 0 || w >= s.W) continue;
                const int64_t o = (pl * s.P + p) * s.Q + q, xi = pl * s.H * s.W + h * s.W + w;
                y_ref[o] += x[xi] / area;
                dx_ref[xi] += dy[o] / area;
              }
      Vec y(ny, kNaN), dx(nx, kNaN);
      cpu::avg_pool2d_forward(s, x.data(), y.data());
      expect_close(y, y_ref);
      cpu::avg_pool2d_backward(s, dy.data(), dx.data());
      expect_close(dx, dx_ref);
    }
  }
}

TEST_CASE("elementwise ops", "[cpu][elementwise]") {
  for (const int64_t n : {int64_t{13}, int64_t{100003}}) {  // serial and OpenMP paths
    DYNAMIC_SECTION("n = " << n) {
      Vec a = random_vec(n, 900), b = random_vec(n, 901);
      a[0] = 0.0f;  // relu at exactly zero
      Vec y(n, kNaN);
      DVec want(n);

      cpu::pointwise_forward(PointwiseOp::kRelu, n, a.data(), y.data());
      for (int64_t i = 0; i < n; ++i) want[i] = a[i] > 0 ? a[i] : 0.0;
      CHECK(std::equal(y.begin(), y.end(), want.begin()));
      {  // NaN stays NaN (as torch.relu), -0 stays -0
        Vec odd = {kNaN, -0.0f, -2.0f}, out(3);
        cpu::pointwise_forward(PointwiseOp::kRelu, 3, odd.data(), out.data());
        CHECK(std::isnan(out[0]));
        CHECK(std::signbit(out[1]));
        CHECK(out[2] == 0.0f);
      }
      Vec dx(n, kNaN);
      cpu::pointwise_backward(PointwiseOp::kRelu, n, y.data(), b.data(), dx.data());
      for (int64_t i = 0; i < n; ++i) want[i] = y[i] > 0 ? b[i] : 0.0;
      CHECK(std::equal(dx.begin(), dx.end(), want.begin()));
      CHECK(dx[0] == 0.0f);

      cpu::add(n, a.data(), b.data(), y.data());
      for (int64_t i = 0; i < n; ++i) want[i] = static_cast<double>(a[i]) + b[i];
      expect_close(y, want);

      Vec z = b;
      cpu::axpy(n, -0.37f, a.data(), z.data());
      for (int64_t i = 0; i < n; ++i) want[i] = b[i] - 0.37 * a[i];
      expect_close(z, want);

      cpu::scale(n, 2.5f, a.data(), y.data());
      for (int64_t i = 0; i < n; ++i) want[i] = 2.5 * a[i];
      expect_close(y, want);

      cpu::fill(n, 1.25f, y.data());
      CHECK(std::all_of(y.begin(), y.end(), [](float v) { return v == 1.25f; }));

      double total = 0.0;
      for (float v : a) total += v;
      const Vec s{cpu::sum(n, a.data())};
      expect_close(s, DVec{total});
    }
  }
  SECTION("sum of nothing and of many ones") {
    CHECK(cpu::sum(0, nullptr) == 0.0f);
    Vec ones(1 << 24, 1.0f);  // float accumulation would stall at 2^24
    ones.push_back(1.0f);
    CHECK(cpu::sum(static_cast<int64_t>(ones.size()), ones.data()) == 16777216.0f);
  }
}

TEST_CASE("pointwise silu against FP64, tails and NaN included", "[cpu][elementwise]") {
  // y = x / (1 + e^-x): expf (1 ulp in glibc), one addition of positive
  // terms and one division give at most about 3 ulps, so 8 * 2^-24 relative
  // is a bound with room. dx = dy s (1 + x (1 - s)): 1 - s cancels for large
  // x, where the rounding of s (2^-24 absolute) is multiplied by x, hence an
  // absolute term in |x|.
  for (const int64_t n : {int64_t{13}, int64_t{100003}}) {  // serial and OpenMP paths
    DYNAMIC_SECTION("n = " << n) {
      Vec x = random_vec(n, 910), dy = random_vec(n, 911);
      for (float& v : x) v *= 12.0f;  // [-12, 12)
      x[0] = 0.0f;
      x[1] = -100.0f;  // e^100 overflows: y is -0, dx is 0
      x[2] = 100.0f;
      x[3] = kNaN;
      Vec y(n), dx(n);
      cpu::pointwise_forward(PointwiseOp::kSilu, n, x.data(), y.data());
      cpu::pointwise_backward(PointwiseOp::kSilu, n, x.data(), dy.data(), dx.data());
      const double eps = std::ldexp(1.0, -24);
      for (int64_t i = 4; i < n; ++i) {
        const double xd = x[i], s = 1.0 / (1.0 + std::exp(-xd));
        const double want_y = xd * s, want_dx = dy[i] * s * (1.0 + xd * (1.0 - s));
        INFO("x = " << x[i] << ", dy = " << dy[i]);
        REQUIRE(std::fabs(y[i] - want_y) <= 8 * eps * std::fabs(want_y));
        REQUIRE(std::fabs(dx[i] - want_dx) <= 8 * eps * (1 + std::fabs(xd)) * std::fabs(dy[i]));
      }
      CHECK(y[0] == 0.0f);
      CHECK(dx[0] == 0.5f * dy[0]);  // silu'(0) = 1/2
      CHECK((y[1] == 0.0f && std::signbit(y[1])));
      CHECK(dx[1] == 0.0f);
      CHECK(y[2] == 100.0f);
      CHECK(dx[2] == dy[2]);
      CHECK(std::isnan(y[3]));
      CHECK(std::isnan(dx[3]));
    }
  }
}

TEST_CASE("channel bias and channel sums", "[cpu][elementwise]") {
  struct Dims {
    int64_t outer, C, inner;
  };
  for (const Dims d : {Dims{5, 3, 7}, Dims{1, 1, 9}, Dims{3, 130, 1}, Dims{64, 20, 676},
                       Dims{700, 77, 1}}) {
    DYNAMIC_SECTION("outer " << d.outer << " C " << d.C << " inner " << d.inner) {
      const int64_t n = d.outer * d.C * d.inner;
      const Vec x = random_vec(n, 1000), bias = random_vec(d.C, 1001);
      Vec y(n, kNaN), db(d.C, kNaN);
      DVec want(n), db_ref(d.C, 0.0);
      for (int64_t i = 0; i < n; ++i) {
        const int64_t c = (i / d.inner) % d.C;
        want[i] = static_cast<double>(x[i]) + bias[c];
        db_ref[c] += x[i];
      }
      cpu::add_channel_bias(d.outer, d.C, d.inner, x.data(), bias.data(), y.data());
      expect_close(y, want);
      cpu::channel_sum(d.outer, d.C, d.inner, x.data(), db.data());
      expect_close(db, db_ref);
    }
  }
}

TEST_CASE("softmax cross-entropy", "[cpu][softmax]") {
  struct Dims {
    int64_t N, C;
  };
  // Label smoothing e: the target is (1 - e) onehot + e / C (e = 1: uniform).
  for (const Dims d : {Dims{1, 1}, Dims{5, 7}, Dims{3, 10}, Dims{1000, 37}})
  for (const float smoothing : {0.0f, 0.1f, 1.0f}) {
    DYNAMIC_SECTION("N " << d.N << " C " << d.C << " label smoothing " << smoothing) {
      // Large logits: a naive exp would overflow.
      const Vec logits = random_vec(d.N * d.C, 1100, -90.0f, 120.0f);
      std::vector<int64_t> labels(d.N);
      for (int64_t i = 0; i < d.N; ++i) labels[i] = (i * 7 + 3) % d.C;
      const Vec dloss = random_vec(d.N, 1101, 0.5f, 2.0f);
      Vec loss(d.N, kNaN), probs(d.N * d.C, kNaN), dlogits(d.N * d.C, kNaN);
      cpu::softmax_cross_entropy_forward(d.N, d.C, logits.data(), labels.data(), smoothing,
                                         loss.data(), probs.data());
      DVec loss_ref(d.N), probs_ref(d.N * d.C), dl_ref(d.N * d.C);
      for (int64_t i = 0; i < d.N; ++i) {
        const float* x = &logits[i * d.C];
        const double mx = *std::max_element(x, x + d.C);
        double se = 0.0;
        for (int64_t j = 0; j < d.C; ++j) se += std::exp(x[j] - mx);
        const double lse = mx + std::log(se);
        // -sum_j q_j log p_j, written straight from the definition.
        loss_ref[i] = 0.0;
        double row = 0.0;
        for (int64_t j = 0; j < d.C; ++j) {
          const double q = (1.0 - smoothing) * (j == labels[i]) + double(smoothing) / d.C;
          loss_ref[i] -= q * (x[j] - lse);
          probs_ref[i * d.C + j] = std::exp(x[j] - lse);
          dl_ref[i * d.C + j] = (probs_ref[i * d.C + j] - q) * dloss[i];
          row += probs[i * d.C + j];
        }
        CHECK(row == Approx(1.0).epsilon(1e-5));
      }
      if (d.C > 1) {
        expect_close(loss, loss_ref, 1e-4, 1e-6);
      } else {
        CHECK(loss[0] == 0.0f);  // a single class costs nothing
      }
      expect_close(probs, probs_ref, 1e-4, 1e-6);
      cpu::softmax_cross_entropy_backward(d.N, d.C, probs.data(), labels.data(), smoothing,
                                          dloss.data(), dlogits.data());
      if (d.C > 1) {
        expect_close(dlogits, dl_ref, 1e-4, 1e-6);
      } else {
        CHECK(dlogits[0] == 0.0f);
      }
    }
  }
}

namespace {

// Double-precision batch norm forward (training statistics): the oracle for
// the kernel's forward and, through finite differences, its backward.
DVec bn_train_ref(int64_t N, int64_t C, int64_t HW, const DVec& x, const DVec& g, const DVec& b,
                  double eps, DVec* mean_out = nullptr, DVec* var_out = nullptr) {
  DVec y(x.size());
  for (int64_t c = 0; c < C; ++c) {
    double m = 0.0, v = 0.0;
    for (int64_t n = 0; n < N; ++n)
      for (int64_t i = 0; i < HW; ++i) m += x[(n * C + c) * HW + i];
    m /= N * HW;
    for (int64_t n = 0; n < N; ++n)
      for (int64_t i = 0; i < HW; ++i) v += std::pow(x[(n * C + c) * HW + i] - m, 2);
    v /= N * HW;
    if (mean_out) (*mean_out)[c] = m;
    if (var_out) (*var_out)[c] = v;
    for (int64_t n = 0; n < N; ++n)
      for (int64_t i = 0; i < HW; ++i) {
        const int64_t k = (n * C + c) * HW + i;
        y[k] = (x[k] - m) / std::sqrt(v + eps) * g[c] + b[c];
      }
  }
  return y;
}

DVec to_d(const Vec& v) { return DVec(v.begin(), v.end()); }

}  // namespace

TEST_CASE("batch norm train / eval / backward", "[cpu][batchnorm]") {
  struct Dims {
    int64_t N, C, HW;
  };
  const float eps = 1e-5f, momentum = 0.1f;
  for (const Dims d : {Dims{5, 3, 7}, Dims{1, 2, 9}, Dims{4, 1, 1}, Dims{8, 16, 300}}) {
    DYNAMIC_SECTION("N " << d.N << " C " << d.C << " HW " << d.HW) {
      const int64_t n = d.N * d.C * d.HW, M = d.N * d.HW;
      Vec x = random_vec(n, 1200, -2.0f, 3.0f);
      for (auto& v : x) v += 5.0f;  // non-zero mean
      const Vec gamma = random_vec(d.C, 1201, 0.5f, 1.5f), beta = random_vec(d.C, 1202);
      const Vec rm0 = random_vec(d.C, 1203), rv0 = random_vec(d.C, 1204, 0.5f, 2.0f);
      Vec rm = rm0, rv = rv0, sm(d.C, kNaN), si(d.C, kNaN), y(n, kNaN);
      cpu::batch_norm_forward_train(d.N, d.C, d.HW, x.data(), gamma.data(), beta.data(), eps,
                                    momentum, rm.data(), rv.data(), sm.data(), si.data(),
                                    y.data());
      DVec mean(d.C), var(d.C);
      const DVec y_ref =
          bn_train_ref(d.N, d.C, d.HW, to_d(x), to_d(gamma), to_d(beta), eps, &mean, &var);
      expect_close(y, y_ref);
      DVec rm_ref(d.C), rv_ref(d.C), si_ref(d.C);
      for (int64_t c = 0; c < d.C; ++c) {
        si_ref[c] = 1.0 / std::sqrt(var[c] + eps);
        rm_ref[c] = 0.9 * rm0[c] + 0.1 * mean[c];
        rv_ref[c] = 0.9 * rv0[c] + 0.1 * var[c] * (M > 1 ? double(M) / (M - 1) : 1.0);
      }
      expect_close(sm, mean);
      expect_close(si, si_ref);
      expect_close(rm, rm_ref);
      expect_close(rv, rv_ref);

      // Null running stats are allowed and give the same output.
      Vec y2(n, kNaN);
      cpu::batch_norm_forward_train(d.N, d.C, d.HW, x.data(), gamma.data(), beta.data(), eps,
                                    momentum, nullptr, nullptr, sm.data(), si.data(), y2.data());
      CHECK(y2 == y);

      // Eval uses the running statistics.
      cpu::batch_norm_forward_eval(d.N, d.C, d.HW, x.data(), gamma.data(), beta.data(),
                                   rv0.data() /* as mean */, rv0.data(), eps, y2.data());
      DVec ye_ref(n);
      for (int64_t i = 0; i < n; ++i) {
        const int64_t c = (i / d.HW) % d.C;
        ye_ref[i] = (x[i] - rv0[c]) / std::sqrt(double(rv0[c]) + eps) * gamma[c] + beta[c];
      }
      expect_close(y2, ye_ref);

      // Backward of L = sum(y * r) against central differences of the
      // double-precision forward (feasible on the small shapes).
      const Vec r = random_vec(n, 1205);
      Vec dx(n, kNaN), dg(d.C, kNaN), db(d.C, kNaN);
      cpu::batch_norm_backward_train(d.N, d.C, d.HW, x.data(), gamma.data(), sm.data(),
                                     si.data(), r.data(), dx.data(), dg.data(), db.data());
      if (M == 1) return;  // var = 0: the gradient is dominated by eps; skip
      DVec xd = to_d(x), gd = to_d(gamma), bd = to_d(beta);
      auto loss = [&]() {
        const DVec yy = bn_train_ref(d.N, d.C, d.HW, xd, gd, bd, eps);
        double L = 0.0;
        for (int64_t i = 0; i < n; ++i) L += yy[i] * r[i];
        return L;
      };
      auto central = [&](double& v) {
        const double h = 1e-4, keep = v;
        v = keep + h;
        const double up = loss();
        v = keep - h;
        const double down = loss();
        v = keep;
        return (up - down) / (2 * h);
      };
      DVec dg_fd(d.C), db_fd(d.C);
      for (int64_t c = 0; c < d.C; ++c) {
        dg_fd[c] = central(gd[c]);
        db_fd[c] = central(bd[c]);
      }
      expect_close(dg, dg_fd);
      expect_close(db, db_fd);
      DVec dx_ref(n);
      if (n <= 200) {
        for (int64_t i = 0; i < n; ++i) dx_ref[i] = central(xd[i]);
      } else {  // closed form in double for the large shape
        for (int64_t i = 0; i < n; ++i) {
          const int64_t c = (i / d.HW) % d.C;
          const double is = 1.0 / std::sqrt(var[c] + eps), xh = (x[i] - mean[c]) * is;
          dx_ref[i] = gamma[c] * is / M * (M * r[i] - db_fd[c] - xh * dg_fd[c]);
        }
      }
      expect_close(dx, dx_ref, 1e-4, 1e-4);
    }
  }
}

TEST_CASE("sgd update follows the PyTorch formula", "[cpu][sgd]") {
  struct Cfg {
    float momentum, wd;
    bool nesterov, first;
  };
  const Cfg cfgs[] = {{0.0f, 0.0f, false, false}, {0.0f, 0.01f, false, false},
                      {0.9f, 0.0f, false, true},  {0.9f, 0.0f, false, false},
                      {0.9f, 5e-4f, true, true},  {0.9f, 5e-4f, true, false},
                      {0.5f, 0.1f, false, false}};
  const float lr = 0.05f;
  for (const int64_t n : {int64_t{13}, int64_t{40000}}) {
    for (size_t ci = 0; ci < std::size(cfgs); ++ci) {
      const Cfg& k = cfgs[ci];
      DYNAMIC_SECTION("n " << n << " mom " << k.momentum << " wd " << k.wd << " nesterov "
                           << k.nesterov << " first " << k.first) {
        Vec p = random_vec(n, 1300), buf = random_vec(n, 1302);
        const Vec g = random_vec(n, 1301);
        if (k.first) std::fill(buf.begin(), buf.end(), kNaN);  // must not be read
        DVec p_ref(n), buf_ref(n);
        for (int64_t i = 0; i < n; ++i) {
          double gg = g[i] + double(k.wd) * p[i];
          if (k.momentum != 0.0f) {
            const double b = k.first ? gg : double(k.momentum) * buf[i] + gg;
            buf_ref[i] = b;
            gg = k.nesterov ? gg + double(k.momentum) * b : b;
          }
          p_ref[i] = p[i] - double(lr) * gg;
        }
        cpu::sgd_update(n, p.data(), g.data(), k.momentum != 0.0f ? buf.data() : nullptr, lr,
                        k.momentum, k.wd, k.nesterov, k.first);
        expect_close(p, p_ref);
        if (k.momentum != 0.0f) expect_close(buf, buf_ref);
      }
    }
  }
}

TEST_CASE("cpu sgd_update over many tensors in one pass gives each its own update's bits",
          "[cpu][sgd]") {
  // Ragged sizes around the 16384-element chunks, one empty, enough in all
  // for the threads to share them; even tensors at their first step (their
  // buffer NaN, never read), odd ones continuing; a bfloat16 copy on every third.
  const std::vector<int64_t> sizes = {1, 16383, 16384, 16385, 0, 40000, 7, 70001, 300};
  for (float momentum : {0.0f, 0.9f})
    for (float wd : {0.0f, 0.01f})
      for (bool nesterov : {false, true}) {
        INFO("momentum " << momentum << ", weight_decay " << wd << ", nesterov " << nesterov);
        std::vector<Vec> p, buf, p_ref, buf_ref, grads;
        std::vector<std::vector<bfloat16>> copy, copy_ref;
        std::vector<SgdEntry> entries;
        for (size_t i = 0; i < sizes.size(); ++i) {
          const auto n = size_t(sizes[i]);
          p.push_back(random_vec(n, uint32_t(1400 + i)));
          buf.push_back(i % 2 == 0 ? Vec(n, kNaN) : random_vec(n, uint32_t(1500 + i)));
          grads.push_back(random_vec(n, uint32_t(1600 + i)));
          copy.emplace_back(n, bfloat16(0.0f));
        }
        p_ref = p, buf_ref = buf, copy_ref = copy;
        for (size_t i = 0; i < sizes.size(); ++i) {
          const bool first = i % 2 == 0, has_copy = i % 3 == 0;
          entries.push_back({p[i].data(), grads[i].data(), momentum != 0.0f ? buf[i].data() : nullptr,
                             has_copy ? copy[i].data() : nullptr, sizes[i], first});
          cpu::sgd_update(sizes[i], p_ref[i].data(), grads[i].data(),
                          momentum != 0.0f ? buf_ref[i].data() : nullptr, 0.05f, momentum, wd,
                          nesterov, first, has_copy ? copy_ref[i].data() : nullptr);
        }
        cpu::sgd_update(entries.data(), entries.size(), 0.05f, momentum, wd, nesterov);
        for (size_t i = 0; i < sizes.size(); ++i) {
          INFO("tensor " << i);
          REQUIRE(std::memcmp(p[i].data(), p_ref[i].data(), p[i].size() * sizeof(float)) == 0);
          REQUIRE(std::memcmp(buf[i].data(), buf_ref[i].data(), buf[i].size() * sizeof(float)) == 0);
          REQUIRE(std::memcmp(copy[i].data(), copy_ref[i].data(), copy[i].size() * 2) == 0);
        }
      }
}

TEST_CASE("cpu count_correct reads bfloat16 logits as themselves", "[cpu]") {
  // Row 0: 1.001 rounds to 1.0 in bfloat16, a tie that the first column wins;
  // in float32 the second column wins. Row 1: the same answer either way.
  const Vec logits = {1.0f, 1.001f, -3.0f, 2.0f};
  const std::vector<int64_t> labels = {1, 1};
  std::vector<bfloat16> narrow;
  for (float v : logits) narrow.push_back(bfloat16(v));
  CHECK(cpu::count_correct(2, 2, logits.data(), labels.data()) == 2);
  CHECK(cpu::count_correct(2, 2, narrow.data(), labels.data()) == 1);
}
