// The out-of-line half of anvil::cuda::launch (cuda_compat.h): the
// ANVIL_CUDA_SYNC switch, the text of a failed launch, and the profiler's
// events (core/profile.h): every launch goes through here, so with
// profiling on each one is bracketed by two CUDA events on its stream, read
// back into the profile when the training step ends.
#include <fmt/format.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <unordered_map>
#include <vector>

#include "core/profile.h"
#include "core/symbol_name.h"
#include "kernels/cuda/runtime.h"

namespace anvil::cuda {
namespace {

std::atomic<bool>& sync_flag() {
  static std::atomic<bool> flag = [] {
    const char* v = std::getenv("ANVIL_CUDA_SYNC");
    return v != nullptr && *v != '\0' && std::strcmp(v, "0") != 0;
  }();
  return flag;
}

// This thread's launches since its step began, each with its events; and
// the events free for reuse.
struct PendingLaunch {
  cudaEvent_t start = nullptr, end = nullptr;  // end: null if the launch threw
  profile::Family family;
  uint32_t name;
  int stream;
  double host_us;  // when the host issued it
};

struct LaunchLog {
  std::vector<PendingLaunch> pending;
  std::vector<cudaEvent_t> free_events;
  std::unordered_map<const void*, uint32_t> names;
};

LaunchLog& launch_log() {
  thread_local LaunchLog log;
  return log;
}

cudaEvent_t take_event(LaunchLog& log) {
  if (!log.free_events.empty()) {
    cudaEvent_t e = log.free_events.back();
    log.free_events.pop_back();
    return e;
  }
  cudaEvent_t e = nullptr;
  check(cudaEventCreate(&e), "cudaEventCreate (anvil-train --profile)");
  return e;
}

// The records of this thread's launches, after the device has finished
// them (profile::end_step synchronises first). Times are placed on the
// host's clock by the first launch: its host time plus each event's
// device time after that launch's start.
void flush_launches() {
  LaunchLog& log = launch_log();
  if (log.pending.empty()) return;
  const PendingLaunch& first = log.pending.front();
  for (const PendingLaunch& p : log.pending) {
    if (p.end != nullptr) {
      float start_ms = 0, end_ms = 0;
      check(cudaEventElapsedTime(&start_ms, first.start, p.start),
            "cudaEventElapsedTime (anvil-train --profile)");
      check(cudaEventElapsedTime(&end_ms, first.start, p.end),
            "cudaEventElapsedTime (anvil-train --profile)");
      profile::add(p.family, p.name, p.stream, first.host_us + 1000.0 * start_ms,
                   first.host_us + 1000.0 * end_ms);
    }
  }
  for (const PendingLaunch& p : log.pending) {
    log.free_events.push_back(p.start);
    if (p.end != nullptr) log.free_events.push_back(p.end);
  }
  log.pending.clear();
}

}  // namespace

bool profiling() { return profile::enabled(); }

void profile_launch_begin(const void* kernel, cudaStream_t stream) {
  if (!profile::records_launches()) return;  // evaluation, setup, a host wait
  LaunchLog& log = launch_log();
  auto [it, added] = log.names.emplace(kernel, 0);
  if (added) it->second = profile::name_id(short_kernel_name(kernel_name(kernel)));
  static const bool registered = (profile::set_launch_flush(&flush_launches), true);
  (void)registered;
  PendingLaunch p{.family = profile::current_family(),
                  .name = it->second,
                  .stream = profile::stream_index(stream),
                  .host_us = profile::now_us()};
  p.start = take_event(log);
  log.pending.push_back(p);
  check(cudaEventRecord(p.start, stream), "cudaEventRecord (anvil-train --profile)");
}

void profile_launch_end(cudaStream_t stream) {
  if (!profile::records_launches()) return;
  LaunchLog& log = launch_log();
  if (log.pending.empty() || log.pending.back().end != nullptr) return;
  cudaEvent_t e = take_event(log);
  log.pending.back().end = e;
  check(cudaEventRecord(e, stream), "cudaEventRecord (anvil-train --profile)");
#if defined(ANVIL_CUDA_SIM)
  // The simulator runs queued work only when something waits for it, and
  // stamps an event recorded on an idle stream at once: run the launch now,
  // so that its two events bracket the kernel's run and nothing else.
  check(cudaStreamSynchronize(stream), "cudaStreamSynchronize (anvil-train --profile, simulator)");
#endif
}

bool sync_launches() { return sync_flag().load(std::memory_order_relaxed); }
void set_sync_launches(bool on) { sync_flag().store(on, std::memory_order_relaxed); }

std::string kernel_name(const void* kernel) {
#if !defined(ANVIL_CUDA_SIM)
  const char* name = nullptr;
  if (cudaFuncGetName(&name, kernel) == cudaSuccess && name != nullptr) return demangle(name);
  (void)cudaGetLastError();
#endif
  return kernel_name_at(kernel);
}

void throw_launch_error(const void* kernel, dim3 grid, dim3 block, size_t shared_bytes,
                        std::source_location where, const char* when, cudaError_t err) {
  (void)cudaGetLastError();
  throw std::runtime_error(fmt::format(
      "{}:{}: kernel {} {}: grid ({}, {}, {}), block ({}, {}, {}), {} shared bytes: {}",
      where.file_name(), where.line(), kernel_name(kernel), when, grid.x, grid.y, grid.z,
      block.x, block.y, block.z, shared_bytes, cudaGetErrorString(err)));
}

}  // namespace anvil::cuda
