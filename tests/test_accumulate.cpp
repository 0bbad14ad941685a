// The collectives' reduction step, dst = (dst + src) * scale
// (kernels/cpu/accumulate.cpp, kernels/cuda/accumulate.cu): the CPU loop
// against a double-precision reference, the CUDA kernel against the CPU on
// ragged sizes, at every alignment (the kernel takes 128-bit loads only when
// both pointers are 16-byte aligned, and the scalar loop for the rest), and
// int64 sums past 32 bits.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"
#if defined(ANVIL_CUDA_BACKEND)
#include "kernels/cuda/cuda_kernels.h"
#include "tests/cuda_test_util.h"
#endif

namespace {
std::vector<float> ramp(size_t n, float start, float step) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = start + step * float(i % 97) - 0.25f * float(i % 13);
  return v;
}
}  // namespace

TEST_CASE("cpu accumulate: dst = (dst + src) * scale, and exact int64 sums", "[cpu][accumulate]") {
  for (int64_t n : {0, 1, 5, 33, 40000}) {  // 40000 crosses the OpenMP threshold
    for (float scale : {1.0f, 0.25f, 1.0f / 3.0f}) {
      INFO("n " << n << ", scale " << scale);
      std::vector<float> dst = ramp(size_t(n), 1.5f, 0.5f), src = ramp(size_t(n), -3.0f, 0.125f);
      std::vector<float> want(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i)
        want[size_t(i)] = float((double(dst[size_t(i)]) + src[size_t(i)]) * scale);
      anvil::cpu::accumulate(n, dst.data(), src.data(), scale);
      for (int64_t i = 0; i < n; ++i)
        REQUIRE(std::fabs(dst[size_t(i)] - want[size_t(i)]) <= 1e-6f * (1 + std::fabs(want[size_t(i)])));
    }
  }
  std::vector<int64_t> a = {int64_t(1) << 40, -5, 7}, b = {(int64_t(1) << 40) + 3, 5, -9};
  anvil::cpu::accumulate(3, a.data(), b.data());
  REQUIRE(a == std::vector<int64_t>{(int64_t(1) << 41) + 3, 0, -2});
  REQUIRE_THROWS_WITH(anvil::cpu::accumulate(-1, a.data(), b.data()),
                      Catch::Matchers::Contains("negative size -1"));
}

#if defined(ANVIL_CUDA_BACKEND)
TEST_CASE("cuda accumulate matches the CPU at every size, alignment and scale",
          "[cuda][accumulate]") {
  if (!cuda_test::have_device()) return;
  for (int64_t n : {0, 1, 3, 4, 5, 255, 1027, 70001}) {
    for (int64_t dst_offset : {0, 1, 2, 3}) {
      for (int64_t src_offset : {0, 3}) {
        for (float scale : {1.0f, 0.5f}) {
          INFO("n " << n << ", dst offset " << dst_offset << ", src offset " << src_offset
                    << ", scale " << scale);
          std::vector<float> dst = ramp(size_t(n + dst_offset), 2.0f, 0.25f);
          const std::vector<float> src = ramp(size_t(n + src_offset), -1.0f, 0.5f);
          cuda_test::DeviceBuffer<float> ddst(dst), dsrc(src);
          anvil::cpu::accumulate(n, dst.data() + dst_offset, src.data() + src_offset, scale);
          anvil::cuda::accumulate(n, ddst.ptr + dst_offset, dsrc.ptr + src_offset, scale, nullptr);
          cuda_test::require_close(ddst.to_host(), dst, 1e-6f, 1e-6f);
        }
      }
    }
  }
  const std::vector<int64_t> a = {int64_t(1) << 40, -5, 7, 1}, b = {(int64_t(1) << 40) + 3, 5, -9, 2};
  cuda_test::DeviceBuffer<int64_t> da(a), db(b);
  anvil::cuda::accumulate(4, da.ptr, db.ptr, nullptr);
  REQUIRE(da.to_host() == std::vector<int64_t>{(int64_t(1) << 41) + 3, 0, -2, 3});
}
#endif
