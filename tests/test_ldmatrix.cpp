// ldmatrix.sync.aligned.m8n8.x{1,2,4}{.trans}.shared.b16 in the simulator
// build: the emulation's mapping against the PTX ISA's, written out here
// independently of it; the same through a kernel, with rows scattered in
// shared memory; the mutation hook; and the errors of a partial or diverged
// warp, mixed variants and a misaligned row address.
#if defined(ANVIL_CUDA_SIM)
#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdint>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cuda/cuda_compat.h"
#include "sim/mma_sim.h"
#include "tests/cuda_test_util.h"
#include "sim_ldmatrix_kernels.cu"

namespace {

namespace mma = anvil::sim::mma;
namespace k = sim_ldmatrix_kernels;

// ---- the PTX ISA ("Warp-level matrix load instruction: ldmatrix"), kept
// apart from the emulation's code. Addresses addr0-addr7 are the rows of the
// first matrix, addr8-addr15 of the second, and so on, given by threads
// 0-7 (.x1), 0-15 (.x2) or 0-31 (.x4): thread 8i + r gives row r of matrix
// i. Each thread receives a fragment of a row, a group of four threads a
// whole row: for .b16, register i of %laneid holds elements
//   row = %laneid >> 2, col = (%laneid % 4) * 2 + j, j = 0 (low), 1 (high)
// of matrix i; .trans loads the matrix in column-major order, so the same
// fragment is of its transpose: stored row (%laneid % 4) * 2 + j, column
// %laneid >> 2.
struct Element {
  int matrix, row, col;  // row: the stored row (whose address thread 8 matrix + row gave)
};
Element isa_element(bool trans, int laneid, int i, int j) {
  const int row = laneid >> 2, col = (laneid % 4) * 2 + j;
  return trans ? Element{i, col, row} : Element{i, row, col};
}
int isa_address_thread(int matrix, int row) { return 8 * matrix + row; }

constexpr int kCounts[] = {1, 2, 4};

}  // namespace

TEST_CASE("sim ldmatrix: the emulation's mapping is the PTX ISA's, lane by lane", "[mma][sim][tsan]") {
  for (bool trans : {false, true})
    for (int lane = 0; lane < 32; ++lane)
      for (int reg = 0; reg < 4; ++reg)
        for (int half = 0; half < 2; ++half) {
          const mma::LdmatrixCoord got = mma::ldmatrix_coord(trans, lane, reg, half);
          const Element want = isa_element(trans, lane, reg, half);
          INFO((trans ? ".trans" : "") << " lane " << lane << ", r" << reg << ", half " << half);
          REQUIRE(got.matrix == want.matrix);
          REQUIRE(got.row == want.row);
          REQUIRE(got.col == want.col);
        }
}

TEST_CASE("sim ldmatrix: each variant's mapping is a bijection onto its matrices", "[mma][sim][tsan]") {
  for (int count : kCounts)
    for (bool trans : {false, true}) {
      INFO("x" << count << (trans ? ".trans" : ""));
      std::vector<int> hits(count * 64, 0), hits_isa(count * 64, 0);
      for (int lane = 0; lane < 32; ++lane)
        for (int reg = 0; reg < count; ++reg)
          for (int half = 0; half < 2; ++half) {
            const mma::LdmatrixCoord at = mma::ldmatrix_coord(trans, lane, reg, half);
            REQUIRE(at.matrix == reg);
            REQUIRE((at.row >= 0 && at.row < 8 && at.col >= 0 && at.col < 8));
            ++hits[at.matrix * 64 + at.row * 8 + at.col];
            const Element e = isa_element(trans, lane, reg, half);
            ++hits_isa[e.matrix * 64 + e.row * 8 + e.col];
          }
      for (int e = 0; e < count * 64; ++e) {
        INFO("matrix " << e / 64 << ", element (" << e / 8 % 8 << ", " << e % 8 << ")");
        REQUIRE(hits[e] == 1);
        REQUIRE(hits_isa[e] == 1);
      }
    }
}

namespace {

// Every lane's 4 registers after ldmatrix.x`count` through a kernel, rows
// scattered over shared memory by `slot` (lane l's row is slot[l]).
std::vector<uint32_t> run(int count, bool trans, const std::vector<uint16_t>& src,
                          const std::vector<int>& slot) {
  cuda_test::DeviceBuffer<uint16_t> s(src);
  cuda_test::DeviceBuffer<int> sl(slot);
  cuda_test::DeviceBuffer<uint32_t> out(std::vector<uint32_t>(128, 0xdeadbeefu));
  anvil::cuda::launch(k::ldmatrix_rows, 1, dim3(32), 0, nullptr, s.ptr, sl.ptr, out.ptr, count,
                      trans ? 1 : 0);
  return out.to_host();
}

struct Scattered {
  std::vector<uint16_t> src;  // slot s, element c: s * 8 + c + 1 (distinct)
  std::vector<int> slot;      // a permutation of 32 of the 64 slots
};
Scattered scattered(uint32_t seed) {
  Scattered x;
  x.src.resize(k::kSlots * 8);
  std::iota(x.src.begin(), x.src.end(), uint16_t{1});
  std::vector<int> all(k::kSlots);
  std::iota(all.begin(), all.end(), 0);
  std::mt19937 rng(seed);
  std::shuffle(all.begin(), all.end(), rng);
  x.slot.assign(all.begin(), all.begin() + 32);
  return x;
}

// Whether the registers are those the ISA gives for the rows the lanes named.
bool matches_isa(int count, bool trans, const Scattered& x, const std::vector<uint32_t>& regs) {
  for (int lane = 0; lane < 32; ++lane)
    for (int reg = 0; reg < count; ++reg)
      for (int half = 0; half < 2; ++half) {
        const Element e = isa_element(trans, lane, reg, half);
        const int s = x.slot[isa_address_thread(e.matrix, e.row)];
        const uint16_t want = x.src[s * 8 + e.col];
        if (uint16_t(regs[4 * lane + reg] >> (16 * half)) != want) return false;
      }
  return true;
}

}  // namespace

TEST_CASE("sim ldmatrix: rows anywhere in shared memory land where the PTX ISA says",
          "[mma][sim][tsan]") {
  const Scattered x = scattered(3);
  for (int count : kCounts)
    for (bool trans : {false, true}) {
      INFO("x" << count << (trans ? ".trans" : ""));
      const std::vector<uint32_t> regs = run(count, trans, x.src, x.slot);
      for (int lane = 0; lane < 32; ++lane)
        for (int reg = 0; reg < 4; ++reg) {
          INFO("lane " << lane << ", r" << reg);
          if (reg >= count) {  // registers the variant lacks are not written
            REQUIRE(regs[4 * lane + reg] == 0xdeadbeefu);
            continue;
          }
          for (int half = 0; half < 2; ++half) {
            const Element e = isa_element(trans, lane, reg, half);
            const uint16_t want = x.src[x.slot[isa_address_thread(e.matrix, e.row)] * 8 + e.col];
            INFO("half " << half);
            REQUIRE(uint16_t(regs[4 * lane + reg] >> (16 * half)) == want);
          }
        }
    }
}

TEST_CASE("sim ldmatrix: the mutation hook swaps registers or drops .trans", "[mma][sim][tsan]") {
  const Scattered x = scattered(5);
  REQUIRE(matches_isa(4, true, x, run(4, true, x.src, x.slot)));
  struct Case {
    const char* name;
    void (*set)();
    int count;
    bool trans;
  };
  const Case cases[] = {
      {"swap:0:1", [] { mma::set_ldmatrix_swap(0, 1); }, 2, false},
      {"swap:1:3", [] { mma::set_ldmatrix_swap(1, 3); }, 4, true},
      {"notrans", [] { mma::set_ldmatrix_drop_trans(); }, 4, true},
  };
  for (const Case& c : cases) {
    INFO(c.name);
    c.set();
    const std::string hook = mma::ldmatrix_mutation();
    bool right = true;
    try {
      right = matches_isa(c.count, c.trans, x, run(c.count, c.trans, x.src, x.slot));
    } catch (...) {
      mma::clear_ldmatrix_mutation();
      throw;
    }
    mma::clear_ldmatrix_mutation();
    CHECK(hook == c.name);
    REQUIRE_FALSE(right);
    REQUIRE(mma::ldmatrix_mutation().empty());
    REQUIRE(matches_isa(c.count, c.trans, x, run(c.count, c.trans, x.src, x.slot)));
  }
}

TEST_CASE("sim ldmatrix: a partial or diverged warp or mixed variants are errors naming the "
          "kernel and the lane, a misaligned row one naming the lane",
          "[mma][sim][tsan]") {
  cuda_test::DeviceBuffer<uint32_t> out(64);
  auto site = Catch::Contains("sim_ldmatrix_kernels.cu");
  SECTION("a block that ends inside the warp") {
    anvil::cuda::launch(k::ldmatrix_partial_warp, 1, dim3(48), 0, nullptr, out.ptr);
    REQUIRE_THROWS_WITH(out.to_host(),
                        site && Catch::Contains("ldmatrix_partial_warp") &&
                            Catch::Contains("warp 1: lane 0 waits in ldmatrix.sync m8n8.x1.b16") &&
                            Catch::Contains("lane 16 does not exist"));
  }
  SECTION("lanes at two different ldmatrix instructions") {
    anvil::cuda::launch(k::ldmatrix_diverged, 1, dim3(32), 0, nullptr, out.ptr);
    REQUIRE_THROWS_WITH(out.to_host(),
                        site && Catch::Contains("ldmatrix_diverged") &&
                            Catch::Contains("lane 0 waits in ldmatrix.sync") &&
                            Catch::Contains("but lane 16 waits in ldmatrix.sync at") &&
                            Catch::Contains("diverged"));
  }
  SECTION("lanes in different variants") {
    anvil::cuda::launch(k::ldmatrix_mixed, 1, dim3(32), 0, nullptr, out.ptr);
    REQUIRE_THROWS_WITH(out.to_host(),
                        Catch::Contains("ldmatrix_mixed") &&
                            Catch::Contains("lane 0 waits in ldmatrix.sync m8n8.x4.b16") &&
                            Catch::Contains("but lane 16 waits in ldmatrix.sync "
                                            "m8n8.x4.trans.b16"));
  }
  SECTION("a row address that is not 16-byte aligned") {
    anvil::cuda::launch(k::ldmatrix_unaligned, 1, dim3(32), 0, nullptr, out.ptr);
    REQUIRE_THROWS_WITH(out.to_host(), Catch::Contains("test_ldmatrix.cpp") &&
                                           Catch::Contains("lane 5's row address") &&
                                           Catch::Contains("is not 16-byte aligned"));
  }
  SECTION("an ldmatrix outside a kernel") {
    alignas(16) uint16_t row[8] = {};
    uint32_t d[1];
    REQUIRE_THROWS_AS((anvil::cuda::tc::ldmatrix<1, false>(d, row)), std::logic_error);
  }
  // The simulator is usable again after each of these.
  const Scattered x = scattered(9);
  REQUIRE(matches_isa(2, true, x, run(2, true, x.src, x.slot)));
}

#endif  // ANVIL_CUDA_SIM
