// kernels/cuda BatchNorm (batch_norm.cu) against the CPU kernels: training
// forward (output, saved statistics, running statistics, with and without
// running buffers), eval forward and training backward, on shapes from one
// value per channel to channels longer than a block (so that a thread walks
// several runs). Runs on the simulator (ANVIL_CUDA=SIM) or on a real GPU
// when there is one.
#if defined(ANVIL_CUDA_BACKEND)
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cuda/cuda_kernels.h"
#include "tests/cuda_test_util.h"

namespace {

using Vec = std::vector<float>;
using cuda_test::DeviceBuffer;

struct Shape {
  int64_t N, C, HW;
};
// (1, 2, 1): a single value per channel (M = 1: running var takes the biased
// value); (5, 2, 77) and (2, 2, 300): a channel longer than the 256-thread
// block, runs shorter and longer than the block.
const Shape kShapes[] = {{2, 3, 5},  {4, 1, 1},  {1, 4, 7},  {3, 16, 9},
                         {1, 2, 1},  {5, 2, 77}, {2, 2, 300}};

constexpr float kEps = 1e-5f, kMomentum = 0.1f;
constexpr float kTol = 1e-5f;

// x with a per-channel offset and spread, so the mean is far from 0.
Vec make_x(const Shape& s, uint32_t seed) {
  Vec x = cuda_test::random_floats(size_t(s.N * s.C * s.HW), seed);
  for (int64_t n = 0; n < s.N; ++n)
    for (int64_t c = 0; c < s.C; ++c)
      for (int64_t i = 0; i < s.HW; ++i) {
        float& v = x[size_t((n * s.C + c) * s.HW + i)];
        v = 2.0f + float(c) * 0.5f + v * (1.0f + float(c % 3));
      }
  return x;
}

// The CPU computes y = x*a + b with a = gamma*invstd, b = beta - mean*a, which
// cancels when |x*a| >> |y| (e.g. one value per channel: invstd = 1/sqrt(eps));
// the GPU computes (x - mean)*a + beta. So y is compared within kTol plus a
// few ulps of |x*a|, the rounding the CPU's form can lose.
void require_close_y(const Shape& s, const Vec& got, const Vec& want, const Vec& x,
                     const Vec& gamma, const Vec& invstd) {
  REQUIRE(got.size() == want.size());
  for (size_t j = 0; j < got.size(); ++j) {
    const size_t c = (j / size_t(s.HW)) % size_t(s.C);
    const float xa = std::fabs(x[j] * gamma[c] * invstd[c]);
    const float tol = kTol + kTol * std::fabs(want[j]) + 4.0f * 1.2e-7f * xa;
    if (!(std::fabs(got[j] - want[j]) <= tol)) {
      INFO("element " << j << ": got " << got[j] << ", want " << want[j] << ", |x*a| " << xa);
      REQUIRE(std::fabs(got[j] - want[j]) <= tol);
    }
  }
}

#define SHAPE_INFO(s) INFO("N " << s.N << ", C " << s.C << ", HW " << s.HW)

}  // namespace

TEST_CASE("cuda batch_norm_forward_train matches the CPU", "[cuda][batchnorm]") {
  if (!cuda_test::have_device()) return;
  uint32_t seed = 1;
  for (const Shape& s : kShapes) {
    SHAPE_INFO(s);
    const size_t n = size_t(s.N * s.C * s.HW), C = size_t(s.C);
    const Vec x = make_x(s, seed), gamma = cuda_test::random_floats(C, seed + 1, 0.5f, 1.5f),
              beta = cuda_test::random_floats(C, seed + 2);
    const Vec rm0 = cuda_test::random_floats(C, seed + 3),
              rv0 = cuda_test::random_floats(C, seed + 4, 0.5f, 2.0f);
    Vec y(n), mean(C), invstd(C), rm = rm0, rv = rv0;
    anvil::cpu::batch_norm_forward_train(s.N, s.C, s.HW, x.data(), gamma.data(), beta.data(),
                                         kEps, kMomentum, rm.data(), rv.data(), mean.data(),
                                         invstd.data(), y.data());

    DeviceBuffer<float> dx(x), dgamma(gamma), dbeta(beta), drm(rm0), drv(rv0), dy(n),
        dmean(C), dinvstd(C);
    anvil::cuda::batch_norm_forward_train(s.N, s.C, s.HW, dx.ptr, dgamma.ptr, dbeta.ptr, kEps,
                                          kMomentum, drm.ptr, drv.ptr, dmean.ptr, dinvstd.ptr,
                                          dy.ptr, nullptr);
    {
      INFO("y");
      require_close_y(s, dy.to_host(), y, x, gamma, invstd);
    }
    {
      INFO("save_mean");
      cuda_test::require_close(dmean.to_host(), mean, kTol, kTol);
    }
    {
      INFO("save_invstd");
      cuda_test::require_close(dinvstd.to_host(), invstd, kTol, kTol);
    }
    {
      INFO("running_mean");
      cuda_test::require_close(drm.to_host(), rm, kTol, kTol);
    }
    {
      INFO("running_var (unbiased)");
      cuda_test::require_close(drv.to_host(), rv, kTol, kTol);
    }

    // Without running buffers: the same output and saved statistics.
    DeviceBuffer<float> dy2(n), dmean2(C), dinvstd2(C);
    anvil::cuda::batch_norm_forward_train(s.N, s.C, s.HW, dx.ptr, dgamma.ptr, dbeta.ptr, kEps,
                                          kMomentum, nullptr, nullptr, dmean2.ptr, dinvstd2.ptr,
                                          dy2.ptr, nullptr);
    REQUIRE(dy2.to_host() == dy.to_host());  // deterministic: bit for bit
    REQUIRE(dmean2.to_host() == dmean.to_host());
    REQUIRE(dinvstd2.to_host() == dinvstd.to_host());
    seed += 10;
  }
}

TEST_CASE("cuda batch_norm_forward_eval matches the CPU", "[cuda][batchnorm]") {
  if (!cuda_test::have_device()) return;
  uint32_t seed = 300;
  for (const Shape& s : kShapes) {
    SHAPE_INFO(s);
    const size_t n = size_t(s.N * s.C * s.HW), C = size_t(s.C);
    const Vec x = make_x(s, seed), gamma = cuda_test::random_floats(C, seed + 1, 0.5f, 1.5f),
              beta = cuda_test::random_floats(C, seed + 2),
              rm = cuda_test::random_floats(C, seed + 3, 1.0f, 3.0f),
              rv = cuda_test::random_floats(C, seed + 4, 0.5f, 2.0f);
    Vec y(n);
    anvil::cpu::batch_norm_forward_eval(s.N, s.C, s.HW, x.data(), gamma.data(), beta.data(),
                                        rm.data(), rv.data(), kEps, y.data());
    DeviceBuffer<float> dx(x), dgamma(gamma), dbeta(beta), drm(rm), drv(rv), dy(n);
    anvil::cuda::batch_norm_forward_eval(s.N, s.C, s.HW, dx.ptr, dgamma.ptr, dbeta.ptr, drm.ptr,
                                         drv.ptr, kEps, dy.ptr, nullptr);
    cuda_test::require_close(dy.to_host(), y, kTol, kTol);
    seed += 10;
  }
}

TEST_CASE("cuda batch_norm_backward_train matches the CPU", "[cuda][batchnorm]") {
  if (!cuda_test::have_device()) return;
  uint32_t seed = 600;
  for (const Shape& s : kShapes) {
    SHAPE_INFO(s);
    const size_t n = size_t(s.N * s.C * s.HW), C = size_t(s.C);
    const Vec x = make_x(s, seed), gamma = cuda_test::random_floats(C, seed + 1, 0.5f, 1.5f),
              beta = cuda_test::random_floats(C, seed + 2), g = cuda_test::random_floats(n, seed + 3);
    // Saved statistics from the CPU forward, shared by both backwards.
    Vec y(n), mean(C), invstd(C);
    anvil::cpu::batch_norm_forward_train(s.N, s.C, s.HW, x.data(), gamma.data(), beta.data(),
                                         kEps, kMomentum, nullptr, nullptr, mean.data(),
                                         invstd.data(), y.data());
    Vec dx(n), dgamma(C), dbeta(C);
    anvil::cpu::batch_norm_backward_train(s.N, s.C, s.HW, x.data(), gamma.data(), mean.data(),
                                          invstd.data(), g.data(), dx.data(), dgamma.data(),
                                          dbeta.data());

    DeviceBuffer<float> d_x(x), d_gamma(gamma), d_mean(mean), d_invstd(invstd), d_g(g),
        d_dx(n), d_dgamma(C), d_dbeta(C);
    anvil::cuda::batch_norm_backward_train(s.N, s.C, s.HW, d_x.ptr, d_gamma.ptr, d_mean.ptr,
                                           d_invstd.ptr, d_g.ptr, d_dx.ptr, d_dgamma.ptr,
                                           d_dbeta.ptr, nullptr);
    {
      INFO("dx");
      cuda_test::require_close(d_dx.to_host(), dx, kTol, kTol);
    }
    {
      INFO("dgamma");
      cuda_test::require_close(d_dgamma.to_host(), dgamma, kTol, kTol);
    }
    {
      INFO("dbeta");
      cuda_test::require_close(d_dbeta.to_host(), dbeta, kTol, kTol);
    }
    seed += 10;
  }
}

TEST_CASE("cuda batch norm with no channels or empty channels", "[cuda][batchnorm]") {
  if (!cuda_test::have_device()) return;
  // C == 0 launches nothing; N == 0 still writes the saved statistics (mean
  // 0, invstd 1/sqrt(eps)) and gradients of 0, as the CPU does.
  DeviceBuffer<float> one(Vec{1.0f, 1.0f}), mean(2), invstd(2), dg(2), db(2), dummy(1);
  anvil::cuda::batch_norm_forward_train(2, 0, 3, dummy.ptr, one.ptr, one.ptr, kEps, kMomentum,
                                        nullptr, nullptr, mean.ptr, invstd.ptr, dummy.ptr,
                                        nullptr);
  anvil::cuda::batch_norm_forward_train(0, 2, 3, dummy.ptr, one.ptr, one.ptr, kEps, kMomentum,
                                        nullptr, nullptr, mean.ptr, invstd.ptr, dummy.ptr,
                                        nullptr);
  Vec want_mean(2), want_invstd(2);
  anvil::cpu::batch_norm_forward_train(0, 2, 3, nullptr, Vec{1, 1}.data(), Vec{1, 1}.data(), kEps,
                                       kMomentum, nullptr, nullptr, want_mean.data(),
                                       want_invstd.data(), nullptr);
  cuda_test::require_close(mean.to_host(), want_mean, kTol, kTol);
  cuda_test::require_close(invstd.to_host(), want_invstd, kTol, kTol);
  anvil::cuda::batch_norm_backward_train(0, 2, 3, dummy.ptr, one.ptr, mean.ptr, invstd.ptr,
                                         dummy.ptr, dummy.ptr, dg.ptr, db.ptr, nullptr);
  REQUIRE(dg.to_host() == Vec{0.0f, 0.0f});
  REQUIRE(db.to_host() == Vec{0.0f, 0.0f});
}

#endif
