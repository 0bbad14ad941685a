// The simulator's tensor core (see mma_sim.h): fragment mapping, the
// computation of one warp's D, ldmatrix's mapping and each lane's row read,
// and the test-only mutations. The
// collective's bookkeeping (every lane present, at one call site) is in
// warp_collectives.cpp, which copies the lanes' registers in and D out, so that
// this file only touches the scheduler's own copies.
#include "sim/mma_sim.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <utility>

#include "core/bfloat16.h"
#include "core/tf32.h"
#include "sim/cuda_sim.h"
#include "sim/sim_internal.h"

namespace anvil::sim::mma {
namespace {

// The register swap: -1 when off, else operand << 8 | i << 4 | j.
std::atomic<int> g_swap{-1};
std::once_flag g_swap_env_once;

int pack_swap(Operand operand, int i, int j) {
  if (i < 0 || j < 0 || i > 3 || j > 3 || (operand == Operand::kB && (i > 1 || j > 1)))
    throw std::invalid_argument("mma register swap: registers " + std::to_string(i) + " and " +
                                std::to_string(j) + " do not exist in that operand");
  return i == j ? -1 : static_cast<int>(operand) << 8 | i << 4 | j;
}

// ANVIL_SIM_MMA_SWAP="A:1:2" sets the swap at the first mma.
void read_swap_env() {
  const char* env = std::getenv("ANVIL_SIM_MMA_SWAP");
  if (env == nullptr || *env == '\0') return;
  const char* names = "ABCD";
  const char* at = std::strchr(names, env[0]);
  int i = -1, j = -1;
  if (at == nullptr || *at == '\0' || std::strlen(env) != 5 || env[1] != ':' || env[3] != ':' ||
      (i = env[2] - '0') < 0 || i > 3 || (j = env[4] - '0') < 0 || j > 3)
    throw std::invalid_argument(std::string("ANVIL_SIM_MMA_SWAP=") + env +
                                ": expected OPERAND:I:J, e.g. A:1:2");
  g_swap.store(pack_swap(static_cast<Operand>(at - names), i, j));
}

int current_swap() {
  std::call_once(g_swap_env_once, read_swap_env);
  return g_swap.load(std::memory_order_relaxed);
}

// Swaps registers i and j of `regs` if the swap names `operand`.
template <typename T>
void apply_swap(int swap, Operand operand, T* regs) {
  if (swap < 0 || (swap >> 8) != static_cast<int>(operand)) return;
  std::swap(regs[swap >> 4 & 15], regs[swap & 15]);
}

// The ldmatrix mutation: -1 off, -2 ignore .trans, else i << 4 | j.
std::atomic<int> g_ld_mutation{-1};
std::once_flag g_ld_env_once;

void read_ld_env() {
  const char* env = std::getenv("ANVIL_SIM_LDMATRIX_MUTATION");
  if (env == nullptr || *env == '\0') return;
  const std::string v = env;
  if (v == "notrans") {
    g_ld_mutation.store(-2);
    return;
  }
  if (v.size() == 8 && v.compare(0, 5, "swap:") == 0 && v[6] == ':' && v[5] >= '0' &&
      v[5] <= '3' && v[7] >= '0' && v[7] <= '3') {
    g_ld_mutation.store(v[5] == v[7] ? -1 : (v[5] - '0') << 4 | (v[7] - '0'));
    return;
  }
  throw std::invalid_argument("ANVIL_SIM_LDMATRIX_MUTATION=" + v +
                              ": expected swap:I:J (registers 0-3) or notrans");
}

int current_ld_mutation() {
  std::call_once(g_ld_env_once, read_ld_env);
  return g_ld_mutation.load(std::memory_order_relaxed);
}

}  // namespace

const char* shape_name(Shape shape) {
  return shape == Shape::kM16N8K8Tf32 ? "m16n8k8.tf32" : "m16n8k16.bf16";
}

int fragment_elements(Shape shape, Operand operand) {
  const bool bf16 = shape == Shape::kM16N8K16Bf16;
  switch (operand) {
    case Operand::kA: return bf16 ? 8 : 4;
    case Operand::kB: return bf16 ? 4 : 2;
    default: return 4;
  }
}

int matrix_rows(Shape shape, Operand operand) {
  const int k = shape == Shape::kM16N8K16Bf16 ? 16 : 8;
  return operand == Operand::kB ? k : 16;
}

int matrix_cols(Shape shape, Operand operand) {
  const int k = shape == Shape::kM16N8K16Bf16 ? 16 : 8;
  return operand == Operand::kA ? k : 8;
}

// With g = lane >> 2 (the lane's group of four) and t = lane & 3 (its place
// in the group), following the ISA's figures bit by bit (mma.cuh has the
// tables): the bits of e say which half of the rows or columns an element
// lies in.
Coord fragment_coord(Shape shape, Operand operand, int lane, int e) {
  const int g = lane >> 2, t = lane & 3;
  if (operand == Operand::kC || operand == Operand::kD)
    return {g | (e >> 1) << 3, t << 1 | (e & 1)};
  if (shape == Shape::kM16N8K8Tf32) {
    if (operand == Operand::kA) return {g | (e & 1) << 3, t | (e >> 1) << 2};
    return {t | e << 2, g};  // B
  }
  if (operand == Operand::kA) return {g | (e >> 1 & 1) << 3, (t << 1 | (e & 1)) | (e >> 2) << 3};
  return {(t << 1 | (e & 1)) | (e >> 1) << 3, g};  // B
}

void compute(Shape shape, const WarpRegisters& in, float (&d)[32][4]) {
  const int swap = current_swap();
  const bool bf16 = shape == Shape::kM16N8K16Bf16;
  const int kdim = bf16 ? 16 : 8;
  float a[16][16] = {}, b[16][8] = {}, c[16][8] = {};
  // Element e of a lane's fragment: a TF32 register read through the mask,
  // or one 16-bit half of a BF16 register.
  auto element = [bf16](const uint32_t* regs, int e) {
    if (!bf16) return tf32_operand(regs[e]);
    return bf16_bits_to_float(static_cast<uint16_t>(regs[e >> 1] >> (16 * (e & 1))));
  };
  for (int lane = 0; lane < 32; ++lane) {
    uint32_t ar[4], br[2];
    float cr[4];
    std::memcpy(ar, in.a[lane], sizeof ar);
    std::memcpy(br, in.b[lane], sizeof br);
    std::memcpy(cr, in.c[lane], sizeof cr);
    apply_swap(swap, Operand::kA, ar);
    apply_swap(swap, Operand::kB, br);
    apply_swap(swap, Operand::kC, cr);
    for (int e = 0; e < fragment_elements(shape, Operand::kA); ++e) {
      const Coord at = fragment_coord(shape, Operand::kA, lane, e);
      a[at.row][at.col] = element(ar, e);
    }
    for (int e = 0; e < fragment_elements(shape, Operand::kB); ++e) {
      const Coord at = fragment_coord(shape, Operand::kB, lane, e);
      b[at.row][at.col] = element(br, e);
    }
    for (int e = 0; e < 4; ++e) {
      const Coord at = fragment_coord(shape, Operand::kC, lane, e);
      c[at.row][at.col] = cr[e];
    }
  }
  float out[16][8];
  for (int i = 0; i < 16; ++i) {
    for (int j = 0; j < 8; ++j) {
      float acc = c[i][j];
      for (int k = 0; k < kdim; ++k) {
        const float p = a[i][k] * b[k][j];  // exact unless outside float32's normal range
        acc = acc + p;
      }
      out[i][j] = acc;
    }
  }
  for (int lane = 0; lane < 32; ++lane) {
    for (int e = 0; e < 4; ++e) {
      const Coord at = fragment_coord(shape, Operand::kD, lane, e);
      d[lane][e] = out[at.row][at.col];
    }
    apply_swap(swap, Operand::kD, d[lane]);
  }
}

void mma_sync(Shape shape, const uint32_t* a, const uint32_t* b, const float* c, float* d,
              std::source_location where) {
  LaneOperands ops{shape, a, b, c, d, where};
  warp_collective(WarpOp::kMma, 0xffffffffu, reinterpret_cast<uintptr_t>(&ops),
                  static_cast<int>(shape), 32);
}

std::string ldmatrix_name(int count, bool trans) {
  return "m8n8.x" + std::to_string(count) + (trans ? ".trans" : "") + ".b16";
}

// Lane l holds, of each matrix, two consecutive elements of row l / 4 (at
// columns 2 (l % 4) + half); with .trans, of column l / 4.
LdmatrixCoord ldmatrix_coord(bool trans, int lane, int reg, int half) {
  const int r = lane >> 2, c = (lane & 3) << 1 | half;
  return trans ? LdmatrixCoord{reg, c, r} : LdmatrixCoord{reg, r, c};
}

void ldmatrix_compute(int count, bool trans, const uint16_t (&rows)[32][8], uint32_t (&d)[32][4]) {
  const int mutation = current_ld_mutation();
  if (mutation == -2) trans = false;
  for (int lane = 0; lane < 32; ++lane) {
    for (int reg = 0; reg < 4; ++reg) {
      d[lane][reg] = 0;
      if (reg >= count) continue;
      for (int half = 0; half < 2; ++half) {
        const LdmatrixCoord at = ldmatrix_coord(trans, lane, reg, half);
        d[lane][reg] |= uint32_t(rows[8 * at.matrix + at.row][at.col]) << (16 * half);
      }
    }
    if (mutation >= 0 && (mutation >> 4) < count && (mutation & 15) < count)
      std::swap(d[lane][mutation >> 4], d[lane][mutation & 15]);
  }
}

void ldmatrix_sync(int count, bool trans, const void* row, uint32_t* d,
                   std::source_location where) {
  if (count != 1 && count != 2 && count != 4)
    throw std::invalid_argument("ldmatrix: " + std::to_string(count) + " matrices (1, 2 or 4)");
  LdmatrixLane ops;
  ops.count = count;
  ops.trans = trans;
  ops.d = d;
  ops.where = where;
  const int lane = detail::current_lane();  // -1 outside a kernel: warp_collective throws
  if (lane >= 0) {
    if (lane < 8 * count) {  // a lane that gives a row address
      if (reinterpret_cast<uintptr_t>(row) % 16 != 0) {
        char text[32];
        std::snprintf(text, sizeof text, "%p", row);
        throw std::invalid_argument("ldmatrix.sync.aligned." + ldmatrix_name(count, trans) +
                                    ": lane " + std::to_string(lane) + "'s row address " + text +
                                    " is not 16-byte aligned");
      }
      std::memcpy(ops.row, row, sizeof ops.row);
    }
  }
  warp_collective(WarpOp::kLdmatrix, 0xffffffffu, reinterpret_cast<uintptr_t>(&ops),
                  count | (trans ? 8 : 0), 32);
}

void set_ldmatrix_swap(int i, int j) {
  if (i < 0 || j < 0 || i > 3 || j > 3)
    throw std::invalid_argument("ldmatrix register swap: registers " + std::to_string(i) +
                                " and " + std::to_string(j) + " do not exist");
  std::call_once(g_ld_env_once, [] {});  // a test's setting wins over the environment
  g_ld_mutation.store(i == j ? -1 : i << 4 | j);
}

void set_ldmatrix_drop_trans() {
  std::call_once(g_ld_env_once, [] {});
  g_ld_mutation.store(-2);
}

void clear_ldmatrix_mutation() {
  std::call_once(g_ld_env_once, [] {});
  g_ld_mutation.store(-1);
}

std::string ldmatrix_mutation() {
  const int m = current_ld_mutation();
  if (m == -1) return "";
  if (m == -2) return "notrans";
  return "swap:" + std::to_string(m >> 4) + ":" + std::to_string(m & 15);
}

void set_register_swap(Operand operand, int i, int j) {
  std::call_once(g_swap_env_once, [] {});  // a test's setting wins over the environment
  g_swap.store(pack_swap(operand, i, j));
}

void clear_register_swap() {
  std::call_once(g_swap_env_once, [] {});
  g_swap.store(-1);
}

std::string register_swap() {
  const int swap = current_swap();
  if (swap < 0) return "";
  return std::string(1, "ABCD"[swap >> 8]) + ":" + std::to_string(swap >> 4 & 15) + ":" +
         std::to_string(swap & 15);
}

}  // namespace anvil::sim::mma
