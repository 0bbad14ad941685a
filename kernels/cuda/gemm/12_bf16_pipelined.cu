// GEMM rung 12, BF16 tensor cores fed by cp.async and ldmatrix: rung 10's
// numerics (bf16 operands, mma.sync.m16n8k16, FP32 accumulation, so its
// error bounds hold; C float32 or bfloat16, a bias, alpha and beta, split-K
// as 08) with rung 11's kind of pipeline, and the fragments loaded from
// shared memory by ldmatrix instead of one word at a time. The tile is
// mma_ldmatrix.cuh's. It reads bfloat16 operands only: gemm()'s float32
// overload on this rung runs rung 10 (which rounds float32 as it stages it).
//
// Threads. A block of 128 threads (4 warps, 2 x 2) computes a 128 x 128
// tile of C; each warp 64 x 64 of it, 4 x 8 mma tiles of 16 x 8 (128
// accumulators a lane). Per 16 of k a warp issues 8 ldmatrix.x4 (4 for the
// A fragments of its 4 row tiles, 4 for the B fragments of its 8 column
// tiles, two at a time) for 32 mma: rung 11 needed 16 eight-byte loads for
// 32 mma of half the k.
//
// Fragments via ldmatrix (kernels/cuda/mma.cuh has the PTX ISA's tables).
// ldmatrix.x4 loads four 8 x 8 matrices of 16-bit elements, lane 8i + r
// giving the address of row r of matrix i (16 contiguous bytes), and hands
// lane (g = lane / 4, t = lane % 4) elements (g, 2t) and (g, 2t + 1) of
// each matrix in one register, or with .trans those of the transpose. The
// m16n8k16 .bf16 fragments are made of exactly such pieces: A's a[0..3] are
// its 8 x 8 quarters (rows 0-7 / 8-15 by k 0-7 / 8-15, rows first) and B's
// b[0], b[1] its halves along k, with (g, 2t..2t+1) read as (n = g,
// k = 2t..2t+1). So an operand stored contiguous along k (op(A) = A,
// op(B) = B^T) has 8 contiguous k of one row j in each 16-byte row of a
// matrix and is read without .trans; one stored contiguous along j
// (op(A) = A^T, op(B) = B) has 8 contiguous j of one k there and is read
// with .trans, which turns its rows k into the fragment's columns.
//
// Shared memory. A stage holds 32 of k of each operand as stored, in
// 16-byte chunks of 8 elements along the contiguous index:
//   contiguous along k: 128 rows j of 64 bytes (4 chunks); chunk c of row j
//     at position c ^ (j / 2 % 4);
//   contiguous along j: 32 rows k of 256 bytes (16 chunks); chunk c of row
//     k at position c ^ (k % 8).
// Bank conflicts. Shared memory serves 128 bytes (32 banks of 4 bytes, 8
// chunk positions) per phase: an ldmatrix phase is one matrix, 8 rows
// r0..r0 + 7 (r0 a multiple of 8) at the same logical chunk c; a 16-byte
// cp.async store phase is 8 lanes of consecutive units. Along k, two rows
// share 128 bytes: row r's chunk lands at position 4 (r % 2) + (c ^ (r / 2
// % 4)), and over r0..r0 + 7 (or a store phase's 2 rows x 4 chunks) those
// are the 8 positions. Along j a row is 256 bytes (0 mod 128): row k's
// chunk c lands at (c ^ (k % 8)) % 8, the 8 positions over 8 rows k, and
// over a store phase's 8 consecutive chunks of one row. Every ldmatrix and
// every cp.async store is conflict-free.
//
// Pipeline: 4 stages (4 x 16 KB = 64 KB of dynamic shared memory, past the
// 48 KB a kernel gets without opting in; mma_rung.cuh's launcher opts in
// once per kernel and device). Stage s is copied into buffer s % 4 by
// cp.async.cg, 16 bytes a copy (4 per thread and operand, a warp reading
// runs of 64 or 256 contiguous bytes), with src-size short of 16 at ragged
// edges and 0 outside them (zeros: the products past M, N, K are 0). An
// operand whose base or row stride is not a multiple of 16 bytes (8
// elements) is copied by the launcher into the workspace first, its rows
// rounded up to whole 16-byte chunks (aligned_copy.h, and rung 11's header
// for why a copy rather than a second main loop): the kernel has one main
// loop, all 16-byte copies, and gives rung 10's bits on every operand (the
// same products summed in the same order).
// One commit group per stage, empty past the end. Step s:
//   wait_group 2        this thread's copies of stage s have landed (those
//                       of s + 1 and s + 2 may still be in flight)
//   __syncthreads       publishes stage s; every warp is past its mma of
//                       stage s - 1
//   copy stage s + 3    into buffer (s + 3) % 4 = (s - 1) % 4, just freed
//   2 x (8 ldmatrix.x4, 32 mma) per warp on buffer s % 4
// One barrier per step, three stages (96 of k) of copies in flight behind
// the mma. Unlike rung 11 there is no pass over shared memory between the copy
// and the fragment loads: bfloat16 is the mma's operand format as stored.
//
// Split-K and the kernel: mma_rung.cuh's, as 09-11's. The backend's BF16
// GEMM (kBf16Gemm) on bfloat16 operands.
//   build/sim/bench_cuda_kernels gemm 12
#include "kernels/cuda/gemm/aligned_copy.h"
#include "kernels/cuda/gemm/mma_ldmatrix.cuh"
#include "kernels/cuda/gemm/mma_rung.cuh"

namespace anvil::cuda {

using LdmatrixRung = gemm_kernels::MmaRung<mma_ldmatrix::Bf16>;

size_t gemm_rungs::bf16_pipelined_workspace_floats(int64_t M, int64_t N, int64_t K) {
  return LdmatrixRung::workspace_floats(M, N, K);
}

void gemm_rungs::bf16_pipelined(const GemmArgs& g, cudaStream_t stream) {
  // float32 operands: rung 10, which rounds them as it stages them; its
  // split plan is the same (same block tile, same kMinBlocks), so is the
  // workspace.
  static_assert(mma_ldmatrix::Bf16::kBM == mma_tile::Wide<mma_tile::Bf16>::kBM &&
                mma_ldmatrix::Bf16::kBN == mma_tile::Wide<mma_tile::Bf16>::kBN &&
                mma_ldmatrix::Bf16::kMinBlocks == mma_tile::Wide<mma_tile::Bf16>::kMinBlocks);
  bf16_mma(g, stream);
}

// Operands whose 16-byte chunks are not all aligned are copied to aligned
// ones past the split's partials first (aligned_copy.h).
template <class TC>
static void run_of_bf16(const GemmArgsOf<bfloat16, TC>& g, cudaStream_t stream) {
  const size_t partials = LdmatrixRung::workspace_floats(g.M, g.N, g.K);
  gemm_kernels::by_transpose<LdmatrixRung::Run>(aligned_copy::operands(g, partials, stream),
                                                stream);
}

void gemm_rungs::bf16_pipelined_of_bf16(const Bf16GemmArgs& g, cudaStream_t stream) {
  run_of_bf16(g, stream);
}

void gemm_rungs::bf16_pipelined_to_bf16(const Bf16OutGemmArgs& g, cudaStream_t stream) {
  run_of_bf16(g, stream);
}

}  // namespace anvil::cuda
