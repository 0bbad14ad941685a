// core/precision.h: the float32 precision settings and what each backend does
// under them. On the CPU, bitwise: ieee is the exact FP32 algorithm (no
// Winograd), tf32 is that algorithm on operands rounded by core/tf32.h's
// rule, the bias gradient stays FP32. On cuda:0 (simulated or real): the
// default runs convolutions on the TF32 rung and matmuls on the FP32 one,
// and the CPU's emulation agrees with the tensor cores to within FP32
// summation order, a bound that the unrounded FP32 result breaks.
#include <catch2/catch.hpp>
#include <bit>
#include <cmath>
#include <vector>

#include "core/backend.h"
#include "core/ops.h"
#include "core/precision.h"
#include "core/random.h"
#include "core/tensor.h"
#include "core/tf32.h"
#include "kernels/cpu/cpu_kernels.h"
#include "core/shapes.h"
#include "tests/tensor_util.h"
#if defined(ANVIL_CUDA_BACKEND)
#include "tests/cuda_test_util.h"
#endif

using namespace anvil;
using anvil::test::uniform;
using Catch::Contains;

namespace {

using Vec = std::vector<float>;

Vec rounded(const Vec& v) {
  Vec r(v.size());
  cpu::round_to_tf32(int64_t(v.size()), v.data(), r.data());
  return r;
}

bool bitwise_equal(const Vec& a, const Vec& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::bit_cast<uint32_t>(a[i]) != std::bit_cast<uint32_t>(b[i])) return false;
  return true;
}

// A ResNet-like 3x3 layer: the CPU's Winograd kernels take it by default.
Conv2dShape resnet_like() {
  Conv2dShape s{2, 16, 6, 6, 16, 3, 3, 1, 1, 1, 1, 0, 0};
  s.P = Conv2dShape::out_size(s.H, s.R, 1, 1);
  s.Q = Conv2dShape::out_size(s.W, s.S, 1, 1);
  return s;
}

Vec forward(const Conv2dShape& s, const Tensor& x, const Tensor& w, const Tensor& b) {
  Tensor y = Tensor::empty({s.N, s.K, s.P, s.Q});
  backend_for(Device::cpu()).conv2d_forward(s, x, w, b, y);
  return y.to_vector();
}

}  // namespace

TEST_CASE("fp32 precision: PyTorch's defaults, the words, and a scope that restores",
          "[precision]") {
  REQUIRE(fp32_precision(OpFamily::kConv) == Fp32Precision::kDefault);
  REQUIRE(fp32_precision(OpFamily::kMatmul) == Fp32Precision::kDefault);
  // cudnn.allow_tf32 is on, matmuls stay FP32; the CPU never rounds unasked.
  CHECK(fp32_math(OpFamily::kConv, DeviceType::CUDA) == Fp32Math::kTf32);
  CHECK(fp32_math(OpFamily::kMatmul, DeviceType::CUDA) == Fp32Math::kFp32);
  CHECK(fp32_math(OpFamily::kConv, DeviceType::CPU) == Fp32Math::kFp32Fast);
  CHECK(fp32_math(OpFamily::kMatmul, DeviceType::CPU) == Fp32Math::kFp32);
  CHECK(describe_fp32_math(DeviceType::CUDA) == "conv TF32 (tensor cores), matmul FP32");
  {
    ScopedFp32Precision all(Fp32Precision::kTf32);
    CHECK(fp32_math(OpFamily::kMatmul, DeviceType::CPU) == Fp32Math::kTf32);
    CHECK(describe_fp32_math(DeviceType::CPU) == "conv TF32 (emulated), matmul TF32 (emulated)");
    ScopedFp32Precision inner(Fp32Precision::kIeee, Fp32Precision::kDefault);
    CHECK(fp32_math(OpFamily::kConv, DeviceType::CUDA) == Fp32Math::kFp32);
    CHECK(fp32_math(OpFamily::kMatmul, DeviceType::CUDA) == Fp32Math::kFp32);
  }
  CHECK(fp32_precision(OpFamily::kConv) == Fp32Precision::kDefault);
  CHECK(fp32_precision(OpFamily::kMatmul) == Fp32Precision::kDefault);
  for (const char* word : {"default", "ieee", "tf32"})
    CHECK(to_string(parse_fp32_precision(word)) == std::string(word));
  CHECK_THROWS_WITH(parse_fp32_precision("high"),
                    Contains("'high'") && Contains("default, ieee or tf32"));
}

TEST_CASE("fp32 precision on the cpu: tf32 rounds the operands as a tensor core, ieee rules "
          "Winograd out",
          "[precision]") {
  const Conv2dShape s = resnet_like();
  const Tensor x = uniform({s.N, s.C, s.H, s.W}, 1), w = uniform({s.K, s.C, s.R, s.S}, 2),
               b = uniform({s.K}, 3), dy = uniform({s.N, s.K, s.P, s.Q}, 4);
  const Vec xv = x.to_vector(), wv = w.to_vector(), bv = b.to_vector(), dyv = dy.to_vector();
  const Vec xr = rounded(xv), wr = rounded(wv), dyr = rounded(dyv);
  auto conv_ref = [&](const Vec& xs, const Vec& ws, cpu::ConvAlgo algo) {
    Vec y(size_t(s.N * s.K * s.P * s.Q));
    cpu::conv2d_forward(s, xs.data(), ws.data(), bv.data(), y.data(), algo);
    return y;
  };
  const Vec exact = conv_ref(xv, wv, cpu::ConvAlgo::kExact);
  const Vec winograd = conv_ref(xv, wv, cpu::ConvAlgo::kFastest);
  REQUIRE_FALSE(bitwise_equal(exact, winograd));  // else this layer shows nothing

  SECTION("forward") {
    CHECK(bitwise_equal(forward(s, x, w, b), winograd));  // the default: the fastest
    {
      ScopedFp32Precision ieee(Fp32Precision::kIeee);
      CHECK(bitwise_equal(forward(s, x, w, b), exact));
    }
    ScopedFp32Precision tf32(Fp32Precision::kTf32);
    const Vec y = forward(s, x, w, b);
    CHECK(bitwise_equal(y, conv_ref(xr, wr, cpu::ConvAlgo::kExact)));
    CHECK_FALSE(bitwise_equal(y, exact));
  }
  SECTION("backward-data and backward-weight; the bias gradient stays FP32") {
    ScopedFp32Precision tf32(Fp32Precision::kTf32);
    Backend& cpu_backend = backend_for(Device::cpu());
    Tensor dx = Tensor::empty(x.shape()), dw = Tensor::empty(w.shape()), db = Tensor::empty({s.K});
    cpu_backend.conv2d_backward_data(s, dy, w, dx);
    cpu_backend.conv2d_backward_weight(s, x, dy, dw, db);
    Vec dx_ref(xv.size()), dw_ref(wv.size()), db_ref(bv.size());
    cpu::conv2d_backward_data(s, dyr.data(), wr.data(), dx_ref.data(), cpu::ConvAlgo::kExact);
    cpu::conv2d_backward_weight(s, xr.data(), dyr.data(), dw_ref.data(), nullptr,
                                cpu::ConvAlgo::kExact);
    cpu::channel_sum(s.N, s.K, s.P * s.Q, dyv.data(), db_ref.data());
    CHECK(bitwise_equal(dx.to_vector(), dx_ref));
    CHECK(bitwise_equal(dw.to_vector(), dw_ref));
    CHECK(bitwise_equal(db.to_vector(), db_ref));
  }
  SECTION("matmul") {
    const Tensor a = uniform({5, 37}, 5), m = uniform({37, 3}, 6);
    const Vec av = a.to_vector(), mv = m.to_vector();
    auto ref = [&](const Vec& p, const Vec& q) {
      Vec c(15);
      cpu::gemm(false, false, 5, 3, 37, 1.0f, p.data(), 37, q.data(), 3, 0.0f, c.data(), 3);
      return c;
    };
    CHECK(bitwise_equal(matmul(a, m).to_vector(), ref(av, mv)));  // the default: FP32
    ScopedFp32Precision tf32(Fp32Precision::kTf32);
    const Vec c = matmul(a, m).to_vector();
    CHECK(bitwise_equal(c, ref(rounded(av), rounded(mv))));
    CHECK_FALSE(bitwise_equal(c, ref(av, mv)));
  }
}

#if defined(ANVIL_CUDA_BACKEND)
TEST_CASE("cuda: fp32 precision picks the rungs, and the cpu's tf32 emulation agrees with "
          "the tensor cores",
          "[cuda][precision]") {
  if (!cuda_test::have_device()) return;
  const Device gpu = Device::cuda(0);
  // Short reductions (R = 36 and 24 terms), so that the FP32 bound below is
  // tight enough for the TF32 rounding to break it.
  Conv2dShape s{2, 4, 7, 7, 8, 3, 3, 1, 1, 1, 1, 0, 0};
  s.P = Conv2dShape::out_size(s.H, s.R, 1, 1);
  s.Q = Conv2dShape::out_size(s.W, s.S, 1, 1);
  const Tensor x = uniform({s.N, s.C, s.H, s.W}, 11), w = uniform({s.K, s.C, s.R, s.S}, 12);
  auto conv_on = [&](Device d) { return conv2d(x.to(d), w.to(d), Tensor(), 1, 1).to_vector(); };
  constexpr int64_t kInner = 24;
  const Tensor a = uniform({33, kInner}, 13), m = uniform({kInner, 9}, 14);
  auto matmul_on = [&](Device d) { return matmul(a.to(d), m.to(d)).to_vector(); };

  const Vec conv_default = conv_on(gpu), matmul_default = matmul_on(gpu);
  Vec conv_ieee, matmul_ieee, conv_tf32, matmul_tf32, conv_cpu_tf32, matmul_cpu_tf32;
  {
    ScopedFp32Precision ieee(Fp32Precision::kIeee);
    conv_ieee = conv_on(gpu);
    matmul_ieee = matmul_on(gpu);
  }
  {
    ScopedFp32Precision tf32(Fp32Precision::kTf32);
    conv_tf32 = conv_on(gpu);
    matmul_tf32 = matmul_on(gpu);
    conv_cpu_tf32 = conv_on(Device::cpu());
    matmul_cpu_tf32 = matmul_on(Device::cpu());
  }
  // The default: TF32 convolutions, FP32 matmuls (PyTorch's).
  CHECK(bitwise_equal(conv_default, conv_tf32));
  CHECK_FALSE(bitwise_equal(conv_default, conv_ieee));
  CHECK(bitwise_equal(matmul_default, matmul_ieee));
  CHECK_FALSE(bitwise_equal(matmul_default, matmul_tf32));

  // The CPU's emulation and the tensor cores add the same exact products of
  // TF32 operands (11 significant bits each: their products are exact in
  // FP32), in different orders. With S~ the sum of |products| over R terms,
  // the CPU's FP32 sums are within (R - 1) * 2^-24 * S~ of the exact sum; a
  // tensor core that truncated at every step (its internal rounding is not
  // specified) within (R - 1) * 2^-23 * S~. So the two differ by at most
  // 3 * R * 2^-24 * S~. The FP32 result of the unrounded operands must
  // break that bound somewhere (the control: the rounding is real).
  const Vec xr = rounded(x.to_vector()), wr = rounded(w.to_vector());
  const Vec ar = rounded(a.to_vector()), mr = rounded(m.to_vector());
  Vec conv_mag(conv_tf32.size(), 0.0f), matmul_mag(matmul_tf32.size(), 0.0f);
  for (int64_t n = 0; n < s.N; ++n)
    for (int64_t k = 0; k < s.K; ++k)
      for (int64_t p = 0; p < s.P; ++p)
        for (int64_t q = 0; q < s.Q; ++q) {
          double mag = 0;
          for (int64_t c = 0; c < s.C; ++c)
            for (int64_t r = 0; r < s.R; ++r)
              for (int64_t t = 0; t < s.S; ++t) {
                const int64_t h = p + r - 1, ww = q + t - 1;
                if (h < 0 || h >= s.H || ww < 0 || ww >= s.W) continue;
                mag += std::fabs(double(xr[size_t(((n * s.C + c) * s.H + h) * s.W + ww)]) *
                                 wr[size_t(((k * s.C + c) * s.R + r) * s.S + t)]);
              }
          conv_mag[size_t(((n * s.K + k) * s.P + p) * s.Q + q)] = float(mag);
        }
  for (int64_t i = 0; i < 33; ++i)
    for (int64_t j = 0; j < 9; ++j) {
      double mag = 0;
      for (int64_t k = 0; k < kInner; ++k)
        mag += std::fabs(double(ar[size_t(i * kInner + k)]) * mr[size_t(k * 9 + j)]);
      matmul_mag[size_t(i * 9 + j)] = float(mag);
    }
  // The worst |u - v| / bound over the elements.
  auto worst = [](const Vec& u, const Vec& v, const Vec& mag, int64_t R) {
    double r = 0;
    for (size_t i = 0; i < u.size(); ++i)
      r = std::max(r, std::fabs(double(u[i]) - v[i]) / (3.0 * double(R) * 0x1p-24 * mag[i]));
    return r;
  };
  const int64_t conv_terms = s.C * s.R * s.S;
  CHECK(worst(conv_cpu_tf32, conv_tf32, conv_mag, conv_terms) <= 1.0);
  CHECK(worst(matmul_cpu_tf32, matmul_tf32, matmul_mag, kInner) <= 1.0);
  CHECK(worst(conv_ieee, conv_tf32, conv_mag, conv_terms) > 1.0);
  CHECK(worst(matmul_ieee, matmul_tf32, matmul_mag, kInner) > 1.0);
}
#endif
