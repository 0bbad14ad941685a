// Running a test on several ranks: the GPUs the NCCL tests may use, and
// one thread per rank.
#pragma once
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <exception>
#include <optional>
#include <thread>
#include <vector>

#include "core/device.h"
#include "tests/cuda_test_util.h"
#include "parallel/communicator.h"

namespace parallel_test {

// How many GPUs the tests may use (they skip, with a warning, below `want`).
inline int gpus(int want) {
  if (!anvil::parallel::nccl_missing_reason().empty()) {
    WARN(anvil::parallel::nccl_missing_reason());
    return 0;
  }
  // No GPU at all is a skip (or, under ANVIL_REQUIRE_CUDA=1, a failure);
  // fewer than the test needs is a skip everywhere: a one-GPU machine is usable.
  if (!cuda_test::have_device("NCCL test")) return 0;
  const int n = std::min(anvil::device_count(), 5);
  if (n < want) WARN("needs " << want << " GPUs, found " << n << ": NCCL test not run");
  return n < want ? 0 : n;
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
