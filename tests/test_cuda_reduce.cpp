// kernels/cuda reductions (kernels/cuda/reduce/): every sum rung against cpu::sum on
// sizes around the warp, block and grid boundaries, the determinism of the
// two-pass rung, channel_sum against cpu::channel_sum on ragged shapes,
// and label_check. Runs on the simulator (ANVIL_CUDA=SIM) or on a real GPU.
#if defined(ANVIL_CUDA_BACKEND)
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cuda/cuda_kernels.h"
#include "tests/cuda_test_util.h"

namespace {

using Vec = std::vector<float>;
using cuda_test::DeviceBuffer;

double abs_sum(const Vec& v) {
  double s = 0.0;
  for (float x : v) s += std::fabs(x);
  return s;
}

// Runs sum(rung) on x and returns out[0]; out starts as garbage, so the
// rungs that need it zeroed must zero it themselves.
float device_sum(int rung, const Vec& x) {
  const int64_t n = static_cast<int64_t>(x.size());
  DeviceBuffer<float> dx(x), out(Vec{12345.0f});
  DeviceBuffer<float> ws(anvil::cuda::sum_workspace_floats(rung, n));
  anvil::cuda::sum(rung, n, dx.ptr, out.ptr, ws.count ? ws.ptr : nullptr, nullptr);
  return out.to_host()[0];
}

}  // namespace

TEST_CASE("cuda reduce: every sum rung matches cpu::sum", "[cuda][reduce]") {
  if (!cuda_test::have_device()) return;
  for (int rung = 1; rung <= anvil::cuda::kSumRungs; ++rung) {
    for (int64_t n : {0, 1, 31, 33, 1000, 4099, 70000}) {
      DYNAMIC_SECTION("rung " << rung << ", n " << n) {
        const Vec x = cuda_test::random_floats(size_t(n), uint32_t(7 + n));
        const float want = anvil::cpu::sum(n, x.data());
        const float got = device_sum(rung, x);
        if (n == 0) {
          REQUIRE(got == 0.0f);
        } else {
          REQUIRE(std::fabs(got - want) <= 1e-5 * abs_sum(x));
        }
      }
    }
  }
  SECTION("workspace: only the two-pass rung needs one") {
    for (int rung = 1; rung <= 3; ++rung)
      REQUIRE(anvil::cuda::sum_workspace_floats(rung, 70000) == 0);
    REQUIRE(anvil::cuda::sum_workspace_floats(4, 0) == 0);
    REQUIRE(anvil::cuda::sum_workspace_floats(4, 1) == 1);
    REQUIRE(anvil::cuda::sum_workspace_floats(4, 70000) > 1);
  }
  SECTION("an unknown rung is refused") {
    REQUIRE_THROWS_WITH(anvil::cuda::sum(5, 1, nullptr, nullptr, nullptr, nullptr),
                        Catch::Contains("no rung 5"));
    REQUIRE_THROWS_AS(anvil::cuda::sum_workspace_floats(0, 1), std::invalid_argument);
  }
}

TEST_CASE("cuda reduce: the two-pass sum is bitwise deterministic", "[cuda][reduce]") {
  if (!cuda_test::have_device()) return;
  for (int64_t n : {4099, 70000}) {
    // Values of very different magnitudes, so that any change of order shows.
    Vec x = cuda_test::random_floats(size_t(n), 99);
    for (size_t i = 0; i < x.size(); i += 7) x[i] *= 1e4f;
    const float a = device_sum(4, x), b = device_sum(4, x);
    uint32_t bits_a, bits_b;
    std::memcpy(&bits_a, &a, 4);
    std::memcpy(&bits_b, &b, 4);
    REQUIRE(bits_a == bits_b);
    REQUIRE(std::fabs(a - anvil::cpu::sum(n, x.data())) <= 1e-5 * abs_sum(x));
  }
}

namespace {

struct ChannelShape {
  int64_t outer, C, inner;
};

// channel_sum(rung) of dy (from dy_offset floats into its device copy, to
// test unaligned starts); db starts as garbage, which must be overwritten.
Vec device_channel_sum(int rung, const ChannelShape& s, const Vec& dy, size_t dy_offset = 0) {
  Vec padded(dy_offset, 0.0f);
  padded.insert(padded.end(), dy.begin(), dy.end());
  DeviceBuffer<float> ddy(padded), ddb(Vec(size_t(s.C), 777.0f));
  DeviceBuffer<float> ws(anvil::cuda::channel_sum_workspace_floats(rung, s.outer, s.C, s.inner));
  anvil::cuda::channel_sum(rung, s.outer, s.C, s.inner, ddy.ptr + dy_offset, ddb.ptr,
                           ws.count ? ws.ptr : nullptr, nullptr);
  return ddb.to_host();
}

void require_channel_sum_close(const ChannelShape& s, const Vec& dy, const Vec& got) {
  Vec want(size_t(s.C));
  anvil::cpu::channel_sum(s.outer, s.C, s.inner, dy.data(), want.data());
  for (int64_t c = 0; c < s.C; ++c) {
    double scale = 0.0;
    for (int64_t o = 0; o < s.outer; ++o)
      for (int64_t i = 0; i < s.inner; ++i)
        scale += std::fabs(dy[size_t((o * s.C + c) * s.inner + i)]);
    INFO("channel " << c);
    REQUIRE(std::fabs(got[size_t(c)] - want[size_t(c)]) <= 1e-5 * scale + 1e-7);
  }
}

// Blocks per channel of rung 2 (its workspace is one float per block).
int64_t channel_sum_splits(const ChannelShape& s) {
  return int64_t(anvil::cuda::channel_sum_workspace_floats(2, s.outer, s.C, s.inner)) / s.C;
}

}  // namespace

TEST_CASE("cuda reduce: channel_sum matches cpu::channel_sum on ragged shapes", "[cuda][reduce]") {
  if (!cuda_test::have_device()) return;
  // Ragged: one channel, 3 channels, odd and tiny runs, N = 1, inner not a
  // multiple of 4 (scalar loads) or a multiple of 4 (float4), channels cut
  // into several slices whose last one is short (5 x 999 floats on one
  // channel: 10 slices), column sums (inner 1: 300 columns in 2 blocks of
  // threads, row slices whose last is short), and the bias shapes of LeNet's and ResNet-18's
  // layers at batch 2 (Linear: inner 1; convolutions and BatchNorm: HW).
  // Under the sanitizers (the simulator about 10 times slower, a launch
  // costing in proportion to its blocks) the widest of those are left out.
  const ChannelShape shapes[] = {
      {3, 5, 7},     {1, 1, 1},     {2, 64, 1},   {4, 3, 50},   {0, 4, 3},
      {33, 2, 17},   {5, 1, 999},   {1, 3, 1373}, {7, 3, 256},  {9, 1, 1020},
      {2, 20, 676},  {2, 50, 81},   {2, 128, 1},  {2, 10, 1},   {2, 64, 784},
      {200, 300, 1}, {1000, 3, 1},  {65, 1, 1},
#if !defined(__SANITIZE_THREAD__) && !defined(__SANITIZE_ADDRESS__)
      {2, 128, 196}, {2, 256, 49},  {2, 512, 16},
#endif
  };
  for (int rung = 1; rung <= anvil::cuda::kChannelSumRungs; ++rung) {
    for (const ChannelShape& s : shapes) {
      DYNAMIC_SECTION("rung " << rung << ", outer " << s.outer << ", C " << s.C
                                 << ", inner " << s.inner) {
        const Vec dy = cuda_test::random_floats(size_t(s.outer * s.C * s.inner), 5);
        require_channel_sum_close(s, dy, device_channel_sum(rung, s, dy));
        // A start 4 bytes past a 16-byte boundary: rung 2 must fall back to
        // scalar loads (the simulator fails a misaligned float4).
        require_channel_sum_close(s, dy, device_channel_sum(rung, s, dy, 1));
      }
    }
  }
  SECTION("rung 2 splits the channels that need it, and one wave of blocks is its goal") {
    REQUIRE(channel_sum_splits({5, 1, 999}) == 10);  // slices of >= 512 floats
    REQUIRE(channel_sum_splits({7, 3, 256}) == 4);
    REQUIRE(channel_sum_splits({128, 50, 81}) == 21);  // LeNet's conv2 at batch 128: 1050 blocks
    REQUIRE(channel_sum_splits({1, 1, 1}) == 1);
    REQUIRE(channel_sum_splits({256, 64, 784}) == 16);  // ResNet-18 stage 1: 1024 blocks
    REQUIRE(channel_sum_splits({128, 512, 16}) == 2);   // stage 4 at batch 128
    REQUIRE(channel_sum_splits({256, 1, 1 << 20}) == 1056);
    // inner == 1 (a linear layer's bias): column sums over row slices of at
    // least 8 rows, as many as a wave of blocks takes.
    REQUIRE(channel_sum_splits({2, 128, 1}) == 1);
    REQUIRE(channel_sum_splits({256, 128, 1}) == 32);  // LeNet's fc1 at batch 256
    REQUIRE(channel_sum_splits({65, 1, 1}) == 9);
    REQUIRE(channel_sum_splits({200, 300, 1}) == 25);
    REQUIRE(channel_sum_splits({60000, 10, 1}) == 1056);
    REQUIRE(channel_sum_splits({100000, 600, 1}) == 352);  // 3 column blocks: 1056 / 3
  }
  SECTION("workspace, rungs and a missing workspace") {
    REQUIRE(anvil::cuda::channel_sum_workspace_floats(1, 256, 64, 784) == 0);
    REQUIRE(anvil::cuda::channel_sum_workspace_floats(2, 0, 4, 3) == 4);
    REQUIRE(anvil::cuda::channel_sum_workspace_floats(2, 3, 0, 3) == 0);
    const float* no_dy = nullptr;
    REQUIRE_THROWS_WITH(anvil::cuda::channel_sum(3, 1, 1, 1, no_dy, nullptr, nullptr, nullptr),
                        Catch::Contains("no rung 3"));
    REQUIRE_THROWS_WITH(anvil::cuda::channel_sum(2, 1, 1, 1, no_dy, nullptr, nullptr, nullptr),
                        Catch::Contains("workspace"));
  }
}

TEST_CASE("cuda reduce: channel_sum rung 2 is bitwise deterministic", "[cuda][reduce]") {
  if (!cuda_test::have_device()) return;
  for (const ChannelShape& s : {ChannelShape{5, 1, 999}, ChannelShape{2, 64, 784}}) {
    INFO("outer " << s.outer << ", C " << s.C << ", inner " << s.inner);
    // Magnitudes from 1e-3 to 1e4, so that any change of order shows.
    Vec dy = cuda_test::random_floats(size_t(s.outer * s.C * s.inner), 17);
    for (size_t i = 0; i < dy.size(); i += 7) dy[i] *= 1e4f;
    for (size_t i = 3; i < dy.size(); i += 11) dy[i] *= 1e-3f;
    REQUIRE(channel_sum_splits(s) > 1);
    const Vec a = device_channel_sum(2, s, dy), b = device_channel_sum(2, s, dy);
    REQUIRE(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
    require_channel_sum_close(s, dy, a);
  }
}

TEST_CASE("cuda reduce: label_check keeps the first bad label", "[cuda][reduce]") {
  if (!cuda_test::have_device()) return;
  using anvil::cuda::kLabelRecordSlots;
  const std::vector<int64_t> clear(kLabelRecordSlots, -1);
  SECTION("labels in range write nothing") {
    DeviceBuffer<int64_t> labels(std::vector<int64_t>{0, 9, 3}), record(clear);
    anvil::cuda::label_check(3, labels.ptr, 10, 1, record.ptr, nullptr);
    REQUIRE(record.to_host() == clear);
  }
  SECTION("the first bad position whatever the slice, beyond 32 bits") {
    for (int64_t n : {1, 2, 31, 33, 257, 1000}) {
      std::vector<int64_t> host(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) host[size_t(i)] = (i * 37) % 11;
      const int64_t first = n * 2 / 3;
      host[size_t(first)] = int64_t{-5} << 40;
      if (n > 2) host[size_t(n - 1)] = 11;  // a later bad one, in another thread's slice
      DeviceBuffer<int64_t> labels(host), record(clear);
      anvil::cuda::label_check(n, labels.ptr, 11, 7, record.ptr, nullptr);
      INFO("n " << n);
      REQUIRE(record.to_host() == std::vector<int64_t>{first, int64_t{-5} << 40, 11, 7, n});
    }
  }
  SECTION("a record already written is kept") {
    DeviceBuffer<int64_t> a(std::vector<int64_t>{0, 12}), b(std::vector<int64_t>{-1}),
        record(clear);
    anvil::cuda::label_check(2, a.ptr, 10, 1, record.ptr, nullptr);
    anvil::cuda::label_check(1, b.ptr, 10, 2, record.ptr, nullptr);
    REQUIRE(record.to_host() == std::vector<int64_t>{1, 12, 10, 1, 2});
  }
  SECTION("n = 0 is refused") {
    REQUIRE_THROWS_AS(anvil::cuda::label_check(0, nullptr, 10, 1, nullptr, nullptr),
                      std::invalid_argument);
  }
}

#endif  // ANVIL_CUDA_BACKEND
