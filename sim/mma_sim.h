// The simulator's tensor core: mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32
// and mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 as warp
// collectives, and ldmatrix.sync.aligned.m8n8.x{1,2,4}{.trans}.shared.b16
// that feeds them (kernels/cuda/mma.cuh calls them; the fragment layouts are
// documented there, from the PTX ISA).
//
// One mma is a collective of the whole warp, like a shuffle with a full
// mask: every one of the 32 lanes must reach it, at the same call site, with
// the same shape. The scheduler (warp_collectives.cpp) then reads every lane's A, B
// and C registers, computes D and writes each lane's D registers before any
// lane runs on. Anything else (a lane that has returned, waits elsewhere or
// does not exist because the block ends inside the warp, or lanes at
// different mma call sites or shapes) fails the launch with an error naming
// the kernel, its launch and the lane.
//
// Numerics: the tensor core reads only the top 19 bits of a TF32 operand
// (an unconverted float is truncated), a BF16 operand exactly. Products are
// exact in float32 (11x11 and 8x8 significand bits); D[i][j] is
// (((C[i][j] + p_0) + p_1) + ... + p_{K-1}) with p_k = A[i][k] * B[k][j],
// each addition in float32 with round-to-nearest-even. That order and
// rounding are a documented choice: the hardware's are not specified (it is
// reported to truncate and to add several products at once), so tests
// against it use bounds that cover both. Subnormals are kept (not flushed).
#pragma once
#include <cstdint>
#include <source_location>
#include <string>

namespace anvil::sim::mma {

enum class Shape : int { kM16N8K8Tf32 = 1, kM16N8K16Bf16 = 2 };

// "m16n8k8.tf32" or "m16n8k16.bf16", for messages.
const char* shape_name(Shape shape);

// What one lane hands to the collective: its registers and where the call
// is. d may be the same array as c.
struct LaneOperands {
  Shape shape = Shape::kM16N8K8Tf32;
  const uint32_t* a = nullptr;  // 4 registers
  const uint32_t* b = nullptr;  // 2 registers
  const float* c = nullptr;     // 4 registers
  float* d = nullptr;           // 4 registers
  std::source_location where;
};

// The collective itself (kernels call it through mma.cuh). Throws
// std::logic_error outside a kernel.
void mma_sync(Shape shape, const uint32_t* a, const uint32_t* b, const float* c, float* d,
              std::source_location where);

// ---- the emulation's fragment mapping, exposed for the layout tests ----
// An element of a fragment is (lane, e): for TF32 e is the register (A 0..3,
// B 0..1); for BF16, e = 2 * register + half, half 0 being the low 16 bits
// (A 0..7, B 0..3); for C/D (float32 of both shapes) e is the register
// (0..3). A's coordinate is (row m, col k), B's (row k, col n), C's and D's
// (row m, col n).
struct Coord {
  int row = 0;
  int col = 0;
};
enum class Operand : int { kA = 0, kB = 1, kC = 2, kD = 3 };
int fragment_elements(Shape shape, Operand operand);  // per lane
int matrix_rows(Shape shape, Operand operand);
int matrix_cols(Shape shape, Operand operand);
Coord fragment_coord(Shape shape, Operand operand, int lane, int element);

// ---- the computation, on the registers of a whole warp ----
struct WarpRegisters {
  uint32_t a[32][4];
  uint32_t b[32][2];
  float c[32][4];
};
// D's registers for every lane, from the warp's A, B and C registers
// (applying the mutation below, if one is set).
void compute(Shape shape, const WarpRegisters& in, float (&d)[32][4]);

// ---- ldmatrix.sync.aligned.m8n8.xN{.trans}.shared.b16 ----
// A warp collective like mma_sync, with the same rules (all 32 lanes, one
// call site, one variant: N and .trans; else the launch fails naming the
// kernel and the lane). Each lane that supplies a row address (lanes 0 to
// 8N - 1) checks it is 16-byte aligned (else std::invalid_argument naming
// the lane fails the launch) and reads its 16 bytes as it arrives, in its
// own fiber (so the sanitizers see the lane's read); the scheduler then
// hands every lane its registers before any lane runs on. Reading at
// arrival rather than when the last lane arrives differs only for a kernel
// that writes a row another lane of the warp reads without a __syncwarp,
// which CUDA leaves undefined. Whether the address is shared memory is not
// checked (static __shared__ arrays are ordinary thread_local storage here).
struct LdmatrixLane {
  int count = 1;       // N: 1, 2 or 4 matrices
  bool trans = false;
  uint16_t row[8] = {};  // the 16 bytes at this lane's row address (if it gives one)
  uint32_t* d = nullptr;  // N registers
  std::source_location where;
};
void ldmatrix_sync(int count, bool trans, const void* row, uint32_t* d,
                   std::source_location where);
// "m8n8.x4.trans.b16" and the like, for messages.
std::string ldmatrix_name(int count, bool trans);

// The emulation's mapping: half `half` (0: the low 16 bits) of register
// `reg` of lane `lane` is element (row, col) of matrix reg, row being the
// row whose address lane 8 * reg + row gave and col the element of its 16
// bytes (0..7). Exposed for the layout tests.
struct LdmatrixCoord {
  int matrix = 0, row = 0, col = 0;
};
LdmatrixCoord ldmatrix_coord(bool trans, int lane, int reg, int half);
// Every lane's registers from the rows the lanes gave (rows[8 * i + r] is
// row r of matrix i), applying the ldmatrix mutation below if one is set.
void ldmatrix_compute(int count, bool trans, const uint16_t (&rows)[32][8], uint32_t (&d)[32][4]);

// ---- mutation hooks, for tests only ----
// ldmatrix: swap registers i and j of every lane's result (i, j < N; a swap
// naming a register the variant lacks does nothing), or ignore .trans.
// ANVIL_SIM_LDMATRIX_MUTATION="swap:0:1" or "notrans" sets it at the first
// ldmatrix. Global: set it while no kernel runs.
void set_ldmatrix_swap(int i, int j);
void set_ldmatrix_drop_trans();
void clear_ldmatrix_mutation();
// "" when off, else e.g. "swap:0:1" or "notrans".
std::string ldmatrix_mutation();

// mma:
// Makes the emulation swap two registers of one operand in every lane, as
// a misread layout would: registers i and j of A, B or C are exchanged as
// they are read, or of D as it is written. Later layout and kernel tests
// turn it on to show that they notice. ANVIL_SIM_MMA_SWAP="A:1:2" (operand
// A, B, C or D, then two registers) sets it at the first mma. A swap of
// i == j, or no call, is off. Global: set it while no kernel runs.
void set_register_swap(Operand operand, int i, int j);
void clear_register_swap();
// "" when off, else e.g. "A:1:2".
std::string register_swap();

}  // namespace anvil::sim::mma
