// float32 <-> bfloat16, and float32 rounded to TF32, over buffers
// (core/bfloat16.h and core/tf32.h do one value). Split
// across threads above detail::kMinParallel elements, as the other
// elementwise kernels.
#include "core/tf32.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/parallel_util.h"

namespace anvil::cpu {

using detail::kMinParallel;

void float_to_bf16(int64_t n, const float* x, bfloat16* y) {
#pragma omp parallel for simd schedule(static) if (n >= kMinParallel)
  for (int64_t i = 0; i < n; ++i) y[i] = bfloat16(x[i]);
}

void bf16_to_float(int64_t n, const bfloat16* x, float* y) {
#pragma omp parallel for simd schedule(static) if (n >= kMinParallel)
  for (int64_t i = 0; i < n; ++i) y[i] = x[i].to_float();
}

void round_to_tf32(int64_t n, const float* x, float* y) {
#pragma omp parallel for simd schedule(static) if (n >= kMinParallel)
  for (int64_t i = 0; i < n; ++i) y[i] = bits_float(float_to_tf32_bits(x[i]));
}

}  // namespace anvil::cpu
