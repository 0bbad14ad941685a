// bfloat16: the upper 16 bits of an IEEE float32 (1 sign, 8 exponent, 7
// mantissa bits), so it has float32's range with 8 bits of precision.
//
// anvil's own type rather than cuda_bf16.h: that header brings
// vector_types.h, whose float4 clashes with the simulator's. Usable from
// host code, and from device code once compiled by nvcc (ANVIL_HOST_DEVICE).
#pragma once
#include <cstdint>

#include "core/host_device.h"

namespace anvil {

// The builtin behind std::bit_cast, which g++, clang and nvcc provide in
// host and device code alike (std::bit_cast itself is host-only under nvcc).
ANVIL_HOST_DEVICE constexpr uint32_t float_bits(float f) { return __builtin_bit_cast(uint32_t, f); }
ANVIL_HOST_DEVICE constexpr float bits_float(uint32_t u) { return __builtin_bit_cast(float, u); }

// float32 -> bfloat16 bits, rounding to nearest, ties to even. Adding
// 0x7fff plus the kept part's lowest bit to the float's bits carries into
// the kept 16 bits exactly when the dropped 16 bits are above half, or at
// half with an odd kept part. A carry out of the largest finite exponent
// gives Inf, as IEEE rounding does. NaN is tested first (the add could carry
// it into Inf or drop all its payload bits) and comes out quiet, sign kept.
ANVIL_HOST_DEVICE constexpr uint16_t float_to_bf16_bits(float f) {
  const uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x0040u);
  const uint32_t lsb = (u >> 16) & 1u;
  return uint16_t((u + 0x7fffu + lsb) >> 16);
}

// bfloat16 bits -> float32: exact (the 16 dropped bits are zero).
ANVIL_HOST_DEVICE constexpr float bf16_bits_to_float(uint16_t b) {
  return bits_float(uint32_t(b) << 16);
}

// Storage type of DType::BFloat16: two bytes, trivially copyable, so a
// tensor's bytes are the file's bytes (safetensors "BF16").
struct bfloat16 {
  uint16_t bits = 0;

  bfloat16() = default;
  ANVIL_HOST_DEVICE constexpr explicit bfloat16(float f) : bits(float_to_bf16_bits(f)) {}
  ANVIL_HOST_DEVICE static constexpr bfloat16 from_bits(uint16_t b) {
    bfloat16 out;
    out.bits = b;
    return out;
  }
  ANVIL_HOST_DEVICE constexpr explicit operator float() const { return bf16_bits_to_float(bits); }
  ANVIL_HOST_DEVICE constexpr float to_float() const { return bf16_bits_to_float(bits); }
};

static_assert(sizeof(bfloat16) == 2, "bfloat16 must be two bytes, as stored in files");

}  // namespace anvil
