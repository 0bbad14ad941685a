// The CPU Backend (core/backend.h documents each method). Each method is
// defined beside the kernels it calls, in that family's file: an op's CPU
// code is in one place.
//
// Convolutions and matrix products follow core/precision.h: FP32 with the
// fastest algorithm by default; kIeee rules Winograd out; kTf32 and kBf16
// emulate a tensor core: the operands are rounded to TF32 or BF16
// (rounded_operand below), and the exact FP32 algorithm runs on them (for
// BF16 with gemm_bf16 as its GEMM: the CPU's BF16 dot-product instructions
// where present); so do bfloat16 operands under any setting (operand_math). A
// product of two such values (11 or 8 significant bits each) is exact in FP32, so only the order of the FP32
// sums differs from the GPU's. The bias and its gradient stay FP32, as on
// the GPU.
#pragma once
#include <cstdint>
#include <utility>

#include "core/backend.h"
#include "core/precision.h"

namespace anvil::cpu {

class CpuBackend final : public Backend {
 public:
  // copy in cpu_backend.cpp, convert in convert.cpp; the others in the
  // file of their family (gemm.cpp, conv.cpp, pool.cpp, elementwise.cpp,
  // softmax_cross_entropy.cpp, batch_norm.cpp, sgd.cpp).
#include "kernels/backend_overrides.inc"
};

// A tensor's elements as the kernels take them; null for an undefined
// tensor (an absent bias).
inline float* floats(const Tensor& t) { return t.defined() ? t.data<float>() : nullptr; }
inline const int64_t* int64s(const Tensor& t) { return t.data<int64_t>(); }

// A copy of t's elements rounded as `math` (kTf32 or kBf16) rounds a tensor
// core's operands, in one of the calling thread's two grow-only buffers (0
// or 1; cpu::scratch's slots belong to the kernels): no allocation in steady
// state. t may be float32 or bfloat16 (whose values need no rounding).
// Valid until the next copy into the same buffer (convert.cpp).
const float* rounded_operand(const Tensor& t, int buffer, Fp32Math math);

// Does `math` round the operands (kTf32, kBf16)?
inline bool rounds_operands(Fp32Math math) {
  return math == Fp32Math::kTf32 || math == Fp32Math::kBf16;
}

// The math of a product of a and b under the setting `math`: kBf16 when
// either is bfloat16 (its values are BF16's whatever the setting, as the
// CUDA backend then runs its BF16 rungs; a float32 partner is rounded to
// bfloat16 as those rungs round it), else `math`.
inline Fp32Math operand_math(Fp32Math math, const Tensor& a, const Tensor& b) {
  return a.dtype() == DType::BFloat16 || b.dtype() == DType::BFloat16 ? Fp32Math::kBf16 : math;
}

}  // namespace anvil::cpu
