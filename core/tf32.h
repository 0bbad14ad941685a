// TF32, the tensor cores' 19-bit float: float32's sign and 8 exponent bits
// with the top 10 of its 23 mantissa bits. It lives in a 32-bit register
// whose 13 low bits the tensor core ignores.
#pragma once
#include <cstdint>

#include "core/bfloat16.h"  // ANVIL_HOST_DEVICE, float_bits, bits_float

namespace anvil {

constexpr uint32_t kTf32Mask = 0xffffe000u;  // the 19 bits a tensor core reads

// cvt.rna.tf32.f32 as sm_80 and sm_90 execute it (their SASS: a test for
// |x| >= Inf or NaN, an integer add of 0x1000 to the bits of the other
// values, then an AND with 0xffffe000). So finite values round to nearest
// with ties away from zero, a carry into the exponent included: from
// 0x7f7ff000 (halfway between the largest tf32, 0x7f7fe000, and 2^128) up,
// the result is Inf, as IEEE rounding gives. Inf stays Inf. A NaN is only
// masked: a quiet NaN (bit 22 set) stays NaN, but a signalling NaN whose
// payload lies only in the 13 low bits becomes Inf, as on the GPU.
ANVIL_HOST_DEVICE constexpr uint32_t float_to_tf32_bits(float f) {
  uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) < 0x7f800000u) u += 0x1000u;
  return u & kTf32Mask;
}

// The value a tensor core reads from a 32-bit TF32 operand register: its top
// 19 bits. A float that was not converted is truncated (toward zero).
ANVIL_HOST_DEVICE constexpr float tf32_operand(uint32_t bits) {
  return bits_float(bits & kTf32Mask);
}

}  // namespace anvil
