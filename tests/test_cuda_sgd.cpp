// kernels/cuda SGD update (sgd.cu) against cpu::sgd_update: every
// combination of momentum, weight decay and nesterov, over two steps
// (first_step true, then false), on ragged sizes. On the first step the
// momentum buffer holds NaN, which must never be read. Runs on the simulator
// (ANVIL_CUDA=SIM) or on a real GPU when there is one.
#if defined(ANVIL_CUDA_BACKEND)
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cuda/cuda_kernels.h"
#include "tests/cuda_test_util.h"

namespace {
using Vec = std::vector<float>;
using cuda_test::DeviceBuffer;
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
}  // namespace

TEST_CASE("cuda sgd_update matches the CPU for every option over two steps", "[cuda][sgd]") {
  if (!cuda_test::have_device()) return;
  const float lr = 0.1f;
  for (int64_t n : {0, 1, 7, 1000, 4097}) {
    for (float momentum : {0.0f, 0.9f}) {
      for (float wd : {0.0f, 0.01f}) {
        for (bool nesterov : {false, true}) {
          INFO("n " << n << ", momentum " << momentum << ", weight_decay " << wd
                    << ", nesterov " << nesterov);
          Vec p = cuda_test::random_floats(size_t(n), 1);
          Vec buf(size_t(n), kNaN);  // garbage: first_step must not read it
          DeviceBuffer<float> dp(p), dbuf(buf);
          float* gbuf = momentum != 0.0f ? dbuf.ptr : nullptr;
          float* cbuf = momentum != 0.0f ? buf.data() : nullptr;
          for (int step = 0; step < 2; ++step) {
            INFO("step " << step);
            const Vec g = cuda_test::random_floats(size_t(n), 10 + step);
            DeviceBuffer<float> dg(g);
            anvil::cpu::sgd_update(n, p.data(), g.data(), cbuf, lr, momentum, wd, nesterov,
                                   step == 0);
            anvil::cuda::sgd_update(n, dp.ptr, dg.ptr, gbuf, lr, momentum, wd, nesterov,
                                    step == 0, nullptr);
            cuda_test::require_close(dp.to_host(), p, 1e-6f, 1e-6f);
            if (momentum != 0.0f) cuda_test::require_close(dbuf.to_host(), buf, 1e-6f, 1e-6f);
          }
          // With momentum == 0 the buffer is never touched (still NaN).
          if (momentum == 0.0f)
            for (float v : dbuf.to_host()) REQUIRE(std::isnan(v));
        }
      }
    }
  }
}

TEST_CASE("cuda sgd_update checks its arguments", "[cuda][sgd]") {
  if (!cuda_test::have_device()) return;
  DeviceBuffer<float> d(4);
  REQUIRE_THROWS_AS(anvil::cuda::sgd_update(4, d.ptr, d.ptr, nullptr, 0.1f, 0.9f, 0.0f, false,
                                            true, nullptr),
                    std::invalid_argument);
  REQUIRE_THROWS_AS(anvil::cuda::sgd_update(-1, d.ptr, d.ptr, nullptr, 0.1f, 0.0f, 0.0f, false,
                                            true, nullptr),
                    std::invalid_argument);
}

#endif
