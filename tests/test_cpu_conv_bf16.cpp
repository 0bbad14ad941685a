// The CPU convolutions on bfloat16 tensors (autocast's), which read the
// operands as stored (kernels/cpu/conv.cpp's bfloat16 instantiations): the
// same bits as the float32 kernels with ConvAlgo::kBf16 on the widened
// operands, whose error bound tests/test_autocast.cpp checks against FP64.
// y and dx bfloat16 are those float32 results rounded once; y and dx
// float32, dw and the bias gradient are equal to them. Ragged shapes: odd
// channels, stride 2, padding, 1x1, one image (each step threaded) and
// several (chunks shared out to the threads). Run with ANVIL_CPU_BF16=off
// too, for the SGEMM path.
#include <catch2/catch.hpp>

#include <cstdint>
#include <random>
#include <vector>

#include "core/backend.h"
#include "core/bfloat16.h"
#include "core/tensor.h"
#include "kernels/cpu/cpu_kernels.h"
#include "core/shapes.h"

using namespace anvil;

namespace {

Conv2dShape make_shape(int64_t N, int64_t C, int64_t H, int64_t W, int64_t K, int64_t R,
                       int64_t stride, int64_t pad) {
  Conv2dShape s{N, C, H, W, K, R, R, stride, stride, pad, pad, 0, 0};
  s.P = Conv2dShape::out_size(H, R, stride, pad);
  s.Q = Conv2dShape::out_size(W, R, stride, pad);
  return s;
}

// n values in [-2, 2) that bfloat16 holds exactly.
std::vector<float> bf16_values(int64_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> d(-2.0f, 2.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = bf16_bits_to_float(float_to_bf16_bits(d(gen)));
  return v;
}

std::vector<uint32_t> bits_of(const std::vector<float>& v) {
  std::vector<uint32_t> out;
  for (float e : v) out.push_back(float_bits(e));
  return out;
}
// A float32 result rounded to bfloat16, as float bits.
std::vector<uint32_t> rounded_bits(const std::vector<float>& v) {
  std::vector<uint32_t> out;
  for (float e : v) out.push_back(uint32_t{float_to_bf16_bits(e)} << 16);
  return out;
}

}  // namespace

TEST_CASE("cpu conv2d on bfloat16 tensors: the float32 kBf16 kernels' bits, rounded once",
          "[cpu][conv][bf16]") {
  Backend& be = backend_for(Device::cpu());
  const Conv2dShape shapes[] = {
      make_shape(3, 5, 9, 7, 6, 3, 2, 1),   // odd channels, stride 2, padding
      make_shape(1, 7, 6, 5, 9, 3, 1, 1),   // one image
      make_shape(5, 9, 4, 4, 3, 1, 1, 0),   // 1x1
      make_shape(4, 4, 10, 10, 5, 3, 1, 0),  // C*R*S = 36, no padding
      make_shape(2, 3, 9, 9, 4, 3, 1, 1)     // the direct kernels' (float32 copies)
  };
  uint32_t seed = 0;
  for (const Conv2dShape& s : shapes) {
    INFO("N " << s.N << " C " << s.C << " H " << s.H << " W " << s.W << " K " << s.K << " R "
              << s.R << " stride " << s.stride_h << " pad " << s.pad_h);
    const auto xv = bf16_values(s.N * s.C * s.H * s.W, ++seed);
    const auto wv = bf16_values(s.K * s.C * s.R * s.S, ++seed);
    const auto dyv = bf16_values(s.N * s.K * s.P * s.Q, ++seed);
    const auto bv = bf16_values(s.K, ++seed);
    const Shape xs{s.N, s.C, s.H, s.W}, ws{s.K, s.C, s.R, s.S}, ys{s.N, s.K, s.P, s.Q};
    const Tensor x = Tensor::from_vector(xv, xs).to(DType::BFloat16);
    const Tensor w = Tensor::from_vector(wv, ws).to(DType::BFloat16);
    const Tensor dy = Tensor::from_vector(dyv, ys).to(DType::BFloat16);
    const Tensor bias = Tensor::from_vector(bv, {s.K});

    // The references: the float32 kernels on the same values.
    std::vector<float> y_ref(dyv.size()), dx_ref(xv.size()), dw_ref(wv.size()), db_ref(bv.size());
    cpu::conv2d_forward(s, xv.data(), wv.data(), bv.data(), y_ref.data(), cpu::ConvAlgo::kBf16);
    cpu::conv2d_backward_data(s, dyv.data(), wv.data(), dx_ref.data(), cpu::ConvAlgo::kBf16);
    cpu::conv2d_backward_weight(s, xv.data(), dyv.data(), dw_ref.data(), db_ref.data(),
                                cpu::ConvAlgo::kBf16);

    for (const DType out : {DType::BFloat16, DType::Float32}) {
      INFO("y and dx " << dtype_name(out));
      const auto want = [&](const std::vector<float>& ref) {
        return out == DType::BFloat16 ? rounded_bits(ref) : bits_of(ref);
      };
      const Tensor y = Tensor::empty(ys, out, Device::cpu());
      be.conv2d_forward(s, x, w, bias, y);
      CHECK(bits_of(y.to(DType::Float32).to_vector()) == want(y_ref));
      const Tensor dx = Tensor::empty(xs, out, Device::cpu());
      be.conv2d_backward_data(s, dy, w, dx);
      CHECK(bits_of(dx.to(DType::Float32).to_vector()) == want(dx_ref));
    }
    const Tensor dw = Tensor::empty(ws, DType::Float32, Device::cpu());
    const Tensor db = Tensor::empty({s.K}, DType::Float32, Device::cpu());
    be.conv2d_backward_weight(s, x, dy, dw, db);
    CHECK(bits_of(dw.to_vector()) == bits_of(dw_ref));
    CHECK(bits_of(db.to_vector()) == bits_of(db_ref));
  }
}

TEST_CASE("cpu channel_sum of a bfloat16 dy is channel_sum of its float32 copy, bit for bit",
          "[cpu][bf16]") {
  // inner 1 (a linear layer's bias), a ragged tail of the 16-wide loads, and
  // inner beyond one 4096-element block.
  const int64_t dims[][3] = {{37, 70, 1}, {5, 3, 45}, {2, 3, 4100}};
  for (const auto& d : dims) {
    INFO("outer " << d[0] << " C " << d[1] << " inner " << d[2]);
    const auto v = bf16_values(d[0] * d[1] * d[2], uint32_t(d[2]));
    std::vector<bfloat16> v16;
    for (float e : v) v16.push_back(bfloat16(e));
    std::vector<float> from32(static_cast<size_t>(d[1])), from16(from32.size());
    cpu::channel_sum(d[0], d[1], d[2], v.data(), from32.data());
    cpu::channel_sum(d[0], d[1], d[2], v16.data(), from16.data());
    CHECK(bits_of(from16) == bits_of(from32));
  }
}
