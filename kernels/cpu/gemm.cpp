// GEMM and per-thread scratch space.
// gemm forwards to OpenBLAS's cblas_sgemm (row-major): a hand-written kernel
// would not beat it, and it is already OpenMP-threaded, so callers must not
// wrap it in their own parallel region. Degenerate sizes are handled here
// because BLAS implementations disagree on K == 0. scratch() keeps a few
// grow-only, 64-byte aligned buffers per thread, so kernels that need
// im2col columns or staging space allocate only until the largest shape has
// been seen once; contents are NOT preserved across calls or growth.
//
// Slot use by the kernels in this directory (callers holding a scratch slot
// across a kernel call must not use these): conv2d_* use slots 0-3.
#include <cblas.h>

#include <climits>
#include <cstdlib>
#include <new>
#include <stdexcept>
#include <string>

#include "core/ops_util.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/cpu_backend.h"
#include "core/precision.h"

namespace anvil::cpu {

namespace {

constexpr int kScratchSlots = 4;

struct ScratchBuffer {
  float* data = nullptr;
  size_t capacity = 0;
  ScratchBuffer() = default;
  ScratchBuffer(const ScratchBuffer&) = delete;
  ScratchBuffer& operator=(const ScratchBuffer&) = delete;
  ~ScratchBuffer() { std::free(data); }
};

int blas_int(int64_t v, const char* what) {
  if (v < 0 || v > INT_MAX) throw std::out_of_range(std::string("gemm: ") + what + " out of range");
  return static_cast<int>(v);
}

}  // namespace

float* scratch(size_t floats, int slot) {
  thread_local ScratchBuffer buffers[kScratchSlots];
  if (slot < 0 || slot >= kScratchSlots) throw std::out_of_range("cpu::scratch: bad slot");
  ScratchBuffer& b = buffers[slot];
  if (floats > b.capacity || b.data == nullptr) {
    // Grow geometrically so a slowly increasing request does not reallocate
    // every call; round to a whole cache line for aligned_alloc.
    size_t want = floats > b.capacity + b.capacity / 2 ? floats : b.capacity + b.capacity / 2;
    if (want < 16) want = 16;
    size_t bytes = ((want * sizeof(float) + 63) / 64) * 64;
    void* p = std::aligned_alloc(64, bytes);
    if (p == nullptr) throw std::bad_alloc();
    std::free(b.data);
    b.data = static_cast<float*>(p);
    b.capacity = bytes / sizeof(float);
  }
  return b.data;
}

void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
          const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
          int64_t ldc) {
  if (M <= 0 || N <= 0) return;
  if (K <= 0 || alpha == 0.0f) {
    // C = beta * C; beta == 0 overwrites (ignores NaN/garbage in C, as BLAS does).
    for (int64_t i = 0; i < M; ++i) {
      float* c = C + i * ldc;
      if (beta == 0.0f) {
        for (int64_t j = 0; j < N; ++j) c[j] = 0.0f;
      } else if (beta != 1.0f) {
        for (int64_t j = 0; j < N; ++j) c[j] *= beta;
      }
    }
    return;
  }
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, blas_int(M, "M"), blas_int(N, "N"),
              blas_int(K, "K"), alpha, A, blas_int(lda, "lda"), B, blas_int(ldb, "ldb"), beta, C,
              blas_int(ldc, "ldc"));
}

// ---- CpuBackend (cpu_backend.h) ----

// A bfloat16 y is staged in float32 (its values first, for beta != 0) and
// rounded once, after the bias. Two bfloat16 operands are read as stored.
void CpuBackend::gemm(bool ta, bool tb, float alpha, const Tensor& a, const Tensor& b,
                      float beta, const Tensor& y_out, const Tensor& bias) {
  int64_t M = y_out.size(0), N = y_out.size(1);
  int64_t K = ta ? a.size(0) : a.size(1);
  ops_detail::Float32Io io;
  const Tensor y = beta == 0.0f ? io.out(y_out) : io.inout(y_out);
  const Fp32Math m = operand_math(fp32_math(OpFamily::kMatmul, DeviceType::CPU), a, b);
  if (a.dtype() == DType::BFloat16 && b.dtype() == DType::BFloat16) {
    cpu::gemm_bf16(ta, tb, M, N, K, alpha, a.data<bfloat16>(), a.size(1), b.data<bfloat16>(),
                   b.size(1), beta, floats(y), N);
  } else if (rounds_operands(m)) {
    const float* A = rounded_operand(a, 0, m);
    const float* B = rounded_operand(b, 1, m);
    if (m == Fp32Math::kBf16)
      cpu::gemm_bf16(ta, tb, M, N, K, alpha, A, a.size(1), B, b.size(1), beta, floats(y), N);
    else
      cpu::gemm(ta, tb, M, N, K, alpha, A, a.size(1), B, b.size(1), beta, floats(y), N);
  } else {
    cpu::gemm(ta, tb, M, N, K, alpha, floats(a), a.size(1), floats(b), b.size(1), beta, floats(y),
              N);
  }
  if (bias.defined()) cpu::add_channel_bias(M, N, 1, floats(y), floats(bias), floats(y));
  io.finish();
}

}  // namespace anvil::cpu
