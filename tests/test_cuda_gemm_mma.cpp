// kernels/cuda GEMM on tensor cores, rungs 09 (TF32, 09_tf32_mma.cu), 10
// (BF16, 10_bf16_mma.cu), 11 (TF32 through a cp.async pipeline,
// 11_tf32_pipelined.cu) and 12 (BF16 through cp.async and ldmatrix,
// 12_bf16_pipelined.cu), against an FP64 reference, element by element,
// with bounds derived below: ragged shapes, every transpose, odd and
// 16-byte-aligned strides, several tiles and a split K. A control shows
// that the operands really are rounded, and in the simulator build a
// mutation of the emulated tensor core (a swapped fragment register) shows
// that these tests notice a misread fragment layout. Rung 10 also reads
// bfloat16 A and B: within the bounds of FP64 of those operands, and
// bitwise the same as from float32 holding the same values (the same words
// staged, the same order of k); so do the CPU and CUDA backends given
// bfloat16 tensors. Rung 12 reads bfloat16 only: within rung 10's bounds and
// bitwise rung 10's result (the same products, summed in the same order).
// Rung 11 (the multistage mainloop's TF32 instance) is bitwise rung 09's,
// at 2, 3 and 4 stages, on every path of its copies. Operands that are not
// 16-byte aligned (the classifier's N x 10 dY) reach rungs 11 and 12
// through aligned copies in the workspace: the same bits again.
//
// The bounds, per element of D = alpha * op(A) op(B) + beta * C, with
// S = sum_k |a_k b_k| over the unrounded operands, u the operands' unit
// roundoff (rounding to nearest: TF32 keeps 10 explicit mantissa bits,
// u = 2^-11; BF16 7, u = 2^-8) and e = 2^-24 (FP32's):
//   - rounding: |a~ b~ - a b| <= (2u + u^2) |a b| per product, so at most
//     2u (1 + u/2) S in all;
//   - accumulation in FP32 of K exact products (11 x 11 or 8 x 8
//     significand bits fit FP32's 24): at most K * 2e * S (first order; 2e
//     rather than e because a tensor core may truncate instead of rounding
//     at each step, and the split-K partial sums add at most splits <= K
//     more roundings);
//   - the epilogue alpha * acc + beta * c: two roundings, at most
//     2e (|alpha| S + |beta c|) (first order).
// Hence the bound |d - ref| <= c * 2u * |alpha| S + 2^-23 |beta c| with
// c = 1 + u/2 + (K + 1) * 2^-23 / (2u): for TF32 (2u = 2^-10)
// c = 1 + 2^-12 + (K + 1) * 2^-13, 1.02 at K = 133 and 1.07 at K = 600; for
// BF16 (2u = 2^-7) c = 1 + 2^-9 + (K + 1) * 2^-16. Against the FP64 product
// of the operands rounded as the kernel rounds them the FP32 bound
// (K + 2) * 2^-23 * (|alpha| S~ + |beta c|) holds, the one a correct FP32
// GEMM of those operands meets.
//
// The control: the result must fail K * 2^-24 * (|alpha| S + |beta c|)
// against the unrounded operands' FP64 product, a bound an FP32 GEMM meets.
// It can tell the rounding from FP32 only while that bound is well below
// the rounding's error, which on random operands is about u * S / sqrt(K)
// (the terms' rounding errors have random signs): for TF32 up to K of a few
// hundred. So it is asserted for K <= kControlMaxK; longer reductions (the
// split-K case) rely on the rounded-operand comparison, which a kernel that
// does not round (the tensor core would truncate) fails.
#if defined(ANVIL_CUDA_BACKEND)
#include <catch2/catch.hpp>
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "core/backend.h"
#include "core/bfloat16.h"
#include "core/precision.h"
#include "core/tensor.h"
#include "core/tf32.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/gemm/split_k.h"
#include "tests/cuda_test_util.h"
#if defined(ANVIL_CUDA_SIM)
#include "sim/mma_sim.h"
#endif

namespace {

using Vec = std::vector<float>;
using cuda_test::DeviceBuffer;
namespace cu = anvil::cuda;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kSentinel = 12345.0f;  // C's padding: must come back untouched
constexpr int64_t kControlMaxK = 256;

// A tensor-core rung: its rung, unit roundoff and rounding.
struct Rung {
  int rung;
  double u;
  double (*round)(float);
  const char* name;
};
double tf32(float x) { return double(std::bit_cast<float>(anvil::float_to_tf32_bits(x))); }
double bf16(float x) { return double(anvil::bf16_bits_to_float(anvil::float_to_bf16_bits(x))); }
constexpr Rung kTf32{9, 0x1p-11, tf32, "tf32"}, kBf16{10, 0x1p-8, bf16, "bf16"},
    kTf32Pipelined{11, 0x1p-11, tf32, "tf32"}, kBf16Ldmatrix{12, 0x1p-8, bf16, "bf16"};
static_assert(cu::gemm_rungs::kRungs[kTf32.rung - 1].math == cu::gemm_rungs::Math::kTf32);
static_assert(cu::gemm_rungs::kRungs[kTf32Pipelined.rung - 1].math ==
              cu::gemm_rungs::Math::kTf32);
static_assert(cu::gemm_rungs::kRungs[kBf16.rung - 1].math == cu::gemm_rungs::Math::kBf16);
static_assert(cu::gemm_rungs::kRungs[kBf16Ldmatrix.rung - 1].math ==
              cu::gemm_rungs::Math::kBf16);

struct Case {
  int64_t M, N, K;
  bool ta, tb;
  int64_t pad;  // row strides: the stored row + pad, rounded up to a multiple of align
  float alpha, beta;
  int64_t align = 1;
  int64_t offset = 0;  // elements A and B start past their buffers' 16-byte aligned start
};

// The worst |d - ref| / bound over the elements, for the three comparisons
// of the top of this file.
struct Ratios {
  double bound = 0;    // unrounded reference, the rung's bound: must be <= 1
  double fp32 = 0;     // unrounded reference, FP32 bound: the control, must be far > 1
  double rounded = 0;  // reference from rounded operands, FP32 bound: must be <= 1
  bool padding_kept = true;
};

// How the operands reach the rung: float32 as drawn; float32 holding
// bfloat16 values (the draws rounded); those values as bfloat16 (gemm()'s
// bfloat16 overload).
enum class Operands { kFloat32, kBf16Values, kBf16 };

// The stored A, B and C of a case (row strides the stored row + pad).
struct Stored {
  int64_t lda, ldb, ldc;
  Vec A, B, C;
};

Stored draw(const Case& s, uint32_t seed, bool bf16_values) {
  const int64_t a_rows = s.ta ? s.K : s.M, a_cols = s.ta ? s.M : s.K;
  const int64_t b_rows = s.tb ? s.N : s.K, b_cols = s.tb ? s.K : s.N;
  auto ld = [&](int64_t cols) { return (cols + s.pad + s.align - 1) / s.align * s.align; };
  const int64_t lda = ld(a_cols), ldb = ld(b_cols), ldc = ld(s.N);
  // NaN in A's and B's padding: a kernel reading it would spread NaN.
  Stored st{lda, ldb, ldc, Vec(size_t(a_rows * lda), kNaN), Vec(size_t(b_rows * ldb), kNaN),
            Vec(size_t(s.M * ldc), kSentinel)};
  const Vec ra = cuda_test::random_floats(size_t(a_rows * a_cols), seed);
  const Vec rb = cuda_test::random_floats(size_t(b_rows * b_cols), seed + 1);
  const Vec rc = cuda_test::random_floats(size_t(s.M * s.N), seed + 2);
  auto value = [&](float v) { return bf16_values ? float(bf16(v)) : v; };
  for (int64_t r = 0; r < a_rows; ++r)
    for (int64_t c = 0; c < a_cols; ++c)
      st.A[size_t(r * lda + c)] = value(ra[size_t(r * a_cols + c)]);
  for (int64_t r = 0; r < b_rows; ++r)
    for (int64_t c = 0; c < b_cols; ++c)
      st.B[size_t(r * ldb + c)] = value(rb[size_t(r * b_cols + c)]);
  for (int64_t m = 0; m < s.M; ++m)  // beta == 0 must not read C: NaN there would leak
    for (int64_t n = 0; n < s.N; ++n)
      st.C[size_t(m * ldc + n)] = s.beta == 0.0f ? kNaN : rc[size_t(m * s.N + n)];
  return st;
}

std::vector<anvil::bfloat16> to_bf16(const Vec& v) {
  std::vector<anvil::bfloat16> out;
  for (float e : v) out.push_back(anvil::bfloat16(e));
  return out;
}

Ratios compare(const Rung& rung, const Case& s, const Stored& st, const Vec& got);

Ratios run_case(const Rung& rung, const Case& s, uint32_t seed, Operands operands = Operands::kFloat32,
                Vec* result = nullptr) {
  const Stored st = draw(s, seed, operands != Operands::kFloat32);
  DeviceBuffer<float> dC(st.C);
  // The workspace as the backend sizes it, for these operands (NaN: the
  // aligned copies' padding must never be read).
  auto run = [&](const auto& dA, const auto& dB) {
    const auto *A = dA.ptr + s.offset, *B = dB.ptr + s.offset;
    DeviceBuffer<float> ws(Vec(cu::gemm_workspace_floats(rung.rung, s.ta, s.tb, s.M, s.N, s.K,
                                                         A, st.lda, B, st.ldb),
                               kNaN));
    cu::gemm(rung.rung, s.ta, s.tb, s.M, s.N, s.K, s.alpha, A, st.lda, B, st.ldb, s.beta,
             dC.ptr, st.ldc, ws.ptr, nullptr);
    return dC.to_host();
  };
  auto shifted = [&](auto v) {
    v.insert(v.begin(), size_t(s.offset), typename decltype(v)::value_type(kNaN));
    return v;
  };
  Vec got;
  if (operands == Operands::kBf16) {
    const DeviceBuffer<anvil::bfloat16> dA(shifted(to_bf16(st.A))), dB(shifted(to_bf16(st.B)));
    got = run(dA, dB);
  } else {
    const DeviceBuffer<float> dA(shifted(st.A)), dB(shifted(st.B));
    got = run(dA, dB);
  }
  if (result) *result = got;
  return compare(rung, s, st, got);
}

// The worst ratios of got (C as stored, ldc) against FP64 of the stored operands.
Ratios compare(const Rung& rung, const Case& s, const Stored& st, const Vec& got) {
  const Vec &A = st.A, &B = st.B, &C = st.C;
  const int64_t lda = st.lda, ldb = st.ldb, ldc = st.ldc;
  Ratios out;
  const double alpha = s.alpha, beta = s.beta;
  for (int64_t m = 0; m < s.M; ++m) {
    for (int64_t n = 0; n < s.N; ++n) {
      double exact = 0, rounded = 0, S = 0, St = 0;
      for (int64_t k = 0; k < s.K; ++k) {
        const float a = s.ta ? A[size_t(k * lda + m)] : A[size_t(m * lda + k)];
        const float b = s.tb ? B[size_t(n * ldb + k)] : B[size_t(k * ldb + n)];
        exact += double(a) * b;
        rounded += rung.round(a) * rung.round(b);
        S += std::fabs(double(a) * b);
        St += std::fabs(rung.round(a) * rung.round(b));
      }
      const double bc = s.beta == 0.0f ? 0.0 : beta * C[size_t(m * ldc + n)];
      const double d = got[size_t(m * ldc + n)];
      const double c = 1 + rung.u / 2 + double(s.K + 1) * 0x1p-23 / (2 * rung.u);
      const double bound = c * 2 * rung.u * std::fabs(alpha) * S + 0x1p-23 * std::fabs(bc);
      const double fp32 = double(s.K + 2) * 0x1p-23;
      out.bound = std::max(out.bound, std::fabs(d - (alpha * exact + bc)) / bound);
      const double fp32_tight = double(s.K) * 0x1p-24;  // the control's bound
      out.fp32 = std::max(out.fp32, std::fabs(d - (alpha * exact + bc)) /
                                        (fp32_tight * (std::fabs(alpha) * S + std::fabs(bc))));
      out.rounded = std::max(out.rounded, std::fabs(d - (alpha * rounded + bc)) /
                                              (fp32 * (std::fabs(alpha) * St + std::fabs(bc))));
      if (std::isnan(d)) out.bound = out.rounded = std::numeric_limits<double>::infinity();
    }
    for (int64_t n = s.N; n < ldc; ++n)
      out.padding_kept = out.padding_kept && got[size_t(m * ldc + n)] == kSentinel;
  }
  return out;
}

std::string describe(const Case& s) {
  return std::to_string(s.M) + "x" + std::to_string(s.N) + "x" + std::to_string(s.K) +
         ", trans_a " + std::to_string(s.ta) + ", trans_b " + std::to_string(s.tb) +
         ", ld padding " + std::to_string(s.pad) + ", ld aligned to " + std::to_string(s.align);
}

}  // namespace

TEST_CASE("cuda gemm mma: rungs 9 and 11 (TF32) and 10 (BF16) are within their bounds of FP64 "
          "and round their operands", "[cuda][gemm][tf32][bf16][tsan]") {
  if (!cuda_test::have_device()) return;
  // A ragged single tile with odd strides (scalar loads; rung 11 copies
  // them to aligned ones first), every transpose; 130 x 136 (2 x 2 tiles, ragged) with strides a
  // multiple of 4 (16-byte loads or copies, zero-filled past the edges),
  // every transpose; and a one-tile result whose K = 600 splits over grid.z
  // (5 chunks of 128, the last 88).
  std::vector<Case> cases;
  for (int t = 0; t < 4; ++t)
    cases.push_back({67, 45, 133, bool(t & 1), bool(t & 2), 3, 0.5f, -1.5f});
  for (int t = 0; t < 4; ++t)
    cases.push_back({130, 136, 24, bool(t & 1), bool(t & 2), 4, 1.0f, 0.0f});
  cases.push_back({20, 9, 600, false, false, 1, -0.75f, 0.25f});
  cases.push_back({20, 9, 600, true, true, 1, 1.0f, 0.0f});
  for (const Rung& rung : {kTf32, kBf16, kTf32Pipelined}) {
    INFO("rung " << rung.rung << " (" << rung.name << ")");
    REQUIRE(cu::gemm_workspace_floats(rung.rung, 67, 45, 133) == 0);  // K too short to split
    REQUIRE(cu::gemm_workspace_floats(rung.rung, 20, 9, 600) == 5 * 20 * 9);
    uint32_t seed = 11;
    for (const Case& s : cases) {
      INFO(describe(s) << ", alpha " << s.alpha << ", beta " << s.beta);
      const Ratios r = run_case(rung, s, seed += 3);
      INFO("worst error / bound: " << rung.name << " bound " << r.bound
                                   << ", FP32 bound (control) " << r.fp32
                                   << ", rounded operands, FP32 bound " << r.rounded);
      REQUIRE(r.padding_kept);  // C's padding is never written
      REQUIRE(r.bound <= 1.0);
      REQUIRE(r.rounded <= 1.0);
      // The control: the same result fails the bound that an FP32 GEMM of
      // the unrounded operands meets, so the rounding is active.
      if (s.K <= kControlMaxK) REQUIRE(r.fp32 > 4.0);
    }
  }
}

// Bitwise equality (float == would let -0 stand for +0).
bool same_bits(const Vec& a, const Vec& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST_CASE("cuda gemm mma: rung 11 gives rung 9's bits on every transpose and ragged shapes, "
          "and at 2 and 3 stages with A along k",
          "[cuda][gemm][tf32][tsan]") {
  if (!cuda_test::have_device()) return;
  // Every transpose of a ragged single tile with odd strides (not 16-byte
  // aligned: rung 11's launcher copies them to aligned ones) and with strides a
  // multiple of 4 floats (16-byte copies, short at the edges: 67, 45 and 133
  // are not multiples of 4); of 2 x 2 ragged
  // tiles with K = 48, whose first block lies wholly inside (the
  // FullIterator's loop) and the others across the edges; a K of 600 split
  // over grid.z. Rung 11 runs the same mma, k ascending in steps of 8, on
  // the same rounded operands as rung 09, so the results are rung 09's
  // bits; the stage depth changes when a stage lands, never the order of
  // the sums.
  std::vector<Case> cases;
  for (int t = 0; t < 4; ++t) {
    cases.push_back({67, 45, 133, bool(t & 1), bool(t & 2), 3, 0.5f, -1.5f});
    cases.push_back({67, 45, 133, bool(t & 1), bool(t & 2), 0, 1.0f, 0.0f, 4});
    cases.push_back({130, 136, 48, bool(t & 1), bool(t & 2), 0, 1.0f, 0.5f, 4});
  }
  cases.push_back({20, 9, 600, false, false, 0, -0.75f, 0.25f, 4});
  uint32_t seed = 41;
  for (const Case& s : cases) {
    INFO(describe(s) << ", alpha " << s.alpha << ", beta " << s.beta);
    seed += 3;
    Vec rung09, rung11;
    const Ratios r = run_case(kTf32Pipelined, s, seed, Operands::kFloat32, &rung11);
    INFO("worst error / bound: tf32 bound " << r.bound << ", FP32 bound of the rounded operands "
                                            << r.rounded);
    REQUIRE(r.padding_kept);
    REQUIRE(r.bound <= 1.0);
    REQUIRE(r.rounded <= 1.0);
    run_case(kTf32, s, seed, Operands::kFloat32, &rung09);
    REQUIRE(same_bits(rung11, rung09));
    const Stored st = draw(s, seed, false);
    const DeviceBuffer<float> dA(st.A), dB(st.B);
    DeviceBuffer<float> ws(Vec(cu::gemm_workspace_floats(11, s.ta, s.tb, s.M, s.N, s.K, dA.ptr,
                                                         st.lda, dB.ptr, st.ldb),
                               kNaN));
    for (int stages : {2, 3}) {
      if (s.ta) continue;  // the 2- and 3-stage builds take A along k only
      INFO(stages << " stages");
      DeviceBuffer<float> dC(st.C);
      const cu::GemmArgs g{s.ta, s.tb, int(s.M), int(s.N), int(s.K), s.alpha, dA.ptr, st.lda,
                           dB.ptr, st.ldb, s.beta, dC.ptr, st.ldc, ws.ptr};
      cu::gemm_rungs::tf32_pipelined_stages(stages, g, nullptr);
      REQUIRE(same_bits(dC.to_host(), rung11));
    }
  }
  const cu::GemmArgs none{};
  REQUIRE_THROWS_WITH(cu::gemm_rungs::tf32_pipelined_stages(5, none, nullptr),
                      "gemm rung 11: 5 stages (2, 3 or 4 are built)");
  cu::GemmArgs along_m{};
  along_m.trans_a = true;
  REQUIRE_THROWS_WITH(cu::gemm_rungs::tf32_pipelined_stages(2, along_m, nullptr),
                      "gemm rung 11: 2 stages are built for A along k only (trans_a false)");
}

TEST_CASE("cuda gemm mma: rung 10 reads bfloat16 A and B, bitwise as float32 of the same values",
          "[cuda][gemm][bf16]") {
  if (!cuda_test::have_device()) return;
  // Every transpose, ragged, with odd strides (element loads) and strides
  // a multiple of 4 (8-byte quads, zeros past the edges); a split K.
  std::vector<Case> cases;
  for (int t = 0; t < 4; ++t) {
    cases.push_back({67, 45, 133, bool(t & 1), bool(t & 2), 3, 0.5f, -1.5f});
    cases.push_back({132, 72, 40, bool(t & 1), bool(t & 2), 4, 1.0f, 0.0f});
  }
  cases.push_back({20, 9, 600, true, false, 4, -0.75f, 0.25f});
  uint32_t seed = 31;
  for (const Case& s : cases) {
    INFO(describe(s) << ", alpha " << s.alpha << ", beta " << s.beta);
    Vec from_bf16, from_float;
    const Ratios r = run_case(kBf16, s, seed += 3, Operands::kBf16, &from_bf16);
    INFO("worst error / bound: bf16 bound " << r.bound << ", FP32 bound of the operands "
                                            << r.rounded);
    REQUIRE(r.padding_kept);
    // The operands are bfloat16 already: FP64 of them is the rounded-operand
    // reference, and the control (unrounded operands) does not apply.
    REQUIRE(r.bound <= 1.0);
    REQUIRE(r.rounded <= 1.0);
    run_case(kBf16, s, seed, Operands::kBf16Values, &from_float);
    CHECK(same_bits(from_bf16, from_float));  // the same words staged, the same order of k
  }
  const anvil::bfloat16* none = nullptr;
  REQUIRE_THROWS_WITH(cu::gemm(9, false, false, 4, 4, 4, 1.0f, none, 4, none, 4, 0.0f, nullptr, 4,
                               nullptr, nullptr),
                      "cuda::gemm: rung 9 (tf32 mma) reads float32 operands only; bfloat16 "
                      "ones need rung 12 (bf16 mma ldmatrix)");
}

namespace {

// Rung 12's cases: every transpose of a ragged single tile with odd strides
// (not 16-byte aligned: the launcher copies them to aligned ones) and with strides
// a multiple of 8 elements (16-byte cp.async, short at the edges: 67, 45
// and 133 are not multiples of 8); 2 x 2 ragged tiles; a K of 600 split
// over grid.z.
std::vector<Case> ldmatrix_cases() {
  std::vector<Case> cases;
  for (int t = 0; t < 4; ++t) {
    cases.push_back({67, 45, 133, bool(t & 1), bool(t & 2), 3, 0.5f, -1.5f});
    cases.push_back({67, 45, 133, bool(t & 1), bool(t & 2), 0, 1.0f, 0.0f, 8});
  }
  cases.push_back({130, 136, 40, true, false, 0, 1.0f, 0.5f, 8});
  cases.push_back({20, 9, 600, false, true, 0, -0.75f, 0.25f, 8});
  return cases;
}

}  // namespace

TEST_CASE("cuda gemm mma: rung 12 (ldmatrix) reads bfloat16 A and B within rung 10's bounds, "
          "bitwise as rung 10",
          "[cuda][gemm][bf16]") {
  if (!cuda_test::have_device()) return;
  REQUIRE(cu::gemm_workspace_floats(kBf16Ldmatrix.rung, 67, 45, 133) == 0);
  REQUIRE(cu::gemm_workspace_floats(kBf16Ldmatrix.rung, 20, 9, 600) == 5 * 20 * 9);
  uint32_t seed = 71;
  for (const Case& s : ldmatrix_cases()) {
    INFO(describe(s) << ", alpha " << s.alpha << ", beta " << s.beta);
    Vec got, rung10;
    const Ratios r = run_case(kBf16Ldmatrix, s, seed += 3, Operands::kBf16, &got);
    INFO("worst error / bound: bf16 bound " << r.bound << ", FP32 bound of the operands "
                                            << r.rounded);
    REQUIRE(r.padding_kept);
    REQUIRE(r.bound <= 1.0);
    REQUIRE(r.rounded <= 1.0);
    run_case(kBf16, s, seed, Operands::kBf16, &rung10);
    REQUIRE(same_bits(got, rung10));
  }
  // float32 operands run rung 10: rounded, within its bounds.
  const Case f{67, 45, 133, true, false, 3, 0.5f, -1.5f};
  const Ratios r = run_case(kBf16Ldmatrix, f, 5);
  REQUIRE(r.bound <= 1.0);
  REQUIRE(r.rounded <= 1.0);
  REQUIRE(r.fp32 > 4.0);
}

TEST_CASE("cuda gemm mma: rungs 11 and 12 copy unaligned operands to aligned ones, with rungs "
          "9's and 10's bits", "[cuda][gemm][tf32][bf16][tsan]") {
  if (!cuda_test::have_device()) return;
  // The classifier's products (LeNet's and ResNet-18's 10 classes): dY is
  // batch x 10, rows 40 bytes apart (20 in bfloat16). dX = dY W (A = dY,
  // lda = 10) and dW = dY^T X (trans_a, the same A) at a ragged batch of 37
  // and LeNet's 84 features (rows of 168 bytes in bfloat16: copied too);
  // the forward Y = X W^T (trans_b, N = 10); strides of whole chunks with
  // bases one element past 16 bytes; a K of 600 split over grid.z, the
  // copies past the partials. The workspace is NaN: the copies' padding is
  // never read. The multistage kernels then read the same values in the
  // same places of op(A) and op(B) as rungs 09 and 10 do: their bits.
  const std::vector<Case> cases = {
      {37, 84, 10, false, false, 0, 1.0f, 0.0f},          // dX = dY W
      {10, 84, 37, true, false, 0, 1.0f, 0.5f},           // dW (+)= dY^T X
      {37, 10, 84, false, true, 0, 1.0f, 0.0f},           // Y = X W^T
      {33, 19, 45, true, true, 0, -0.5f, 0.25f, 8, 1},    // bases past 16 bytes
      {20, 9, 600, false, true, 1, 0.75f, 0.0f},          // split K, odd strides
  };
  uint32_t seed = 101;
  for (const Case& s : cases) {
    INFO(describe(s) << ", operands " << s.offset << " elements past 16 bytes");
    seed += 3;
    Vec rung11, rung09, rung12, rung10;
    const Ratios tf32 = run_case(kTf32Pipelined, s, seed, Operands::kFloat32, &rung11);
    REQUIRE(tf32.padding_kept);
    REQUIRE(tf32.bound <= 1.0);
    REQUIRE(tf32.rounded <= 1.0);
    run_case(kTf32, s, seed, Operands::kFloat32, &rung09);
    REQUIRE(same_bits(rung11, rung09));
    const Ratios bf16 = run_case(kBf16Ldmatrix, s, seed, Operands::kBf16, &rung12);
    REQUIRE(bf16.padding_kept);
    REQUIRE(bf16.bound <= 1.0);
    REQUIRE(bf16.rounded <= 1.0);
    run_case(kBf16, s, seed, Operands::kBf16, &rung10);
    REQUIRE(same_bits(rung12, rung10));
    // A bfloat16 C with a bias: rung 12's words are rung 10's.
    const Stored st = draw(s, seed, true);
    std::vector<anvil::bfloat16> a = to_bf16(st.A), b = to_bf16(st.B);
    a.insert(a.begin(), size_t(s.offset), anvil::bfloat16(kNaN));
    b.insert(b.begin(), size_t(s.offset), anvil::bfloat16(kNaN));
    const DeviceBuffer<anvil::bfloat16> dA(a), dB(b);
    const DeviceBuffer<float> bias(cuda_test::random_floats(size_t(s.N), seed + 7));
    const anvil::bfloat16 *A = dA.ptr + s.offset, *B = dB.ptr + s.offset;
    auto bf16_c = [&](int rung) {
      DeviceBuffer<anvil::bfloat16> c(to_bf16(st.C));
      DeviceBuffer<float> ws(Vec(
          cu::gemm_workspace_floats(rung, s.ta, s.tb, s.M, s.N, s.K, A, st.lda, B, st.ldb), kNaN));
      cu::gemm(rung, s.ta, s.tb, s.M, s.N, s.K, s.alpha, A, st.lda, B, st.ldb, s.beta, c.ptr,
               st.ldc, bias.ptr, ws.ptr, nullptr);
      std::vector<uint16_t> bits;
      for (const anvil::bfloat16 v : c.to_host()) bits.push_back(v.bits);
      return bits;
    };
    REQUIRE(bf16_c(kBf16Ldmatrix.rung) == bf16_c(kBf16.rung));
  }
  // The workspace of dX = dY W (37 x 84 x 10): A's copy, 37 rows of 12
  // floats (8 bfloat16 of 16: 37 x 32 bytes), and in bfloat16 B's too (10
  // rows of 88), plus 3 floats to reach 16 bytes; nothing for the rungs
  // without copies, or aligned operands (null bases are aligned).
  const float* f = nullptr;
  const anvil::bfloat16* h = nullptr;
  REQUIRE(cu::gemm_workspace_floats(11, false, false, 37, 84, 10, f, 10, f, 84) == 37 * 12 + 3);
  REQUIRE(cu::gemm_workspace_floats(12, false, false, 37, 84, 10, h, 10, h, 84) ==
          37 * 8 + 10 * 88 / 2 + 3);
  REQUIRE(cu::gemm_workspace_floats(9, false, false, 37, 84, 10, f, 10, f, 84) == 0);
  REQUIRE(cu::gemm_workspace_floats(12, false, false, 37, 84, 10, f, 10, f, 84) == 0);
  REQUIRE(cu::gemm_workspace_floats(11, false, false, 37, 84, 12, f, 12, f, 84) == 0);
  // The split: the partials, then the copies (20 x 600 and 9 x 600 floats).
  REQUIRE(cu::gemm_workspace_floats(11, false, true, 20, 9, 600, f, 601, f, 601) ==
          5 * 20 * 9 + 29 * 600 + 3);
  REQUIRE_THROWS_WITH(cu::gemm(11, false, false, 37, 84, 10, 1.0f, f, 10, f, 84, 0.0f, nullptr,
                               84, nullptr, nullptr),
                      "cuda::gemm: rung 11 needs 447 floats of workspace for this shape (null "
                      "given)");
}

TEST_CASE("cuda gemm mma: rung 12's bfloat16 C with a bias is its float32 C rounded once",
          "[cuda][gemm][bf16]") {
  if (!cuda_test::have_device()) return;
  for (const Case& s : {Case{67, 45, 133, false, true, 0, 0.5f, -1.5f, 8},
                        Case{20, 9, 600, true, false, 0, 1.0f, 0.5f, 8}}) {
    INFO(describe(s));
    const Stored st = draw(s, 91, true);
    const DeviceBuffer<anvil::bfloat16> dA(to_bf16(st.A)), dB(to_bf16(st.B));
    const DeviceBuffer<float> bias(cuda_test::random_floats(size_t(s.N), 93));
    DeviceBuffer<float> ws(Vec(cu::gemm_workspace_floats(12, s.ta, s.tb, s.M, s.N, s.K, dA.ptr,
                                                         st.lda, dB.ptr, st.ldb) +
                                   1,
                               kNaN));
    Vec c = st.C;  // C's values bfloat16 ones, so that both Cs hold the same
    for (float& v : c) v = float(bf16(v));
    DeviceBuffer<float> c32(c), plain(c);
    DeviceBuffer<anvil::bfloat16> c16(to_bf16(c));
    auto run = [&](auto* c, const float* b) {
      cu::gemm(12, s.ta, s.tb, s.M, s.N, s.K, s.alpha, dA.ptr, st.lda, dB.ptr, st.ldb, s.beta, c,
               st.ldc, b, ws.ptr, nullptr);
    };
    run(c32.ptr, bias.ptr);
    run(plain.ptr, nullptr);
    run(c16.ptr, bias.ptr);
    const Vec want = c32.to_host(), without = plain.to_host(), b = bias.to_host();
    const std::vector<anvil::bfloat16> got = c16.to_host();
    for (int64_t m = 0; m < s.M; ++m)
      for (int64_t n = 0; n < s.N; ++n) {
        const size_t i = size_t(m * st.ldc + n);
        INFO("C(" << m << ", " << n << "): float32 " << want[i] << ", without the bias "
                  << without[i] << ", bias " << b[size_t(n)]);
        REQUIRE(got[i].bits == anvil::float_to_bf16_bits(want[i]));
        // The bias is added once, in FP32: C with and without it differ by
        // the bias, up to a few roundings.
        REQUIRE(std::fabs(want[i] - without[i] - b[size_t(n)]) <=
                0x1p-21 * (1.0 + std::fabs(want[i]) + std::fabs(without[i])));
      }
  }
}

TEST_CASE("gemm backends: bfloat16 operands on the CPU and cuda:0 against FP64, and bitwise as "
          "float32 of the same values under BF16 math",
          "[cuda][gemm][bf16]") {
  std::vector<anvil::Device> devices{anvil::Device::cpu()};
  if (cuda_test::have_device("bf16 operand backend test")) devices.push_back(anvil::Device::cuda(0));
  using anvil::DType;
  using anvil::Tensor;
  uint32_t seed = 51;
  for (int t = 0; t < 4; ++t) {
    const Case s{37, 21, 45, bool(t & 1), bool(t & 2), 0, 1.0f, 0.0f};  // as the op layer calls it
    const Stored st = draw(s, seed += 3, true);
    for (const anvil::Device d : devices) {
      INFO(d.str() << ", " << describe(s));
      auto run = [&](DType dtype) {
        const Tensor a = Tensor::from_vector(st.A, {int64_t(st.A.size()) / st.lda, st.lda})
                             .to(dtype)
                             .to(d);
        const Tensor b = Tensor::from_vector(st.B, {int64_t(st.B.size()) / st.ldb, st.ldb})
                             .to(dtype)
                             .to(d);
        const Tensor y = Tensor::empty({s.M, s.N}, DType::Float32, d);
        anvil::backend_for(d).gemm(s.ta, s.tb, s.alpha, a, b, s.beta, y, Tensor());
        return y.to_vector();
      };
      // bfloat16 operands are BF16 math under any setting (the default here).
      const Vec got = run(DType::BFloat16);
      const Ratios r = compare(kBf16, s, st, got);
      INFO("worst error / bound: bf16 bound " << r.bound << ", FP32 bound of the operands "
                                              << r.rounded);
      REQUIRE(r.bound <= 1.0);
      REQUIRE(r.rounded <= 1.0);
      anvil::ScopedBf16Math bf16_math;
      CHECK(same_bits(got, run(DType::Float32)));
    }
  }
}

#if defined(ANVIL_CUDA_SIM)
TEST_CASE("cuda gemm mma: a swapped fragment register in the emulated tensor core breaks rungs "
          "9 to 11", "[cuda][gemm][tf32][bf16][sim][tsan]") {
  namespace mma = anvil::sim::mma;
  const Case s{67, 45, 133, false, true, 3, 1.0f, 0.0f};
  struct Swap {
    mma::Operand operand;
    int i, j;
  };
  for (const Rung& rung : {kTf32, kBf16, kTf32Pipelined}) {
    for (const Swap w : {Swap{mma::Operand::kA, 1, 2}, Swap{mma::Operand::kB, 0, 1}}) {
      mma::set_register_swap(w.operand, w.i, w.j);
      const std::string hook = mma::register_swap();
      Ratios broken;
      try {
        broken = run_case(rung, s, 5);
      } catch (...) {
        mma::clear_register_swap();
        throw;
      }
      mma::clear_register_swap();
      INFO("rung " << rung.rung << ", swap " << hook << ": worst error / " << rung.name
                   << " bound " << broken.bound);
      REQUIRE(!hook.empty());
      REQUIRE(broken.bound > 10.0);  // a misread layout is far outside the bound
    }
    REQUIRE(mma::register_swap().empty());
    REQUIRE(run_case(rung, s, 5).bound <= 1.0);  // and right again without the swap
  }
}

// Clears the simulator's ldmatrix mutation when it leaves scope, thrown
// through or not.
struct ClearLdmatrixMutation {
  ~ClearLdmatrixMutation() { anvil::sim::mma::clear_ldmatrix_mutation(); }
};

TEST_CASE("cuda gemm mma: a mutated ldmatrix (swapped registers, .trans ignored) breaks rung 12",
          "[cuda][gemm][bf16][sim][tsan]") {
  namespace mma = anvil::sim::mma;
  struct Mutation {
    const char* name;
    void (*set)();
    Case s;  // .trans matters only for an operand contiguous along j
  };
  const Mutation mutations[] = {
      {"swap:0:1", [] { mma::set_ldmatrix_swap(0, 1); },
       {67, 45, 133, false, true, 0, 1.0f, 0.0f, 8}},
      {"swap:1:2", [] { mma::set_ldmatrix_swap(1, 2); },
       {67, 45, 133, true, false, 0, 1.0f, 0.0f, 8}},
      {"notrans", [] { mma::set_ldmatrix_drop_trans(); },
       {67, 45, 133, true, false, 0, 1.0f, 0.0f, 8}},
  };
  for (const Mutation& m : mutations) {
    INFO(m.name << ", " << describe(m.s));
    REQUIRE(run_case(kBf16Ldmatrix, m.s, 5, Operands::kBf16).bound <= 1.0);
    m.set();
    const std::string hook = mma::ldmatrix_mutation();
    Ratios broken;
    {
      const ClearLdmatrixMutation clear;
      broken = run_case(kBf16Ldmatrix, m.s, 5, Operands::kBf16);
    }
    INFO("worst error / bf16 bound " << broken.bound);
    REQUIRE(hook == m.name);
    REQUIRE(broken.bound > 10.0);
    REQUIRE(mma::ldmatrix_mutation().empty());
  }
}

TEST_CASE("cuda gemm mma: a mutated ldmatrix (swapped registers) breaks rung 11",
          "[cuda][gemm][tf32][sim][tsan]") {
  namespace mma = anvil::sim::mma;
  // Rung 11 reads its operands stored contiguous along k by ldmatrix
  // (without .trans: float32 is not transposed by it), both of them in the
  // first case, A only in the second.
  const std::pair<int, Case> swaps[] = {{0, {67, 45, 133, false, true, 0, 1.0f, 0.0f, 4}},
                                        {1, {67, 45, 133, false, false, 3, 1.0f, 0.0f}}};
  for (const auto& [first, s] : swaps) {
    INFO("swap:" << first << ":" << first + 1 << ", " << describe(s));
    REQUIRE(run_case(kTf32Pipelined, s, 5).bound <= 1.0);
    mma::set_ldmatrix_swap(first, first + 1);
    Ratios broken;
    {
      const ClearLdmatrixMutation clear;
      broken = run_case(kTf32Pipelined, s, 5);
    }
    INFO("worst error / tf32 bound " << broken.bound);
    REQUIRE(broken.bound > 10.0);
  }
}
#endif

#endif  // ANVIL_CUDA_BACKEND
