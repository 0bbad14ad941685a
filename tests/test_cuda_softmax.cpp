// kernels/cuda softmax cross-entropy (kernels/cuda/softmax/): every
// forward rung against cpu::softmax_cross_entropy_forward on ragged
// shapes and on logits of large magnitude (stability), and the backward
// kernel against the CPU, each with and without label smoothing, and count_correct (a batch's correct predictions,
// counted on the device) against cpu::count_correct. Runs on the simulator
// or on a real GPU.
#if defined(ANVIL_CUDA_BACKEND)
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cuda/cuda_kernels.h"
#include "tests/cuda_test_util.h"

namespace {

using Vec = std::vector<float>;
using cuda_test::DeviceBuffer;

struct Shape {
  int64_t N, C;
};
const Shape kShapes[] = {{1, 1}, {1, 10}, {7, 10}, {5, 33}, {3, 100}, {2, 1000}};

std::vector<int64_t> labels_for(int64_t N, int64_t C) {
  std::vector<int64_t> labels(static_cast<size_t>(N));
  for (int64_t i = 0; i < N; ++i) labels[size_t(i)] = (i * 7 + 3) % C;
  return labels;
}

// Label smoothing 0 (plain cross-entropy) and PyTorch recipes' 0.1.
const float kSmoothings[] = {0.0f, 0.1f};

// Runs the forward rung and checks loss and probs against the CPU.
void check_forward(int rung, int64_t N, int64_t C, const Vec& logits, float smoothing) {
  const std::vector<int64_t> labels = labels_for(N, C);
  Vec want_loss(static_cast<size_t>(N)), want_probs(size_t(N * C));
  anvil::cpu::softmax_cross_entropy_forward(N, C, logits.data(), labels.data(), smoothing,
                                            want_loss.data(), want_probs.data());
  DeviceBuffer<float> dlogits(logits), dloss(static_cast<size_t>(N)), dprobs(size_t(N * C));
  DeviceBuffer<int64_t> dlabels(labels);
  anvil::cuda::softmax_cross_entropy_forward(rung, N, C, dlogits.ptr, dlabels.ptr, smoothing,
                                             dloss.ptr, dprobs.ptr, nullptr);
  // Probabilities far below 1 carry the absolute error of their row's sum.
  cuda_test::require_close(dprobs.to_host(), want_probs, 1e-5f, 1e-7f);
  cuda_test::require_close(dloss.to_host(), want_loss, 1e-5f, 1e-6f);
}

}  // namespace

TEST_CASE("cuda softmax: every forward rung matches the CPU", "[cuda][softmax]") {
  if (!cuda_test::have_device()) return;
  for (int rung = 1; rung <= anvil::cuda::kSoftmaxRungs; ++rung) {
    for (const Shape& s : kShapes) {
      for (const float smoothing : kSmoothings) {
        DYNAMIC_SECTION("rung " << rung << ", " << s.N << "x" << s.C
                                   << ", label smoothing " << smoothing) {
          check_forward(rung, s.N, s.C,
                        cuda_test::random_floats(size_t(s.N * s.C), uint32_t(s.C), -3.0f, 3.0f),
                        smoothing);
        }
      }
    }
  }
}

TEST_CASE("cuda softmax: large logits neither overflow nor underflow", "[cuda][softmax]") {
  if (!cuda_test::have_device()) return;
  for (int rung = 1; rung <= anvil::cuda::kSoftmaxRungs; ++rung) {
    for (const Shape& s : {Shape{7, 10}, Shape{3, 100}, Shape{2, 1000}}) {
      DYNAMIC_SECTION("rung " << rung << ", " << s.N << "x" << s.C) {
        // exp(80) overflows float after a few terms, exp(-80) is subnormal:
        // only the shift by the row max keeps this finite.
        Vec logits = cuda_test::random_floats(size_t(s.N * s.C), 3, -80.0f, 80.0f);
        for (int64_t i = 0; i < s.N; ++i) logits[size_t(i * s.C)] = 88.5f;  // near FLT max's log
        // Every row the same large constant: uniform probabilities, loss log C.
        const Vec flat(size_t(s.N * s.C), -1000.0f);
        for (const float smoothing : kSmoothings) {
          check_forward(rung, s.N, s.C, logits, smoothing);
          check_forward(rung, s.N, s.C, flat, smoothing);
        }
      }
    }
  }
}

TEST_CASE("cuda softmax: arguments are checked", "[cuda][softmax]") {
  if (!cuda_test::have_device()) return;
  REQUIRE_THROWS_WITH(anvil::cuda::softmax_cross_entropy_forward(4, 1, 1, nullptr, nullptr, 0.0f,
                                                                 nullptr, nullptr, nullptr),
                      Catch::Contains("no rung 4"));
  REQUIRE_THROWS_AS(anvil::cuda::softmax_cross_entropy_forward(1, 1, 0, nullptr, nullptr, 0.0f,
                                                               nullptr, nullptr, nullptr),
                    std::invalid_argument);
  // N == 0 launches nothing.
  anvil::cuda::softmax_cross_entropy_forward(3, 0, 10, nullptr, nullptr, 0.0f, nullptr, nullptr,
                                             nullptr);
  anvil::cuda::softmax_cross_entropy_backward(0, 10, nullptr, nullptr, 0.0f, nullptr,
                                              static_cast<float*>(nullptr), nullptr);
}

TEST_CASE("cuda softmax: backward matches the CPU", "[cuda][softmax]") {
  if (!cuda_test::have_device()) return;
  for (const Shape& s : kShapes)
  for (const float smoothing : kSmoothings) {
    DYNAMIC_SECTION(s.N << "x" << s.C << ", label smoothing " << smoothing) {
      const std::vector<int64_t> labels = labels_for(s.N, s.C);
      Vec logits = cuda_test::random_floats(size_t(s.N * s.C), 11, -3.0f, 3.0f);
      Vec loss(size_t(s.N)), probs(size_t(s.N * s.C));
      anvil::cpu::softmax_cross_entropy_forward(s.N, s.C, logits.data(), labels.data(), smoothing,
                                                loss.data(), probs.data());
      const Vec dloss = cuda_test::random_floats(size_t(s.N), 12, 0.1f, 2.0f);
      Vec want(size_t(s.N * s.C));
      anvil::cpu::softmax_cross_entropy_backward(s.N, s.C, probs.data(), labels.data(), smoothing,
                                                 dloss.data(), want.data());
      DeviceBuffer<float> dprobs(probs), ddloss(dloss), dgrad(size_t(s.N * s.C));
      DeviceBuffer<int64_t> dlabels(labels);
      anvil::cuda::softmax_cross_entropy_backward(s.N, s.C, dprobs.ptr, dlabels.ptr, smoothing,
                                                  ddloss.ptr, dgrad.ptr, nullptr);
      cuda_test::require_close(dgrad.to_host(), want, 1e-6f, 1e-7f);
    }
  }
}

// Logits on a coarse grid of values, so that many rows hold their maximum
// twice or more and the first-maximum rule decides.
Vec tied_logits(int64_t N, int64_t C, uint32_t seed) {
  Vec x = cuda_test::random_floats(size_t(N * C), seed, -2.0f, 2.0f);
  for (float& v : x) v = std::round(v);
  return x;
}

TEST_CASE("cuda softmax: count_correct counts what the CPU counts", "[cuda][softmax]") {
  if (!cuda_test::have_device()) return;
  SECTION("ties go to the first maximum, on both") {
    const Vec logits = {1, 3, 3,   // argmax 1
                        5, 5, 5,   // argmax 0
                        -1, -2, 0};  // argmax 2
    const std::vector<int64_t> labels = {1, 0, 1};
    CHECK(anvil::cpu::count_correct(3, 3, logits.data(), labels.data()) == 2);
    DeviceBuffer<float> dlogits(logits);
    DeviceBuffer<int64_t> dlabels(labels), counter(std::vector<int64_t>{0});
    anvil::cuda::count_correct(3, 3, dlogits.ptr, dlabels.ptr, counter.ptr, nullptr);
    CHECK(counter.to_host() == std::vector<int64_t>{2});
  }
  // Past one block, past the 1024-block grid (rows the grid-stride loop
  // reaches), and rows not a multiple of a warp.
  const Shape shapes[] = {{1, 1}, {1, 10}, {7, 10}, {5, 33}, {300, 3}, {1000, 10},
                          {1024 * 256 + 77, 2}};
  for (const Shape& s : shapes) {
    DYNAMIC_SECTION(s.N << "x" << s.C) {
      const Vec logits = tied_logits(s.N, s.C, uint32_t(s.N + s.C));
      const std::vector<int64_t> labels = labels_for(s.N, s.C);
      const int64_t want = anvil::cpu::count_correct(s.N, s.C, logits.data(), labels.data());
      if (s.N >= 300) {  // the case is not trivial: some right, some wrong
        CHECK(want > 0);
        CHECK(want < s.N);
      }
      // The counter adds to what it holds: a value past 32 bits.
      const int64_t start = (int64_t(1) << 40) + 3;
      DeviceBuffer<float> dlogits(logits);
      DeviceBuffer<int64_t> dlabels(labels), counter(std::vector<int64_t>{start});
      anvil::cuda::count_correct(s.N, s.C, dlogits.ptr, dlabels.ptr, counter.ptr, nullptr);
      anvil::cuda::count_correct(s.N, s.C, dlogits.ptr, dlabels.ptr, counter.ptr, nullptr);
      CHECK(counter.to_host() == std::vector<int64_t>{start + 2 * want});
      // bfloat16 logits (autocast's) count as their float32 widening does.
      std::vector<anvil::bfloat16> narrow(logits.size());
      Vec widened(logits.size());
      for (size_t i = 0; i < logits.size(); ++i) {
        narrow[i] = anvil::bfloat16(logits[i]);
        widened[i] = narrow[i].to_float();
      }
      const int64_t want_narrow =
          anvil::cpu::count_correct(s.N, s.C, widened.data(), labels.data());
      CHECK(anvil::cpu::count_correct(s.N, s.C, narrow.data(), labels.data()) == want_narrow);
      DeviceBuffer<anvil::bfloat16> dnarrow(narrow);
      DeviceBuffer<int64_t> counter_narrow(std::vector<int64_t>{0});
      anvil::cuda::count_correct(s.N, s.C, dnarrow.ptr, dlabels.ptr, counter_narrow.ptr, nullptr);
      CHECK(counter_narrow.to_host() == std::vector<int64_t>{want_narrow});
    }
  }
  SECTION("bad shapes are refused, N == 0 counts nothing") {
    REQUIRE_THROWS_WITH(
        anvil::cuda::count_correct(2, 0, static_cast<const float*>(nullptr), nullptr, nullptr,
                                   nullptr),
        Catch::Contains("count_correct"));
    anvil::cuda::count_correct(0, 10, static_cast<const float*>(nullptr), nullptr, nullptr,
                               nullptr);
  }
}

#endif  // ANVIL_CUDA_BACKEND
