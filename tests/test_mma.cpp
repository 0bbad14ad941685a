// Tensor cores: the float32-to-TF32 rounding (core/tf32.h, tc::cvt_tf32) bit
// for bit against a reference from the definition (every build), and in the simulator build the emulated
// mma.sync: its fragment mapping against the PTX ISA's formulas written out
// here, independently of the emulation; one-hot matrices through real mma
// calls; whole-warp products against FP64; the register-swap mutation hook;
// and the errors of a partial or diverged warp.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/tf32.h"

namespace {

uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float float_of(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Rounds finite x to `mantissa` explicit bits with float32's exponent range
// (subnormals included), in double arithmetic: nearest, ties away from zero
// (ties_even false) or to even. Overflow past float32's range gives Inf.
float reference_round(float x, int mantissa, bool ties_even) {
  const double ax = std::fabs(static_cast<double>(x));
  if (ax == 0.0) return x;
  int e = 0;
  std::frexp(ax, &e);                       // ax in [2^(e-1), 2^e)
  const int lead = std::max(e - 1, -126);   // subnormals share 2^-126's spacing
  const double ulp = std::ldexp(1.0, lead - mantissa);
  const double q = ax / ulp;                // exact: a power-of-two scaling
  const double r = ties_even ? std::nearbyint(q) : std::floor(q + 0.5);
  const double v = r * ulp;
  if (v >= std::ldexp(1.0, 128)) return std::copysign(std::numeric_limits<float>::infinity(), x);
  return static_cast<float>(std::copysign(v, static_cast<double>(x)));  // exact
}

// TF32 rounding from the definition: round to nearest, ties to even, to 10
// mantissa bits (the PTX ISA's cvt.rn.tf32.f32); Inf stays Inf and a NaN
// becomes the quiet NaN 0x7fffe000.
uint32_t reference_tf32(float x) {
  if (std::isnan(x)) return 0x7fffe000u;
  if (std::isinf(x)) return bits_of(x);
  return bits_of(reference_round(x, 10, true));
}

}  // namespace

TEST_CASE("tf32: rounding float32 to tf32 is bit-exact against a reference", "[mma][tf32]") {
  auto check = [](uint32_t u) {
    const float x = float_of(u);
    const uint32_t got = anvil::float_to_tf32_bits(x), want = reference_tf32(x);
    if (got != want || (got & 0x1fffu) != 0) {
      INFO("input 0x" << std::hex << u << ": got 0x" << got << ", want 0x" << want);
      REQUIRE(got == want);
      REQUIRE((got & 0x1fffu) == 0);
    }
  };
  SECTION("edge cases") {
    struct Case {
      uint32_t in, out;
    };
    const Case cases[] = {
        {0x00000000u, 0x00000000u}, {0x80000000u, 0x80000000u},  // zeros keep their sign
        {0x3f800000u, 0x3f800000u},                              // 1.0
        {0x3f800fffu, 0x3f800000u},                              // below the tie: down
        {0x3f801000u, 0x3f800000u},                              // tie, even kept part: stays
        {0x3f801001u, 0x3f802000u},                              // just above the tie: up
        {0x3f803000u, 0x3f804000u},                              // tie, odd kept part: up
        {0xbf801000u, 0xbf800000u},                              // negative tie to even
        {0xbf803000u, 0xbf804000u},                              // negative tie, odd: away
        {0x3fffffffu, 0x40000000u},                              // carry into the exponent
        {0x7f7fe000u, 0x7f7fe000u},                              // largest tf32
        {0x7f7fefffu, 0x7f7fe000u},                              // rounds down to it
        {0x7f7ff000u, 0x7f800000u},                              // tie above it (odd): Inf
        {0x7f7fffffu, 0x7f800000u},                              // largest float: Inf
        {0xff7fffffu, 0xff800000u},                              // and -Inf
        {0x00000001u, 0x00000000u},                              // smallest subnormal: 0
        {0x00001000u, 0x00000000u},                              // subnormal tie: to even 0
        {0x00003000u, 0x00004000u},                              // subnormal tie, odd: up
        {0x80000fffu, 0x80000000u},                              // -subnormal below the tie
        {0x007ff000u, 0x00800000u},                              // subnormal up to normal
        {0x7f800000u, 0x7f800000u}, {0xff800000u, 0xff800000u},  // Inf stays Inf
        {0x7fc00000u, 0x7fffe000u}, {0xffc00001u, 0x7fffe000u},  // NaN: the quiet NaN
        {0x7fffffffu, 0x7fffe000u},                              // CUDA's NaN: no carry out
        {0x7f800001u, 0x7fffe000u},                              // sNaN, low payload: NaN
    };
    for (const Case& c : cases) {
      INFO("input 0x" << std::hex << c.in);
      REQUIRE(anvil::float_to_tf32_bits(float_of(c.in)) == c.out);
      check(c.in);
    }
  }
  SECTION("every high half with the low halves around each tie, and a random sample") {
    // The 13 dropped bits are the low 16's bottom 13: these low halves put
    // each of the 65536 high halves just below, at and above a tie, with an
    // even and an odd kept part.
    const uint32_t lows[] = {0x0000, 0x0001, 0x0fff, 0x1000, 0x1001, 0x1fff, 0x2000,
                             0x2fff, 0x3000, 0x3001, 0x8000, 0x9000, 0xefff, 0xf000, 0xffff};
    for (uint32_t high = 0; high < 0x10000u; ++high)
      for (uint32_t low : lows) check(high << 16 | low);
    std::mt19937 rng(31);
    for (int i = 0; i < (1 << 20); ++i) check(static_cast<uint32_t>(rng()));
  }
}

#if defined(ANVIL_CUDA_SIM)
#include "kernels/cuda/cuda_compat.h"
#include "sim/mma_sim.h"
#include "tests/cuda_test_util.h"
#include "sim_mma_kernels.cu"

namespace {

namespace mma = anvil::sim::mma;
using mma::Operand;
using mma::Shape;
template <typename T>
using Buf = cuda_test::DeviceBuffer<T>;

// ---- the PTX ISA's formulas, as the ISA writes them (section 9.7.14.5,
// "Matrix Fragments for mma.m16n8k8", .tf32, and "Matrix Fragments for
// mma.m16n8k16 with floating point type", .bf16), kept apart from the
// emulation's code. For .bf16, element i lies in register i / 2, low half
// first ("Elements (low to high)").
struct RowCol {
  int row, col;
  bool operator==(const RowCol&) const = default;
};

RowCol isa_coord(Shape shape, Operand operand, int laneid, int i) {
  const int groupID = laneid >> 2;
  const int threadID_in_group = laneid % 4;
  if (operand == Operand::kC || operand == Operand::kD) {
    // Both shapes: row = groupID for c0 and c1, groupID + 8 for c2 and c3;
    // col = (threadID_in_group * 2) + (i & 0x1).
    const int row = i < 2 ? groupID : groupID + 8;
    return {row, (threadID_in_group * 2) + (i & 0x1)};
  }
  if (shape == Shape::kM16N8K8Tf32) {
    if (operand == Operand::kA) {
      // row = groupID for a0 and a2, groupID + 8 for a1 and a3;
      // col = threadID_in_group for a0 and a1, threadID_in_group + 4 for a2 and a3.
      const int row = (i == 0 || i == 2) ? groupID : groupID + 8;
      const int col = (i == 0 || i == 1) ? threadID_in_group : threadID_in_group + 4;
      return {row, col};
    }
    // B: row = threadID_in_group for b0, threadID_in_group + 4 for b1; col = groupID.
    return {i == 0 ? threadID_in_group : threadID_in_group + 4, groupID};
  }
  if (operand == Operand::kA) {
    // row = groupID for ai where 0 <= i < 2 || 4 <= i < 6, groupID + 8 otherwise;
    // col = (threadID_in_group * 2) + (i & 0x1) for i < 4, ... + 8 for i >= 4.
    const int row = ((0 <= i && i < 2) || (4 <= i && i < 6)) ? groupID : groupID + 8;
    const int col = i < 4 ? (threadID_in_group * 2) + (i & 0x1)
                          : (threadID_in_group * 2) + (i & 0x1) + 8;
    return {row, col};
  }
  // B: row = (threadID_in_group * 2) + (i & 0x1) for bi where i < 2, ... + 8
  // for i >= 2; col = groupID.
  const int row = i < 2 ? (threadID_in_group * 2) + (i & 0x1)
                        : (threadID_in_group * 2) + (i & 0x1) + 8;
  return {row, groupID};
}

struct Dims {
  int rows, cols, per_lane;
};
Dims isa_dims(Shape shape, Operand operand) {
  const bool bf16 = shape == Shape::kM16N8K16Bf16;
  switch (operand) {
    case Operand::kA: return {16, bf16 ? 16 : 8, bf16 ? 8 : 4};
    case Operand::kB: return {bf16 ? 16 : 8, 8, bf16 ? 4 : 2};
    default: return {16, 8, 4};
  }
}

const char* name(Shape s) { return s == Shape::kM16N8K8Tf32 ? "tf32 m16n8k8" : "bf16 m16n8k16"; }
std::string name(Operand o) { return std::string(1, "ABCD"[static_cast<int>(o)]); }

constexpr Shape kShapes[] = {Shape::kM16N8K8Tf32, Shape::kM16N8K16Bf16};
constexpr Operand kOperands[] = {Operand::kA, Operand::kB, Operand::kC, Operand::kD};

// bf16 bits of a float that is one already (exact).
uint16_t bf16_of(float f) { return static_cast<uint16_t>(bits_of(f) >> 16); }

// One warp's registers for A (rows x k), B (k x 8) and C (16 x 8),
// row-major, packed by the ISA's formulas: TF32 operands as the float's
// bits (the caller passes TF32 values, or wants them truncated), BF16
// operands as the top 16 bits (the caller passes bf16 values).
struct Problem {
  std::vector<uint32_t> a, b;
  std::vector<float> c;
};
void pack(Shape shape, const std::vector<float>& A, const std::vector<float>& B,
          const std::vector<float>& C, Problem& p) {
  const bool bf16 = shape == Shape::kM16N8K16Bf16;
  const size_t base_a = p.a.size(), base_b = p.b.size();
  p.a.resize(base_a + 128, 0u);
  p.b.resize(base_b + 64, 0u);
  const int k = bf16 ? 16 : 8;
  for (int lane = 0; lane < 32; ++lane) {
    const Dims da = isa_dims(shape, Operand::kA), db = isa_dims(shape, Operand::kB);
    for (int i = 0; i < da.per_lane; ++i) {
      const RowCol at = isa_coord(shape, Operand::kA, lane, i);
      const float v = A[at.row * k + at.col];
      uint32_t& reg = p.a[base_a + lane * 4 + (bf16 ? i / 2 : i)];
      reg |= bf16 ? uint32_t(bf16_of(v)) << (16 * (i % 2)) : bits_of(v);
    }
    for (int i = 0; i < db.per_lane; ++i) {
      const RowCol at = isa_coord(shape, Operand::kB, lane, i);
      const float v = B[at.row * 8 + at.col];
      uint32_t& reg = p.b[base_b + lane * 2 + (bf16 ? i / 2 : i)];
      reg |= bf16 ? uint32_t(bf16_of(v)) << (16 * (i % 2)) : bits_of(v);
    }
    for (int i = 0; i < 4; ++i) {
      const RowCol at = isa_coord(shape, Operand::kC, lane, i);
      p.c.push_back(C[at.row * 8 + at.col]);
    }
  }
}

// Runs every problem (one warp each) and returns each one's D (16 x 8,
// row-major), read back by the ISA's formula.
std::vector<std::vector<float>> run(Shape shape, const Problem& p) {
  const size_t warps = p.c.size() / 128;
  Buf<uint32_t> a(p.a), b(p.b);
  Buf<float> c(p.c), d(p.c.size());
  const unsigned per_block = 4;  // warps
  REQUIRE(warps % per_block == 0);
  anvil::cuda::launch(sim_mma_kernels::registers_mma, static_cast<unsigned>(warps / per_block),
                      dim3(32 * per_block), 0, nullptr, a.ptr, b.ptr, c.ptr, d.ptr,
                      shape == Shape::kM16N8K16Bf16 ? 1 : 0);
  const std::vector<float> regs = d.to_host();
  std::vector<std::vector<float>> out(warps, std::vector<float>(128));
  for (size_t w = 0; w < warps; ++w)
    for (int lane = 0; lane < 32; ++lane)
      for (int i = 0; i < 4; ++i) {
        const RowCol at = isa_coord(shape, Operand::kD, lane, i);
        out[w][at.row * 8 + at.col] = regs[(w * 32 + lane) * 4 + i];
      }
  return out;
}

// Distinct small integers (exact in bf16 and tf32): value v at index i.
std::vector<float> distinct(size_t n, float offset) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = offset + static_cast<float>(i);
  return v;
}

}  // namespace

TEST_CASE("sim mma: the emulation's fragment mapping is the PTX ISA's, element by element",
          "[mma][sim][tsan]") {
  for (Shape shape : kShapes)
    for (Operand operand : kOperands) {
      const Dims dims = isa_dims(shape, operand);
      INFO(name(shape) << ", " << name(operand));
      REQUIRE(mma::fragment_elements(shape, operand) == dims.per_lane);
      REQUIRE(mma::matrix_rows(shape, operand) == dims.rows);
      REQUIRE(mma::matrix_cols(shape, operand) == dims.cols);
      for (int lane = 0; lane < 32; ++lane)
        for (int i = 0; i < dims.per_lane; ++i) {
          const mma::Coord got = mma::fragment_coord(shape, operand, lane, i);
          const RowCol want = isa_coord(shape, operand, lane, i);
          INFO("lane " << lane << ", element " << i);
          REQUIRE(got.row == want.row);
          REQUIRE(got.col == want.col);
        }
    }
}

TEST_CASE("sim mma: every fragment mapping is a bijection onto its matrix", "[mma][sim][tsan]") {
  for (Shape shape : kShapes)
    for (Operand operand : kOperands) {
      const Dims dims = isa_dims(shape, operand);
      INFO(name(shape) << ", " << name(operand));
      REQUIRE(32 * dims.per_lane == dims.rows * dims.cols);
      std::vector<int> hits(dims.rows * dims.cols, 0), hits_isa(hits);
      for (int lane = 0; lane < 32; ++lane)
        for (int i = 0; i < dims.per_lane; ++i) {
          const mma::Coord at = mma::fragment_coord(shape, operand, lane, i);
          REQUIRE(at.row >= 0);
          REQUIRE(at.row < dims.rows);
          REQUIRE(at.col >= 0);
          REQUIRE(at.col < dims.cols);
          ++hits[at.row * dims.cols + at.col];
          const RowCol isa = isa_coord(shape, operand, lane, i);
          ++hits_isa[isa.row * dims.cols + isa.col];
        }
      for (size_t e = 0; e < hits.size(); ++e) {
        INFO("element (" << e / dims.cols << ", " << e % dims.cols << ")");
        REQUIRE(hits[e] == 1);
        REQUIRE(hits_isa[e] == 1);
      }
    }
}

TEST_CASE("sim mma: one-hot matrices land where the PTX ISA says", "[mma][sim][tsan]") {
  for (Shape shape : kShapes) {
    DYNAMIC_SECTION(name(shape)) {
      const int k = shape == Shape::kM16N8K16Bf16 ? 16 : 8;
      const std::vector<float> zero_c(128, 0.0f);
      // A one-hot at (r, c): D's row r is B's row c, every other element 0.
      Problem pa;
      const std::vector<float> B = distinct(k * 8, 1.0f);
      for (int e = 0; e < 16 * k; ++e) {
        std::vector<float> A(16 * k, 0.0f);
        A[e] = 1.0f;
        pack(shape, A, B, zero_c, pa);
      }
      const auto da = run(shape, pa);
      for (int e = 0; e < 16 * k; ++e)
        for (int i = 0; i < 16; ++i)
          for (int j = 0; j < 8; ++j) {
            const float want = i == e / k ? B[(e % k) * 8 + j] : 0.0f;
            INFO("A one-hot at (" << e / k << ", " << e % k << "): D(" << i << ", " << j << ")");
            REQUIRE(da[e][i * 8 + j] == want);
          }
      // B one-hot at (r, c): D's column c is A's column r, every other 0.
      Problem pb;
      const std::vector<float> A = distinct(16 * k, 1.0f);
      for (int e = 0; e < k * 8; ++e) {
        std::vector<float> Bh(k * 8, 0.0f);
        Bh[e] = 1.0f;
        pack(shape, A, Bh, zero_c, pb);
      }
      const auto db = run(shape, pb);
      for (int e = 0; e < k * 8; ++e)
        for (int i = 0; i < 16; ++i)
          for (int j = 0; j < 8; ++j) {
            const float want = j == e % 8 ? A[i * k + e / 8] : 0.0f;
            INFO("B one-hot at (" << e / 8 << ", " << e % 8 << "): D(" << i << ", " << j << ")");
            REQUIRE(db[e][i * 8 + j] == want);
          }
      // C one-hot at (r, c), A and B zero: D is the same one-hot matrix.
      Problem pc;
      const std::vector<float> zero_a(16 * k, 0.0f), zero_b(k * 8, 0.0f);
      for (int e = 0; e < 128; ++e) {
        std::vector<float> C(128, 0.0f);
        C[e] = 1.0f;
        pack(shape, zero_a, zero_b, C, pc);
      }
      const auto dc = run(shape, pc);
      for (int e = 0; e < 128; ++e)
        for (int f = 0; f < 128; ++f) {
          INFO("C one-hot at (" << e / 8 << ", " << e % 8 << "): D(" << f / 8 << ", " << f % 8
                                << ")");
          REQUIRE(dc[e][f] == (e == f ? 1.0f : 0.0f));
        }
    }
  }
}

TEST_CASE("sim mma: the tensor core reads only the top 19 bits of a TF32 operand", "[mma][sim][tsan]") {
  // A = 1 + 2^-20 (bits below TF32's mantissa), B = 3: an exact unit would
  // give 8 * 3 * (1 + 2^-20) = 24 + 24 * 2^-20, the tensor core 24.
  std::vector<float> A(16 * 8, 1.0f + std::ldexp(1.0f, -20)), B(8 * 8, 3.0f), C(128, 0.0f);
  Problem p;
  pack(Shape::kM16N8K8Tf32, A, B, C, p);
  for (int i = 0; i < 3; ++i) pack(Shape::kM16N8K8Tf32, A, B, C, p);  // a whole block
  const auto d = run(Shape::kM16N8K8Tf32, p);
  for (float v : d[0]) REQUIRE(v == 24.0f);
  // Truncation, not rounding: 1 + 2^-10 - 2^-20 reads as 1.
  std::fill(A.begin(), A.end(), 1.0f + std::ldexp(1.0f, -10) - std::ldexp(1.0f, -20));
  Problem q;
  for (int i = 0; i < 4; ++i) pack(Shape::kM16N8K8Tf32, A, B, C, q);
  const auto e = run(Shape::kM16N8K8Tf32, q);
  for (float v : e[0]) REQUIRE(v == 24.0f);
}

namespace {

// D = A * B + C for random A (16 x k), B (k x 8), C through tf32_tile or
// bf16_tile; returns the largest |d - ref| / bound over the elements, where
// ref is FP64 from the operands rounded as the kernel rounds them
// (`rounded` true) or unrounded (false), and bound = k * 2^-24 *
// (|c| + sum |a b|): float32 accumulation of k + 1 exact terms in any order
// errs by at most (k) u times that sum, u = 2^-24, to first order.
double tile_error(bool bf16, int k, bool rounded, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> A(16 * k), B(k * 8), C(128);
  for (float& v : A) v = dist(rng);
  for (float& v : B) v = dist(rng);
  for (float& v : C) v = dist(rng);
  Buf<float> da(A), db(B), dc(C), dd(128);
  if (bf16)
    anvil::cuda::launch(sim_mma_kernels::bf16_tile, 1, dim3(32), 0, nullptr, da.ptr, db.ptr, dc.ptr,
                        dd.ptr, k);
  else
    anvil::cuda::launch(sim_mma_kernels::tf32_tile, 1, dim3(32), 0, nullptr, da.ptr, db.ptr, dc.ptr,
                        dd.ptr, k);
  const std::vector<float> D = dd.to_host();
  auto round = [&](float x) {
    if (!rounded) return static_cast<double>(x);
    return static_cast<double>(bf16 ? reference_round(x, 7, true) : reference_round(x, 10, true));
  };
  double worst = 0.0;
  for (int i = 0; i < 16; ++i)
    for (int j = 0; j < 8; ++j) {
      double ref = C[i * 8 + j], mag = std::fabs(C[i * 8 + j]);
      for (int kk = 0; kk < k; ++kk) {
        const double p = round(A[i * k + kk]) * round(B[kk * 8 + j]);
        ref += p;
        mag += std::fabs(p);
      }
      const double bound = k * std::ldexp(1.0, -24) * mag;
      worst = std::max(worst, std::fabs(D[i * 8 + j] - ref) / bound);
    }
  return worst;
}

}  // namespace

TEST_CASE("sim mma: a warp's D = A * B + C against FP64, TF32 and BF16", "[mma][sim][tsan]") {
  for (bool bf16 : {false, true}) {
    DYNAMIC_SECTION((bf16 ? "bf16" : "tf32")) {
      for (uint32_t seed : {1u, 2u, 3u}) {
        INFO("seed " << seed);
        // Within float32 accumulation's bound of the rounded operands' FP64
        // product (seen: at most 0.06 of it)...
        REQUIRE(tile_error(bf16, 32, true, seed) <= 1.0);
        // ...and far outside it of the unrounded operands' (the rounding is
        // active; seen: 76-96 times it for TF32, 600-740 for BF16).
        REQUIRE(tile_error(bf16, 32, false, seed) > 20.0);
      }
    }
  }
}

TEST_CASE("sim mma: swapping two fragment registers in the emulation breaks an mma product",
          "[mma][sim][tsan]") {
  struct Swap {
    Operand operand;
    int i, j;
  };
  const Swap swaps[] = {{Operand::kA, 1, 2}, {Operand::kA, 0, 3}, {Operand::kB, 0, 1},
                        {Operand::kC, 0, 1}, {Operand::kD, 1, 2}};
  for (bool bf16 : {false, true}) {
    for (const Swap& s : swaps) {
      DYNAMIC_SECTION((bf16 ? "bf16" : "tf32") << ", " << name(s.operand) << s.i << " <-> "
                                               << name(s.operand) << s.j) {
        REQUIRE(tile_error(bf16, 32, true, 7) <= 1.0);  // right without the swap
        mma::set_register_swap(s.operand, s.i, s.j);
        const std::string hook = mma::register_swap();
        double err = 0.0;
        try {
          err = tile_error(bf16, 32, true, 7);
        } catch (...) {
          mma::clear_register_swap();
          throw;
        }
        mma::clear_register_swap();
        CHECK(hook == name(s.operand) + ":" + std::to_string(s.i) + ":" + std::to_string(s.j));
        REQUIRE(err > 1000.0);  // wrong with it (seen: 2e5 to 5e5 times the bound)
        REQUIRE(mma::register_swap().empty());
        REQUIRE(tile_error(bf16, 32, true, 7) <= 1.0);  // and right again
      }
    }
  }
}

TEST_CASE("sim mma: a partial or diverged warp is an error naming the kernel and the lane",
          "[mma][sim][tsan]") {
  using namespace sim_mma_kernels;
  Buf<float> out(64);
  auto site = Catch::Contains("test_mma.cpp");
  SECTION("a block that ends inside the warp") {
    anvil::cuda::launch(mma_partial_warp, 1, dim3(48), 0, nullptr, out.ptr);
    REQUIRE_THROWS_WITH(out.to_host(), site && Catch::Contains("mma_partial_warp") &&
                                           Catch::Contains("warp 1: lane 0 waits in mma.sync") &&
                                           Catch::Contains("lane 16 does not exist"));
  }
  SECTION("lanes at two different mma instructions") {
    anvil::cuda::launch(mma_diverged, 1, dim3(32), 0, nullptr, out.ptr);
    REQUIRE_THROWS_WITH(out.to_host(), site && Catch::Contains("mma_diverged") &&
                                           Catch::Contains("lane 0 waits in mma.sync") &&
                                           Catch::Contains("but lane 16 waits in mma.sync at") &&
                                           Catch::Contains("diverged"));
  }
  SECTION("lanes that have returned") {
    anvil::cuda::launch(mma_after_return, 1, dim3(32), 0, nullptr, out.ptr);
    REQUIRE_THROWS_WITH(out.to_host(), site && Catch::Contains("mma_after_return") &&
                                           Catch::Contains("names lane 8: it has returned"));
  }
  SECTION("lanes in mma instructions of different shapes") {
    anvil::cuda::launch(mma_mixed_shapes, 1, dim3(32), 0, nullptr, out.ptr);
    REQUIRE_THROWS_WITH(out.to_host(),
                        site && Catch::Contains("mma_mixed_shapes") &&
                            Catch::Contains("m16n8k8.tf32") &&
                            Catch::Contains("lane 16 waits in mma.sync m16n8k16.bf16"));
  }
  SECTION("an mma outside a kernel") {
    const uint32_t a[4] = {}, b[2] = {};
    float c[4] = {};
    REQUIRE_THROWS_AS(anvil::cuda::tc::mma_m16n8k8_tf32(c, a, b, c), std::logic_error);
  }
  // The simulator is usable again after each of these.
  REQUIRE(tile_error(false, 8, true, 5) <= 1.0);
}

#endif  // ANVIL_CUDA_SIM
