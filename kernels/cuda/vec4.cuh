// 128-bit accesses: four consecutive floats moved by one instruction, for the
// kernels that move their tiles in 16-byte pieces (GEMM rungs 05-08 in
// gemm/, convolution rungs 04-05 in conv/).
//
// Under nvcc these are float4 accesses: one LDG.E.128 from global memory, or
// one LDS.128 / STS.128 in shared memory, where scalar code would issue four
// instructions. The hardware requires the address to be a multiple of 16
// bytes and faults otherwise, so callers use them only where they have
// checked that (a 16-byte aligned base, a row stride and an offset that are
// multiples of 4 floats). Four bfloat16 are 8 bytes: their quad (Bf16x4
// below) moves by one 64-bit access, on an 8-byte boundary. In the simulator the bytes are copied (no type
// punning for g++ to miscompile), and an address that is not a multiple of 16
// throws: the launch fails as the GPU's would, so the tests on ragged shapes
// and strides show any vector access that would fault on a GPU.
#pragma once
#include <cstdint>

#include "core/bfloat16.h"
#include "kernels/cuda/cuda_compat.h"

#if !defined(__CUDACC__)
#include <cstring>
#include <stdexcept>
#include <string>
#endif

namespace anvil::cuda::vec {

#if !defined(__CUDACC__)
inline void require_aligned(const void* p, const char* what, std::uintptr_t bytes = 16) {
  if (reinterpret_cast<std::uintptr_t>(p) % bytes != 0)
    throw std::runtime_error("misaligned " + std::to_string(8 * bytes) + "-bit " + what +
                             " at address " + std::to_string(reinterpret_cast<std::uintptr_t>(p)) +
                             " (not a multiple of " + std::to_string(bytes) + " bytes)");
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

// p[0], p[1] = x, y as one 8-byte store; p must be 8-byte aligned.
__device__ __forceinline__ void store2(float* p, float x, float y) {
#if defined(__CUDACC__)
  *reinterpret_cast<float2*>(p) = make_float2(x, y);
#else
  require_aligned(p, "store", 8);
  p[0] = x;
  p[1] = y;
#endif
}

// Element i (0..3) of v; with i a compile-time constant after unrolling, a
// register name and no code.
__device__ __forceinline__ float at(const float4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// Four consecutive bfloat16 as the two 32-bit words that hold them in
// memory (little-endian): lo = elements 0 (low half) and 1, hi = 2 and 3.
// The quad of a bfloat16 operand, as float4 is a float32 one's.
struct Bf16x4 {
  uint32_t lo, hi;
};

// p[0..3] as one Bf16x4; p must be 8-byte aligned.
__device__ __forceinline__ Bf16x4 load4(const bfloat16* p) {
#if defined(__CUDACC__)
  const uint2 v = *reinterpret_cast<const uint2*>(p);
  return Bf16x4{v.x, v.y};
#else
  require_aligned(p, "load", 8);
  Bf16x4 v;
  std::memcpy(&v, p, sizeof v);
  return v;
#endif
}

// Element i (0..3) of v.
__device__ __forceinline__ bfloat16 at(const Bf16x4& v, int i) {
  const uint32_t w = i < 2 ? v.lo : v.hi;
  return bfloat16::from_bits(uint16_t(i % 2 == 0 ? w : w >> 16));
}

// Four elements as their quad: a float4, or a Bf16x4.
__device__ __forceinline__ float4 quad_of(const float (&v)[4]) {
  return make_float4(v[0], v[1], v[2], v[3]);
}
__device__ __forceinline__ Bf16x4 quad_of(const bfloat16 (&v)[4]) {
  return Bf16x4{uint32_t(v[0].bits) | uint32_t(v[1].bits) << 16,
                uint32_t(v[2].bits) | uint32_t(v[3].bits) << 16};
}

}  // namespace anvil::cuda::vec
