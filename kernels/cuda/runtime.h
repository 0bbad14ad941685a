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

}  // namespace anvil::cuda
