// kernels/cuda elementwise kernels (elementwise.cu) against the CPU kernels:
// ragged sizes (0, 1, 7, 1000, 4097), in-place use (the output aliasing an
// input), relu at exactly 0 and NaN, fill of every dtype, float32 <-> bfloat16
// conversion, the int64 add, the scalar broadcast, the per-channel
// bias. Every device buffer is 3 elements longer than n and the tail holds a
// sentinel, so a kernel writing past n shows. Runs on the simulator
// (ANVIL_CUDA=SIM) or on a real GPU when there is one.
#if defined(ANVIL_CUDA_BACKEND)
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <stdexcept>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cuda/cuda_kernels.h"
#include "tests/cuda_test_util.h"

namespace {

using Vec = std::vector<float>;
using cuda_test::DeviceBuffer;

constexpr int64_t kSizes[] = {0, 1, 7, 1000, 4097};
constexpr size_t kTail = 3;
constexpr float kSentinel = 12345.0f;
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// n random values in [-1, 1) followed by kTail sentinels.
Vec input(int64_t n, uint32_t seed) {
  Vec v = cuda_test::random_floats(size_t(n), seed);
  v.resize(size_t(n) + kTail, kSentinel);
  return v;
}

// Within rtol/atol like require_close, and NaN where the reference has NaN.
void require_match(const Vec& got, const Vec& want, float rtol = 1e-6f, float atol = 1e-7f) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    const bool ok = std::isnan(want[i])
                        ? std::isnan(got[i])
                        : std::fabs(got[i] - want[i]) <= atol + rtol * std::fabs(want[i]);
    if (!ok) {
      INFO("element " << i << ": got " << got[i] << ", want " << want[i]);
      REQUIRE(ok);
    }
  }
}

}  // namespace

TEST_CASE("cuda relu forward/backward match the CPU, in place too", "[cuda][elementwise]") {
  if (!cuda_test::have_device()) return;
  using anvil::PointwiseOp;  // ReLU is one of core/pointwise.h's ops
  for (int64_t n : kSizes) {
    INFO("n = " << n);
    Vec x = input(n, 11);
    // Exact zeros (relu' at 0 is 0), negative zero and a NaN among the values.
    if (n >= 7) {
      x[0] = 0.0f;
      x[3] = -0.0f;
      x[5] = kNaN;
    }
    Vec want = x;
    anvil::cpu::pointwise_forward(PointwiseOp::kRelu, n, x.data(), want.data());

    DeviceBuffer<float> dx(x), dy(Vec(x.size(), kSentinel));
    anvil::cuda::pointwise_forward(PointwiseOp::kRelu, n, dx.ptr, dy.ptr, nullptr);
    Vec y_want(x.size(), kSentinel);
    anvil::cpu::pointwise_forward(PointwiseOp::kRelu, n, x.data(), y_want.data());
    require_match(dy.to_host(), y_want);

    anvil::cuda::pointwise_forward(PointwiseOp::kRelu, n, dx.ptr, dx.ptr, nullptr);  // in place
    require_match(dx.to_host(), want);

    // Backward: y has exact zeros (gradient must be 0 there), dy random.
    Vec y = input(n, 12);
    for (size_t i = 0; i < size_t(n); ++i) y[i] = (i % 3 == 0) ? 0.0f : y[i];
    const Vec g = input(n, 13);
    Vec gx_want(x.size(), kSentinel);
    anvil::cpu::pointwise_backward(PointwiseOp::kRelu, n, y.data(), g.data(), gx_want.data());
    DeviceBuffer<float> d_y(y), d_g(g), d_gx(Vec(x.size(), kSentinel));
    anvil::cuda::pointwise_backward(PointwiseOp::kRelu, n, d_y.ptr, d_g.ptr, d_gx.ptr, nullptr);
    const Vec gx = d_gx.to_host();
    require_match(gx, gx_want);
    for (size_t i = 0; i < size_t(n); i += 3) REQUIRE(gx[i] == 0.0f);

    Vec inplace_want = g;
    anvil::cpu::pointwise_backward(PointwiseOp::kRelu, n, y.data(), g.data(), inplace_want.data());
    anvil::cuda::pointwise_backward(PointwiseOp::kRelu, n, d_y.ptr, d_g.ptr, d_g.ptr, nullptr);  // dx aliases dy
    require_match(d_g.to_host(), inplace_want);
  }
}

TEST_CASE("cuda add and mul match the CPU, in place on either input", "[cuda][elementwise]") {
  if (!cuda_test::have_device()) return;
  for (int64_t n : kSizes) {
    INFO("n = " << n);
    const Vec a = input(n, 21), b = input(n, 22);
    for (int op = 0; op < 2; ++op) {
      INFO((op == 0 ? "add" : "mul"));
      auto cpu = [&](const float* pa, const float* pb, float* py) {
        op == 0 ? anvil::cpu::add(n, pa, pb, py) : anvil::cpu::mul(n, pa, pb, py);
      };
      auto gpu = [&](const float* pa, const float* pb, float* py) {
        op == 0 ? anvil::cuda::add(n, pa, pb, py, nullptr)
                : anvil::cuda::mul(n, pa, pb, py, nullptr);
      };
      Vec want(a.size(), kSentinel);
      cpu(a.data(), b.data(), want.data());

      DeviceBuffer<float> da(a), db(b), dy(Vec(a.size(), kSentinel));
      gpu(da.ptr, db.ptr, dy.ptr);
      require_match(dy.to_host(), want, 0.0f, 0.0f);  // one rounding each: exact

      Vec want_a = a;  // y aliases a
      cpu(want_a.data(), b.data(), want_a.data());
      gpu(da.ptr, db.ptr, da.ptr);
      require_match(da.to_host(), want_a, 0.0f, 0.0f);

      Vec want_b = b;  // y aliases b
      DeviceBuffer<float> da2(a);
      cpu(a.data(), want_b.data(), want_b.data());
      gpu(da2.ptr, db.ptr, db.ptr);
      require_match(db.to_host(), want_b, 0.0f, 0.0f);
    }
  }
}

TEST_CASE("cuda axpy and scale match the CPU, in place too", "[cuda][elementwise]") {
  if (!cuda_test::have_device()) return;
  for (int64_t n : kSizes) {
    for (float alpha : {0.0f, 1.0f, -0.37f, 2.5f}) {
      INFO("n = " << n << ", alpha = " << alpha);
      const Vec x = input(n, 31), y0 = input(n, 32);
      // axpy: y += alpha * x (may be fused into one fma on a GPU, hence atol)
      Vec want = y0;
      anvil::cpu::axpy(n, alpha, x.data(), want.data());
      DeviceBuffer<float> dx(x), dy(y0);
      anvil::cuda::axpy(n, alpha, dx.ptr, dy.ptr, nullptr);
      require_match(dy.to_host(), want, 1e-6f, 1e-6f);
      // x aliasing y: y = y + alpha * y
      Vec want_self = y0;
      anvil::cpu::axpy(n, alpha, want_self.data(), want_self.data());
      DeviceBuffer<float> dself(y0);
      anvil::cuda::axpy(n, alpha, dself.ptr, dself.ptr, nullptr);
      require_match(dself.to_host(), want_self, 1e-6f, 1e-6f);

      // scale: y = alpha * x, out of place and in place
      Vec s_want(x.size(), kSentinel);
      anvil::cpu::scale(n, alpha, x.data(), s_want.data());
      DeviceBuffer<float> ds(Vec(x.size(), kSentinel));
      anvil::cuda::scale(n, alpha, dx.ptr, ds.ptr, nullptr);
      require_match(ds.to_host(), s_want, 0.0f, 0.0f);
      anvil::cuda::scale(n, alpha, dx.ptr, dx.ptr, nullptr);
      require_match(dx.to_host(), s_want, 0.0f, 0.0f);
    }
  }
}

TEST_CASE("cuda fill writes exactly n elements of each dtype", "[cuda][elementwise]") {
  if (!cuda_test::have_device()) return;
  for (int64_t n : kSizes) {
    INFO("n = " << n);
    const size_t len = size_t(n) + kTail;
    {
      Vec want(len, kSentinel);
      anvil::cpu::fill(n, -3.25f, want.data());
      DeviceBuffer<float> d(Vec(len, kSentinel));
      anvil::cuda::fill(n, -3.25f, d.ptr, nullptr);
      require_match(d.to_host(), want, 0.0f, 0.0f);
    }
    {
      const int64_t value = (int64_t(1) << 40) + 7;  // needs all 64 bits
      std::vector<int64_t> want(size_t(n), value);
      want.resize(len, -1);
      DeviceBuffer<int64_t> d(std::vector<int64_t>(len, -1));
      anvil::cuda::fill(n, value, d.ptr, nullptr);
      REQUIRE(d.to_host() == want);
    }
    {
      std::vector<uint8_t> want(size_t(n), 200);
      want.resize(len, 0xAB);
      DeviceBuffer<uint8_t> d(std::vector<uint8_t>(len, 0xAB));
      anvil::cuda::fill(n, uint8_t(200), d.ptr, nullptr);
      REQUIRE(d.to_host() == want);
    }
  }
}

TEST_CASE("cuda float32 <-> bfloat16 conversion matches the CPU on exactly n elements",
          "[cuda][elementwise][bf16]") {
  if (!cuda_test::have_device()) return;
  using anvil::bfloat16;
  const bfloat16 sentinel = bfloat16::from_bits(0xABCD);
  auto bits = [](const std::vector<bfloat16>& v) {
    std::vector<uint16_t> out;
    for (bfloat16 b : v) out.push_back(b.bits);
    return out;
  };
  for (int64_t n : kSizes) {
    INFO("n = " << n);
    const size_t len = size_t(n) + kTail;
    // Random bit patterns: every exponent, NaNs, Infs and denormals among them.
    std::mt19937 gen(uint32_t(n) + 17);
    Vec x(len, kSentinel);
    for (int64_t i = 0; i < n; ++i) {
      const uint32_t u = uint32_t(gen());
      std::memcpy(&x[size_t(i)], &u, 4);
    }
    std::vector<bfloat16> want(len, sentinel);
    anvil::cpu::float_to_bf16(n, x.data(), want.data());
    DeviceBuffer<float> dx(x);
    DeviceBuffer<bfloat16> dy(std::vector<bfloat16>(len, sentinel));
    anvil::cuda::float_to_bf16(n, dx.ptr, dy.ptr, nullptr);
    const std::vector<bfloat16> got = dy.to_host();
    REQUIRE(bits(got) == bits(want));

    Vec back_want(len, kSentinel);
    anvil::cpu::bf16_to_float(n, want.data(), back_want.data());
    DeviceBuffer<float> dback(Vec(len, kSentinel));
    anvil::cuda::bf16_to_float(n, dy.ptr, dback.ptr, nullptr);
    const Vec back = dback.to_host();
    REQUIRE(std::memcmp(back.data(), back_want.data(), len * sizeof(float)) == 0);

    DeviceBuffer<bfloat16> dfill(std::vector<bfloat16>(len, sentinel));
    anvil::cuda::fill(n, bfloat16(-2.0f), dfill.ptr, nullptr);
    std::vector<uint16_t> fill_want(size_t(n), 0xC000);
    fill_want.resize(len, 0xABCD);
    REQUIRE(bits(dfill.to_host()) == fill_want);
  }
}

TEST_CASE("cuda add_scalar adds to exactly n int64 elements, all 64 bits", "[cuda][elementwise]") {
  if (!cuda_test::have_device()) return;
  for (int64_t n : kSizes) {
    INFO("n = " << n);
    const size_t len = size_t(n) + kTail;
    std::vector<int64_t> start(len), want(len);
    for (size_t i = 0; i < len; ++i) start[i] = (int64_t(1) << 40) * int64_t(i % 5) - int64_t(i);
    for (size_t i = 0; i < len; ++i) want[i] = start[i] + (i < size_t(n) ? (int64_t(3) << 33) : 0);
    DeviceBuffer<int64_t> d(start);
    anvil::cuda::add_scalar(n, int64_t(3) << 33, d.ptr, nullptr);
    REQUIRE(d.to_host() == want);
  }
  CHECK_THROWS_WITH(anvil::cuda::add_scalar(-1, 1, nullptr, nullptr),
                    Catch::Contains("add_scalar"));
}

TEST_CASE("cuda broadcast_scalar writes alpha * x[0] to exactly n elements", "[cuda][elementwise]") {
  if (!cuda_test::have_device()) return;
  for (int64_t n : kSizes) {
    INFO("n = " << n);
    const size_t len = size_t(n) + kTail;
    Vec want(len, kSentinel);
    for (int64_t i = 0; i < n; ++i) want[size_t(i)] = 0.25f * -6.5f;
    DeviceBuffer<float> x(Vec{-6.5f, 99.0f});  // only x[0] is read
    DeviceBuffer<float> d(Vec(len, kSentinel));
    anvil::cuda::broadcast_scalar(n, 0.25f, x.ptr, d.ptr, nullptr);
    require_match(d.to_host(), want, 0.0f, 0.0f);
  }
  CHECK_THROWS_WITH(anvil::cuda::broadcast_scalar(-1, 1.0f, nullptr, nullptr, nullptr),
                    Catch::Contains("broadcast_scalar"));
}

TEST_CASE("cuda add_channel_bias matches the CPU on ragged shapes, in place too",
          "[cuda][elementwise]") {
  if (!cuda_test::have_device()) return;
  struct Shape {
    int64_t outer, C, inner;
  };
  const Shape shapes[] = {{0, 3, 4}, {2, 0, 5}, {1, 1, 1}, {2, 3, 5},   {4, 7, 1},
                          {3, 16, 9}, {1, 10, 1000}, {5, 13, 63}, {4097, 1, 1}};
  for (const Shape& s : shapes) {
    INFO("outer " << s.outer << ", C " << s.C << ", inner " << s.inner);
    const int64_t total = s.outer * s.C * s.inner;
    const Vec x = input(total, 41), bias = cuda_test::random_floats(size_t(s.C), 42);
    Vec want(x.size(), kSentinel);
    anvil::cpu::add_channel_bias(s.outer, s.C, s.inner, x.data(), bias.data(), want.data());
    DeviceBuffer<float> dx(x), db(bias), dy(Vec(x.size(), kSentinel));
    anvil::cuda::add_channel_bias(s.outer, s.C, s.inner, dx.ptr, db.ptr, dy.ptr, nullptr);
    require_match(dy.to_host(), want, 0.0f, 0.0f);
    anvil::cuda::add_channel_bias(s.outer, s.C, s.inner, dx.ptr, db.ptr, dx.ptr, nullptr);
    require_match(dx.to_host(), want, 0.0f, 0.0f);
  }
}

TEST_CASE("cuda elementwise kernels reject negative sizes", "[cuda][elementwise]") {
  if (!cuda_test::have_device()) return;
  DeviceBuffer<float> d(4);
  REQUIRE_THROWS_AS(anvil::cuda::pointwise_forward(anvil::PointwiseOp::kRelu, -1, d.ptr, d.ptr, nullptr),
                    std::invalid_argument);
  REQUIRE_THROWS_AS(anvil::cuda::fill(-5, 1.0f, d.ptr, nullptr), std::invalid_argument);
  REQUIRE_THROWS_AS(anvil::cuda::add_channel_bias(1, -2, 1, d.ptr, d.ptr, d.ptr, nullptr),
                    std::invalid_argument);
}

TEST_CASE("cuda pointwise ops (silu) match the CPU, in place too", "[cuda][elementwise]") {
  if (!cuda_test::have_device()) return;
  // The same source (core/pointwise.h) on both: equal in the simulator;
  // on a GPU the device's expf may differ by an ulp or two, which rtol
  // 1e-6 (8 ulps) covers.
  using anvil::PointwiseOp;
  for (int64_t n : kSizes) {
    INFO("n = " << n);
    Vec x = input(n, 21), dy = input(n, 22);
    for (size_t i = 0; i < size_t(n); ++i) x[i] *= 12.0f;
    if (n >= 7) {
      x[1] = -100.0f;
      x[2] = 100.0f;
      x[5] = kNaN;
    }
    Vec y_want(x.size(), kSentinel), dx_want(x.size(), kSentinel);
    anvil::cpu::pointwise_forward(PointwiseOp::kSilu, n, x.data(), y_want.data());
    anvil::cpu::pointwise_backward(PointwiseOp::kSilu, n, x.data(), dy.data(), dx_want.data());

    DeviceBuffer<float> dev_x(x), dev_dy(dy), dev_y(Vec(x.size(), kSentinel));
    anvil::cuda::pointwise_forward(PointwiseOp::kSilu, n, dev_x.ptr, dev_y.ptr, nullptr);
    require_match(dev_y.to_host(), y_want);
    anvil::cuda::pointwise_backward(PointwiseOp::kSilu, n, dev_x.ptr, dev_dy.ptr, dev_dy.ptr,
                                    nullptr);  // in place over dy
    require_match(dev_dy.to_host(), dx_want);
    anvil::cuda::pointwise_forward(PointwiseOp::kSilu, n, dev_x.ptr, dev_x.ptr, nullptr);
    require_match(dev_x.to_host(), y_want);
  }
}

#endif
