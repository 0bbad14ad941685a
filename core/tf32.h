// TF32, the tensor cores' 19-bit float: float32's sign and 8 exponent bits
// with the top 10 of its 23 mantissa bits. It lives in a 32-bit register
// whose 13 low bits the tensor core ignores.
#pragma once
#include <cstdint>

#include "core/bfloat16.h"  // ANVIL_HOST_DEVICE, float_bits, bits_float

namespace anvil {

constexpr uint32_t kTf32Mask = 0xffffe000u;  // the 19 bits a tensor core reads

// float32 rounded to TF32 as anvil's tensor-core rungs round their operands
// (kernels/cuda/mma.cuh, cvt_tf32): to nearest, ties to even, as bfloat16
// (core/bfloat16.h), and as sm_90's cvt.rn.tf32.f32, one instruction there
// (F2FP.TF32.F32); sm_80 has only cvt.rna (ties away), so mma.cuh spells the
// same rounding out in integer instructions for it. Finite values: add
// 0xfff plus the lowest kept bit (bit 13) and clear the 13 low bits; a carry
// runs into the exponent, so from 0x7f7ff000 (halfway between the largest
// tf32, 0x7f7fe000, and 2^128, whose kept part is odd) up the result is
// Inf, as IEEE rounding gives. Inf stays Inf; a NaN becomes the quiet NaN
// 0x7fffe000 (what the tensor core reads of CUDA's canonical 0x7fffffff).
ANVIL_HOST_DEVICE constexpr uint32_t float_to_tf32_bits(float f) {
  const uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fffe000u;  // NaN
  if ((u & 0x7fffffffu) == 0x7f800000u) return u;           // Inf
  return (u + 0xfffu + (u >> 13 & 1u)) & kTf32Mask;
}

// The value a tensor core reads from a 32-bit TF32 operand register: its top
// 19 bits. A float that was not converted is truncated (toward zero).
ANVIL_HOST_DEVICE constexpr float tf32_operand(uint32_t bits) {
  return bits_float(bits & kTf32Mask);
}

}  // namespace anvil
