// The CPU Backend (core/backend.h documents each method). Each method is
// defined beside the kernels it calls, in that family's file: an op's CPU
// code is in one place.
//
// Convolutions and matrix products follow core/precision.h: FP32 with the
// fastest algorithm by default; kIeee rules Winograd out; kTf32 emulates a
// tensor core: the operands are rounded to TF32 (tf32_operand below), and
// the exact FP32 algorithm runs on them. A product of two TF32 values (11
// significant bits each) is exact in FP32, so only the order of the FP32
// sums differs from the GPU's. The bias and its gradient stay FP32, as on
// the GPU.
#pragma once
#include <cstdint>
#include <utility>

#include "core/backend.h"

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

// A copy of t's floats rounded to TF32, as a tensor core reads them, in one
// of the calling thread's two grow-only buffers (0 or 1; cpu::scratch's
// slots belong to the kernels): no allocation in steady state. Valid until
// the next copy into the same buffer (convert.cpp).
const float* tf32_operand(const Tensor& t, int buffer);

}  // namespace anvil::cpu
