// The GEMM entry points: argument checks, then the rung's launcher (gemm.h
// lists the rungs; each file says how its threads map to the product).
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "kernels/cuda/gemm/gemm.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/gemm/aligned_copy.h"
#include "core/precision.h"

namespace anvil::cuda {
namespace {

void check_rung(int number) {
  if (number < 1 || number > kGemmRungs)
    throw std::invalid_argument("cuda::gemm: no rung " + std::to_string(number) +
                                " (there are 1 to " + std::to_string(kGemmRungs) + ")");
}

void check_size(const char* name, int64_t v) {
  if (v < 0 || v > INT32_MAX)
    throw std::invalid_argument(std::string("cuda::gemm: ") + name + " = " + std::to_string(v) +
                                " is out of range [0, 2^31)");
}

void check_ld(const char* name, int64_t ld, int64_t row, const char* what) {
  if (ld < row)
    throw std::invalid_argument(std::string("cuda::gemm: ") + name + " = " + std::to_string(ld) +
                                " is smaller than a row of " + what + " (" +
                                std::to_string(row) + " elements)");
}

}  // namespace

size_t gemm_workspace_floats(int number, int64_t M, int64_t N, int64_t K) {
  check_rung(number);
  check_size("M", M);
  check_size("N", N);
  check_size("K", K);
  return gemm_rungs::kRungs[number - 1].workspace(M, N, K);
}

namespace {

// The partials of the split, and the aligned copies where the rung makes
// them of operands of T.
template <class T>
size_t workspace_of(const gemm_rungs::Rung& rung, bool trans_a, bool trans_b, int64_t M,
                    int64_t N, int64_t K, const T* A, int64_t lda, const T* B, int64_t ldb) {
  using gemm_rungs::AlignedCopies;
  const AlignedCopies copies =
      std::is_same_v<T, float> ? AlignedCopies::kFloat32 : AlignedCopies::kBf16;
  const size_t partials = rung.workspace(M, N, K);
  if (rung.copies != copies) return partials;
  return partials + size_t(aligned_copy::workspace_floats(
                        aligned_copy::stored_a(trans_a, M, K, A, lda),
                        aligned_copy::stored_b(trans_b, N, K, B, ldb)));
}

template <class T>
size_t checked_workspace(int number, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                         const T* A, int64_t lda, const T* B, int64_t ldb) {
  gemm_workspace_floats(number, M, N, K);  // the rung's and sizes' checks
  return workspace_of(gemm_rungs::kRungs[number - 1], trans_a, trans_b, M, N, K, A, lda, B, ldb);
}

}  // namespace

size_t gemm_workspace_floats(int number, bool trans_a, bool trans_b, int64_t M, int64_t N,
                             int64_t K, const float* A, int64_t lda, const float* B, int64_t ldb) {
  return checked_workspace(number, trans_a, trans_b, M, N, K, A, lda, B, ldb);
}

size_t gemm_workspace_floats(int number, bool trans_a, bool trans_b, int64_t M, int64_t N,
                             int64_t K, const bfloat16* A, int64_t lda, const bfloat16* B,
                             int64_t ldb) {
  return checked_workspace(number, trans_a, trans_b, M, N, K, A, lda, B, ldb);
}

namespace {

// The rung's launcher for operands of T and C of TC: every rung reads
// float32 into a float32 C; bfloat16 operands, a bfloat16 C and a bias only
// where the rung has launchers for them.
[[noreturn]] void no_launcher(int number, const gemm_rungs::Rung& r, const char* what) {
  throw std::invalid_argument("cuda::gemm: rung " + std::to_string(number) + " (" + r.name +
                              ") " + what + " need rung " + std::to_string(kBf16Gemm) + " (" +
                              gemm_rungs::kRungs[kBf16Gemm - 1].name + ")");
}
gemm_rungs::Launch launcher(int number, const gemm_rungs::Rung& r, const float*, const float*,
                            const float* bias) {
  if (bias != nullptr) no_launcher(number, r, "adds no bias; a bias and bfloat16 operands");
  return r.launch;
}
gemm_rungs::LaunchBf16 launcher(int number, const gemm_rungs::Rung& r, const bfloat16*,
                                const float*, const float*) {
  if (r.launch_bf16 == nullptr)
    no_launcher(number, r, "reads float32 operands only; bfloat16 ones");
  return r.launch_bf16;
}
gemm_rungs::LaunchBf16Out launcher(int number, const gemm_rungs::Rung& r, const bfloat16*,
                                   const bfloat16*, const float*) {
  if (r.launch_bf16_out == nullptr)
    no_launcher(number, r, "reads float32 operands only; bfloat16 ones");
  return r.launch_bf16_out;
}

template <class T, class TC>
void checked_gemm(int number, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                  float alpha, const T* A, int64_t lda, const T* B, int64_t ldb, float beta,
                  TC* C, int64_t ldc, const float* bias, float* workspace, cudaStream_t stream) {
  check_rung(number);
  const gemm_rungs::Rung& rung = gemm_rungs::kRungs[number - 1];
  const auto launch = launcher(number, rung, A, static_cast<const TC*>(C), bias);
  check_size("M", M);
  check_size("N", N);
  check_size("K", K);
  check_ld("lda", lda, trans_a ? M : K, trans_a ? "A (stored K x M)" : "A (stored M x K)");
  check_ld("ldb", ldb, trans_b ? K : N, trans_b ? "B (stored N x K)" : "B (stored K x N)");
  check_ld("ldc", ldc, N, "C (M x N)");
  if (workspace == nullptr) {
    const size_t needed = workspace_of(rung, trans_a, trans_b, M, N, K, A, lda, B, ldb);
    if (needed > 0)
      throw std::invalid_argument("cuda::gemm: rung " + std::to_string(number) + " needs " +
                                  std::to_string(needed) +
                                  " floats of workspace for this shape (null given)");
  }
  if (M == 0 || N == 0) return;
  const GemmArgsOf<T, TC> g{trans_a, trans_b, int(M), int(N), int(K), alpha, A, lda, B, ldb, beta,
                            C, ldc, workspace, bias};
  launch(g, stream);
}

}  // namespace

void gemm(int number, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
          const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
          int64_t ldc, float* workspace, cudaStream_t stream) {
  checked_gemm(number, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, nullptr,
               workspace, stream);
}

void gemm(int number, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
          const bfloat16* A, int64_t lda, const bfloat16* B, int64_t ldb, float beta, float* C,
          int64_t ldc, float* workspace, cudaStream_t stream) {
  checked_gemm(number, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, nullptr,
               workspace, stream);
}

void gemm(int number, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
          const bfloat16* A, int64_t lda, const bfloat16* B, int64_t ldb, float beta, float* C,
          int64_t ldc, const float* bias, float* workspace, cudaStream_t stream) {
  checked_gemm(number, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, bias,
               workspace, stream);
}

void gemm(int number, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
          const bfloat16* A, int64_t lda, const bfloat16* B, int64_t ldb, float beta, bfloat16* C,
          int64_t ldc, const float* bias, float* workspace, cudaStream_t stream) {
  checked_gemm(number, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, bias,
               workspace, stream);
}

void gemm(int number, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
          const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
          int64_t ldc, cudaStream_t stream) {
  gemm(number, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, nullptr, stream);
}

// ---- CudaBackend (cuda_backend.h) ----

// The rung by core/precision.h: the tensor cores where matmuls compute in
// TF32 or BF16 (autocast), else the FP32 rung; bfloat16 operands go to the
// BF16 rung, which reads them as they are, whatever the setting, and
// stores a float32 or bfloat16 y with the bias added in its epilogue. The
// float32 rungs take no bias: it is added by a pass over y (the same
// float32 sum, y being float32).
void CudaBackend::gemm(bool ta, bool tb, float alpha, const Tensor& a, const Tensor& b,
                       float beta, const Tensor& y, const Tensor& bias) {
  activate();
  int64_t M = y.size(0), N = y.size(1);
  int64_t K = ta ? a.size(0) : a.size(1);
  if (bf16_operands("gemm", a, b, y)) {
    const Tensor a16 = bf16_operand(a), b16 = bf16_operand(b);
    Tensor ws = workspace(gemm_workspace_floats(kBf16Gemm, ta, tb, M, N, K, bf16s(a16),
                                                a.size(1), bf16s(b16), b.size(1)));
    if (y.dtype() == DType::BFloat16)
      cuda::gemm(kBf16Gemm, ta, tb, M, N, K, alpha, bf16s(a16), a.size(1), bf16s(b16), b.size(1),
                 beta, y.data<bfloat16>(), N, floats(bias), floats(ws), stream_);
    else
      cuda::gemm(kBf16Gemm, ta, tb, M, N, K, alpha, bf16s(a16), a.size(1), bf16s(b16), b.size(1),
                 beta, floats(y), N, floats(bias), floats(ws), stream_);
    return;
  }
  const Fp32Math math = fp32_math(OpFamily::kMatmul, DeviceType::CUDA);
  const int rung = math == Fp32Math::kTf32   ? kTf32Gemm
                   : math == Fp32Math::kBf16 ? kBf16Gemm
                                             : kBestGemm;
  Tensor ws = workspace(
      gemm_workspace_floats(rung, ta, tb, M, N, K, floats(a), a.size(1), floats(b), b.size(1)));
  cuda::gemm(rung, ta, tb, M, N, K, alpha, floats(a), a.size(1), floats(b), b.size(1), beta,
             floats(y), N, floats(ws), stream_);
  if (bias.defined()) add_channel_bias(M, N, 1, y, bias, y);
}

}  // namespace anvil::cuda
