// The simulator's cp.async against the PTX ISA's text (as kernels/cuda/
// cp_async.cuh quotes it), checked through what a kernel sees in shared
// memory: a copy lands only at the wait_group that completes its group (so
// a read before it sees the old value: the emulation defers each copy to
// the latest moment the ISA allows); wait_group<N> leaves exactly the newest
// N groups and the uncommitted copies; wait_all completes everything; src-
// size zero-fills; and the ISA's alignment and size rules fail the launch.
#if defined(ANVIL_CUDA_SIM)
#include <catch2/catch.hpp>
#include <cstdint>
#include <vector>

#include "kernels/cuda/cuda_compat.h"
#include "sim_cp_async_kernels.cu"
#include "tests/cuda_test_util.h"

using cuda_test::DeviceBuffer;
using sim_cp_async_kernels::kOld;

namespace {

std::vector<uint32_t> numbered(int n) {
  std::vector<uint32_t> v(n);
  for (int i = 0; i < n; ++i) v[i] = 0x1000u + uint32_t(i);
  return v;
}

}  // namespace

TEST_CASE("cp.async: a copy lands at the wait that completes its group, not before",
          "[cp_async][sim]") {
  DeviceBuffer<uint32_t> src(numbered(128)), out(256);
  anvil::cuda::launch(sim_cp_async_kernels::arrival, 1, dim3(32), 0, nullptr, src.ptr, out.ptr);
  const std::vector<uint32_t> got = out.to_host();
  for (int i = 0; i < 32; ++i) {
    INFO("thread " << i);
    CHECK(got[8 * i + 0] == kOld);  // issued
    CHECK(got[8 * i + 1] == kOld);  // committed
    CHECK(got[8 * i + 3] == 1);     // one group pending before the wait
    CHECK(got[8 * i + 2] == 0x1000u + uint32_t(4 * i));  // after wait_group 0
    CHECK(got[8 * i + 4] == 0);
    // A neighbour's copy, after a barrier.
    CHECK(got[8 * i + 5] == 0x1000u + uint32_t(4 * ((i + 1) % 32)));
  }
}

TEST_CASE("cp.async: wait_group N leaves the newest N groups and the uncommitted copies",
          "[cp_async][sim]") {
  DeviceBuffer<uint32_t> src(numbered(8)), out(21);
  anvil::cuda::launch(sim_cp_async_kernels::groups, 1, dim3(1), 0, nullptr, src.ptr, out.ptr);
  const std::vector<uint32_t> got = out.to_host();
  const uint32_t n0 = 0x1000u, n1 = n0 + 1, n2 = n0 + 2, n3 = n0 + 3, n4 = n0 + 4;
  // wait_group 2: groups 0 and 1 complete, 2 and 3 pending, the fifth copy uncommitted.
  CHECK(std::vector<uint32_t>(got.begin(), got.begin() + 7) ==
        std::vector<uint32_t>{n0, n1, kOld, kOld, kOld, 2, 1});
  // wait_group 0: every committed group; the uncommitted copy is not waited for.
  CHECK(std::vector<uint32_t>(got.begin() + 7, got.begin() + 14) ==
        std::vector<uint32_t>{n0, n1, n2, n3, kOld, 0, 1});
  // wait_all: commits it and waits for it.
  CHECK(std::vector<uint32_t>(got.begin() + 14, got.end()) ==
        std::vector<uint32_t>{n0, n1, n2, n3, n4, 0, 0});
}

TEST_CASE("cp.async: bytes past src-size are zeros", "[cp_async][sim]") {
  DeviceBuffer<uint32_t> src(numbered(4)), out(4);
  struct Case {
    int size, src_bytes;
    std::vector<uint32_t> want;
  };
  const Case cases[] = {
      {16, 16, {0x1000u, 0x1001u, 0x1002u, 0x1003u}},
      {16, 12, {0x1000u, 0x1001u, 0x1002u, 0}},
      {16, 4, {0x1000u, 0, 0, 0}},
      {16, 0, {0, 0, 0, 0}},
      {8, 4, {0x1000u, 0, kOld, kOld}},
      {4, 0, {0, kOld, kOld, kOld}},
  };
  for (const Case& c : cases) {
    INFO(c.size << " bytes, src-size " << c.src_bytes);
    anvil::cuda::launch(sim_cp_async_kernels::zero_fill, 1, dim3(1), 0, nullptr, src.ptr, out.ptr,
                        c.size, c.src_bytes);
    CHECK(out.to_host() == c.want);
  }
}

TEST_CASE("cp.async: misaligned addresses, src-size past the size and .cg of 8 bytes fail",
          "[cp_async][sim]") {
  DeviceBuffer<uint32_t> src(numbered(8));
  const char* why[] = {"shared-memory address is not aligned", "global address is not aligned",
                       "src-size 17 is outside [0, 16]", ".cg copies 16 bytes only"};
  for (int which = 0; which < 4; ++which) {
    INFO("case " << which);
    anvil::cuda::launch(sim_cp_async_kernels::forbidden, 1, dim3(1), 0, nullptr, src.ptr, which);
    REQUIRE_THROWS_WITH(anvil::cuda::check(cudaDeviceSynchronize(), "cudaDeviceSynchronize"),
                        Catch::Contains(why[which]) && Catch::Contains("test_cp_async.cpp"));
  }
  REQUIRE_THROWS_AS(anvil::cuda::cp_async::commit_group(), std::logic_error);  // outside a kernel
}

#endif  // ANVIL_CUDA_SIM
