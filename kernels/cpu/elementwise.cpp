// Elementwise ops, channel bias and reductions.
// Plain index loops that GCC vectorises (omp simd), split across threads
// with a static schedule only above detail::kMinParallel elements, below
// which forking the OpenMP team costs more than the loop. Reductions
// accumulate in double over fixed-size blocks and then add the block sums
// in order, so results are accurate and do not depend on the thread count.
#include <algorithm>
#include <vector>
#ifdef __AVX2__
#include <immintrin.h>
#endif

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/parallel_util.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/element.h"

namespace anvil::cpu {

using detail::kMinParallel;

namespace {

constexpr int64_t kSumBlock = 4096;

#ifdef __AVX2__
// Eight elements widened to float (a bfloat16's bits are a float's upper half).
inline __m256 load8(const float* x) { return _mm256_loadu_ps(x); }
inline __m256 load8(const bfloat16* x) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
#endif

// Four independent 4-double accumulators: a single vector accumulator is
// bound by vaddpd latency (~1.3 floats/cycle), which made channel sums
// slower than reading their input. T: float or bfloat16, summed as floats.
template <class T>
double block_sum(const T* x, int64_t n) {
  int64_t i = 0;
  double acc = 0.0;
#ifdef __AVX2__
  __m256d a0 = _mm256_setzero_pd(), a1 = a0, a2 = a0, a3 = a0;
  for (; i + 16 <= n; i += 16) {
    const __m256 u = load8(x + i), v = load8(x + i + 8);
    a0 = _mm256_add_pd(a0, _mm256_cvtps_pd(_mm256_castps256_ps128(u)));
    a1 = _mm256_add_pd(a1, _mm256_cvtps_pd(_mm256_extractf128_ps(u, 1)));
    a2 = _mm256_add_pd(a2, _mm256_cvtps_pd(_mm256_castps256_ps128(v)));
    a3 = _mm256_add_pd(a3, _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)));
  }
  alignas(32) double lanes[4];
  _mm256_store_pd(lanes, _mm256_add_pd(_mm256_add_pd(a0, a1), _mm256_add_pd(a2, a3)));
  acc = (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
#endif
#pragma omp simd reduction(+ : acc)
  for (int64_t j = i; j < n; ++j) acc += static_cast<double>(load(x[j]));
  return acc;
}

}  // namespace

// The elementwise ops take float or bfloat16 elements (kernels/element.h):
// loaded into float, computed in float, stored in their type.

namespace {
template <class Op, class T>
void pointwise_forward_loop(int64_t n, const T* x, T* y) {
#pragma omp parallel for simd schedule(static) if (n >= kMinParallel)
  for (int64_t i = 0; i < n; ++i) y[i] = store<T>(Op::forward(load(x[i])));
}
template <class Op, class T>
void pointwise_backward_loop(int64_t n, const T* saved, const T* dy, T* dx) {
#pragma omp parallel for simd schedule(static) if (n >= kMinParallel)
  for (int64_t i = 0; i < n; ++i) dx[i] = store<T>(Op::backward(load(saved[i]), load(dy[i])));
}
}  // namespace

template <class T>
void pointwise_forward(PointwiseOp op, int64_t n, const T* x, T* y) {
  visit_pointwise(op, [&](auto o) { pointwise_forward_loop<decltype(o)>(n, x, y); });
}
template <class T>
void pointwise_backward(PointwiseOp op, int64_t n, const T* saved, const T* dy, T* dx) {
  visit_pointwise(op, [&](auto o) { pointwise_backward_loop<decltype(o)>(n, saved, dy, dx); });
}

template <class T>
void add(int64_t n, const T* a, const T* b, T* y) {
#pragma omp parallel for simd schedule(static) if (n >= kMinParallel)
  for (int64_t i = 0; i < n; ++i) y[i] = store<T>(load(a[i]) + load(b[i]));
}

template <class T>
void mul(int64_t n, const T* a, const T* b, T* y) {
#pragma omp parallel for simd schedule(static) if (n >= kMinParallel)
  for (int64_t i = 0; i < n; ++i) y[i] = store<T>(load(a[i]) * load(b[i]));
}

void axpy(int64_t n, float alpha, const float* x, float* y) {
#pragma omp parallel for simd schedule(static) if (n >= kMinParallel)
  for (int64_t i = 0; i < n; ++i) y[i] += alpha * x[i];
}

template <class T>
void scale(int64_t n, float alpha, const T* x, T* y) {
#pragma omp parallel for simd schedule(static) if (n >= kMinParallel)
  for (int64_t i = 0; i < n; ++i) y[i] = store<T>(alpha * load(x[i]));
}

// The two element types of each (kernels/element.h).
#define ANVIL_ELEMENTWISE(T)                                                                  \
  template void pointwise_forward<T>(PointwiseOp, int64_t, const T*, T*);                    \
  template void pointwise_backward<T>(PointwiseOp, int64_t, const T*, const T*, T*);         \
  template void add<T>(int64_t, const T*, const T*, T*);                                     \
  template void mul<T>(int64_t, const T*, const T*, T*);                                     \
  template void scale<T>(int64_t, float, const T*, T*);
ANVIL_ELEMENTWISE(float)
ANVIL_ELEMENTWISE(bfloat16)
#undef ANVIL_ELEMENTWISE

void fill(int64_t n, float value, float* y) {
#pragma omp parallel for simd schedule(static) if (n >= kMinParallel)
  for (int64_t i = 0; i < n; ++i) y[i] = value;
}

void add_channel_bias(int64_t outer, int64_t C, int64_t inner, const float* x, const float* bias,
                      float* y) {
  if (inner == 1) {  // [outer, C] matrix (a linear layer): add the bias row to every row
#pragma omp parallel for schedule(static) if (outer * C >= kMinParallel)
    for (int64_t o = 0; o < outer; ++o) {
      const float* xr = x + o * C;
      float* yr = y + o * C;
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) yr[c] = xr[c] + bias[c];
    }
    return;
  }
  const int64_t rows = outer * C;
#pragma omp parallel for schedule(static) if (rows * inner >= kMinParallel)
  for (int64_t r = 0; r < rows; ++r) {
    const float b = bias[r % C];
    const float* xr = x + r * inner;
    float* yr = y + r * inner;
#pragma omp simd
    for (int64_t i = 0; i < inner; ++i) yr[i] = xr[i] + b;
  }
}

template <class T>
void channel_sum(int64_t outer, int64_t C, int64_t inner, const T* dy, float* db) {
  const bool par = outer * C * inner >= kMinParallel;
  if (inner == 1) {
    // [outer, C] matrix, column sums: walk rows contiguously, each thread
    // owning a band of columns so its accumulators stay in registers/L1.
    constexpr int64_t kBand = 64;
    const int64_t bands = (C + kBand - 1) / kBand;
#pragma omp parallel for schedule(static) if (par)
    for (int64_t b = 0; b < bands; ++b) {
      const int64_t c0 = b * kBand, c1 = std::min(C, c0 + kBand);
      double acc[kBand] = {};
      for (int64_t o = 0; o < outer; ++o) {
        const T* row = dy + o * C;
#pragma omp simd
        for (int64_t c = c0; c < c1; ++c) acc[c - c0] += static_cast<double>(load(row[c]));
      }
      for (int64_t c = c0; c < c1; ++c) db[c] = static_cast<float>(acc[c - c0]);
    }
    return;
  }
#pragma omp parallel for schedule(static) if (par)
  for (int64_t c = 0; c < C; ++c) {
    double acc = 0.0;
    for (int64_t o = 0; o < outer; ++o) {
      const T* seg = dy + (o * C + c) * inner;
      for (int64_t i0 = 0; i0 < inner; i0 += kSumBlock)
        acc += block_sum(seg + i0, std::min(kSumBlock, inner - i0));
    }
    db[c] = static_cast<float>(acc);
  }
}
template void channel_sum<float>(int64_t, int64_t, int64_t, const float*, float*);
template void channel_sum<bfloat16>(int64_t, int64_t, int64_t, const bfloat16*, float*);

float sum(int64_t n, const float* x) {
  if (n <= 0) return 0.0f;
  const int64_t blocks = (n + kSumBlock - 1) / kSumBlock;
  if (n < kMinParallel) {
    double acc = 0.0;
    for (int64_t b = 0; b < blocks; ++b)
      acc += block_sum(x + b * kSumBlock, std::min(kSumBlock, n - b * kSumBlock));
    return static_cast<float>(acc);
  }
  // Per-block partials, then an ordered sum: identical result for any
  // number of threads. The partials vector is tiny (n / 4096 doubles).
  thread_local std::vector<double> partial;
  if (partial.size() < static_cast<size_t>(blocks)) partial.resize(blocks);
  double* part = partial.data();
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < blocks; ++b)
    part[b] = block_sum(x + b * kSumBlock, std::min(kSumBlock, n - b * kSumBlock));
  double acc = 0.0;
  for (int64_t b = 0; b < blocks; ++b) acc += part[b];
  return static_cast<float>(acc);
}

// ---- CpuBackend (cpu_backend.h) ----

void CpuBackend::fill(const Tensor& dst, double value) {
  switch (dst.dtype()) {
    case DType::Float32: cpu::fill(dst.numel(), float(value), dst.data<float>()); break;
    case DType::Int64: std::fill_n(dst.data<int64_t>(), dst.numel(), int64_t(value)); break;
    case DType::UInt8: std::fill_n(dst.data<uint8_t>(), dst.numel(), uint8_t(value)); break;
    case DType::BFloat16:
      std::fill_n(dst.data<bfloat16>(), dst.numel(), bfloat16(float(value)));
      break;
  }
}
void CpuBackend::add_scalar_int64(const Tensor& dst, int64_t value) {
  int64_t* y = dst.data<int64_t>();
  for (int64_t i = 0; i < dst.numel(); ++i) y[i] += value;
}

// These take float32 or bfloat16 tensors, all of one dtype.
void CpuBackend::pointwise_forward(PointwiseOp op, const Tensor& x, const Tensor& y) {
  visit_float_dtype(x.dtype(), "pointwise_forward", [&](auto t) {
    using T = decltype(t);
    cpu::pointwise_forward(op, x.numel(), x.data<T>(), y.data<T>());
  });
}
void CpuBackend::pointwise_backward(PointwiseOp op, const Tensor& saved, const Tensor& dy,
                                    const Tensor& dx) {
  visit_float_dtype(saved.dtype(), "pointwise_backward", [&](auto t) {
    using T = decltype(t);
    cpu::pointwise_backward(op, saved.numel(), saved.data<T>(), dy.data<T>(), dx.data<T>());
  });
}
void CpuBackend::add(const Tensor& a, const Tensor& b, const Tensor& y) {
  visit_float_dtype(a.dtype(), "add", [&](auto t) {
    using T = decltype(t);
    cpu::add(a.numel(), a.data<T>(), b.data<T>(), y.data<T>());
  });
}
void CpuBackend::mul(const Tensor& a, const Tensor& b, const Tensor& y) {
  visit_float_dtype(a.dtype(), "mul", [&](auto t) {
    using T = decltype(t);
    cpu::mul(a.numel(), a.data<T>(), b.data<T>(), y.data<T>());
  });
}
void CpuBackend::axpy(float alpha, const Tensor& x, const Tensor& y) {
  cpu::axpy(x.numel(), alpha, floats(x), floats(y));
}
void CpuBackend::scale(float alpha, const Tensor& x, const Tensor& y) {
  visit_float_dtype(x.dtype(), "scale", [&](auto t) {
    using T = decltype(t);
    cpu::scale(x.numel(), alpha, x.data<T>(), y.data<T>());
  });
}
void CpuBackend::add_channel_bias(int64_t outer, int64_t C, int64_t inner, const Tensor& x,
                                  const Tensor& bias, const Tensor& y) {
  cpu::add_channel_bias(outer, C, inner, floats(x), floats(bias), floats(y));
}
// dy float32 or bfloat16 (read as stored); db float32.
void CpuBackend::channel_sum(int64_t outer, int64_t C, int64_t inner, const Tensor& dy,
                             const Tensor& db) {
  visit_float_dtype(dy.dtype(), "channel_sum", [&](auto t) {
    using T = decltype(t);
    cpu::channel_sum(outer, C, inner, dy.data<T>(), floats(db));
  });
}
void CpuBackend::sum(const Tensor& x, double scale, const Tensor& out) {
  floats(out)[0] = static_cast<float>(double(cpu::sum(x.numel(), floats(x))) * scale);
}
void CpuBackend::broadcast_scalar(const Tensor& scalar, float alpha, const Tensor& y) {
  cpu::fill(y.numel(), alpha * floats(scalar)[0], floats(y));
}

}  // namespace anvil::cpu
