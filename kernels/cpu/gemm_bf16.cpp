// GEMM on bfloat16 operands with FP32 sums: C = alpha * op(A) * op(B) + beta * C,
// where every element of A and B is a bfloat16 value, held in a float (as
// rounded_operand leaves them) or stored as bfloat16 (autocast's tensors,
// packed as they are, without a float32 copy). On a CPU with AVX-512 BF16
// (chosen at run time, never at build time) it runs on VDPBF16PS, which
// multiplies 32 bfloat16 pairs and adds them into 16 FP32 sums per
// instruction: twice the products of an FP32 FMA. Elsewhere, and with
// ANVIL_CPU_BF16=off in the environment (read once), it is cpu::gemm
// (OpenBLAS SGEMM) on the same values (bfloat16 operands widened first).
// Both compute every output as a sum of exact products in FP32; they differ
// only in the order of the sums, and VDPBF16PS treats denormal inputs and
// results as zero.
//
// Blocking (BLIS's loop nest): for each block of NC columns and KC depth, B
// is packed into bfloat16 pairs (k, k+1) for NR = 48 columns at a time, so
// one 64-byte load gives the microkernel 16 columns x 2 depths; for each
// block of MC rows A is packed into pairs for MR = 8 rows. The microkernel
// keeps an 8 x 48 tile of C in 24 of the 32 vector registers and, for each
// depth pair, loads 3 vectors of B and broadcasts one pair of A per row:
// 24 VDPBF16PS for 3 loads and 8 broadcasts. KC = 192 keeps a 48-column
// panel of B (18 KB) in L1 and MC = 96 rows of A (36 KB) in L2.
//
// Threads: a call from outside a parallel region splits the columns (or the
// rows, when there are more of them) between the OpenMP threads, each with
// its own packing buffers; a call inside one (the convolutions' per-image
// chunks) runs on the calling thread, as cpu::gemm does there.
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <immintrin.h>
#include <new>
#include <string_view>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"

namespace anvil::cpu {

namespace {

constexpr int64_t kMR = 8, kNR = 48, kKC = 192, kMC = 96, kNC = 48 * 64;
static_assert(kKC % 2 == 0 && kMC % kMR == 0 && kNC % kNR == 0);

// An operand element's bfloat16 bits: a float's 16 upper bits (exact by the
// precondition; no rounding, so NaN and Inf keep their bits), or a stored
// bfloat16's bits. T{} is zero either way.
inline uint32_t hi16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u >> 16;
}
inline uint32_t hi16(bfloat16 v) { return v.bits; }
template <class T>
inline uint32_t pair(T lo, T hi) {
  return hi16(lo) | (hi16(hi) << 16);
}

// One thread's packing buffers (grow-only, 64-byte aligned).
struct PackBuffers {
  uint32_t* a = nullptr;
  uint32_t* b = nullptr;
  PackBuffers() {
    a = static_cast<uint32_t*>(std::aligned_alloc(64, kMC * kKC / 2 * sizeof(uint32_t)));
    b = static_cast<uint32_t*>(std::aligned_alloc(64, kNC * kKC / 2 * sizeof(uint32_t)));
    if (a == nullptr || b == nullptr) {
      std::free(a);
      std::free(b);
      throw std::bad_alloc();
    }
  }
  PackBuffers(const PackBuffers&) = delete;
  PackBuffers& operator=(const PackBuffers&) = delete;
  ~PackBuffers() {
    std::free(a);
    std::free(b);
  }
};

// The calling thread's buffers.
PackBuffers& pack_buffers() {
  thread_local PackBuffers buf;
  return buf;
}

template <class T>
struct Operands {
  bool ta, tb;
  const T* A;
  int64_t lda;
  const T* B;
  int64_t ldb;
};

// B[k0 : k0+kc, n0 : n0+nc] into panels of kNR columns: panel p, pair j,
// column c at dst[(p * kp + j) * kNR + c], kp = ceil(kc / 2); beyond the
// matrix, zeros. Each loop order reads B along its rows.
template <class T>
void pack_b(const Operands<T>& op, int64_t k0, int64_t kc, int64_t n0, int64_t nc, uint32_t* dst) {
  const int64_t kp = (kc + 1) / 2, pairs = kc / 2;  // pairs: the ones with both depths
  for (int64_t p = 0; p * kNR < nc; ++p) {
    const int64_t cols = std::min(kNR, nc - p * kNR), n = n0 + p * kNR;
    uint32_t* panel = dst + p * kp * kNR;
    if (!op.tb) {
      for (int64_t j = 0; j < kp; ++j) {
        const T* r0 = op.B + (k0 + 2 * j) * op.ldb + n;
        uint32_t* out = panel + j * kNR;
        if (j < pairs) {
          const T* r1 = r0 + op.ldb;
          for (int64_t c = 0; c < cols; ++c) out[c] = pair(r0[c], r1[c]);
        } else {
          for (int64_t c = 0; c < cols; ++c) out[c] = pair(r0[c], T{});
        }
        for (int64_t c = cols; c < kNR; ++c) out[c] = 0;
      }
    } else {
      for (int64_t c = 0; c < kNR; ++c) {
        if (c >= cols) {
          for (int64_t j = 0; j < kp; ++j) panel[j * kNR + c] = 0;
          continue;
        }
        const T* e = op.B + (n + c) * op.ldb + k0;
        for (int64_t j = 0; j < pairs; ++j) panel[j * kNR + c] = pair(e[2 * j], e[2 * j + 1]);
        if (kp > pairs) panel[pairs * kNR + c] = pair(e[2 * pairs], T{});
      }
    }
  }
}

// A[m0 : m0+mc, k0 : k0+kc] into panels of kMR rows: panel p, pair j, row r
// at dst[(p * kp + j) * kMR + r]; beyond the matrix, zeros. As pack_b, each
// loop order reads A along its rows.
template <class T>
void pack_a(const Operands<T>& op, int64_t m0, int64_t mc, int64_t k0, int64_t kc, uint32_t* dst) {
  const int64_t kp = (kc + 1) / 2, pairs = kc / 2;
  for (int64_t p = 0; p * kMR < mc; ++p) {
    const int64_t rows = std::min(kMR, mc - p * kMR), m = m0 + p * kMR;
    uint32_t* panel = dst + p * kp * kMR;
    if (op.ta) {  // A is [K, M]: rows k and k+1 give a pair for each m
      for (int64_t j = 0; j < kp; ++j) {
        const T* r0 = op.A + (k0 + 2 * j) * op.lda + m;
        const T* r1 = j < pairs ? r0 + op.lda : nullptr;
        for (int64_t r = 0; r < kMR; ++r)
          panel[j * kMR + r] = r >= rows ? 0u : pair(r0[r], r1 ? r1[r] : T{});
      }
    } else {
      for (int64_t r = 0; r < kMR; ++r) {
        const T* e = op.A + (m + r) * op.lda + k0;
        for (int64_t j = 0; j < kp; ++j)
          panel[j * kMR + r] = r >= rows ? 0u : pair(e[2 * j], j < pairs ? e[2 * j + 1] : T{});
      }
    }
  }
}

// The functions built for AVX-512 BF16, called only after cpu_has_bf16_dot():
// an isa_ namespace, which tools/gpu/isa_check.py reads as "chosen at run
// time" (any other AVX-512 instruction in a binary is refused there).
namespace isa_avx512bf16 {

#define ANVIL_BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))

// C[0:rows, 0:cols] = alpha * (packed A panel x packed B panel) + beta * C,
// over kp depth pairs.
ANVIL_BF16_TARGET void micro_kernel(int64_t kp, const uint32_t* a, const uint32_t* b,
                                    float alpha, float beta, float* C, int64_t ldc,
                                    int64_t rows, int64_t cols) {
  __m512 acc[kMR][3];
  for (int r = 0; r < kMR; ++r)
    for (int j = 0; j < 3; ++j) acc[r][j] = _mm512_setzero_ps();
  for (int64_t p = 0; p < kp; ++p) {
    const __m512bh b0 = (__m512bh)_mm512_load_si512(b);
    const __m512bh b1 = (__m512bh)_mm512_load_si512(b + 16);
    const __m512bh b2 = (__m512bh)_mm512_load_si512(b + 32);
#pragma GCC unroll 8
    for (int r = 0; r < kMR; ++r) {
      const __m512bh ar = (__m512bh)_mm512_set1_epi32(static_cast<int>(a[r]));
      acc[r][0] = _mm512_dpbf16_ps(acc[r][0], ar, b0);
      acc[r][1] = _mm512_dpbf16_ps(acc[r][1], ar, b1);
      acc[r][2] = _mm512_dpbf16_ps(acc[r][2], ar, b2);
    }
    a += kMR;
    b += kNR;
  }
  const __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
  if (rows == kMR && cols == kNR) {
    for (int r = 0; r < kMR; ++r)
      for (int j = 0; j < 3; ++j) {
        float* c = C + r * ldc + 16 * j;
        __m512 v = _mm512_mul_ps(va, acc[r][j]);
        if (beta != 0.0f) v = _mm512_fmadd_ps(vb, _mm512_loadu_ps(c), v);
        _mm512_storeu_ps(c, v);
      }
    return;
  }
  for (int64_t r = 0; r < rows; ++r)
    for (int j = 0; j < 3 && 16 * j < cols; ++j) {
      const int64_t n = std::min<int64_t>(16, cols - 16 * j);
      const __mmask16 mask = static_cast<__mmask16>((1u << n) - 1u);
      float* c = C + r * ldc + 16 * j;
      __m512 v = _mm512_mul_ps(va, acc[r][j]);
      if (beta != 0.0f) v = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(mask, c), v);
      _mm512_mask_storeu_ps(c, mask, v);
    }
}

// The whole product for rows [m_lo, m_hi) and columns [n_lo, n_hi), on the
// calling thread.
template <class T>
ANVIL_BF16_TARGET void gemm_block(const Operands<T>& op, int64_t m_lo, int64_t m_hi, int64_t n_lo,
                                  int64_t n_hi, int64_t K, float alpha, float beta, float* C,
                                  int64_t ldc) {
  PackBuffers& buf = pack_buffers();
  for (int64_t n0 = n_lo; n0 < n_hi; n0 += kNC) {
    const int64_t nc = std::min(kNC, n_hi - n0);
    for (int64_t k0 = 0; k0 < K; k0 += kKC) {
      const int64_t kc = std::min(kKC, K - k0), kp = (kc + 1) / 2;
      const float b_scale = k0 == 0 ? beta : 1.0f;
      pack_b(op, k0, kc, n0, nc, buf.b);
      for (int64_t m0 = m_lo; m0 < m_hi; m0 += kMC) {
        const int64_t mc = std::min(kMC, m_hi - m0);
        pack_a(op, m0, mc, k0, kc, buf.a);
        for (int64_t jn = 0; jn < nc; jn += kNR)
          for (int64_t im = 0; im < mc; im += kMR)
            micro_kernel(kp, buf.a + (im / kMR) * kp * kMR, buf.b + (jn / kNR) * kp * kNR, alpha,
                         b_scale, C + (m0 + im) * ldc + n0 + jn, ldc,
                         std::min(kMR, mc - im), std::min(kNR, nc - jn));
      }
    }
  }
}

}  // namespace isa_avx512bf16

bool cpu_has_bf16_dot() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bf16");
}

}  // namespace

bool bf16_dot_enabled() {
  static const bool enabled = [] {
    const char* v = std::getenv("ANVIL_CPU_BF16");
    if (v != nullptr && std::string_view(v) == "off") return false;
    return cpu_has_bf16_dot();
  }();
  return enabled;
}

namespace {

// An operand for SGEMM: a float one as it is; a bfloat16 one (rows x cols,
// leading dimension ld) widened exactly into the calling thread's buffer
// `slot` (0 or 1).
const float* widened(const float* p, int64_t, int64_t, int64_t, int) { return p; }
const float* widened(const bfloat16* p, int64_t rows, int64_t cols, int64_t ld, int slot) {
  thread_local std::vector<float> buffers[2];
  std::vector<float>& out = buffers[slot];
  const int64_t n = (rows - 1) * ld + cols;
  if (out.size() < static_cast<size_t>(n)) out.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) out[i] = p[i].to_float();
  return out.data();
}

template <class T>
void run(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const T* A,
         int64_t lda, const T* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  if (M <= 0 || N <= 0 || K <= 0 || alpha == 0.0f)  // C = beta * C only
    return gemm(trans_a, trans_b, M, N, K, alpha, nullptr, lda, nullptr, ldb, beta, C, ldc);
  if (!bf16_dot_enabled())
    return gemm(trans_a, trans_b, M, N, K, alpha,
                widened(A, trans_a ? K : M, trans_a ? M : K, lda, 0), lda,
                widened(B, trans_b ? N : K, trans_b ? K : N, ldb, 1), ldb, beta, C, ldc);
  const Operands<T> op{trans_a, trans_b, A, lda, B, ldb};
  const int threads = omp_in_parallel() ? 1 : omp_get_max_threads();
  // Below ~1 MFLOP a second thread costs more than it saves.
  if (threads == 1 || M * N * K < (int64_t{1} << 20))
    return isa_avx512bf16::gemm_block(op, 0, M, 0, N, K, alpha, beta, C, ldc);
  // Whole microkernel tiles per thread, along the longer side.
  const bool by_cols = N >= M;
  const int64_t unit = by_cols ? kNR : kMR, extent = by_cols ? N : M;
  const int64_t tiles = (extent + unit - 1) / unit;
#pragma omp parallel num_threads(threads)
  {
    const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
    const int64_t lo = std::min(extent, tiles * t / nt * unit);
    const int64_t hi = std::min(extent, tiles * (t + 1) / nt * unit);
    if (lo < hi) {
      if (by_cols) isa_avx512bf16::gemm_block(op, 0, M, lo, hi, K, alpha, beta, C, ldc);
      else isa_avx512bf16::gemm_block(op, lo, hi, 0, N, K, alpha, beta, C, ldc);
    }
  }
}

}  // namespace

void gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
               const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
               int64_t ldc) {
  run(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
               const bfloat16* A, int64_t lda, const bfloat16* B, int64_t ldb, float beta,
               float* C, int64_t ldc) {
  run(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

}  // namespace anvil::cpu
