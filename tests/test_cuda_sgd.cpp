// kernels/cuda SGD update (sgd.cu) against cpu::sgd_update: every
// combination of momentum, weight decay and nesterov, over two steps
// (first_step true, then false), on ragged sizes. On the first step the
// momentum buffer holds NaN, which must never be read. The multi-tensor
// update (one launch for many tensors) against the CPU's update of each
// tensor alone, bit for bit; the multi-tensor zeroing. Runs on the
// simulator (ANVIL_CUDA=SIM) or on a real GPU when there is one.
#if defined(ANVIL_CUDA_BACKEND)
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cuda/cuda_kernels.h"
#include "tests/cuda_test_util.h"
#include "tests/launch_audit_util.h"
#include "tests/test_util.h"

namespace {
using Vec = std::vector<float>;
using cuda_test::DeviceBuffer;
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// Bit for bit; names the first element that differs.
template <class T>
void require_same_bits(const std::vector<T>& got, const std::vector<T>& want, const char* what) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i)
    if (std::memcmp(&got[i], &want[i], sizeof(T)) != 0) {
      INFO(what << " element " << i << ": got " << float(got[i]) << ", want " << float(want[i]));
      REQUIRE(std::memcmp(&got[i], &want[i], sizeof(T)) == 0);
    }
}

// One tensor of a multi-tensor update, on the host (the CPU's update of it
// alone) and on the device (the multi-tensor update).
struct Param {
  Vec p, buf;
  std::vector<anvil::bfloat16> copy;
  std::unique_ptr<DeviceBuffer<float>> dp, dbuf;
  std::unique_ptr<DeviceBuffer<anvil::bfloat16>> dcopy;
  bool has_copy = false;
};

// Tensor i of `sizes`: its parameter, a buffer (NaN where its first step
// must not read it), a bfloat16 copy for every third.
std::vector<Param> make_params(const std::vector<int64_t>& sizes, bool first_is_nan) {
  std::vector<Param> params(sizes.size());
  for (size_t i = 0; i < sizes.size(); ++i) {
    Param& t = params[i];
    const auto n = size_t(sizes[i]);
    t.p = cuda_test::random_floats(n, uint32_t(100 + i));
    t.buf = i % 2 == 0 && first_is_nan ? Vec(n, kNaN) : cuda_test::random_floats(n, uint32_t(500 + i));
    t.has_copy = i % 3 == 0;
    t.copy.assign(n, anvil::bfloat16(0.0f));
    t.dp = std::make_unique<DeviceBuffer<float>>(t.p);
    t.dbuf = std::make_unique<DeviceBuffer<float>>(t.buf);
    t.dcopy = std::make_unique<DeviceBuffer<anvil::bfloat16>>(t.copy);
  }
  return params;
}

// Three steps of SGD over every tensor of `sizes` at once on cuda:0, each
// against the CPU's update of each tensor alone: parameters, buffers and
// bfloat16 copies bit for bit. Even tensors take their first step at step
// 0 (their buffer NaN, never read), odd ones continue from a buffer, so one
// launch mixes both; the last step reads its learning rate from the device.
void check_against_cpu(const std::vector<int64_t>& sizes, float momentum, float wd,
                       bool nesterov) {
  std::vector<Param> params = make_params(sizes, momentum != 0.0f);
  const float rates[] = {0.1f, 0.05f, 0.2f};
  DeviceBuffer<float> lr_device(Vec{rates[2]});
  for (int step = 0; step < 3; ++step) {
    INFO("step " << step);
    std::vector<std::unique_ptr<DeviceBuffer<float>>> grads;
    std::vector<anvil::SgdEntry> entries;
    for (size_t i = 0; i < params.size(); ++i) {
      Param& t = params[i];
      const bool first = step == 0 && i % 2 == 0;
      const Vec g = cuda_test::random_floats(t.p.size(), uint32_t(1000 * step + i));
      anvil::cpu::sgd_update(int64_t(t.p.size()), t.p.data(), g.data(),
                             momentum != 0.0f ? t.buf.data() : nullptr, rates[step], momentum, wd,
                             nesterov, first, t.has_copy ? t.copy.data() : nullptr);
      grads.push_back(std::make_unique<DeviceBuffer<float>>(g));
      entries.push_back({t.dp->ptr, grads.back()->ptr, momentum != 0.0f ? t.dbuf->ptr : nullptr,
                         t.has_copy ? t.dcopy->ptr : nullptr, int64_t(t.p.size()), first});
    }
    anvil::cuda::sgd_update(entries.data(), entries.size(), step == 2 ? lr_device.ptr : nullptr,
                            step == 2 ? -1.0f : rates[step], momentum, wd, nesterov, nullptr);
    for (size_t i = 0; i < params.size(); ++i) {
      INFO("tensor " << i << " of " << sizes[i] << " elements");
      const Param& t = params[i];
      require_same_bits(t.dp->to_host(), t.p, "param");
      require_same_bits(t.dbuf->to_host(), t.buf, "momentum buffer");  // untouched with momentum 0
      require_same_bits(t.dcopy->to_host(), t.copy, "bfloat16 copy");
    }
  }
}

// 12 ragged tensors (one launch: chunks of 4096 elements, ragged ends, an
// empty tensor), and 300 small ones (three launches of at most 128).
const std::vector<int64_t> kRagged = {1, 7, 255, 256, 257, 4095, 4096, 4097, 9000, 0, 33, 16385};
std::vector<int64_t> many_sizes() {
  std::vector<int64_t> sizes;
  for (int64_t i = 0; i < 300; ++i) sizes.push_back(i * 37 % 301);
  return sizes;
}

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

TEST_CASE("cuda sgd_update over many tensors at once gives each the CPU's bits, for every option",
          "[cuda][sgd]") {
  if (!cuda_test::have_device()) return;
  for (float momentum : {0.0f, 0.9f})
    for (float wd : {0.0f, 0.01f})
      for (bool nesterov : {false, true}) {
        INFO("momentum " << momentum << ", weight_decay " << wd << ", nesterov " << nesterov);
        {
          INFO("ragged sizes");
          check_against_cpu(kRagged, momentum, wd, nesterov);
        }
        {
          INFO("300 tensors");
          check_against_cpu(many_sizes(), momentum, wd, nesterov);
        }
      }
}

#if defined(ANVIL_CUDA_SIM)
TEST_CASE("cuda sgd: the multi-tensor SGD update and zeroing take one launch per 128 and 256 tensors",
          "[cuda][sgd][sim]") {
  if (!cuda_test::have_device()) return;
  auto launches = [](const std::vector<int64_t>& sizes) {
    anvil::testing::TempDir dir("sgd_audit");
    const std::string path = dir.file("audit.jsonl");
    std::vector<Param> params = make_params(sizes, false);
    std::vector<anvil::SgdEntry> entries;
    std::vector<anvil::cuda::FloatRange> ranges;
    for (Param& t : params) {
      entries.push_back({t.dp->ptr, t.dbuf->ptr, t.dbuf->ptr, nullptr, int64_t(t.p.size()), false});
      ranges.push_back({t.dbuf->ptr, int64_t(t.p.size())});
    }
    {
      launch_audit_test::AuditScope audit(path);
      anvil::cuda::sgd_update(entries.data(), entries.size(), nullptr, 0.1f, 0.9f, 0.0f, true,
                              nullptr);
      anvil::cuda::zero_floats(ranges.data(), ranges.size(), nullptr);
      REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    }
    std::map<std::string, int> out;
    for (auto& [name, row] : launch_audit_test::read_audit(path)) out[name] = row["launches"].get<int>();
    for (Param& t : params)  // every element of every tensor zeroed
      for (float v : t.dbuf->to_host()) REQUIRE(v == 0.0f);
    return out;
  };
  const auto ragged = launches(kRagged);
  CHECK(ragged.at("sgd_kernels::sgd_multi_tensor<true, true>") == 1);
  CHECK(ragged.at("sgd_kernels::zero_multi_tensor") == 1);
  const auto many = launches(many_sizes());  // 299 with elements: 128 + 128 + 43, 256 + 43
  CHECK(many.at("sgd_kernels::sgd_multi_tensor<true, true>") == 3);
  CHECK(many.at("sgd_kernels::zero_multi_tensor") == 2);
}
#endif

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
