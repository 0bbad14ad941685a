// kernels/cuda pooling (pool.cu) against the CPU kernels: max and average,
// forward and backward, on non-overlapping, overlapping (stride < kernel),
// padded, rectangular and LeNet-sized shapes, with a window lying wholly in
// padding, with ties (the argmax must be the CPU's choice: the first maximum
// in scan order) and with NaN inputs. Runs on the simulator (ANVIL_CUDA=SIM)
// or on a real GPU when there is one.
#if defined(ANVIL_CUDA_BACKEND)
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
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
using anvil::Pool2dShape;

Pool2dShape pool_shape(int64_t N, int64_t C, int64_t H, int64_t W, int64_t kh, int64_t kw,
                       int64_t sh, int64_t sw, int64_t ph, int64_t pw) {
  Pool2dShape s{N, C, H, W, kh, kw, sh, sw, ph, pw, 0, 0};
  s.P = anvil::Conv2dShape::out_size(H, kh, sh, ph);
  s.Q = anvil::Conv2dShape::out_size(W, kw, sw, pw);
  return s;
}

struct Case {
  int64_t N, C, H, W, kh, kw, sh, sw, ph, pw;
};
const Case kCases[] = {
    {2, 3, 7, 7, 2, 2, 2, 2, 0, 0},      // 2x2/2 on an odd size (last row/column unused)
    {1, 2, 5, 6, 3, 3, 2, 2, 1, 1},      // overlapping, padded
    {2, 1, 8, 8, 3, 3, 1, 1, 1, 1},      // heavily overlapping ("same" 3x3)
    {1, 4, 28, 28, 2, 2, 2, 2, 0, 0},    // LeNet's
    {1, 2, 6, 7, 2, 3, 1, 2, 1, 0},      // rectangular kernel and stride
    {1, 1, 3, 3, 2, 2, 2, 2, 2, 2},      // windows wholly in padding (-inf, argmax -1)
    {1, 1, 1, 1, 1, 1, 1, 1, 0, 0},      // a single element
    {2, 2, 4, 4, 5, 5, 1, 1, 0, 0},      // kernel larger than the input: P = Q = 0
};

// Equal as floats, or both NaN.
bool same(float a, float b) { return (std::isnan(a) && std::isnan(b)) || a == b; }

// Values with many ties: integers in [0, levels).
Vec quantised(size_t n, uint32_t seed, int levels) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int> d(0, levels - 1);
  Vec v(n);
  for (auto& x : v) x = float(d(gen));
  return v;
}

void check_max_pool(const Pool2dShape& s, const Vec& x, uint32_t seed) {
  const size_t in = size_t(s.N * s.C * s.H * s.W), out = size_t(s.N * s.C * s.P * s.Q);
  Vec y_want(out);
  std::vector<int64_t> arg_want(out);
  anvil::cpu::max_pool2d_forward(s, x.data(), y_want.data(), arg_want.data());

  DeviceBuffer<float> dx(x), dy(out);
  DeviceBuffer<int64_t> darg(out);
  anvil::cuda::max_pool2d_forward(s, dx.ptr, dy.ptr, darg.ptr, nullptr);
  const Vec y = dy.to_host();
  const std::vector<int64_t> arg = darg.to_host();
  for (size_t i = 0; i < out; ++i) {
    INFO("output " << i << ": got " << y[i] << " at " << arg[i] << ", want " << y_want[i]
                   << " at " << arg_want[i]);
    REQUIRE(same(y[i], y_want[i]));
    REQUIRE(arg[i] == arg_want[i]);
  }

  // Backward from the CPU's argmax; dx is prefilled with garbage (NaN) to
  // show that every element is written.
  const Vec g = cuda_test::random_floats(out, seed);
  Vec dx_want(in);
  anvil::cpu::max_pool2d_backward(s, g.data(), arg_want.data(), dx_want.data());
  DeviceBuffer<float> dg(g), ddx(Vec(in, std::numeric_limits<float>::quiet_NaN()));
  DeviceBuffer<int64_t> darg_cpu(arg_want);
  anvil::cuda::max_pool2d_backward(s, dg.ptr, darg_cpu.ptr, ddx.ptr, nullptr);
  // Same additions in the same order as the CPU: equal, not just close.
  cuda_test::require_close(ddx.to_host(), dx_want, 0.0f, 0.0f);
}

void check_avg_pool(const Pool2dShape& s, const Vec& x, uint32_t seed) {
  const size_t in = size_t(s.N * s.C * s.H * s.W), out = size_t(s.N * s.C * s.P * s.Q);
  Vec y_want(out);
  anvil::cpu::avg_pool2d_forward(s, x.data(), y_want.data());
  DeviceBuffer<float> dx(x), dy(out);
  anvil::cuda::avg_pool2d_forward(s, dx.ptr, dy.ptr, nullptr);
  cuda_test::require_close(dy.to_host(), y_want, 1e-6f, 1e-6f);

  const Vec g = cuda_test::random_floats(out, seed);
  Vec dx_want(in);
  anvil::cpu::avg_pool2d_backward(s, g.data(), dx_want.data());
  DeviceBuffer<float> dg(g), ddx(Vec(in, std::numeric_limits<float>::quiet_NaN()));
  anvil::cuda::avg_pool2d_backward(s, dg.ptr, ddx.ptr, nullptr);
  cuda_test::require_close(ddx.to_host(), dx_want, 1e-6f, 1e-6f);
}

#define POOL_INFO(c)                                                                       \
  INFO("N,C,H,W " << c.N << "," << c.C << "," << c.H << "," << c.W << " kernel " << c.kh    \
                  << "x" << c.kw << " stride " << c.sh << "x" << c.sw << " pad " << c.ph  \
                  << "x" << c.pw)

}  // namespace

TEST_CASE("cuda max pool forward/backward match the CPU", "[cuda][pool]") {
  if (!cuda_test::have_device()) return;
  uint32_t seed = 100;
  for (const Case& c : kCases) {
    POOL_INFO(c);
    const Pool2dShape s = pool_shape(c.N, c.C, c.H, c.W, c.kh, c.kw, c.sh, c.sw, c.ph, c.pw);
    const size_t in = size_t(c.N * c.C * c.H * c.W);
    {
      INFO("random values");
      check_max_pool(s, cuda_test::random_floats(in, seed), seed + 1);
    }
    {
      INFO("ties: the first maximum in scan order wins");
      check_max_pool(s, quantised(in, seed, 3), seed + 1);
    }
    {
      INFO("all equal");
      check_max_pool(s, Vec(in, 0.5f), seed + 1);
    }
    {
      INFO("NaN is selected");
      Vec x = quantised(in, seed, 4);
      for (size_t i = 0; i < in; i += 5) x[i] = std::numeric_limits<float>::quiet_NaN();
      check_max_pool(s, x, seed + 1);
    }
    seed += 7;
  }
}

TEST_CASE("cuda avg pool forward/backward match the CPU (count_include_pad)", "[cuda][pool]") {
  if (!cuda_test::have_device()) return;
  uint32_t seed = 200;
  for (const Case& c : kCases) {
    POOL_INFO(c);
    const Pool2dShape s = pool_shape(c.N, c.C, c.H, c.W, c.kh, c.kw, c.sh, c.sw, c.ph, c.pw);
    check_avg_pool(s, cuda_test::random_floats(size_t(c.N * c.C * c.H * c.W), seed), seed + 1);
    seed += 7;
  }
}

TEST_CASE("cuda max pool backward sums overlapping windows that share a maximum",
          "[cuda][pool]") {
  if (!cuda_test::have_device()) return;
  // 3x3 input, 2x2 windows at stride 1: the centre (the maximum) is the
  // argmax of all four windows, so dx[centre] = sum of all four gradients.
  const Pool2dShape s = pool_shape(1, 1, 3, 3, 2, 2, 1, 1, 0, 0);
  const Vec x = {0, 1, 0, 1, 9, 1, 0, 1, 0};
  DeviceBuffer<float> dx(x), dy(4), g(Vec{1.0f, 2.0f, 4.0f, 8.0f}), ddx(9);
  DeviceBuffer<int64_t> arg(4);
  anvil::cuda::max_pool2d_forward(s, dx.ptr, dy.ptr, arg.ptr, nullptr);
  REQUIRE(arg.to_host() == std::vector<int64_t>{4, 4, 4, 4});
  anvil::cuda::max_pool2d_backward(s, g.ptr, arg.ptr, ddx.ptr, nullptr);
  REQUIRE(ddx.to_host() == Vec{0, 0, 0, 0, 15, 0, 0, 0, 0});
}

TEST_CASE("cuda pooling rejects invalid shapes", "[cuda][pool]") {
  if (!cuda_test::have_device()) return;
  DeviceBuffer<float> d(4);
  Pool2dShape s = pool_shape(1, 1, 2, 2, 2, 2, 2, 2, 0, 0);
  s.stride_h = 0;
  REQUIRE_THROWS_AS(anvil::cuda::avg_pool2d_forward(s, d.ptr, d.ptr, nullptr),
                    std::invalid_argument);
}

#endif
