// The staged epilogue's shared-memory layout (kernels/cuda/gemm/
// staged_epilogue.cuh), in the simulator build: every element of a pass's
// tile has its own word, the 16-byte chunks the loop reads are contiguous
// and aligned, and no store of the fragments and no load of a chunk has a
// bank conflict. The lanes' elements come from the PTX ISA's accumulator
// layout of mma.m16n8 (lane (g, t) = (lane / 4, lane % 4) holds c0, c1 at
// row g, columns 2t, 2t + 1 and c2, c3 at row g + 8), written out here; the
// bank model is the one the kernel headers argue with: 32 banks of 4 bytes,
// a 4-byte access served a warp at a time, an 8-byte one 16 lanes at a time,
// a 16-byte one 8 lanes at a time, and lanes that touch the same word share
// it.
#if defined(ANVIL_CUDA_SIM)
#include <catch2/catch.hpp>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include "kernels/cuda/gemm/staged_epilogue.cuh"

namespace {

namespace ep = anvil::cuda::epilogue;
using ep::Order;

// An access of one warp instruction: each lane's float offset (or -1:
// the lane does not take part) and the width in floats.
struct Access {
  explicit Access(int width = 1) : floats(width) {}
  std::vector<int> offset = std::vector<int>(32, -1);
  int floats;
};

// The most distinct words any bank serves in one phase of the access: 1 is
// conflict-free.
int conflict_degree(const Access& a) {
  const int lanes_per_phase = 32 / a.floats;
  int worst = 0;
  for (int phase = 0; phase < 32; phase += lanes_per_phase) {
    std::map<int, std::set<int>> words_of_bank;
    for (int lane = phase; lane < phase + lanes_per_phase; ++lane) {
      if (a.offset[lane] < 0) continue;
      for (int w = 0; w < a.floats; ++w) {
        const int word = a.offset[lane] + w;
        words_of_bank[word % 32].insert(word);
      }
    }
    for (const auto& [bank, words] : words_of_bank) worst = std::max(worst, int(words.size()));
  }
  return worst;
}

template <Order O, bool Perm, int R, int W>
void check_layout() {
  INFO("order " << (O == Order::kRows ? "rows" : "columns") << ", permuted rows " << Perm
                << ", " << R << " x " << W);
  // One word per element, inside the tile.
  std::set<int> seen;
  for (int m = 0; m < R; ++m)
    for (int n = 0; n < W; ++n) {
      const int at = ep::at<O, Perm, R, W>(m, n);
      REQUIRE(at >= 0);
      REQUIRE(at < R * W);
      seen.insert(at);
    }
  CHECK(int(seen.size()) == R * W);

  // The chunks the loop reads: 4 consecutive elements along n (kRows) or
  // m (kColumns), contiguous and 16-byte aligned.
  for (int m = 0; m < R; m += (O == Order::kColumns ? 4 : 1))
    for (int n = 0; n < W; n += (O == Order::kRows ? 4 : 1)) {
      const int first = ep::at<O, Perm, R, W>(m, n);
      CHECK(first % 4 == 0);
      for (int e = 1; e < 4; ++e)
        CHECK(ep::at<O, Perm, R, W>(O == Order::kRows ? m : m + e, O == Order::kRows ? n + e : n) ==
              first + e);
    }

  // The stores of the fragments: per 16-row tile ii and 8-column tile j,
  // the instructions the epilogue issues.
  int worst_store = 0;
  for (int ii = 0; ii < R / 16; ++ii)
    for (int j = 0; j < W / 8; ++j) {
      std::vector<Access> stores;
      if (O == Order::kRows || Perm) stores.assign(2, Access(2));
      else stores.assign(4, Access(1));
      for (int lane = 0; lane < 32; ++lane) {
        const int g = lane / 4, t = lane % 4, n = 8 * j + 2 * t;
        const int m0 = 16 * ii + (Perm ? 2 * g : g), m1 = Perm ? m0 + 1 : m0 + 8;
        if (O == Order::kRows) {  // (c0, c1) at row m0, (c2, c3) at row m1
          stores[0].offset[lane] = ep::at<O, Perm, R, W>(m0, n);
          stores[1].offset[lane] = ep::at<O, Perm, R, W>(m1, n);
        } else if (Perm) {  // (c0, c2) down column n, (c1, c3) down n + 1
          stores[0].offset[lane] = ep::at<O, Perm, R, W>(m0, n);
          stores[1].offset[lane] = ep::at<O, Perm, R, W>(m0, n + 1);
        } else {
          stores[0].offset[lane] = ep::at<O, Perm, R, W>(m0, n);
          stores[1].offset[lane] = ep::at<O, Perm, R, W>(m0, n + 1);
          stores[2].offset[lane] = ep::at<O, Perm, R, W>(m1, n);
          stores[3].offset[lane] = ep::at<O, Perm, R, W>(m1, n + 1);
        }
        if (stores.size() == 2 && O == Order::kColumns) {
          // a pair along m: rows m0, m0 + 1 of one column are adjacent words
          CHECK(ep::at<O, Perm, R, W>(m0 + 1, n) == ep::at<O, Perm, R, W>(m0, n) + 1);
        } else if (stores.size() == 2) {
          CHECK(ep::at<O, Perm, R, W>(m0, n + 1) == ep::at<O, Perm, R, W>(m0, n) + 1);
        }
      }
      for (const Access& a : stores) worst_store = std::max(worst_store, conflict_degree(a));
    }
  CHECK(worst_store == 1);

  // The loads of the loop: lane l's chunk at each step.
  int worst_load = 0;
  if (O == Order::kRows) {
    const int chunks = W / 4, rows_per_step = 32 / chunks;
    for (int r0 = 0; r0 < R; r0 += rows_per_step) {
      Access a(4);
      for (int lane = 0; lane < 32; ++lane)
        a.offset[lane] = ep::at<O, Perm, R, W>(r0 + lane / chunks, 4 * (lane % chunks));
      worst_load = std::max(worst_load, conflict_degree(a));
    }
  } else {
    const int lanes_per_column = R / 4, columns_per_step = 32 / lanes_per_column;
    for (int c0 = 0; c0 < W; c0 += columns_per_step) {
      Access a(4);
      for (int lane = 0; lane < 32; ++lane)
        a.offset[lane] =
            ep::at<O, Perm, R, W>(4 * (lane % lanes_per_column), c0 + lane / lanes_per_column);
      worst_load = std::max(worst_load, conflict_degree(a));
    }
  }
  CHECK(worst_load == 1);
}

}  // namespace

TEST_CASE("staged epilogue: one word per element, aligned chunks, and no bank conflicts in "
          "its stores and loads",
          "[cuda][gemm]") {
  SECTION("the model: a broadcast is free, two words of a bank are a conflict") {
    Access a;
    for (int lane = 0; lane < 32; ++lane) a.offset[lane] = 0;
    CHECK(conflict_degree(a) == 1);
    for (int lane = 0; lane < 32; ++lane) a.offset[lane] = 32 * (lane % 2);
    CHECK(conflict_degree(a) == 2);
    Access pairs(2);  // 16 lanes of 8 bytes a phase: 64 floats apart collide
    for (int lane = 0; lane < 32; ++lane) pairs.offset[lane] = 2 * (lane % 16) + 64 * (lane / 16);
    CHECK(conflict_degree(pairs) == 1);
    for (int lane = 0; lane < 32; ++lane) pairs.offset[lane] = 2 * (lane % 8) + 64 * (lane / 8);
    CHECK(conflict_degree(pairs) == 2);
  }
  SECTION("rows") {
    check_layout<Order::kRows, false, 64, 64>();
    check_layout<Order::kRows, false, 32, 64>();
    check_layout<Order::kRows, true, 64, 64>();
    check_layout<Order::kRows, true, 32, 64>();
    check_layout<Order::kRows, false, 16, 32>();  // mma_tile.cuh's warps of 64 x 32
  }
  SECTION("columns") {
    check_layout<Order::kColumns, false, 64, 64>();
    check_layout<Order::kColumns, false, 32, 64>();
    check_layout<Order::kColumns, true, 64, 64>();
    check_layout<Order::kColumns, true, 32, 64>();
  }
}
#endif
