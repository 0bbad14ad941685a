// float32 <-> bfloat16, and float32 rounded to TF32, over buffers
// (core/bfloat16.h and core/tf32.h do one value). Split
// across threads above detail::kMinParallel elements, as the other
// elementwise kernels.
#include <vector>
#include <stdexcept>
#include "core/tf32.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/parallel_util.h"
#include "kernels/cpu/cpu_backend.h"
#include "core/tensor.h"

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

// ---- CpuBackend (cpu_backend.h) ----

void CpuBackend::convert(const Tensor& src, const Tensor& dst) {
  if (!src.device().is_cpu() || !dst.device().is_cpu())
    throw std::logic_error("cpu backend asked to convert device memory");
  const int64_t n = src.numel();
  if (src.dtype() == DType::Float32 && dst.dtype() == DType::BFloat16)
    return float_to_bf16(n, src.data<float>(), dst.data<bfloat16>());
  if (src.dtype() == DType::BFloat16 && dst.dtype() == DType::Float32)
    return bf16_to_float(n, src.data<bfloat16>(), dst.data<float>());
  // Other pairs go through double, which holds every float32, bfloat16 and
  // uint8 value exactly, and an int64 rounded to nearest. Rounding that
  // double to float32 and then to bfloat16 rounds correctly: float32 keeps
  // more than twice bfloat16's precision plus two bits.
  for (int64_t i = 0; i < n; ++i) {
    double v = 0;
    switch (src.dtype()) {
      case DType::Float32: v = src.data<float>()[i]; break;
      case DType::Int64: v = double(src.data<int64_t>()[i]); break;
      case DType::UInt8: v = src.data<uint8_t>()[i]; break;
      case DType::BFloat16: v = src.data<bfloat16>()[i].to_float(); break;
    }
    switch (dst.dtype()) {
      case DType::Float32: dst.data<float>()[i] = float(v); break;
      case DType::Int64: dst.data<int64_t>()[i] = int64_t(v); break;
      case DType::UInt8: dst.data<uint8_t>()[i] = uint8_t(v); break;
      case DType::BFloat16: dst.data<bfloat16>()[i] = bfloat16(float(v)); break;
    }
  }
}

const float* rounded_operand(const Tensor& t, int buffer, Fp32Math math) {
  thread_local std::vector<float> buffers[2];
  std::vector<float>& r = buffers[buffer];
  if (r.size() < static_cast<size_t>(t.numel())) r.resize(static_cast<size_t>(t.numel()));
  if (t.dtype() == DType::BFloat16) {  // exact in float32, already rounded
    bf16_to_float(t.numel(), t.data<bfloat16>(), r.data());
  } else if (math == Fp32Math::kBf16) {
    const float* x = floats(t);
    float* y = r.data();
    const int64_t n = t.numel();
#pragma omp parallel for simd schedule(static) if (n >= kMinParallel)
    for (int64_t i = 0; i < n; ++i) y[i] = bf16_bits_to_float(float_to_bf16_bits(x[i]));
  } else {
    round_to_tf32(t.numel(), floats(t), r.data());
  }
  return r.data();
}

}  // namespace anvil::cpu
