// The reduction step of the collectives (parallel/): dst = (dst + src) * scale,
// element by element, where src is a chunk just received from another rank.
// One streaming pass, as the sum is memory-bound: three arrays' worth of
// traffic (two reads, one write) for one add and one multiply per element.
// The loop is a plain `omp simd` loop, vectorised for the machine's widest
// vector unit (-march=native); OpenMP threads join in only for chunks large
// enough to pay for forking the team (each thread then streams one
// contiguous slice).
#include <stdexcept>
#include <string>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/parallel_util.h"

namespace anvil::cpu {

void accumulate(int64_t n, float* dst, const float* src, float scale) {
  if (n < 0) throw std::invalid_argument("cpu::accumulate: negative size " + std::to_string(n));
  const bool par = n >= detail::kMinParallel;
  if (scale == 1.0f) {
#pragma omp parallel for simd schedule(static) if (par)
    for (int64_t i = 0; i < n; ++i) dst[i] += src[i];
  } else {
#pragma omp parallel for simd schedule(static) if (par)
    for (int64_t i = 0; i < n; ++i) dst[i] = (dst[i] + src[i]) * scale;
  }
}

void accumulate(int64_t n, int64_t* dst, const int64_t* src) {
  if (n < 0) throw std::invalid_argument("cpu::accumulate: negative size " + std::to_string(n));
  const bool par = n >= detail::kMinParallel;
#pragma omp parallel for simd schedule(static) if (par)
  for (int64_t i = 0; i < n; ++i) dst[i] += src[i];
}

void accumulate(int64_t n, bfloat16* dst, const bfloat16* src, float scale) {
  if (n < 0) throw std::invalid_argument("cpu::accumulate: negative size " + std::to_string(n));
  const bool par = n >= detail::kMinParallel;
#pragma omp parallel for simd schedule(static) if (par)
  for (int64_t i = 0; i < n; ++i)
    dst[i] = bfloat16((dst[i].to_float() + src[i].to_float()) * scale);
}

}  // namespace anvil::cpu
