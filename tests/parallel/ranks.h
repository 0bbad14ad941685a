// Running a test on several ranks: the GPUs the NCCL tests may use, and
// one thread per rank.
#pragma once
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <exception>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "core/device.h"
#include "tests/cuda_test_util.h"
#include "tests/skip.h"
#include "parallel/communicator.h"

namespace parallel_test {

using test_skip::kSkipExitCode;
using test_skip::skip;
using test_skip::skip_count;
using test_skip::SkipCount;

// How many GPUs an NCCL test may use, or 0 after skip(): NCCL missing or no
// GPU fails the test instead under ANVIL_REQUIRE_CUDA=1; fewer GPUs than
// `want` is a skip everywhere (a one-GPU machine is usable).
inline int gpus(int want) {
  if (const std::string why = anvil::parallel::nccl_missing_reason(); !why.empty()) {
    if (cuda_test::cuda_required())
      FAIL("ANVIL_REQUIRE_CUDA=1 and no NCCL: " << why << " (NCCL test not run)");
    skip(why);
    return 0;
  }
  if (anvil::device_count() == 0) {
    if (cuda_test::cuda_required())
      FAIL("ANVIL_REQUIRE_CUDA=1 and no usable CUDA device: " << anvil::no_gpu_reason()
           << " (NCCL test not run)");
    skip("no CUDA device: " + anvil::no_gpu_reason());
    return 0;
  }
  const int n = std::min(anvil::device_count(), 5);
  if (n < want) {
    skip("needs " + std::to_string(want) + " GPUs, found " + std::to_string(n));
    return 0;
  }
  return n;
}

// A test case over several rank counts runs those the GPUs allow, and says
// which it left out.
inline bool enough_gpus(int ranks, int available) {
  if (ranks <= available) return true;
  WARN(ranks << " ranks not run: " << available << " GPUs");
  return false;
}

inline anvil::parallel::CommOptions options(double seconds) {
  anvil::parallel::CommOptions o;
  o.timeout = std::chrono::milliseconds(int64_t(seconds * 1000));
  return o;
}

// Runs fn(rank) on n threads at once and returns each rank's result, or
// rethrows the first exception (after every thread has finished).
template <typename Fn>
auto each_rank(int n, Fn fn) {
  using R = decltype(fn(0));
  std::vector<std::optional<R>> results(static_cast<size_t>(n));
  std::vector<std::exception_ptr> errors(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        results[size_t(r)] = fn(r);
      } catch (...) {
        errors[size_t(r)] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
  std::vector<R> out;
  for (auto& r : results) out.push_back(std::move(*r));
  return out;
}

}  // namespace parallel_test
