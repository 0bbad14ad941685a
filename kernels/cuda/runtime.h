// The CUDA runtime as host code sees it: the real <cuda_runtime.h> in a CUDA
// build (host .cpp files compiled by g++ and .cu files compiled by nvcc), or
// the simulator's runtime subset (sim/cuda_sim.h) in a simulator build
// (ANVIL_CUDA_SIM). Host code that talks to devices includes this header and
// nothing else from CUDA; kernel files include cuda_compat.h.
#pragma once
#include <source_location>
#include <stdexcept>
#include <string>

#if defined(ANVIL_CUDA_SIM)
#include "sim/cuda_sim.h"
#else
#include <cuda_runtime.h>
#endif

namespace anvil::cuda {

// Throws std::runtime_error "file:line: what: <CUDA's error text>" unless
// err is cudaSuccess. The location is the caller's.
inline void check(cudaError_t err, const char* what,
                  std::source_location where = std::source_location::current()) {
  if (err != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky-free error so the next call starts clean
    throw std::runtime_error(std::string(where.file_name()) + ":" + std::to_string(where.line()) +
                             ": " + what + ": " + cudaGetErrorString(err));
  }
}

// ANVIL_CUDA_SYNC=1 (like CUDA_LAUNCH_BLOCKING=1): launch() waits for every
// kernel and checks it, so that a fault is reported by the launch of the
// kernel that caused it, naming it, instead of by a later unrelated call.
// Slow: for finding a fault, not for training. The variable is read once;
// set_sync_launches overrides it (tests, tools).
bool sync_launches();
void set_sync_launches(bool on);

// The profiler (core/profile.h) at every launch: while profiling() is true,
// launch() calls profile_launch_begin before the kernel is queued and
// profile_launch_end after, which record a CUDA event on `stream` each.
bool profiling();
void profile_launch_begin(const void* kernel, cudaStream_t stream);
void profile_launch_end(cudaStream_t stream);

// "namespace::kernel(argument types)" for a kernel's host-side pointer, or
// "kernel at 0x..." where no symbol is found (the simulator build finds
// symbols only in a binary linked with its symbols exported).
std::string kernel_name(const void* kernel);

// Throws std::runtime_error naming the kernel, its grid, block and shared
// bytes, the launch's file:line, `when` (refused at launch, or failed while
// running with ANVIL_CUDA_SYNC=1) and CUDA's error text. Clears the error
// state first, so the next call starts clean (where the error is not sticky).
[[noreturn]] void throw_launch_error(const void* kernel, dim3 grid, dim3 block,
                                     size_t shared_bytes, std::source_location where,
                                     const char* when, cudaError_t err);

}  // namespace anvil::cuda
