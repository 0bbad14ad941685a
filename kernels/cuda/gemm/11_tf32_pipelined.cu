// GEMM rung 11, TF32 tensor cores fed by a cp.async pipeline: rung 09's
// numerics (operands rounded by cvt.rna.tf32.f32, mma.sync.m16n8k8, FP32
// accumulation, so its error bounds hold) and its split-K, with fewer
// instructions around each mma. The tile is mma_pipeline.cuh's.
//
// Threads. A block of 128 threads (4 warps, 2 x 2) computes a 128 x 128
// tile of C; each warp 64 x 64 of it, 4 x 8 mma tiles of 16 x 8 (128
// accumulators a lane). Per 8 of k a warp loads 8 B fragments and 4 A
// fragments with 16 eight-byte shared loads, for 32 mma (rung 09: 24
// four-byte loads for 16).
//
// Fragments, as in 09 (kernels/cuda/mma.cuh has the PTX ISA's tables): with
// g = lane / 4, t = lane % 4, a lane holds a0 (g, t), a1 (g+8, t), a2
// (g, t+4), a3 (g+8, t+4) of A and b0 (k = t, n = g), b1 (k = t+4, g) of B.
// So A's registers come in pairs of rows (m, m+8) and B's in pairs along k
// (t, t+4), and shared memory stores each pair as two adjacent words: one
// 8-byte load per pair, landing in the two consecutive registers the mma
// takes.
//
// Shared memory. A stage holds 8 of k of each operand as 32-bit words. A
// thread owns one unit of 8 words (4 pairs) per operand and stage: it
// copies two quads of the stored matrix there, x at (j, k) and y at its
// partner (A: (j + 8, k); B: (j, k + 4)), each 4 elements along the
// contiguous index, and once they have landed rounds them in place,
// interleaved as x0 y0 x1 y1 x2 y2 x3 y3. Pair rows: for A, rows m and
// m + 8 of each 16 (64 pair rows); for B, each column n (128). The layout
// follows the operand's storage:
//   contiguous along j (op(A) = A^T, op(B) = B):
//     A: 8 rows k of 128 + 8 words, pair (m, k) at 2 * pair row;
//     B: 4 rows k % 4 of 256 + 8 words, pair (n, k) at 2n.
//   contiguous along k (op(A) = A, op(B) = B^T):
//     A: 64 pair rows of 16 words, pair (m, k) at 2 (k ^ 4) in pair rows
//        2 and 3 of every 4, at 2k in the others (the swizzle below);
//     B: 128 rows of 8 words, pair (n, k) at 2k.
// Bank conflicts. An 8-byte load is served per half warp (16 lanes, 128
// bytes): lanes 0-15 are g = 0..3 and t = 0..3, and must hit 16 different
// bank pairs. Along j, lane (g, t) reads word 136t + 2g (A) or 264t + 2g
// (B) past a multiple of 32: 136 and 264 are 8 mod 32, so 8t + 2g runs over
// 0..30 step 2. Along k, B: 8g + 2t, again 0..30. Along k, A: 16g + 2t in
// pair rows of 16 words would put g = 0 and 2 on the same banks; swapping
// the halves of k in pair rows 2 and 3 adds 8 words to those, so the four
// g cover banks 0-7, 16-23, 8-15, 24-31. Fragment loads are conflict-free.
// (The rounding pass's 16-byte loads and stores, units 8 words apart, are
// 2-way conflicted: once per element staged, against the 4 (A) or 2 (B)
// warps that read it.)
//
// Pipeline: 4 stages. Stage s is copied into buffer s % 4 by cp.async: 16
// bytes a copy from operands whose base and row stride are 16-byte
// aligned, with src-size short of 16 at the ragged edges and 0 outside (the
// edges become zeros); 4 bytes a copy otherwise (one branch for the whole
// launch, so the fast loop holds no fallback code). One commit group per
// stage, empty past the end, so each step finds the same count. Step s:
//   wait_group 2        this thread's copies of stage s have landed (the
//                       groups of s+1 and s+2 may still be in flight)
//   round own units     in place, in buffer s % 4
//   __syncthreads       publishes stage s (every thread's copies and
//                       roundings); every warp is past its mma of stage
//                       s - 1
//   copy stage s + 3    into buffer (s + 3) % 4 = (s - 1) % 4, just freed
//   32 mma per warp     on buffer s % 4
// One barrier per step, three stages (24 of k) of copies in flight behind
// the mma. Shared memory: at most 4 x (1088 + 1056) words, 34 KB.
//
// Split-K and the kernel: mma_rung.cuh's, as 09's.
//   build/sim/bench_cuda_kernels gemm 11
#include "kernels/cuda/gemm/mma_pipeline.cuh"
#include "kernels/cuda/gemm/mma_rung.cuh"

namespace anvil::cuda {

using PipelinedRung = gemm_kernels::MmaRung<mma_pipeline::Tf32>;

size_t gemm_rungs::tf32_pipelined_workspace_floats(int64_t M, int64_t N, int64_t K) {
  return PipelinedRung::workspace_floats(M, N, K);
}

void gemm_rungs::tf32_pipelined(const GemmArgs& g, cudaStream_t stream) {
  gemm_kernels::by_transpose<PipelinedRung::Run>(g, stream);
}

}  // namespace anvil::cuda
