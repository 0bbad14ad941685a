// cpu::gemm_bf16 (kernels/cpu/gemm_bf16.cpp) against an FP64 product of the
// same bfloat16 values, on shapes that cross each of its blocks (8-row and
// 48-column tiles, 192-deep and 3072-wide blocks, odd depths), every
// transpose, and leading dimensions wider than the matrix.
//
// Bound: the operands are bfloat16 values, so each product is exact in FP32;
// the only roundings are the K - 1 FP32 additions (in any order: at most
// (K - 1) u sum|a b| to first order), alpha's product and beta's FMA, with
// u = 2^-24. So per element
//   |C - ref| <= (K + 2) u (|alpha| sum_k |a_ik b_kj| + |beta c_ij|).
// A wrong pairing of depths or a misplaced row or column is off by O(|a b|),
// far outside it.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "core/bfloat16.h"
#include "kernels/cpu/cpu_kernels.h"

using namespace anvil;

namespace {

std::vector<float> bf16_values(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> d(-2.0f, 2.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = bf16_bits_to_float(float_to_bf16_bits(d(gen)));
  return v;
}

struct Case {
  int M, N, K;
};

}  // namespace

TEST_CASE("cpu gemm_bf16 against FP64 on ragged shapes and every transpose", "[cpu][gemm]") {
  if (!cpu::bf16_dot_enabled())
    WARN("this CPU has no AVX-512 BF16 (or ANVIL_CPU_BF16=off): gemm_bf16 runs on SGEMM here");
  const Case cases[] = {{67, 133, 45}, {9, 3100, 389}, {101, 50, 193}, {300, 20, 200}, {1, 1, 1}, {8, 48, 2}};
  const float alpha = 0.75f, beta = -0.5f;
  for (const Case& c : cases) {
    for (int combo = 0; combo < 4; ++combo) {
      const bool ta = combo & 1, tb = combo & 2;
      DYNAMIC_SECTION(c.M << "x" << c.N << "x" << c.K << " trans_a=" << ta << " trans_b=" << tb) {
        const int lda = (ta ? c.M : c.K) + 3, ldb = (tb ? c.K : c.N) + 5, ldc = c.N + 2;
        const auto A = bf16_values(size_t(ta ? c.K : c.M) * lda, 1 + combo);
        const auto B = bf16_values(size_t(tb ? c.N : c.K) * ldb, 7 + combo);
        const auto C0 = bf16_values(size_t(c.M) * ldc, 13 + combo);
        auto C = C0;
        cpu::gemm_bf16(ta, tb, c.M, c.N, c.K, alpha, A.data(), lda, B.data(), ldb, beta,
                       C.data(), ldc);
        const double u = 0x1p-24;
        double worst = 0.0;  // the largest |error| / bound
        for (int i = 0; i < c.M; ++i) {
          for (int j = 0; j < c.N; ++j) {
            double sum = 0.0, mag = 0.0;
            for (int k = 0; k < c.K; ++k) {
              const double a = ta ? A[size_t(k) * lda + i] : A[size_t(i) * lda + k];
              const double b = tb ? B[size_t(j) * ldb + k] : B[size_t(k) * ldb + j];
              sum += a * b;
              mag += std::fabs(a * b);
            }
            const double c0 = C0[size_t(i) * ldc + j];
            const double want = alpha * sum + beta * c0;
            const double bound = (c.K + 2) * u * (std::fabs(alpha) * mag + std::fabs(beta * c0));
            const double err = std::fabs(C[size_t(i) * ldc + j] - want);
            if (!(err <= bound)) {
              INFO("C[" << i << "][" << j << "] = " << C[size_t(i) * ldc + j] << ", want "
                        << want << ", bound " << bound);
              REQUIRE(err <= bound);
            }
            if (bound > 0) worst = std::max(worst, err / bound);
          }
          // The padding beyond column N is not written.
          for (int j = c.N; j < ldc; ++j) REQUIRE(C[size_t(i) * ldc + j] == C0[size_t(i) * ldc + j]);
        }
        INFO("worst error / bound " << worst);
        CHECK(worst <= 1.0);
      }
    }
  }
}

TEST_CASE("cpu gemm_bf16: beta = 0 ignores C, alpha = 0 and K = 0 scale it", "[cpu][gemm]") {
  const auto A = bf16_values(3 * 4, 3), B = bf16_values(4 * 2, 4);
  std::vector<float> C(6, std::nanf(""));
  cpu::gemm_bf16(false, false, 3, 2, 4, 1.0f, A.data(), 4, B.data(), 2, 0.0f, C.data(), 2);
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 2; ++j) {
      double want = 0.0;
      for (int k = 0; k < 4; ++k) want += double(A[i * 4 + k]) * B[k * 2 + j];
      CHECK(C[i * 2 + j] == Approx(want).margin(1e-6));
    }
  std::vector<float> D = {1, 2, 3, 4};
  cpu::gemm_bf16(false, false, 2, 2, 0, 1.0f, A.data(), 1, B.data(), 2, 0.5f, D.data(), 2);
  CHECK(D == std::vector<float>{0.5f, 1.0f, 1.5f, 2.0f});
}

TEST_CASE("cpu gemm_bf16 on bfloat16 storage gives the float overload's bits", "[cpu][gemm][bf16]") {
  const Case cases[] = {{67, 133, 45}, {9, 150, 389}, {1, 1, 1}, {8, 48, 3}};
  for (const Case& c : cases) {
    for (int combo = 0; combo < 4; ++combo) {
      const bool ta = combo & 1, tb = combo & 2;
      INFO(c.M << "x" << c.N << "x" << c.K << " trans_a=" << ta << " trans_b=" << tb);
      const int lda = (ta ? c.M : c.K) + 3, ldb = (tb ? c.K : c.N) + 5, ldc = c.N + 2;
      const auto A = bf16_values(size_t(ta ? c.K : c.M) * lda, 21 + combo);
      const auto B = bf16_values(size_t(tb ? c.N : c.K) * ldb, 27 + combo);
      std::vector<bfloat16> A16, B16;
      for (float v : A) A16.push_back(bfloat16(v));
      for (float v : B) B16.push_back(bfloat16(v));
      auto C32 = bf16_values(size_t(c.M) * ldc, 33 + combo), C16 = C32;
      cpu::gemm_bf16(ta, tb, c.M, c.N, c.K, 0.75f, A.data(), lda, B.data(), ldb, -0.5f,
                     C32.data(), ldc);
      cpu::gemm_bf16(ta, tb, c.M, c.N, c.K, 0.75f, A16.data(), lda, B16.data(), ldb, -0.5f,
                     C16.data(), ldc);
      for (size_t i = 0; i < C32.size(); ++i) {
        INFO("element " << i);
        REQUIRE(float_bits(C16[i]) == float_bits(C32[i]));
      }
    }
  }
}
