// The simulator under the sanitizers: a kernel reading past a cudaMalloc
// block is reported by AddressSanitizer as a heap-buffer-overflow, and a
// missing __syncthreads (also after another thread's cp.async wait), or two
// blocks on different workers writing one element, by ThreadSanitizer as a
// data race, each naming the kernel's source line. The broken kernels run
// in a child process (this test binary, running a hidden test case), since
// a report ends the process.
// Only meaningful in the asan and tsan builds; elsewhere the children run the
// kernels and nothing is expected of them.
#if defined(ANVIL_CUDA_SIM)
#include <catch2/catch.hpp>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "kernels/cuda/cuda_compat.h"
#include "sim_sanitizer_kernels.cu"
#include "tests/cuda_test_util.h"

using Catch::Matchers::Contains;
using cuda_test::DeviceBuffer;

namespace {

#if defined(__SANITIZE_ADDRESS__)
constexpr bool kAsan = true;
#else
constexpr bool kAsan = false;
#endif
#if defined(__SANITIZE_THREAD__)
constexpr bool kTsan = true;
#else
constexpr bool kTsan = false;
#endif

struct ChildResult {
  int code = -1;
  std::string output;
};

// Runs this test binary on one (hidden) test case; stdout and stderr together.
ChildResult run_child(const std::string& test_name) {
  // The path of this binary, resolved here: in the shell's command line
  // /proc/self/exe would be the shell.
  std::error_code ec;
  std::string self = std::filesystem::read_symlink("/proc/self/exe", ec).string();
  REQUIRE(!ec);
  std::string cmd = "'" + self + "' \"" + test_name + "\" 2>&1";
  ChildResult r;
  FILE* pipe = popen(cmd.c_str(), "r");
  REQUIRE(pipe != nullptr);
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), pipe)) > 0) r.output.append(buf.data(), n);
  int status = pclose(pipe);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

void run_copy_kernel(void (*kernel)(const float*, float*), int threads) {
  DeviceBuffer<float> in(std::vector<float>(size_t(threads), 1.0f));
  DeviceBuffer<float> out{size_t(threads)};
  anvil::cuda::launch(kernel, 1, dim3(threads), 0, nullptr, in.ptr, out.ptr);
  (void)out.to_host();
}

// Two blocks that wait for each other, so they run on two workers at once.
void run_two_meeting_blocks(void (*kernel)(int*, float*)) {
  anvil::sim::set_workers(2);
  DeviceBuffer<int> arrived(std::vector<int>{0});
  DeviceBuffer<float> out(std::vector<float>{0.0f});
  anvil::cuda::launch(kernel, 2, dim3(1), 0, nullptr, arrived.ptr, out.ptr);
  (void)out.to_host();
}

}  // namespace

// ---- children: each runs one broken (or correct) kernel ----

TEST_CASE("sim child: read one past the end", "[.][sim-child]") {
  const int n = 40;
  DeviceBuffer<float> in(std::vector<float>(n, 1.0f));
  DeviceBuffer<float> out{size_t(n) + 1};
  anvil::cuda::launch(sim_test_kernels::read_one_past_the_end, 2, dim3(32), 0, nullptr, in.ptr,
                      out.ptr, n);
  (void)out.to_host();
}

TEST_CASE("sim child: missing syncthreads", "[.][sim-child]") {
  run_copy_kernel(sim_test_kernels::missing_syncthreads, 64);
}

TEST_CASE("sim child: with syncthreads", "[.][sim-child]") {
  run_copy_kernel(sim_test_kernels::with_syncthreads, 64);
}

TEST_CASE("sim child: cp.async missing syncthreads", "[.][sim-child]") {
  run_copy_kernel(sim_test_kernels::cp_async_missing_syncthreads, 64);
}

TEST_CASE("sim child: cp.async with syncthreads", "[.][sim-child]") {
  run_copy_kernel(sim_test_kernels::cp_async_with_syncthreads, 64);
}

TEST_CASE("sim child: missing syncwarp", "[.][sim-child]") {
  run_copy_kernel(sim_test_kernels::missing_syncwarp, 32);
}

TEST_CASE("sim child: with syncwarp", "[.][sim-child]") {
  run_copy_kernel(sim_test_kernels::with_syncwarp, 32);
}

TEST_CASE("sim child: blocks write one element", "[.][sim-child]") {
  run_two_meeting_blocks(sim_test_kernels::blocks_write_one_element);
}

TEST_CASE("sim child: blocks add atomically", "[.][sim-child]") {
  run_two_meeting_blocks(sim_test_kernels::blocks_add_atomically);
}

// ---- the tests ----

TEST_CASE("sim under ASan: an out-of-bounds read in a kernel is a heap-buffer-overflow",
          "[sim][sanitizer][tsan]") {
  if (!kAsan) {
    WARN("not an AddressSanitizer build: the detection is checked by the asan preset");
    return;
  }
  ChildResult r = run_child("sim child: read one past the end");
  INFO(r.output);
  CHECK(r.code != 0);
  CHECK_THAT(r.output, Contains("AddressSanitizer: heap-buffer-overflow"));
  CHECK_THAT(r.output, Contains("read_one_past_the_end"));
  CHECK_THAT(r.output, Contains("sim_sanitizer_kernels.cu"));
  CHECK_THAT(r.output, Contains("0 bytes to the right of 160-byte region"));
}

TEST_CASE("sim under TSan: a missing __syncthreads is a data race", "[sim][sanitizer][tsan]") {
  if (!kTsan) {
    WARN("not a ThreadSanitizer build: the detection is checked by the tsan preset");
    return;
  }
  ChildResult broken = run_child("sim child: missing syncthreads");
  INFO(broken.output);
  CHECK(broken.code != 0);
  CHECK_THAT(broken.output, Contains("ThreadSanitizer: data race"));
  CHECK_THAT(broken.output, Contains("missing_syncthreads"));
  CHECK_THAT(broken.output, Contains("sim_sanitizer_kernels.cu"));
  // The same kernel with its barrier is clean: the barrier orders the accesses.
  ChildResult fixed = run_child("sim child: with syncthreads");
  INFO(fixed.output);
  CHECK(fixed.code == 0);
  CHECK_THAT(fixed.output, !Contains("ThreadSanitizer"));
  // Within a warp, __syncwarp is what orders shared memory.
  ChildResult warp = run_child("sim child: missing syncwarp");
  INFO(warp.output);
  CHECK(warp.code != 0);
  CHECK_THAT(warp.output, Contains("ThreadSanitizer: data race") && Contains("missing_syncwarp"));
  ChildResult warp_fixed = run_child("sim child: with syncwarp");
  INFO(warp_fixed.output);
  CHECK(warp_fixed.code == 0);
  CHECK_THAT(warp_fixed.output, !Contains("ThreadSanitizer"));
}

TEST_CASE("sim under TSan: another thread's cp.async copy read without the barrier after its "
          "wait is a data race", "[sim][sanitizer][cp_async][tsan]") {
  if (!kTsan) {
    WARN("not a ThreadSanitizer build: the detection is checked by the tsan preset");
    return;
  }
  ChildResult broken = run_child("sim child: cp.async missing syncthreads");
  INFO(broken.output);
  CHECK(broken.code != 0);
  CHECK_THAT(broken.output, Contains("ThreadSanitizer: data race") &&
                                Contains("cp_async_missing_syncthreads"));
  ChildResult fixed = run_child("sim child: cp.async with syncthreads");
  INFO(fixed.output);
  CHECK(fixed.code == 0);
  CHECK_THAT(fixed.output, !Contains("ThreadSanitizer"));
}

TEST_CASE("sim under TSan: two blocks writing one element without atomics is a data race",
          "[sim][sanitizer][tsan]") {
  if (!kTsan) {
    WARN("not a ThreadSanitizer build: the detection is checked by the tsan preset");
    return;
  }
  // The blocks run on two worker threads, which only the launch orders.
  ChildResult broken = run_child("sim child: blocks write one element");
  INFO(broken.output);
  CHECK(broken.code != 0);
  CHECK_THAT(broken.output, Contains("ThreadSanitizer: data race") &&
                                Contains("blocks_write_one_element") &&
                                Contains("sim_sanitizer_kernels.cu"));
  ChildResult atomic = run_child("sim child: blocks add atomically");
  INFO(atomic.output);
  CHECK(atomic.code == 0);
  CHECK_THAT(atomic.output, !Contains("ThreadSanitizer"));
}

#endif  // ANVIL_CUDA_SIM
