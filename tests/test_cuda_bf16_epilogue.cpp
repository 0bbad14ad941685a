// The BF16 rungs' bfloat16 outputs (GEMM rung 10, conv rungs 07 and 08: y and dx)
// and channel_sum's bfloat16 dy. A bfloat16 output is the float32 output of
// the same rung, rounded once to nearest even: the tests hold every element
// to that bit for bit, on ragged shapes, unsplit and split (split-K's second
// pass rounds, one thread or one warp an element), with and without a bias.
// channel_sum of a bfloat16 dy is bitwise channel_sum of its float32 copy.
// Then the backends (CPU, cuda:0) through core/backend.h: the same identity
// for gemm with a bias and the convolutions, whatever the device.
#if defined(ANVIL_CUDA_BACKEND)
#include <catch2/catch.hpp>

#include <cstdint>
#include <limits>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "core/backend.h"
#include "core/bfloat16.h"
#include "core/tensor.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/gemm/split_k.h"
#include "core/shapes.h"
#include "tests/cuda_test_util.h"

namespace {

using Vec = std::vector<float>;
using Bf16s = std::vector<anvil::bfloat16>;
using anvil::Conv2dShape;
using cuda_test::DeviceBuffer;
namespace cu = anvil::cuda;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr int kBf16Gemm = cu::kBf16Gemm;

Bf16s to_bf16(const Vec& v) {
  Bf16s out;
  for (float e : v) out.push_back(anvil::bfloat16(e));
  return out;
}

Vec widen(const Bf16s& v) {
  Vec out;
  for (anvil::bfloat16 e : v) out.push_back(e.to_float());
  return out;
}

// Every element of got is want's float rounded to nearest even (core/bfloat16.h);
// names the first that is not.
void require_rounded(const Bf16s& got, const Vec& want) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i].bits != anvil::float_to_bf16_bits(want[i])) {
      INFO("element " << i << ": float32 output " << want[i] << ", bfloat16 output bits 0x"
                      << std::hex << got[i].bits << ", want 0x"
                      << anvil::float_to_bf16_bits(want[i]));
      REQUIRE(got[i].bits == anvil::float_to_bf16_bits(want[i]));
    }
  }
}

struct GemmCase {
  int64_t M, N, K;
  bool ta, tb, bias;
  float alpha, beta;
  int64_t splits;  // what split_k's plan gives for the rung's tile
};

std::string describe(const GemmCase& c) {
  std::ostringstream os;
  os << c.M << " x " << c.N << " x " << c.K << (c.ta ? " A^T" : "") << (c.tb ? " B^T" : "")
     << (c.bias ? ", bias" : "") << ", alpha " << c.alpha << ", beta " << c.beta << ", "
     << c.splits << " split(s)";
  return os.str();
}

// Rung 10's tile is 128 x 128, two blocks per SM: its split plan.
int64_t rung10_splits(int64_t M, int64_t N, int64_t K) {
  const int64_t tiles = ((M + 127) / 128) * ((N + 127) / 128);
  return cu::split_k::plan(M, N, K, tiles, 2).splits;
}

}  // namespace

TEST_CASE("cuda bfloat16 epilogue: GEMM rung 10's bfloat16 C is its float32 C rounded, bit for bit",
          "[cuda][gemm][bf16]") {
  if (!cuda_test::have_device("bf16 epilogue test")) return;
  // Ragged sizes; an odd N (element stores) and an even one (pairs as one
  // 4-byte store); a split below 32 chunks (add_partials) and one of 32
  // (add_partials_by_warp); beta != 0 reads the bfloat16 C.
  std::vector<GemmCase> cases;
  for (const auto& [M, N, K] : {std::tuple<int64_t, int64_t, int64_t>{67, 45, 133},
                                {67, 46, 133}, {7, 46, 600}, {5, 8, 4200}})
    for (const bool bias : {false, true})
      cases.push_back({M, N, K, false, !bias, bias, 1.0f, 0.0f, rung10_splits(M, N, K)});
  cases.push_back({33, 46, 70, true, false, true, 0.5f, 0.25f, rung10_splits(33, 46, 70)});
  cases.push_back({7, 46, 600, true, true, true, 0.5f, 0.25f, rung10_splits(7, 46, 600)});
  REQUIRE(cases[0].splits == 1);
  REQUIRE((cases[4].splits > 1 && cases[4].splits < 32));
  REQUIRE(cases[6].splits >= 32);
  uint32_t seed = 7;
  for (const GemmCase& c : cases) {
    INFO(describe(c));
    const int64_t lda = c.ta ? c.M : c.K, ldb = c.tb ? c.K : c.N;
    const auto draw = [&](int64_t n) { return to_bf16(cuda_test::random_floats(size_t(n), ++seed)); };
    const DeviceBuffer<anvil::bfloat16> A(draw(c.M * c.K)), B(draw(c.K * c.N));
    const DeviceBuffer<float> bias(cuda_test::random_floats(size_t(c.N), ++seed));
    const Bf16s old = to_bf16(cuda_test::random_floats(size_t(c.M * c.N), ++seed));
    DeviceBuffer<float> ws(Vec(cu::gemm_workspace_floats(kBf16Gemm, c.ta, c.tb, c.M, c.N, c.K,
                                                         A.ptr, lda, B.ptr, ldb) +
                                   1,
                               kNaN));
    DeviceBuffer<float> c32(widen(old));
    DeviceBuffer<anvil::bfloat16> c16(old);
    const float* b = c.bias ? bias.ptr : nullptr;
    cu::gemm(kBf16Gemm, c.ta, c.tb, c.M, c.N, c.K, c.alpha, A.ptr, lda, B.ptr, ldb, c.beta, c32.ptr,
             c.N, b, ws.ptr, nullptr);
    cu::gemm(kBf16Gemm, c.ta, c.tb, c.M, c.N, c.K, c.alpha, A.ptr, lda, B.ptr, ldb, c.beta, c16.ptr,
             c.N, b, ws.ptr, nullptr);
    require_rounded(c16.to_host(), c32.to_host());
  }
  // A rung without a bfloat16 epilogue refuses a bfloat16 C, by name.
  const anvil::bfloat16* none = nullptr;
  anvil::bfloat16* no_c = nullptr;
  REQUIRE_THROWS_WITH(cu::gemm(9, false, false, 4, 4, 4, 1.0f, none, 4, none, 4, 0.0f, no_c, 4,
                               nullptr, nullptr, nullptr),
                      Catch::Contains("rung 9 (tf32 mma) reads float32 operands only"));
}

namespace {

Conv2dShape make_shape(int64_t N, int64_t C, int64_t H, int64_t K, int64_t R, int64_t stride,
                       int64_t pad) {
  Conv2dShape s{N, C, H, H, K, R, R, stride, stride, pad, pad, 0, 0};
  s.P = s.Q = Conv2dShape::out_size(H, R, stride, pad);
  return s;
}

}  // namespace

TEST_CASE("cuda bfloat16 epilogue: conv rungs 07 and 08 give bfloat16 y and dx that are their float32 "
          "ones rounded, bit for bit",
          "[cuda][conv][bf16]") {
  if (!cuda_test::have_device("bf16 epilogue test")) return;
  // Batch 7: forward unsplit (67 channels: the 128-row tile), backward-data
  // split (K*R*S = 603); batch 1, strided: both split; batch 7, 13
  // channels: neither splits (the 64-row tile).
  const std::vector<Conv2dShape> shapes = {make_shape(7, 15, 9, 67, 3, 1, 1),
                                           make_shape(1, 70, 5, 45, 3, 2, 1),
                                           make_shape(7, 5, 8, 13, 3, 1, 0)};
  for (const int rung : {7, cu::kBf16Conv}) {
    REQUIRE(cu::conv2d_workspace_floats(rung, shapes[1]) > 0);
    uint32_t seed = 70;
    for (const Conv2dShape& s : shapes) {
      for (const bool with_bias : {false, true}) {
        INFO("rung " << rung << ", N " << s.N << ", C " << s.C << ", H " << s.H << ", K " << s.K
                     << ", stride " << s.stride_h << (with_bias ? ", bias" : ""));
        const size_t nx = size_t(s.N * s.C * s.H * s.W), nw = size_t(s.K * s.C * s.R * s.S),
                     ny = size_t(s.N * s.K * s.P * s.Q);
        const DeviceBuffer<anvil::bfloat16> x(to_bf16(cuda_test::random_floats(nx, ++seed)));
        const DeviceBuffer<anvil::bfloat16> w(to_bf16(cuda_test::random_floats(nw, ++seed)));
        const DeviceBuffer<anvil::bfloat16> dy(to_bf16(cuda_test::random_floats(ny, ++seed)));
        const DeviceBuffer<float> bias(cuda_test::random_floats(size_t(s.K), ++seed));
        DeviceBuffer<float> ws(Vec(cu::conv2d_workspace_floats(rung, s) + 1, kNaN));
        DeviceBuffer<float> y32(Vec(ny, kNaN)), dx32(Vec(nx, kNaN));
        DeviceBuffer<anvil::bfloat16> y16(ny), dx16(nx);
        const float* b = with_bias ? bias.ptr : nullptr;
        cu::conv2d_forward(rung, s, x.ptr, w.ptr, b, y32.ptr, ws.ptr, nullptr);
        cu::conv2d_forward(rung, s, x.ptr, w.ptr, b, y16.ptr, ws.ptr, nullptr);
        require_rounded(y16.to_host(), y32.to_host());
        if (with_bias) continue;  // backward-data has no bias
        cu::conv2d_backward_data(rung, s, dy.ptr, w.ptr, dx32.ptr, ws.ptr, nullptr);
        cu::conv2d_backward_data(rung, s, dy.ptr, w.ptr, dx16.ptr, ws.ptr, nullptr);
        require_rounded(dx16.to_host(), dx32.to_host());
      }
    }
  }
}

TEST_CASE("cuda bfloat16 epilogue: channel_sum of a bfloat16 dy is channel_sum of its float32 "
          "copy, bit for bit",
          "[cuda][reduce][bf16]") {
  if (!cuda_test::have_device("bf16 channel_sum test")) return;
  struct Shape {
    int64_t outer, C, inner;
  };
  // inner ragged (one element a unit), a multiple of 4 (two 32-bit loads a
  // unit), and 1 (a linear bias: column sums).
  uint32_t seed = 700;
  for (const Shape& s : {Shape{7, 67, 45}, Shape{3, 13, 36}, Shape{133, 67, 1}}) {
    INFO("outer " << s.outer << ", C " << s.C << ", inner " << s.inner);
    const Bf16s dy = to_bf16(cuda_test::random_floats(size_t(s.outer * s.C * s.inner), ++seed));
    const DeviceBuffer<anvil::bfloat16> dy16(dy);
    const DeviceBuffer<float> dy32(widen(dy));
    DeviceBuffer<float> ws(
        Vec(cu::channel_sum_workspace_floats(cu::kBestChannelSum, s.outer, s.C, s.inner), kNaN));
    DeviceBuffer<float> from16(Vec(size_t(s.C), kNaN)), from32(Vec(size_t(s.C), kNaN));
    cu::channel_sum(cu::kBestChannelSum, s.outer, s.C, s.inner, dy16.ptr, from16.ptr, ws.ptr,
                    nullptr);
    cu::channel_sum(cu::kBestChannelSum, s.outer, s.C, s.inner, dy32.ptr, from32.ptr, ws.ptr,
                    nullptr);
    const Vec a = from16.to_host(), b = from32.to_host();
    for (size_t c = 0; c < a.size(); ++c) {
      INFO("channel " << c);
      REQUIRE(anvil::float_bits(a[c]) == anvil::float_bits(b[c]));
    }
  }
}

TEST_CASE("backends bfloat16 outputs: gemm with a bias and the convolutions write bfloat16 as "
          "their float32 results rounded, on the CPU and cuda:0",
          "[cuda][bf16][backend]") {
  using anvil::DType;
  using anvil::Tensor;
  std::vector<anvil::Device> devices{anvil::Device::cpu()};
  if (cuda_test::have_device("bf16 backend output test")) devices.push_back(anvil::Device::cuda(0));
  const auto tensor = [](const Vec& v, anvil::Shape shape, anvil::Device d) {
    return Tensor::from_vector(v, shape).to(DType::BFloat16).to(d);
  };
  const auto rounded_bits = [](const Tensor& t32) {
    std::vector<uint16_t> out;
    for (float v : t32.to_vector()) out.push_back(anvil::float_to_bf16_bits(v));
    return out;
  };
  const auto bits = [](const Tensor& t16) {
    std::vector<uint16_t> out;
    for (float v : t16.to(DType::Float32).to_vector()) out.push_back(anvil::float_to_bf16_bits(v));
    return out;
  };
  const Conv2dShape s = make_shape(3, 6, 7, 11, 3, 1, 1);
  for (const anvil::Device d : devices) {
    INFO(d.str());
    anvil::Backend& be = anvil::backend_for(d);
    {  // a linear layer's forward: x w^T + bias
      const Tensor x = tensor(cuda_test::random_floats(19 * 37, 1), {19, 37}, d);
      const Tensor w = tensor(cuda_test::random_floats(23 * 37, 2), {23, 37}, d);
      const Tensor bias = Tensor::from_vector(cuda_test::random_floats(23, 3), {23}).to(d);
      const Tensor y32 = Tensor::empty({19, 23}, DType::Float32, d);
      const Tensor y16 = Tensor::empty({19, 23}, DType::BFloat16, d);
      be.gemm(false, true, 1.0f, x, w, 0.0f, y32, bias);
      be.gemm(false, true, 1.0f, x, w, 0.0f, y16, bias);
      CHECK(bits(y16) == rounded_bits(y32));
    }
    const Tensor x = tensor(cuda_test::random_floats(size_t(s.N * s.C * s.H * s.W), 4),
                            {s.N, s.C, s.H, s.W}, d);
    const Tensor w = tensor(cuda_test::random_floats(size_t(s.K * s.C * s.R * s.S), 5),
                            {s.K, s.C, s.R, s.S}, d);
    const Tensor dy = tensor(cuda_test::random_floats(size_t(s.N * s.K * s.P * s.Q), 6),
                             {s.N, s.K, s.P, s.Q}, d);
    const Tensor bias = Tensor::from_vector(cuda_test::random_floats(size_t(s.K), 7), {s.K}).to(d);
    const Tensor y32 = Tensor::empty(dy.shape(), DType::Float32, d);
    const Tensor y16 = Tensor::empty(dy.shape(), DType::BFloat16, d);
    be.conv2d_forward(s, x, w, bias, y32);
    be.conv2d_forward(s, x, w, bias, y16);
    CHECK(bits(y16) == rounded_bits(y32));
    const Tensor dx32 = Tensor::empty(x.shape(), DType::Float32, d);
    const Tensor dx16 = Tensor::empty(x.shape(), DType::BFloat16, d);
    be.conv2d_backward_data(s, dy, w, dx32);
    be.conv2d_backward_data(s, dy, w, dx16);
    CHECK(bits(dx16) == rounded_bits(dx32));
    const Tensor db16 = Tensor::empty({s.K}, DType::Float32, d);
    const Tensor db32 = Tensor::empty({s.K}, DType::Float32, d);
    be.channel_sum(s.N, s.K, s.P * s.Q, dy, db16);
    be.channel_sum(s.N, s.K, s.P * s.Q, dy.to(DType::Float32), db32);
    CHECK(db16.to_vector() == db32.to_vector());
  }
}
#endif  // ANVIL_CUDA_BACKEND
