// kernels/cuda convolution on TF32 tensor cores (rung 06, 06_tf32_mma.cu):
// forward, backward-data and backward-weight against an FP64 reference,
// element by element, on LeNet-like and ragged small shapes (strides, pads,
// a non-square window, more than 64 channels for the 128-row tile, a
// backward-weight that splits K); a control that shows the operands are
// rounded to TF32; in the simulator build, a swapped fragment register in
// the emulated tensor core must break every direction.
//
// The bounds are GEMM rung 09's (tests/test_cuda_gemm_mma.cpp derives
// them), each direction a GEMM with reduction length R: C*R*S (forward),
// K*R*S (backward-data), N*P*Q (backward-weight). With S = sum |a b| over
// the terms of an element (unrounded operands), the TF32 bound is
//   |d - ref| <= c * 2^-10 * S + 2^-23 |bias|,  c = 1 + 2^-12 + R * 2^-13 + 2^-13
// (the bias is added in FP32 after the sum: one rounding); against the FP64
// sum of the operands rounded to TF32, the FP32 bound (R + 2) * 2^-23 *
// (S~ + |bias|); the control: the TF32 result fails R * 2^-24 * (S + |bias|),
// a bound that an FP32 convolution of the unrounded operands meets, asserted
// for R <= 256 only (test_cuda_gemm_mma.cpp says why; LeNet's conv1
// backward-weight at batch 2 has R = 1152 and relies on the rounded-operand
// comparison).
#if defined(ANVIL_CUDA_BACKEND)
#include <catch2/catch.hpp>
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "core/tf32.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/shapes.h"
#include "tests/cuda_test_util.h"
#if defined(ANVIL_CUDA_SIM)
#include "sim/mma_sim.h"
#endif

namespace {

using Vec = std::vector<float>;
using anvil::Conv2dShape;
using cuda_test::DeviceBuffer;
namespace cu = anvil::cuda;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr int kTf32 = 6;
static_assert(kTf32 == cu::kConvFp32Variants + 1 && kTf32 <= cu::kConvVariants);

double tf32(float x) { return double(std::bit_cast<float>(anvil::float_to_tf32_bits(x))); }

Conv2dShape make_shape(int64_t N, int64_t C, int64_t H, int64_t W, int64_t K, int64_t R,
                       int64_t S, int64_t sh, int64_t sw, int64_t ph, int64_t pw) {
  Conv2dShape s{N, C, H, W, K, R, S, sh, sw, ph, pw, 0, 0};
  s.P = Conv2dShape::out_size(H, R, sh, ph);
  s.Q = Conv2dShape::out_size(W, S, sw, pw);
  return s;
}

std::string describe(const Conv2dShape& s) {
  std::ostringstream o;
  o << "N" << s.N << " C" << s.C << " H" << s.H << " W" << s.W << " K" << s.K << " R" << s.R
    << " S" << s.S << " stride " << s.stride_h << "," << s.stride_w << " pad " << s.pad_h << ","
    << s.pad_w << " -> P" << s.P << " Q" << s.Q;
  return o.str();
}

// One output element's sums over its terms a * b.
struct Sums {
  double exact = 0, rounded = 0, mag = 0, mag_rounded = 0;
  void add(float a, float b) {
    exact += double(a) * b;
    rounded += tf32(a) * tf32(b);
    mag += std::fabs(double(a) * b);
    mag_rounded += std::fabs(tf32(a) * tf32(b));
  }
};

// The worst |d - ref| / bound of a direction's elements (the three
// comparisons of the top of this file).
struct Ratios {
  double tf32 = 0, fp32 = 0, rounded = 0;
  int64_t R = 0;  // the reduction length
  void check(double d, const Sums& s, double bias, int64_t R_) {
    R = R_;
    const double c = 1 + 0x1p-12 + double(R) * 0x1p-13 + 0x1p-13, b = std::fabs(bias);
    const double e = std::fabs(d - (s.exact + bias));
    tf32 = std::max(tf32, e / (c * 0x1p-10 * s.mag + 0x1p-23 * b));
    fp32 = std::max(fp32, e / (double(R) * 0x1p-24 * (s.mag + b)));
    rounded = std::max(rounded, std::fabs(d - (s.rounded + bias)) /
                                    (double(R + 2) * 0x1p-23 * (s.mag_rounded + b)));
    if (std::isnan(d)) tf32 = rounded = std::numeric_limits<double>::infinity();
  }
};

struct Result {
  Ratios forward, backward_data, backward_weight;
};

int64_t at4(int64_t a, int64_t B, int64_t b, int64_t C, int64_t c, int64_t D, int64_t d) {
  return ((a * B + b) * C + c) * D + d;
}

// The three directions of rung 6 on random x, w, bias and dy, against FP64.
Result run_shape(const Conv2dShape& s, uint32_t seed) {
  const Vec x = cuda_test::random_floats(size_t(s.N * s.C * s.H * s.W), seed);
  const Vec w = cuda_test::random_floats(size_t(s.K * s.C * s.R * s.S), seed + 1);
  const Vec bias = cuda_test::random_floats(size_t(s.K), seed + 2);
  const Vec dy = cuda_test::random_floats(size_t(s.N * s.K * s.P * s.Q), seed + 3);
  DeviceBuffer<float> d_x(x), d_w(w), d_bias(bias), d_dy(dy);
  DeviceBuffer<float> ws(Vec(cu::conv2d_workspace_floats(kTf32, s), kNaN));
  DeviceBuffer<float> y(Vec(dy.size(), kNaN)), dx(Vec(x.size(), kNaN)), dw(Vec(w.size(), kNaN));
  cu::conv2d_forward(kTf32, s, d_x.ptr, d_w.ptr, d_bias.ptr, y.ptr, ws.ptr, nullptr);
  cu::conv2d_backward_data(kTf32, s, d_dy.ptr, d_w.ptr, dx.ptr, ws.ptr, nullptr);
  cu::conv2d_backward_weight(kTf32, s, d_x.ptr, d_dy.ptr, dw.ptr, nullptr, ws.ptr, nullptr);
  const Vec got_y = y.to_host(), got_dx = dx.to_host(), got_dw = dw.to_host();

  Result r;
  const int64_t crs = s.C * s.R * s.S, krs = s.K * s.R * s.S, npq = s.N * s.P * s.Q;
  // The input pixel tap (r, t) of output (p, q) reads, or -1 in the padding.
  auto pixel = [&](int64_t p, int64_t q, int64_t r_, int64_t t, int64_t& h, int64_t& wi) {
    h = p * s.stride_h - s.pad_h + r_;
    wi = q * s.stride_w - s.pad_w + t;
    return h >= 0 && h < s.H && wi >= 0 && wi < s.W;
  };
  std::vector<Sums> fwd(dy.size()), bwd_d(x.size()), bwd_w(w.size());
  for (int64_t n = 0; n < s.N; ++n)
    for (int64_t k = 0; k < s.K; ++k)
      for (int64_t p = 0; p < s.P; ++p)
        for (int64_t q = 0; q < s.Q; ++q)
          for (int64_t c = 0; c < s.C; ++c)
            for (int64_t r_ = 0; r_ < s.R; ++r_)
              for (int64_t t = 0; t < s.S; ++t) {
                int64_t h, wi;
                if (!pixel(p, q, r_, t, h, wi)) continue;
                const float xv = x[size_t(at4(n, s.C, c, s.H, h, s.W, wi))];
                const float wv = w[size_t(at4(k, s.C, c, s.R, r_, s.S, t))];
                const float gv = dy[size_t(at4(n, s.K, k, s.P, p, s.Q, q))];
                fwd[size_t(at4(n, s.K, k, s.P, p, s.Q, q))].add(wv, xv);
                bwd_d[size_t(at4(n, s.C, c, s.H, h, s.W, wi))].add(wv, gv);
                bwd_w[size_t(at4(k, s.C, c, s.R, r_, s.S, t))].add(gv, xv);
              }
  for (size_t i = 0; i < fwd.size(); ++i)
    r.forward.check(got_y[i], fwd[i], bias[i / size_t(s.P * s.Q) % size_t(s.K)], crs);
  for (size_t i = 0; i < bwd_d.size(); ++i) r.backward_data.check(got_dx[i], bwd_d[i], 0, krs);
  for (size_t i = 0; i < bwd_w.size(); ++i) r.backward_weight.check(got_dw[i], bwd_w[i], 0, npq);
  return r;
}

void require_within(const Ratios& r, const char* direction) {
  INFO(direction << " (reduction " << r.R << "): worst error / bound: TF32 bound " << r.tf32
                 << ", FP32 bound (control) " << r.fp32 << ", rounded operands, FP32 bound "
                 << r.rounded);
  REQUIRE(r.tf32 <= 1.0);
  REQUIRE(r.rounded <= 1.0);
  if (r.R <= 256) REQUIRE(r.fp32 > 4.0);  // the control: TF32 rounding is active
}

}  // namespace

TEST_CASE("cuda conv tf32: rung 6 is within the TF32 bound of FP64 in every direction",
          "[cuda][conv][tf32]") {
  if (!cuda_test::have_device()) return;
  // LeNet's conv1 at batch 2 (backward-weight's N*P*Q = 1152 splits K) and
  // conv2 at batch 1; strides, pads and a non-square window, ragged; more
  // than 64 channels both ways (the 128-row tile in every direction).
  const Conv2dShape shapes[] = {make_shape(2, 1, 28, 28, 6, 5, 5, 1, 1, 0, 0),
                                make_shape(1, 6, 12, 12, 16, 5, 5, 1, 1, 0, 0),
                                make_shape(2, 3, 9, 8, 5, 3, 2, 2, 1, 1, 0),
                                make_shape(1, 68, 5, 6, 66, 3, 3, 1, 1, 1, 1)};
  REQUIRE(cu::conv2d_workspace_floats(kTf32, shapes[0]) >= 2 * 6 * 25);  // a split
  uint32_t seed = 40;
  for (const Conv2dShape& s : shapes) {
    INFO(describe(s));
    const Result r = run_shape(s, seed += 5);
    require_within(r.forward, "forward");
    require_within(r.backward_data, "backward-data");
    require_within(r.backward_weight, "backward-weight");
  }
}

#if defined(ANVIL_CUDA_SIM)
TEST_CASE("cuda conv tf32: a swapped fragment register in the emulated tensor core breaks rung 6",
          "[cuda][conv][tf32][sim]") {
  namespace mma = anvil::sim::mma;
  const Conv2dShape s = make_shape(2, 3, 9, 8, 5, 3, 2, 2, 1, 1, 0);
  mma::set_register_swap(mma::Operand::kA, 1, 2);
  Result broken;
  try {
    broken = run_shape(s, 3);
  } catch (...) {
    mma::clear_register_swap();
    throw;
  }
  mma::clear_register_swap();
  INFO("worst error / TF32 bound with A:1:2 swapped: forward " << broken.forward.tf32
       << ", backward-data " << broken.backward_data.tf32 << ", backward-weight "
       << broken.backward_weight.tf32);
  REQUIRE(broken.forward.tf32 > 10.0);
  REQUIRE(broken.backward_data.tf32 > 10.0);
  REQUIRE(broken.backward_weight.tf32 > 10.0);
  const Result fixed = run_shape(s, 3);  // right again without the swap
  REQUIRE(fixed.forward.tf32 <= 1.0);
  REQUIRE(fixed.backward_data.tf32 <= 1.0);
  REQUIRE(fixed.backward_weight.tf32 <= 1.0);
}
#endif

#endif  // ANVIL_CUDA_BACKEND
