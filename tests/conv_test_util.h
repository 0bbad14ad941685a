// What the tensor-core convolution tests share (tests/test_cuda_conv_tf32.cpp,
// tests/test_cuda_conv_batch256.cpp): the rungs' roundings, shapes, random
// operands, and the bounds of an element against FP64.
//
// The bounds are GEMM rungs 09's and 10's (tests/test_cuda_gemm_mma.cpp
// derives them), each direction a GEMM with reduction length R: C*R*S
// (forward), K*R*S (backward-data), N*P*Q (backward-weight). With S =
// sum |a b| over the terms of an element (unrounded operands) and u the
// operands' unit roundoff (TF32 2^-11, BF16 2^-8), the bound is
//   |d - ref| <= c * 2u * S + 2^-23 |bias|,  c = 1 + u/2 + (R + 1) * 2^-23 / (2u)
// (the bias is added in FP32 after the sum: one rounding); against the FP64
// sum of the operands rounded as the rung rounds them, the FP32 bound
// (R + 2) * 2^-23 * (S~ + |bias|); the control: the result fails
// R * 2^-24 * (S + |bias|), a bound that an FP32 convolution of the
// unrounded operands meets (test_cuda_gemm_mma.cpp says when it applies).
#pragma once
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "core/bfloat16.h"
#include "core/tf32.h"
#include "kernels/cuda/cuda_kernels.h"
#include "core/shapes.h"
#include "tests/cuda_test_util.h"

namespace conv_test {

using Vec = std::vector<float>;
using anvil::Conv2dShape;
namespace cu = anvil::cuda;

// A tensor-core rung: its rung, unit roundoff and rounding.
struct Rung {
  int rung;
  double u;
  double (*round)(float);
  cu::gemm_rungs::Math math;
};
inline double tf32(float x) {
  return double(std::bit_cast<float>(anvil::float_to_tf32_bits(x)));
}
inline double bf16(float x) {
  return double(anvil::bf16_bits_to_float(anvil::float_to_bf16_bits(x)));
}
constexpr Rung kTf32{6, 0x1p-11, tf32, cu::gemm_rungs::Math::kTf32},
    kBf16{7, 0x1p-8, bf16, cu::gemm_rungs::Math::kBf16},
    kBf16Multistage{8, 0x1p-8, bf16, cu::gemm_rungs::Math::kBf16},
    kTf32Multistage{9, 0x1p-11, tf32, cu::gemm_rungs::Math::kTf32};

inline Conv2dShape make_shape(int64_t N, int64_t C, int64_t H, int64_t W, int64_t K, int64_t R,
                              int64_t S, int64_t sh, int64_t sw, int64_t ph, int64_t pw) {
  Conv2dShape s{N, C, H, W, K, R, S, sh, sw, ph, pw, 0, 0};
  s.P = Conv2dShape::out_size(H, R, sh, ph);
  s.Q = Conv2dShape::out_size(W, S, sw, pw);
  return s;
}

inline std::string describe(const Conv2dShape& s) {
  std::ostringstream o;
  o << "N" << s.N << " C" << s.C << " H" << s.H << " W" << s.W << " K" << s.K << " R" << s.R
    << " S" << s.S << " stride " << s.stride_h << "," << s.stride_w << " pad " << s.pad_h << ","
    << s.pad_w << " -> P" << s.P << " Q" << s.Q;
  return o.str();
}

// One output element's sums over its terms a * b.
struct Sums {
  double exact = 0, rounded = 0, mag = 0, mag_rounded = 0;
  void add(float a, float b, double (*round)(float)) {
    exact += double(a) * b;
    rounded += round(a) * round(b);
    mag += std::fabs(double(a) * b);
    mag_rounded += std::fabs(round(a) * round(b));
  }
};

// The worst |d - ref| / bound of a direction's elements (the three
// comparisons at the top of this file).
struct Ratios {
  double bound = 0, fp32 = 0, rounded = 0;
  int64_t R = 0;  // the reduction length
  void check(double d, const Sums& s, double bias, int64_t R_, double u) {
    R = R_;
    const double c = 1 + u / 2 + double(R + 1) * 0x1p-23 / (2 * u), b = std::fabs(bias);
    const double e = std::fabs(d - (s.exact + bias));
    bound = std::max(bound, e / (c * 2 * u * s.mag + 0x1p-23 * b));
    fp32 = std::max(fp32, e / (double(R) * 0x1p-24 * (s.mag + b)));
    rounded = std::max(rounded, std::fabs(d - (s.rounded + bias)) /
                                    (double(R + 2) * 0x1p-23 * (s.mag_rounded + b)));
    if (std::isnan(d)) bound = rounded = std::numeric_limits<double>::infinity();
  }
};

// The offset of [a, b, c, d] in a tensor of [., B, C, D].
inline int64_t at4(int64_t a, int64_t B, int64_t b, int64_t C, int64_t c, int64_t D,
                   int64_t d) {
  return ((a * B + b) * C + c) * D + d;
}

struct Inputs {
  Vec x, w, bias, dy;
};

// Random x, w, bias and dy for s; with bf16_values, x, w and dy rounded to
// bfloat16 (the bias stays float32, as autocast keeps it).
inline Inputs draw(const Conv2dShape& s, uint32_t seed, bool bf16_values) {
  Inputs in{cuda_test::random_floats(size_t(s.N * s.C * s.H * s.W), seed),
            cuda_test::random_floats(size_t(s.K * s.C * s.R * s.S), seed + 1),
            cuda_test::random_floats(size_t(s.K), seed + 2),
            cuda_test::random_floats(size_t(s.N * s.K * s.P * s.Q), seed + 3)};
  if (bf16_values)
    for (Vec* v : {&in.x, &in.w, &in.dy})
      for (float& e : *v) e = float(bf16(e));
  return in;
}

inline std::vector<anvil::bfloat16> to_bf16(const Vec& v) {
  std::vector<anvil::bfloat16> out;
  for (float e : v) out.push_back(anvil::bfloat16(e));
  return out;
}

}  // namespace conv_test
