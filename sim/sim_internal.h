// What the simulator's own files share, and nothing else includes: the
// scheduler (sim/scheduler.cpp) runs a launch's blocks; the streams
// (sim/streams.cpp) decide when; the runtime (sim/runtime.cpp) owns device
// and pinned memory and the per-thread error state.
#pragma once
#include <cstddef>
#include <memory>
#include <source_location>
#include <string>

#include "sim/cuda_sim.h"

namespace anvil::sim::detail {

// A kernel launch as the stream queue holds it until it runs.
struct KernelLaunch {
  dim3 grid;
  dim3 block;
  size_t shared_bytes = 0;
  std::source_location where;
  std::unique_ptr<KernelCall> call;
};

// "kernel launch at file:line": how every error of a launch begins.
std::string launch_site(const std::source_location& where);

// Throws std::runtime_error naming the launch site if the configuration is
// one a GPU refuses (the launch itself then fails, before anything is queued).
void check_launch_config(dim3 grid, dim3 block, size_t shared_bytes,
                         const std::source_location& where);

// Runs every block of the launch on the worker threads (the calling thread is
// one of them) and returns when all have finished. Throws std::runtime_error
// with the first error: a divergent barrier, a misused warp collective, or an
// exception thrown by a CUDA thread; workers take no new block after it.
void run_kernel(const KernelLaunch& launch);

// ---- runtime.cpp ----
// Records err and its readable detail as this thread's last error.
cudaError_t fail(cudaError_t err, std::string detail);
int current_device();
// The device whose cudaMalloc block holds p, or -1 for host memory.
int device_of(const void* p);
// True when [p, p+bytes) lies inside one cudaHostAlloc/cudaMallocHost block.
bool is_pinned(const void* p, size_t bytes);
// Checks a copy as cudaMemcpy does (the kind against the pointers, the ranges
// against their allocations); resolves cudaMemcpyDefault. `api` names the
// call in the error detail.
cudaError_t check_copy(const char* api, void* dst, const void* src, size_t bytes,
                       cudaMemcpyKind& kind);
cudaError_t check_memset(const char* api, void* p, size_t bytes);

// ---- streams.cpp: the implicit synchronisations of runtime calls ----
// Runs every queued item of every stream of every device (cudaFree and
// cudaFreeHost wait for that); returns a deferred kernel's error, if one failed.
cudaError_t drain_all_devices();

}  // namespace anvil::sim::detail
