// 128-bit accesses: four consecutive floats moved by one instruction, for the
// kernels that move their tiles in 16-byte pieces (GEMM rungs 05-08 in
// gemm/, convolution rungs 04-05 in conv/).
//
// Under nvcc these are float4 accesses: one LDG.E.128 from global memory, or
// one LDS.128 / STS.128 in shared memory, where scalar code would issue four
// instructions. The hardware requires the address to be a multiple of 16
// bytes and faults otherwise, so callers use them only where they have
// checked that (a 16-byte aligned base, a row stride and an offset that are
// multiples of 4 floats). In the simulator the bytes are copied (no type
// punning for g++ to miscompile), and an address that is not a multiple of 16
// throws: the launch fails as the GPU's would, so the tests on ragged shapes
// and strides show any vector access that would fault on a GPU.
#pragma once
#include <cstdint>

#include "kernels/cuda/cuda_compat.h"

#if !defined(__CUDACC__)
#include <cstring>
#include <stdexcept>
#include <string>
#endif

namespace anvil::cuda::vec {

#if !defined(__CUDACC__)
inline void require_aligned(const void* p, const char* what) {
  if (reinterpret_cast<std::uintptr_t>(p) % 16 != 0)
    throw std::runtime_error(std::string("misaligned 128-bit ") + what + " at address " +
                             std::to_string(reinterpret_cast<std::uintptr_t>(p)) +
                             " (not a multiple of 16 bytes)");
}
#endif

// p[0..3] as one float4; p must be 16-byte aligned.
__device__ __forceinline__ float4 load4(const float* p) {
#if defined(__CUDACC__)
  return *reinterpret_cast<const float4*>(p);
#else
  require_aligned(p, "load");
  float4 v;
  std::memcpy(&v, p, sizeof v);
  return v;
#endif
}

// p[0..3] = v; p must be 16-byte aligned.
__device__ __forceinline__ void store4(float* p, const float4& v) {
#if defined(__CUDACC__)
  *reinterpret_cast<float4*>(p) = v;
#else
  require_aligned(p, "store");
  std::memcpy(p, &v, sizeof v);
#endif
}

// Element i (0..3) of v; with i a compile-time constant after unrolling, a
// register name and no code.
__device__ __forceinline__ float at(const float4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

}  // namespace anvil::cuda::vec
