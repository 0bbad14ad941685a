// kernels/cuda convolution (kernels/cuda/conv/): every FP32 rung of forward,
// backward-data and backward-weight against cpu::conv2d_* on ragged shapes
// (strides, pads, non-square windows, chunked batches), with and without
// bias / dbias; degenerate shapes (every rung) and argument checks. The
// tensor-core rungs (after kConvFp32Rungs) cannot meet these FP32
// tolerances: test_cuda_conv_tf32.cpp tests them with derived bounds. Runs on the simulator
// (ANVIL_CUDA=SIM) or on a real GPU when there is one.
#if defined(ANVIL_CUDA_BACKEND)
#include <catch2/catch.hpp>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cuda/cuda_kernels.h"
#include "core/shapes.h"
#include "tests/cuda_test_util.h"

namespace {

using Vec = std::vector<float>;
using anvil::Conv2dShape;
using cuda_test::DeviceBuffer;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

Conv2dShape make_shape(int64_t N, int64_t C, int64_t H, int64_t W, int64_t K, int64_t R,
                       int64_t S, int64_t sh, int64_t sw, int64_t ph, int64_t pw) {
  Conv2dShape s{N, C, H, W, K, R, S, sh, sw, ph, pw, 0, 0};
  s.P = Conv2dShape::out_size(H, R, sh, ph);
  s.Q = Conv2dShape::out_size(W, S, sw, pw);
  return s;
}

Conv2dShape make_shape(int64_t N, int64_t C, int64_t H, int64_t W, int64_t K, int64_t R,
                       int64_t S, int64_t stride, int64_t pad) {
  return make_shape(N, C, H, W, K, R, S, stride, stride, pad, pad);
}

// The shapes every rung is checked on. The (5,12,12,12,4,3,3) one is
// three images per chunk for rung 2 in the simulator build (a chunk of 3,
// then a short one of 2). The (2,68,5,6,66,3,3) one has more than 64 output
// and input channels, so rung 4 runs its 128-row tile in every direction
// (the others take its 64-row tile), with C*R*S = 612 a multiple of 4: the
// forward reads the weights with 16-byte loads.
std::vector<Conv2dShape> test_shapes() {
  return {make_shape(1, 1, 5, 5, 1, 3, 3, 1, 0),    make_shape(2, 3, 7, 6, 5, 3, 3, 1, 1),
          make_shape(2, 4, 9, 9, 6, 5, 5, 2, 2),    make_shape(3, 2, 8, 7, 4, 1, 1, 2, 0),
          make_shape(1, 20, 12, 12, 50, 5, 5, 1, 0),  // LeNet's conv2, batch 1
          make_shape(2, 5, 6, 6, 7, 3, 2, 1, 1),    make_shape(2, 3, 9, 8, 4, 3, 2, 2, 1, 0, 1),
          make_shape(2, 68, 5, 6, 66, 3, 3, 1, 1), make_shape(5, 12, 12, 12, 4, 3, 3, 1, 0)};
}

std::string describe(const Conv2dShape& s) {
  std::ostringstream o;
  o << "N" << s.N << " C" << s.C << " H" << s.H << " W" << s.W << " K" << s.K << " R" << s.R
    << " S" << s.S << " stride " << s.stride_h << "," << s.stride_w << " pad " << s.pad_h << ","
    << s.pad_w << " -> P" << s.P << " Q" << s.Q;
  return o.str();
}

// Within 1e-4 relative to the element and to the output's magnitude.
void require_close_scaled(const Vec& got, const Vec& want) {
  float scale = 1e-3f;
  for (float v : want) scale = std::max(scale, std::fabs(v));
  cuda_test::require_close(got, want, 1e-4f, 1e-4f * scale);
}

// A workspace of the size the rung asks for, full of NaN (so that reading
// workspace nobody wrote shows).
struct Workspace {
  DeviceBuffer<float> buf;
  Workspace(int rung, const Conv2dShape& s)
      : buf(Vec(anvil::cuda::conv2d_workspace_floats(rung, s), kNaN)) {}
  float* ptr() { return buf.count ? buf.ptr : nullptr; }
};

size_t x_size(const Conv2dShape& s) { return size_t(s.N * s.C * s.H * s.W); }
size_t w_size(const Conv2dShape& s) { return size_t(s.K * s.C * s.R * s.S); }
size_t y_size(const Conv2dShape& s) { return size_t(s.N * s.K * s.P * s.Q); }

}  // namespace

TEST_CASE("cuda conv: forward, every FP32 rung, matches the CPU", "[cuda][conv]") {
  if (!cuda_test::have_device()) return;
  for (const Conv2dShape& s : test_shapes()) {
    const Vec x = cuda_test::random_floats(x_size(s), 11), w = cuda_test::random_floats(w_size(s), 12);
    const Vec bias = cuda_test::random_floats(size_t(s.K), 13);
    DeviceBuffer<float> dx(x), dw(w), dbias(bias);
    for (bool with_bias : {false, true}) {
      Vec want(y_size(s));
      anvil::cpu::conv2d_forward(s, x.data(), w.data(), with_bias ? bias.data() : nullptr,
                                 want.data());
      for (int rung = 1; rung <= anvil::cuda::kConvFp32Rungs; ++rung) {
        INFO(describe(s) << ", rung " << rung << ", bias " << with_bias);
        Workspace ws(rung, s);
        DeviceBuffer<float> dy(Vec(y_size(s), kNaN));  // every element must be written
        anvil::cuda::conv2d_forward(rung, s, dx.ptr, dw.ptr, with_bias ? dbias.ptr : nullptr,
                                    dy.ptr, ws.ptr(), nullptr);
        require_close_scaled(dy.to_host(), want);
      }
    }
  }
}

TEST_CASE("cuda conv: backward-data, every FP32 rung, matches the CPU", "[cuda][conv]") {
  if (!cuda_test::have_device()) return;
  for (const Conv2dShape& s : test_shapes()) {
    const Vec g = cuda_test::random_floats(y_size(s), 21), w = cuda_test::random_floats(w_size(s), 22);
    DeviceBuffer<float> dg(g), dw(w);
    Vec want(x_size(s), kNaN);
    anvil::cpu::conv2d_backward_data(s, g.data(), w.data(), want.data());
    for (int rung = 1; rung <= anvil::cuda::kConvFp32Rungs; ++rung) {
      INFO(describe(s) << ", rung " << rung);
      Workspace ws(rung, s);
      DeviceBuffer<float> dx(Vec(x_size(s), kNaN));  // overwritten, not accumulated into
      anvil::cuda::conv2d_backward_data(rung, s, dg.ptr, dw.ptr, dx.ptr, ws.ptr(), nullptr);
      require_close_scaled(dx.to_host(), want);
    }
  }
}

TEST_CASE("cuda conv: backward-weight and dbias, every FP32 rung, match the CPU", "[cuda][conv]") {
  if (!cuda_test::have_device()) return;
  for (const Conv2dShape& s : test_shapes()) {
    const Vec x = cuda_test::random_floats(x_size(s), 31), g = cuda_test::random_floats(y_size(s), 32);
    DeviceBuffer<float> dx(x), dg(g);
    Vec want_w(w_size(s), kNaN), want_b(size_t(s.K), kNaN);
    anvil::cpu::conv2d_backward_weight(s, x.data(), g.data(), want_w.data(), want_b.data());
    for (bool with_bias : {false, true}) {
      for (int rung = 1; rung <= anvil::cuda::kConvFp32Rungs; ++rung) {
        INFO(describe(s) << ", rung " << rung << ", dbias " << with_bias);
        Workspace ws(rung, s);
        DeviceBuffer<float> dw(Vec(w_size(s), kNaN)), db(Vec(size_t(s.K), kNaN));
        anvil::cuda::conv2d_backward_weight(rung, s, dx.ptr, dg.ptr, dw.ptr,
                                            with_bias ? db.ptr : nullptr, ws.ptr(), nullptr);
        require_close_scaled(dw.to_host(), want_w);
        const Vec got_b = db.to_host();
        if (with_bias) {
          require_close_scaled(got_b, want_b);
        } else {
          for (float v : got_b) REQUIRE(std::isnan(v));  // null dbias: not written
        }
      }
    }
  }
}

// The sanitizer builds run the simulator several times slower: there the
// split-K test keeps to its small shapes.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kSanitizerBuild = true;
#else
constexpr bool kSanitizerBuild = false;
#endif

TEST_CASE("cuda conv: split-K (rung 5, and rung 2's weight GEMM) matches the CPU and is "
          "bitwise deterministic", "[cuda][conv][split-k]") {
  if (!cuda_test::have_device()) return;
  // Every shape splits at least one direction in rung 5 (checked below):
  // ragged ones (a short last chunk, strides, pads, a 128-row tile with
  // K = 70) and the layers of LeNet and ResNet-18 (tools/predict/kernel_table.py)
  // at small batches. Backward-weight splits over N*P*Q wherever that is long;
  // forward and backward-data where C*R*S or K*R*S is long and the tiles few
  // (the 512-channel layer). Rung 2 splits each chunk's weight GEMM
  // (GEMM rung 8). Each direction runs twice, each time with a fresh
  // workspace of NaN, and must give the same bits.
  struct Case {
    const char* name;
    Conv2dShape s;
    bool small;  // run under the sanitizers too
  };
  const Case cases[] = {
      {"ragged 3x3, last chunk short", make_shape(3, 3, 17, 17, 5, 3, 3, 1, 0), true},
      {"ragged 3x2 stride 2,1 pad 1,0, K = 70", make_shape(4, 6, 15, 13, 70, 3, 2, 2, 1, 1, 0),
       true},
      {"LeNet conv1 1->20 3x3 @28, batch 8 (42 splits)", make_shape(8, 1, 28, 28, 20, 3, 3, 1, 0),
       true},
      {"LeNet conv2 20->50 5x5 @13, batch 4", make_shape(4, 20, 13, 13, 50, 5, 5, 1, 0), false},
      {"ResNet-18 stem 1->64 3x3 @28, batch 1", make_shape(1, 1, 28, 28, 64, 3, 3, 1, 1), true},
      {"ResNet-18 s1 64->64 3x3 @28, batch 1", make_shape(1, 64, 28, 28, 64, 3, 3, 1, 1), false},
      {"ResNet-18 s2 64->128 3x3/2 @28, batch 2", make_shape(2, 64, 28, 28, 128, 3, 3, 2, 1),
       false},
      {"ResNet-18 s2 shortcut 64->128 1x1/2 @28, batch 2",
       make_shape(2, 64, 28, 28, 128, 1, 1, 2, 0), false},
      {"ResNet-18 s3 256->256 3x3 @7, batch 6", make_shape(6, 256, 7, 7, 256, 3, 3, 1, 1), false},
      {"ResNet-18 s4 512->512 3x3 @4, batch 1", make_shape(1, 512, 4, 4, 512, 3, 3, 1, 1), false},
  };
  enum Direction { kForward, kBackwardData, kBackwardWeight };
  for (const Case& c : cases) {
    if (kSanitizerBuild && !c.small) continue;
    const Conv2dShape& s = c.s;
    SECTION(c.name) {
      INFO(describe(s));
      REQUIRE(anvil::cuda::conv2d_workspace_floats(5, s) > 0);  // rung 5 splits this shape
      const Vec x = cuda_test::random_floats(x_size(s), 41);
      const Vec w = cuda_test::random_floats(w_size(s), 42);
      const Vec g = cuda_test::random_floats(y_size(s), 43);
      const Vec bias = cuda_test::random_floats(size_t(s.K), 44);
      DeviceBuffer<float> d_x(x), d_w(w), d_g(g), d_bias(bias);
      Vec want_y(y_size(s)), want_dx(x_size(s)), want_dw(w_size(s)), want_db(size_t(s.K));
      anvil::cpu::conv2d_forward(s, x.data(), w.data(), bias.data(), want_y.data());
      anvil::cpu::conv2d_backward_data(s, g.data(), w.data(), want_dx.data());
      anvil::cpu::conv2d_backward_weight(s, x.data(), g.data(), want_dw.data(), want_db.data());
      const Vec* wants[] = {&want_y, &want_dx, &want_dw};
      for (int rung : {2, 5}) {
        for (Direction dir : {kForward, kBackwardData, kBackwardWeight}) {
          if (rung == 2 && dir != kBackwardWeight) continue;  // only its weight GEMM splits
          INFO("rung " << rung << ", direction " << int(dir));
          Vec first;
          for (int run = 0; run < 2; ++run) {
            Workspace ws(rung, s);  // fresh NaN: every partial must be written
            DeviceBuffer<float> out(Vec(wants[dir]->size(), kNaN)), db(Vec(size_t(s.K), kNaN));
            if (dir == kForward)
              anvil::cuda::conv2d_forward(rung, s, d_x.ptr, d_w.ptr, d_bias.ptr, out.ptr,
                                          ws.ptr(), nullptr);
            else if (dir == kBackwardData)
              anvil::cuda::conv2d_backward_data(rung, s, d_g.ptr, d_w.ptr, out.ptr, ws.ptr(),
                                                nullptr);
            else
              anvil::cuda::conv2d_backward_weight(rung, s, d_x.ptr, d_g.ptr, out.ptr, db.ptr,
                                                  ws.ptr(), nullptr);
            const Vec got = out.to_host();
            if (run == 0) {
              require_close_scaled(got, *wants[dir]);
              if (dir == kBackwardWeight) require_close_scaled(db.to_host(), want_db);
              first = got;
            } else {  // bitwise the same as the first run
              REQUIRE(std::memcmp(got.data(), first.data(), got.size() * sizeof(float)) == 0);
            }
          }
        }
      }
    }
  }
}

TEST_CASE("cuda conv: degenerate shapes give empty or zero results", "[cuda][conv]") {
  if (!cuda_test::have_device()) return;
  // The window does not fit (P = 0): y is empty, dx and dw are zeros, dbias 0.
  const Conv2dShape s = make_shape(2, 3, 2, 6, 4, 3, 3, 1, 0);
  REQUIRE(s.P == 0);
  for (int rung = 1; rung <= anvil::cuda::kConvRungs; ++rung) {
    INFO("rung " << rung);
    Workspace ws(rung, s);
    DeviceBuffer<float> x(Vec(x_size(s), 1.0f)), w(Vec(w_size(s), 1.0f)), y(0);
    anvil::cuda::conv2d_forward(rung, s, x.ptr, w.ptr, nullptr, y.ptr, ws.ptr(), nullptr);
    DeviceBuffer<float> dx(Vec(x_size(s), kNaN));
    anvil::cuda::conv2d_backward_data(rung, s, y.ptr, w.ptr, dx.ptr, ws.ptr(), nullptr);
    REQUIRE(dx.to_host() == Vec(x_size(s), 0.0f));
    DeviceBuffer<float> dw(Vec(w_size(s), kNaN)), db(Vec(size_t(s.K), kNaN));
    anvil::cuda::conv2d_backward_weight(rung, s, x.ptr, y.ptr, dw.ptr, db.ptr, ws.ptr(),
                                        nullptr);
    REQUIRE(dw.to_host() == Vec(w_size(s), 0.0f));
    REQUIRE(db.to_host() == Vec(size_t(s.K), 0.0f));
  }
}

TEST_CASE("cuda conv: bad shapes and rungs are refused", "[cuda][conv]") {
  if (!cuda_test::have_device()) return;
  using anvil::cuda::conv2d_forward;
  using anvil::cuda::conv2d_workspace_floats;
  Conv2dShape s = make_shape(1, 2, 5, 5, 3, 3, 3, 1, 0);
  // Every rung's workspace holds at least the bias gradient's per-channel
  // partials (backward-weight's dbias is a channel_sum); beyond that, only
  // rung 2 (columns) and a rung 5 that splits need space.
  const size_t bias_partials =
      anvil::cuda::channel_sum_workspace_floats(anvil::cuda::kBestChannelSum, 1, 3, 3 * 3);
  REQUIRE(bias_partials > 0);
  REQUIRE(conv2d_workspace_floats(1, s) == bias_partials);
  REQUIRE(conv2d_workspace_floats(3, s) == bias_partials);
  REQUIRE(conv2d_workspace_floats(4, s) == bias_partials);
  REQUIRE(conv2d_workspace_floats(5, s) == bias_partials);  // N*P*Q = 9: too short to split
  REQUIRE(conv2d_workspace_floats(2, s) > bias_partials);
#if defined(ANVIL_CUDA_SIM)
  // The simulator's 2^15-float column chunk: the batch-5 test shape runs as
  // chunks of 3 and 2 images (columns [108, 3*100] plus a [4, 3*100] matrix),
  // then the partials of the weight GEMM [4, 108] over K = 3*100, which
  // GEMM rung 8 splits in two.
  REQUIRE(anvil::cuda::gemm_workspace_floats(8, 4, 108, 300) == 2 * 4 * 108);
  REQUIRE(conv2d_workspace_floats(2, test_shapes().back()) == 3 * 100 * (108 + 4) + 2 * 4 * 108);
#endif
  REQUIRE_THROWS_WITH(conv2d_workspace_floats(anvil::cuda::kConvRungs + 1, s),
                      Catch::Contains("no rung " +
                                      std::to_string(anvil::cuda::kConvRungs + 1)));
  // The operands typed: float32 and bfloat16 ones have overloads of their own.
  const float* none = nullptr;
  REQUIRE_THROWS_WITH(conv2d_forward(0, s, none, none, nullptr, nullptr, nullptr, nullptr),
                      Catch::Contains("no rung 0"));
  REQUIRE_THROWS_WITH(conv2d_forward(2, s, none, none, nullptr, nullptr, nullptr, nullptr),
                      Catch::Contains("needs a workspace"));
  float not_read = 0;  // dbias: refused before anything runs
  REQUIRE_THROWS_WITH(anvil::cuda::conv2d_backward_weight(3, s, none, none, nullptr, &not_read,
                                                          nullptr, nullptr),
                      Catch::Contains("dbias needs a workspace"));
  Conv2dShape bad = s;
  bad.P = 4;
  REQUIRE_THROWS_WITH(conv2d_forward(1, bad, none, none, nullptr, nullptr, nullptr, nullptr),
                      Catch::Contains("P = 4"));
  bad = s;
  bad.stride_w = 0;
  REQUIRE_THROWS_WITH(anvil::cuda::conv2d_backward_data(3, bad, none, none, nullptr, nullptr,
                                                        nullptr),
                      Catch::Contains("stride_w = 0"));
  bad = s;
  bad.N = -1;
  REQUIRE_THROWS_AS(anvil::cuda::conv2d_backward_weight(1, bad, none, none, nullptr, nullptr,
                                                        nullptr, nullptr),
                    std::invalid_argument);
}

#endif  // ANVIL_CUDA_BACKEND
