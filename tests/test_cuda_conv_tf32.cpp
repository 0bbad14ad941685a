// kernels/cuda convolution on tensor cores, rungs 06 (TF32, 06_tf32_mma.cu),
// 07 (BF16, 07_bf16_mma.cu), 08 (BF16) and 09 (TF32), the last two every
// direction on channels-last operands and the multistage mainloop
// (08_bf16_multistage.cu, 09_tf32_multistage.cu): forward, backward-data
// and backward-weight against an FP64 reference, element by element, on
// LeNet-like and ragged small shapes (strides, pads, a non-square window,
// more than 64 channels for the 128-row tile, a backward-weight that splits
// K); a control that shows the operands are rounded; in the simulator
// build, a swapped fragment register in the emulated tensor core must break
// every direction of every rung. Rung 07 also reads bfloat16 x, w and dy:
// within the bounds of FP64 of those operands, and bitwise the same as from
// float32 holding the same values (the same words staged, the same order of
// k); so do the CPU and CUDA backends given bfloat16 tensors. Rungs 08 and
// 09 also over strides, windows, pads, channel counts that leave their last
// channel block partial and output channels that leave their tiles ragged,
// and bitwise the same at every pipeline depth.
//
// The bounds (tests/conv_test_util.h derives them): each direction a GEMM
// with reduction length R: C*R*S (forward), K*R*S (backward-data), N*P*Q
// (backward-weight), the rung's bound from its unit roundoff, the FP32
// bound against the rounded operands, and the control: the result fails
// the bound an FP32 convolution of the unrounded operands meets, asserted
// for R <= 256 only (LeNet's conv1 backward-weight at batch 2 has R = 1152
// and relies on the rounded-operand comparison).
#if defined(ANVIL_CUDA_BACKEND)
#include <catch2/catch.hpp>
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "core/backend.h"
#include "core/bfloat16.h"
#include "core/precision.h"
#include "core/tensor.h"
#include "core/tf32.h"
#include "kernels/cuda/cuda_kernels.h"
#include "core/shapes.h"
#include "tests/conv_test_util.h"
#include "tests/cuda_test_util.h"
#if defined(ANVIL_CUDA_SIM)
#include "sim/mma_sim.h"
#endif

namespace {

using Vec = std::vector<float>;
using anvil::Conv2dShape;
using cuda_test::DeviceBuffer;
namespace cu = anvil::cuda;

using namespace conv_test;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
struct Result {
  Ratios forward, backward_data, backward_weight;
  Vec y, dx, dw;  // what the rung wrote
};

// The three outputs y, dx, dw of a rung against FP64 of the inputs.
Result compare(const Rung& rung, const Conv2dShape& s, const Inputs& in, Vec y, Vec dx, Vec dw) {
  const Vec &x = in.x, &w = in.w, &bias = in.bias, &dy = in.dy;
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
                fwd[size_t(at4(n, s.K, k, s.P, p, s.Q, q))].add(wv, xv, rung.round);
                bwd_d[size_t(at4(n, s.C, c, s.H, h, s.W, wi))].add(wv, gv, rung.round);
                bwd_w[size_t(at4(k, s.C, c, s.R, r_, s.S, t))].add(gv, xv, rung.round);
              }
  for (size_t i = 0; i < fwd.size(); ++i)
    r.forward.check(y[i], fwd[i], bias[i / size_t(s.P * s.Q) % size_t(s.K)], crs, rung.u);
  for (size_t i = 0; i < bwd_d.size(); ++i)
    r.backward_data.check(dx[i], bwd_d[i], 0, krs, rung.u);
  for (size_t i = 0; i < bwd_w.size(); ++i)
    r.backward_weight.check(dw[i], bwd_w[i], 0, npq, rung.u);
  r.y = std::move(y), r.dx = std::move(dx), r.dw = std::move(dw);
  return r;
}

// How the operands reach the rung: float32 as drawn; float32 holding
// bfloat16 values; those values as bfloat16 (conv2d_*'s bfloat16 overloads).
enum class Operands { kFloat32, kBf16Values, kBf16 };

// The three directions of a rung on random x, w, bias and dy, against FP64.
Result run_shape(const Rung& rung, const Conv2dShape& s, uint32_t seed,
                 Operands operands = Operands::kFloat32) {
  const Inputs in = draw(s, seed, operands != Operands::kFloat32);
  DeviceBuffer<float> d_bias(in.bias);
  DeviceBuffer<float> ws(Vec(cu::conv2d_workspace_floats(rung.rung, s), kNaN));
  DeviceBuffer<float> y(Vec(in.dy.size(), kNaN)), dx(Vec(in.x.size(), kNaN)),
      dw(Vec(in.w.size(), kNaN));
  auto run = [&](const auto& d_x, const auto& d_w, const auto& d_dy) {
    cu::conv2d_forward(rung.rung, s, d_x.ptr, d_w.ptr, d_bias.ptr, y.ptr, ws.ptr, nullptr);
    cu::conv2d_backward_data(rung.rung, s, d_dy.ptr, d_w.ptr, dx.ptr, ws.ptr, nullptr);
  };
  if (operands == Operands::kBf16) {
    const DeviceBuffer<anvil::bfloat16> d_x(to_bf16(in.x)), d_w(to_bf16(in.w)),
        d_dy(to_bf16(in.dy));
    run(d_x, d_w, d_dy);
    cu::conv2d_backward_weight(rung.rung, s, d_x.ptr, d_dy.ptr, dw.ptr, ws.ptr, nullptr);
    return compare(rung, s, in, y.to_host(), dx.to_host(), dw.to_host());
  }
  const DeviceBuffer<float> d_x(in.x), d_w(in.w), d_dy(in.dy);
  run(d_x, d_w, d_dy);
  cu::conv2d_backward_weight(rung.rung, s, d_x.ptr, d_dy.ptr, dw.ptr, nullptr, ws.ptr,
                             nullptr);
  return compare(rung, s, in, y.to_host(), dx.to_host(), dw.to_host());
}

// LeNet's conv1 at batch 2 (backward-weight's N*P*Q = 1152 splits K) and
// conv2 at batch 1; strides, pads and a non-square window, ragged; more
// than 64 channels both ways (the 128-row tile in every direction). The
// forward's weights [K, C*R*S] are read a quad at a time where C*R*S is a
// multiple of 4 (the last shape), element by element otherwise.
std::vector<Conv2dShape> test_shapes() {
  return {make_shape(2, 1, 28, 28, 6, 5, 5, 1, 1, 0, 0), make_shape(1, 6, 12, 12, 16, 5, 5, 1, 1, 0, 0),
          make_shape(2, 3, 9, 8, 5, 3, 2, 2, 1, 1, 0), make_shape(1, 68, 5, 6, 66, 3, 3, 1, 1, 1, 1)};
}

// Bitwise equality (float == would let -0 stand for +0).
bool same_bits(const Vec& a, const Vec& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

void require_within(const Ratios& r, const char* direction) {
  INFO(direction << " (reduction " << r.R << "): worst error / bound: the rung's bound " << r.bound
                 << ", FP32 bound (control) " << r.fp32 << ", rounded operands, FP32 bound "
                 << r.rounded);
  REQUIRE(r.bound <= 1.0);
  REQUIRE(r.rounded <= 1.0);
  if (r.R <= 256) REQUIRE(r.fp32 > 4.0);  // the control: the rounding is active
}

}  // namespace

TEST_CASE("cuda conv mma: rungs 6 (TF32) and 7 (BF16) are within their bounds of FP64 in every "
          "direction",
          "[cuda][conv][tf32][tsan]") {
  if (!cuda_test::have_device()) return;
  const std::vector<Conv2dShape> shapes = test_shapes();
  for (const Rung& rung : {kTf32, kBf16}) {
    REQUIRE(cu::conv_rungs::rung(rung.rung).math == rung.math);
    REQUIRE(cu::conv2d_workspace_floats(rung.rung, shapes[0]) >= 2 * 6 * 25);  // a split
    uint32_t seed = 40;
    for (const Conv2dShape& s : shapes) {
      INFO("rung " << rung.rung << ", " << describe(s));
      const Result r = run_shape(rung, s, seed += 5);
      require_within(r.forward, "forward");
      require_within(r.backward_data, "backward-data");
      require_within(r.backward_weight, "backward-weight");
    }
  }
}

// Operands that are bfloat16 already: the rounded-operand reference is the
// exact one, so the rung's bound and the FP32 bound of the operands both
// apply, and the control (which needs unrounded operands) does not.
void require_within_bf16(const Result& r) {
  for (const auto& [ratios, direction] :
       {std::pair{&r.forward, "forward"}, {&r.backward_data, "backward-data"},
        {&r.backward_weight, "backward-weight"}}) {
    INFO(direction << " (reduction " << ratios->R << "): worst error / bound: the rung's bound "
                   << ratios->bound << ", FP32 bound " << ratios->rounded);
    REQUIRE(ratios->bound <= 1.0);
    REQUIRE(ratios->rounded <= 1.0);
  }
}

// Rungs 7 and 8 read bfloat16 operands (the test of rung 8 below calls it).
static void require_bf16_reads_as_float32(const Rung& rung, uint32_t seed) {
  for (const Conv2dShape& s : test_shapes()) {
    INFO("rung " << rung.rung << ", " << describe(s));
    const Result b = run_shape(rung, s, seed += 5, Operands::kBf16);
    require_within_bf16(b);
    // The same bf16 words in shared memory, the same order of k: the same bits.
    const Result f = run_shape(rung, s, seed, Operands::kBf16Values);
    CHECK(same_bits(b.y, f.y));
    CHECK(same_bits(b.dx, f.dx));
    CHECK(same_bits(b.dw, f.dw));
  }
}

TEST_CASE("cuda conv mma: rung 7 reads bfloat16 x, w and dy, bitwise as float32 of the same "
          "values",
          "[cuda][conv][bf16]") {
  if (!cuda_test::have_device()) return;
  require_bf16_reads_as_float32(kBf16, 70);
  // The rungs that read float32 only refuse bfloat16, by name.
  const Conv2dShape s = test_shapes()[2];
  const anvil::bfloat16* none = nullptr;
  float* no_output = nullptr;
  REQUIRE_THROWS_WITH(cu::conv2d_forward(6, s, none, none, nullptr, no_output, nullptr, nullptr),
                      "cuda::conv2d_forward: rung 6 (tf32 mma) reads float32 operands only; "
                      "bfloat16 ones need rung 8 (bf16 multistage)");
  REQUIRE_THROWS_WITH(cu::conv2d_backward_data(5, s, none, none, no_output, nullptr, nullptr),
                      Catch::Contains("cuda::conv2d_backward_data: rung 5"));
  REQUIRE_THROWS_WITH(cu::conv2d_backward_weight(1, s, none, none, nullptr, nullptr, nullptr),
                      Catch::Contains("cuda::conv2d_backward_weight: rung 1"));
}

// The rungs on the multistage mainloop (08 BF16, 09 TF32: one set of
// iterators over the mma's kind) in every direction on the ladder's shapes
// and on shapes that exercise their iterators (at stride 2 backward-data
// runs one convolution per residue class; backward-weight walks N*P*Q with
// carries, split where its tiles are few: LeNet's conv1 at batch 2 and 3,
// the last chunk partial; rows of 40 positions, longer than a step, once):
// C of 1, 13 and 40 (padded to whole 16-byte chunks, 8 bfloat16 or 4
// floats: a channel block of 32 or 16 partly or mostly outside), K of 6,
// 24, 33, 64, 70 and 128 (the 256 x 64 tile up to 64, the 128 x 128 one
// above, ragged), windows 1x1, 3x3 and 5x5, strides 1 and 2 (mixed), pads
// 0, 1 and 2, batches 1 to 7; ResNet-18's stride-2 transition and 1x1
// shortcut, LeNet's conv1 (d2l's pad 2). And at 2, 3 and 4 pipeline stages
// (forward_at), the same bits: the depth changes when a stage lands, never
// what is summed or in what order.
using ForwardAt = void (*)(int stages, const Conv2dShape&, const float*, const float*,
                           const float*, float*, float*, cudaStream_t);
static void require_multistage_rung(const Rung& rung, ForwardAt forward_at, uint32_t seed) {
  REQUIRE(cu::conv_rungs::rung(rung.rung).math == rung.math);
  for (const Conv2dShape& s : test_shapes()) {
    INFO(describe(s));
    const Result r = run_shape(rung, s, seed - 10);
    require_within(r.forward, "forward");
    require_within(r.backward_data, "backward-data");
    require_within(r.backward_weight, "backward-weight");
  }
  const Conv2dShape shapes[] = {make_shape(1, 13, 7, 9, 70, 3, 3, 2, 2, 1, 1),
                                make_shape(7, 40, 5, 5, 24, 1, 1, 1, 1, 0, 0),
                                make_shape(2, 8, 11, 10, 33, 5, 5, 1, 2, 2, 2),
                                make_shape(1, 64, 14, 14, 128, 3, 3, 2, 2, 1, 1),
                                make_shape(1, 64, 7, 7, 64, 3, 3, 1, 1, 1, 1),
                                make_shape(3, 1, 28, 28, 6, 5, 5, 1, 1, 2, 2),
                                make_shape(1, 64, 8, 8, 128, 1, 1, 2, 2, 0, 0),
                                make_shape(1, 8, 3, 40, 16, 1, 3, 1, 1, 0, 1)};
  // LeNet's conv1 at batch 3 splits backward-weight: its workspace holds
  // at least two chunks' partials besides x and dy in NHWC (C = 1 and K =
  // 6 padded to a whole chunk, 8 bfloat16 (a float holds two) or 4 floats).
  const Conv2dShape lenet = shapes[5];
  const int64_t chunk = rung.math == cu::gemm_rungs::Math::kBf16 ? 8 : 4;
  const int64_t per_float = rung.math == cu::gemm_rungs::Math::kBf16 ? 2 : 1;
  REQUIRE(cu::conv2d_workspace_floats(rung.rung, lenet) >=
          size_t(2 * lenet.K * lenet.R * lenet.S +
                 (lenet.N * lenet.H * lenet.W * chunk + lenet.N * lenet.P * lenet.Q * 8) /
                     per_float));
  for (const Conv2dShape& s : shapes) {
    INFO(describe(s));
    const Inputs in = draw(s, seed += 5, false);
    const DeviceBuffer<float> x(in.x), w(in.w), bias(in.bias), dy(in.dy);
    DeviceBuffer<float> ws(Vec(cu::conv2d_workspace_floats(rung.rung, s), kNaN));
    DeviceBuffer<float> y(Vec(in.dy.size(), kNaN)), dx(Vec(in.x.size(), kNaN)),
        dw(Vec(in.w.size(), kNaN));
    cu::conv2d_forward(rung.rung, s, x.ptr, w.ptr, bias.ptr, y.ptr, ws.ptr, nullptr);
    cu::conv2d_backward_data(rung.rung, s, dy.ptr, w.ptr, dx.ptr, ws.ptr, nullptr);
    cu::conv2d_backward_weight(rung.rung, s, x.ptr, dy.ptr, dw.ptr, nullptr, ws.ptr, nullptr);
    const Vec rung_y = y.to_host();
    const Result r = compare(rung, s, in, rung_y, dx.to_host(), dw.to_host());
    require_within(r.forward, "forward");
    require_within(r.backward_data, "backward-data");
    require_within(r.backward_weight, "backward-weight");
    if (s.C != 64 && s.C != 13) continue;  // the depth sweep: several k-steps, both tiles' rows
    for (int stages : {2, 3, 4}) {
      INFO(stages << " stages");
      DeviceBuffer<float> y_at(Vec(in.dy.size(), kNaN));
      forward_at(stages, s, x.ptr, w.ptr, bias.ptr, y_at.ptr, ws.ptr, nullptr);
      const Vec got = y_at.to_host();
      CHECK(same_bits(got, rung_y));
      const Result at = compare(rung, s, in, got, Vec(in.x.size()), Vec(in.w.size()));
      require_within(at.forward, "forward");
    }
  }
  const Conv2dShape s = shapes[0];
  CHECK_THROWS_WITH(forward_at(5, s, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr),
                    "conv rung 0" + std::to_string(rung.rung) +
                        ": 5 stages (2, 3 or 4 are built)");
}

// Rung 08 also from bfloat16 tensors, bitwise as from float32 ones.
// (Not tagged [tsan], as the sweep took 344 s under ThreadSanitizer: there
// the fragment-register test below runs rungs 8 and 9 in every direction.)
TEST_CASE("cuda conv rung 8: every direction within its bounds on channels-last operands over "
          "strides, windows, pads and channel counts, the same bits at every pipeline depth",
          "[cuda][conv][bf16]") {
  if (!cuda_test::have_device()) return;
  require_multistage_rung(kBf16Multistage, cu::conv_rungs::bf16_multistage_forward, 120);
  require_bf16_reads_as_float32(kBf16Multistage, 90);
}

// Rung 09: rung 06's bounds (TF32 operands, FP32 sums) on rung 08's shapes.
TEST_CASE("cuda conv rung 9: every direction within the TF32 bounds on channels-last operands "
          "over strides, windows, pads and channel counts, the same bits at every pipeline depth",
          "[cuda][conv][tf32]") {
  if (!cuda_test::have_device()) return;
  require_multistage_rung(kTf32Multistage, cu::conv_rungs::tf32_multistage_forward, 120);
}

TEST_CASE("conv backends: bfloat16 operands on the CPU and cuda:0 against FP64, and bitwise as "
          "float32 of the same values under BF16 math",
          "[cuda][conv][bf16]") {
  std::vector<anvil::Device> devices{anvil::Device::cpu()};
  if (cuda_test::have_device("bf16 operand backend test")) devices.push_back(anvil::Device::cuda(0));
  using anvil::DType;
  using anvil::Tensor;
  uint32_t seed = 90;
  for (const Conv2dShape& s : test_shapes()) {
    const Inputs in = draw(s, seed += 5, true);
    // db's FP64 reference: the sum of dy over n, p, q, and its magnitude.
    std::vector<double> db_ref(size_t(s.K)), db_mag(size_t(s.K));
    for (size_t i = 0; i < in.dy.size(); ++i) {
      db_ref[i / size_t(s.P * s.Q) % size_t(s.K)] += in.dy[i];
      db_mag[i / size_t(s.P * s.Q) % size_t(s.K)] += std::fabs(in.dy[i]);
    }
    for (const anvil::Device d : devices) {
      INFO(d.str() << ", " << describe(s));
      auto tensor = [&](const Vec& v, const anvil::Shape& shape, DType dtype) {
        return Tensor::from_vector(v, shape).to(dtype).to(d);
      };
      // The three directions and the bias gradient through d's backend.
      auto run = [&](DType dtype, Vec& db) {
        const Tensor x = tensor(in.x, {s.N, s.C, s.H, s.W}, dtype);
        const Tensor w = tensor(in.w, {s.K, s.C, s.R, s.S}, dtype);
        const Tensor dy = tensor(in.dy, {s.N, s.K, s.P, s.Q}, dtype);
        const Tensor bias = tensor(in.bias, {s.K}, DType::Float32);
        const Tensor y = Tensor::empty(dy.shape(), DType::Float32, d);
        const Tensor dx = Tensor::empty(x.shape(), DType::Float32, d);
        const Tensor dw = Tensor::empty(w.shape(), DType::Float32, d);
        const Tensor dbias = Tensor::empty({s.K}, DType::Float32, d);
        anvil::Backend& be = anvil::backend_for(d);
        be.conv2d_forward(s, x, w, bias, y);
        be.conv2d_backward_data(s, dy, w, dx);
        be.conv2d_backward_weight(s, x, dy, dw, dbias);
        db = dbias.to_vector();
        return compare(kBf16, s, in, y.to_vector(), dx.to_vector(), dw.to_vector());
      };
      Vec db, db_f;
      // bfloat16 operands are BF16 math under any setting (the default here).
      const Result b = run(DType::BFloat16, db);
      require_within_bf16(b);
      const double R = double(s.N * s.P * s.Q);
      for (size_t k = 0; k < db.size(); ++k)
        REQUIRE(std::fabs(db[k] - db_ref[k]) <= R * 0x1p-23 * db_mag[k]);
      anvil::ScopedBf16Math bf16_math;
      const Result f = run(DType::Float32, db_f);
      CHECK(same_bits(b.y, f.y));
      CHECK(same_bits(b.dx, f.dx));
      CHECK(same_bits(b.dw, f.dw));
      CHECK(same_bits(db, db_f));
    }
  }
}

// Run by ctest twice (tests/CMakeLists.txt): as shipped, where the backend's
// BF16 convolutions must give rung 8's bits exactly and its TF32 ones
// (float32 tensors under the default precision) rung 9's, and with
// ANVIL_CONV_BF16_RUNG=7 ANVIL_CONV_TF32_RUNG=6, rungs 7's and 6's. The
// rungs sum in different orders, so a backend on the wrong rung fails.
TEST_CASE("cuda conv: the backend's BF16 and TF32 convolutions run the shipped rungs 8 and 9, "
          "or the ones ANVIL_CONV_BF16_RUNG and ANVIL_CONV_TF32_RUNG name",
          "[.][conv-rung-override]") {
  if (!cuda_test::have_device("ANVIL_CONV_*_RUNG test")) return;
  const auto named = [](const char* var, int shipped) {
    const char* v = std::getenv(var);
    return v == nullptr || *v == '\0' ? shipped : std::atoi(v);
  };
  const int bf16 = named("ANVIL_CONV_BF16_RUNG", 8), tf32 = named("ANVIL_CONV_TF32_RUNG", 9);
  REQUIRE(cu::bf16_conv_rung() == bf16);
  REQUIRE(cu::tf32_conv_rung() == tf32);
  REQUIRE(anvil::fp32_math(anvil::OpFamily::kConv, anvil::DeviceType::CUDA) ==
          anvil::Fp32Math::kTf32);
  using anvil::DType;
  using anvil::Tensor;
  const anvil::Device d = anvil::Device::cuda(0);
  struct Case {
    DType dtype;
    const Rung& rung;
    Operands operands;
  };
  for (const Case& c : {Case{DType::BFloat16, bf16 == 8 ? kBf16Multistage : kBf16, Operands::kBf16},
                        Case{DType::Float32, tf32 == 9 ? kTf32Multistage : kTf32,
                             Operands::kFloat32}}) {
    uint32_t seed = 150;
    for (const Conv2dShape& s : test_shapes()) {
      INFO("rung " << c.rung.rung << ", " << describe(s));
      const Inputs in = draw(s, seed += 5, c.operands != Operands::kFloat32);
      auto tensor = [&](const Vec& v, const anvil::Shape& shape) {
        return Tensor::from_vector(v, shape).to(c.dtype).to(d);
      };
      const Tensor x = tensor(in.x, {s.N, s.C, s.H, s.W}), w = tensor(in.w, {s.K, s.C, s.R, s.S});
      const Tensor dy = tensor(in.dy, {s.N, s.K, s.P, s.Q});
      const Tensor bias = Tensor::from_vector(in.bias, {s.K}).to(d);
      const Tensor y = Tensor::empty(dy.shape(), DType::Float32, d);
      const Tensor dx = Tensor::empty(x.shape(), DType::Float32, d);
      const Tensor dw = Tensor::empty(w.shape(), DType::Float32, d);
      const Tensor dbias = Tensor::empty({s.K}, DType::Float32, d);
      anvil::Backend& be = anvil::backend_for(d);
      be.conv2d_forward(s, x, w, bias, y);
      be.conv2d_backward_data(s, dy, w, dx);
      be.conv2d_backward_weight(s, x, dy, dw, dbias);
      const Result direct = run_shape(c.rung, s, seed, c.operands);
      CHECK(same_bits(y.to_vector(), direct.y));
      CHECK(same_bits(dx.to_vector(), direct.dx));
      CHECK(same_bits(dw.to_vector(), direct.dw));
    }
  }
}

#if defined(ANVIL_CUDA_SIM)
TEST_CASE("cuda conv mma: a swapped fragment register in the emulated tensor core breaks rungs 6 "
          "to 9",
          "[cuda][conv][tf32][sim][tsan]") {
  namespace mma = anvil::sim::mma;
  const Conv2dShape s = make_shape(2, 3, 9, 8, 5, 3, 2, 2, 1, 1, 0);
  for (const Rung& rung : {kTf32, kBf16, kBf16Multistage, kTf32Multistage}) {
    INFO("rung " << rung.rung);
    mma::set_register_swap(mma::Operand::kA, 1, 2);
    Result broken;
    try {
      broken = run_shape(rung, s, 3);
    } catch (...) {
      mma::clear_register_swap();
      throw;
    }
    mma::clear_register_swap();
    INFO("worst error / bound with A:1:2 swapped: forward " << broken.forward.bound
         << ", backward-data " << broken.backward_data.bound << ", backward-weight "
         << broken.backward_weight.bound);
    REQUIRE(broken.forward.bound > 10.0);
    REQUIRE(broken.backward_data.bound > 10.0);
    REQUIRE(broken.backward_weight.bound > 10.0);
    const Result fixed = run_shape(rung, s, 3);  // right again without the swap
    REQUIRE(fixed.forward.bound <= 1.0);
    REQUIRE(fixed.backward_data.bound <= 1.0);
    REQUIRE(fixed.backward_weight.bound <= 1.0);
  }
}
#endif

#endif  // ANVIL_CUDA_BACKEND
