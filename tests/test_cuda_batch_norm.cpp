// kernels/cuda BatchNorm (kernels/cuda/batch_norm/) against the CPU kernels: training
// forward (output, saved statistics, running statistics, with and without
// running buffers), eval forward and training backward, on shapes from one
// value per channel to channels longer than a block (so that a thread walks
// several runs), for both training rungs (1 one block per channel, 2
// several blocks per channel): ragged shapes, ResNet-18's BatchNorm shapes at
// batch 2, an ill-conditioned input against a float64 reference, and bitwise
// determinism. Runs on the simulator (ANVIL_CUDA=SIM) or on a real GPU when
// there is one.
#if defined(ANVIL_CUDA_BACKEND)
#include <catch2/catch.hpp>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
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
// (1, 1, 4099) and (3, 3, 1372): channels cut into 5 slices by rung 2
// (scalar loads, HW odd; float4 loads, HW a multiple of 4), the last one
// short. Then ResNet-18's BatchNorm shapes (28x28 inputs) at batch 2 (2
// slices a channel). Under the sanitizers, where the simulator runs about 10
// times slower and a launch costs in proportion to its blocks, stages 1 and
// 2 at batch 1 only (stages 3 and 4 launch 256 and 512 blocks a pass).
const Shape kShapes[] = {{2, 3, 5},    {4, 1, 1},  {1, 4, 7},   {3, 16, 9},   {1, 2, 1},
                         {5, 2, 77},   {2, 2, 300}, {1, 1, 4099}, {3, 3, 1372},
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
                         {1, 64, 784}, {1, 128, 196}
#else
                         {2, 64, 784}, {2, 128, 196}, {2, 256, 49}, {2, 512, 16}
#endif
};

// Rung 2's workspace (at least one float, so that a buffer exists).
struct Workspace : cuda_test::DeviceBuffer<float> {
  Workspace(int rung, const Shape& s)
      : DeviceBuffer(std::max<size_t>(
            1, anvil::cuda::batch_norm_workspace_floats(rung, s.N, s.C, s.HW))) {}
};

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

constexpr int kRungs = anvil::cuda::kBatchNormRungs;

}  // namespace

TEST_CASE("cuda batch_norm_forward_train matches the CPU", "[cuda][batchnorm]") {
  if (!cuda_test::have_device()) return;
  for (int rung = 1; rung <= kRungs; ++rung) {
  uint32_t seed = 1;
  for (const Shape& s : kShapes) {
    SHAPE_INFO(s);
    INFO("rung " << rung);
    Workspace ws(rung, s);
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
    anvil::cuda::batch_norm_forward_train(rung, s.N, s.C, s.HW, dx.ptr, dgamma.ptr, dbeta.ptr,
                                          kEps, kMomentum, drm.ptr, drv.ptr, dmean.ptr,
                                          dinvstd.ptr, dy.ptr, ws.ptr, nullptr);
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
    anvil::cuda::batch_norm_forward_train(rung, s.N, s.C, s.HW, dx.ptr, dgamma.ptr, dbeta.ptr,
                                          kEps, kMomentum, nullptr, nullptr, dmean2.ptr,
                                          dinvstd2.ptr, dy2.ptr, ws.ptr, nullptr);
    REQUIRE(dy2.to_host() == dy.to_host());  // deterministic: bit for bit
    REQUIRE(dmean2.to_host() == dmean.to_host());
    REQUIRE(dinvstd2.to_host() == dinvstd.to_host());
    seed += 10;
  }
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
  for (int rung = 1; rung <= kRungs; ++rung) {
  uint32_t seed = 600;
  for (const Shape& s : kShapes) {
    SHAPE_INFO(s);
    INFO("rung " << rung);
    Workspace ws(rung, s);
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
    anvil::cuda::batch_norm_backward_train(rung, s.N, s.C, s.HW, d_x.ptr, d_gamma.ptr,
                                           d_mean.ptr, d_invstd.ptr, d_g.ptr, d_dx.ptr,
                                           d_dgamma.ptr, d_dbeta.ptr, ws.ptr, nullptr);
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
}

TEST_CASE("cuda batch norm with no channels or empty channels", "[cuda][batchnorm]") {
  if (!cuda_test::have_device()) return;
  // C == 0 launches nothing; N == 0 still writes the saved statistics (mean
  // 0, invstd 1/sqrt(eps)) and gradients of 0, as the CPU does.
  for (int rung = 1; rung <= kRungs; ++rung) {
    INFO("rung " << rung);
    DeviceBuffer<float> one(Vec{1.0f, 1.0f}), mean(2), invstd(2), dg(2), db(2), dummy(1);
    Workspace ws(rung, Shape{0, 2, 3});
    anvil::cuda::batch_norm_forward_train(rung, 2, 0, 3, dummy.ptr, one.ptr, one.ptr, kEps,
                                          kMomentum, nullptr, nullptr, mean.ptr, invstd.ptr,
                                          dummy.ptr, ws.ptr, nullptr);
    anvil::cuda::batch_norm_forward_train(rung, 0, 2, 3, dummy.ptr, one.ptr, one.ptr, kEps,
                                          kMomentum, nullptr, nullptr, mean.ptr, invstd.ptr,
                                          dummy.ptr, ws.ptr, nullptr);
    Vec want_mean(2), want_invstd(2);
    anvil::cpu::batch_norm_forward_train<float>(0, 2, 3, nullptr, Vec{1, 1}.data(),
                                                Vec{1, 1}.data(), kEps, kMomentum, nullptr,
                                                nullptr, want_mean.data(), want_invstd.data(),
                                                nullptr);
    cuda_test::require_close(mean.to_host(), want_mean, kTol, kTol);
    cuda_test::require_close(invstd.to_host(), want_invstd, kTol, kTol);
    anvil::cuda::batch_norm_backward_train(rung, 0, 2, 3, dummy.ptr, one.ptr, mean.ptr,
                                           invstd.ptr, dummy.ptr, dummy.ptr, dg.ptr, db.ptr,
                                           ws.ptr, nullptr);
    REQUIRE(dg.to_host() == Vec{0.0f, 0.0f});
    REQUIRE(db.to_host() == Vec{0.0f, 0.0f});
  }
}

TEST_CASE("cuda batch norm rung 2: workspace, splits and refusals", "[cuda][batchnorm]") {
  using anvil::cuda::batch_norm_workspace_floats;
  REQUIRE(batch_norm_workspace_floats(1, 256, 64, 784) == 0);
  // 3 floats per block: ResNet-18's stage 1 at batch 256 is 64 x 16 blocks.
  REQUIRE(batch_norm_workspace_floats(2, 256, 64, 784) == 3 * 64 * 16);
  REQUIRE(batch_norm_workspace_floats(2, 1, 1, 4099) == 3 * 9);  // slices of >= 512 floats
  REQUIRE(batch_norm_workspace_floats(2, 128, 512, 16) == 3 * 512 * 2);
  REQUIRE_THROWS_WITH(batch_norm_workspace_floats(3, 1, 1, 1), Catch::Contains("no rung 3"));
  REQUIRE_THROWS_WITH(anvil::cuda::batch_norm_forward_train<float>(2, 1, 1, 1, nullptr, nullptr, nullptr,
                                                            kEps, kMomentum, nullptr, nullptr,
                                                            nullptr, nullptr, nullptr, nullptr,
                                                            nullptr),
                      Catch::Contains("workspace"));
  // Rung 1 has no fused ReLU, forward or backward (refused before any launch).
  float y = 0.0f;
  REQUIRE_THROWS_WITH(anvil::cuda::batch_norm_forward_train<float>(
                          1, 1, 1, 1, nullptr, nullptr, nullptr, kEps, kMomentum, nullptr,
                          nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, true),
                      Catch::Contains("rung 1 has no fused ReLU"));
  REQUIRE_THROWS_WITH(anvil::cuda::batch_norm_backward_train<float>(
                          1, 1, 1, 1, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                          nullptr, nullptr, nullptr, nullptr, &y),
                      Catch::Contains("rung 1 has no fused ReLU"));
}

namespace {

// A bit-for-bit copy of the forward's and backward's outputs.
std::vector<uint32_t> bits(const Vec& v) {
  std::vector<uint32_t> out(v.size());
  std::memcpy(out.data(), v.data(), v.size() * sizeof(float));
  return out;
}

}  // namespace

TEST_CASE("cuda batch norm rung 2 is bitwise deterministic", "[cuda][batchnorm]") {
  if (!cuda_test::have_device()) return;
  const Shape s{2, 64, 784};  // 2 slices a channel
  const size_t n = size_t(s.N * s.C * s.HW), C = size_t(s.C);
  Vec x = make_x(s, 4242);
  for (size_t i = 0; i < n; i += 13) x[i] *= 100.0f;  // magnitudes that show a change of order
  const Vec gamma = cuda_test::random_floats(C, 1, 0.5f, 1.5f);
  const Vec beta = cuda_test::random_floats(C, 2), g = cuda_test::random_floats(n, 3);
  DeviceBuffer<float> dx(x), dgamma(gamma), dbeta(beta), dg(g);
  std::vector<std::vector<uint32_t>> runs[2];
  for (auto& run : runs) {
    Workspace ws(2, s);
    DeviceBuffer<float> y(n), mean(C), invstd(C), grad_x(n), grad_gamma(C), grad_beta(C);
    anvil::cuda::batch_norm_forward_train(2, s.N, s.C, s.HW, dx.ptr, dgamma.ptr, dbeta.ptr, kEps,
                                          kMomentum, nullptr, nullptr, mean.ptr, invstd.ptr,
                                          y.ptr, ws.ptr, nullptr);
    anvil::cuda::batch_norm_backward_train(2, s.N, s.C, s.HW, dx.ptr, dgamma.ptr, mean.ptr,
                                           invstd.ptr, dg.ptr, grad_x.ptr, grad_gamma.ptr,
                                           grad_beta.ptr, ws.ptr, nullptr);
    for (const DeviceBuffer<float>* b :
         {&y, &mean, &invstd, &grad_x, &grad_gamma, &grad_beta})
      run.push_back(bits(b->to_host()));
  }
  for (size_t i = 0; i < runs[0].size(); ++i) {
    INFO("output " << i << " (y, mean, invstd, dx, dgamma, dbeta)");
    REQUIRE(runs[0][i] == runs[1][i]);
  }
}

// Values with a large mean and a small spread (1000 + 0.01 u, u in [-1, 1]):
// E[x^2] - E[x]^2 would lose every digit of the variance in float, and a
// float running mean near 1000 rounds each update to 6e-5. Rung 2's
// saved statistics are compared with a float64 reference computed here from
// the same float inputs (two passes in double) at float32 precision: the
// mean within 1 ulp at 1000 (6.1e-5), invstd within 1e-6 relative (8 ulps).
// (Measured: rung 2 at most 3.0e-5 and 7.4e-8; rung 1, float sums,
// 1.0e-4 and 1.2e-4, so it is not held to this.)
TEST_CASE("cuda batch norm: a large mean with a small spread, against float64",
          "[cuda][batchnorm]") {
  if (!cuda_test::have_device()) return;
  for (const Shape& s : {Shape{3, 3, 1372}, Shape{1, 2, 4099}, Shape{2, 64, 49}}) {
    SHAPE_INFO(s);
    const size_t n = size_t(s.N * s.C * s.HW), C = size_t(s.C);
    Vec x = cuda_test::random_floats(n, 77);
    for (float& v : x) v = 1000.0f + 0.01f * v;
    std::vector<double> mean(C, 0.0), var(C, 0.0);
    const double M = double(s.N * s.HW);
    for (int pass = 0; pass < 2; ++pass)
      for (size_t i = 0; i < n; ++i) {
        const size_t c = (i / size_t(s.HW)) % C;
        if (pass == 0)
          mean[c] += x[i] / M;
        else
          var[c] += (x[i] - mean[c]) * (x[i] - mean[c]) / M;
      }
    Workspace ws(2, s);
    DeviceBuffer<float> dx(x), ones(Vec(C, 1.0f)), zeros(Vec(C, 0.0f)), y(n), dmean(C), dinvstd(C);
    anvil::cuda::batch_norm_forward_train(2, s.N, s.C, s.HW, dx.ptr, ones.ptr, zeros.ptr, kEps,
                                          kMomentum, nullptr, nullptr, dmean.ptr, dinvstd.ptr,
                                          y.ptr, ws.ptr, nullptr);
    const Vec got_mean = dmean.to_host(), got_invstd = dinvstd.to_host();
    for (size_t c = 0; c < C; ++c) {
      const double want_invstd = 1.0 / std::sqrt(var[c] + double(kEps));
      INFO("channel " << c << ": mean " << got_mean[c] << " (want " << mean[c] << "), invstd "
                      << got_invstd[c] << " (want " << want_invstd << ")");
      REQUIRE(std::fabs(got_mean[c] - mean[c]) <= 6.1e-5);
      REQUIRE(std::fabs(got_invstd[c] - want_invstd) <= 1e-6 * want_invstd);
    }
  }
}

#endif
