// GEMM rung 09, TF32 tensor cores: the product on mma.sync.m16n8k8 with TF32
// operands (10 explicit mantissa bits, rounded to nearest, ties to even, by
// tc::cvt_tf32) and FP32 accumulation, with rung 08's split-K. Not
// FP32: each product carries a relative error up to about 2^-10 (tests/
// test_cuda_gemm_mma.cpp derives the bound), so the backend's default stays
// rung 08; this is what a TF32 setting will run. The core is mma_tile.cuh.
//
// Fragments (the PTX ISA's m16n8k8 .tf32, as kernels/cuda/mma.cuh documents
// them). With g = lane / 4 and t = lane % 4, a lane holds, of one 16 x 8 x 8
// mma: A (m x k) a0 (g, t), a1 (g+8, t), a2 (g, t+4), a3 (g+8, t+4); B
// (k x n) b0 (t, g), b1 (t+4, g); C and D c0 (g, 2t), c1 (g, 2t+1),
// c2 (g+8, 2t), c3 (g+8, 2t+1). So a fragment load has the 8 lanes of one t
// reading 8 consecutive rows of A (or columns of B) at the same k, and the
// 4 values of t at 4 different k.
//
// Tiling. A block of 256 threads computes a 128 x 128 tile of C: 2 x 4 warps
// of 64 x 32, each warp 4 x 4 mma tiles of 16 x 8, so 64 accumulators per
// lane. Per 8 of k a warp loads 4 A fragments (16 registers) and 4 B
// fragments (8), each used by 4 mma: 16 mma per 24 shared-memory loads.
//
// Shared memory. A stage holds BK = 8 of k of each operand (one mma deep),
// rounded to TF32 as it is stored (each element converted once, not once
// per warp that reads it) and kept as the 32-bit operand word, laid out
// as the operand lies in global memory so that staging is one 16-byte load
// and one 16-byte store per quad whatever the transpose:
//   - contiguous along j (op(B) = B, op(A) = A^T stored K x M): [k][j], rows
//     of 128 + 8 words. Lane (g, t) of a fragment load reads word
//     (k0 + t) * 136 + j0 + g: bank 8t + g + const mod 32, the 32 lanes in 32
//     banks (a row of 136 = 8 mod 32 puts the 4 rows t on 4 bank octets).
//   - contiguous along k (op(A) = A, op(B) = B^T stored N x K): [j][k], rows
//     of 8 + 4 words. Lane (g, t) reads word (j0 + g) * 12 + k0 + t: bank
//     12g + t + const; 12g mod 32 = 0, 12, 24, 4, 16, 28, 8, 20 are 8
//     different multiples of 4 and t adds 0-3: 32 banks again.
// So fragment loads are free of bank conflicts. The 16-byte stores of the
// [k][j] layout are too (consecutive threads, consecutive quads of a row);
// those of [j][k] have one two-way conflict per quarter warp (its 8 threads
// store rows j..j+3, two quads each, at words 0, 4, 12, 16, 24, 28, 36, 40:
// 4 and 36 share banks), a cost paid once per element staged, against the
// fragment loads' 4 (A) and 2 (B) reads of each.
// BK = 8 rather than 16: with 16 the prefetch registers (4 quads a thread)
// push sm_80's build of one transpose past __launch_bounds__'s 128
// registers into a spill; with 8 every instantiation stays at <= 119
// registers without local memory on sm_80 and sm_90 (ptxas -v).
//
// Pipeline: rung 07's double buffering. The global loads of step s+1 go out
// into registers before the 16 mma of step s and are rounded and stored
// into the other stage after them; one __syncthreads per step. Ragged edges
// are zeros in shared memory: every lane reaches every mma, as mma.sync
// requires. C is written as pairs C[m][n], C[m][n+1] (c0 c1, c2 c3): the 4
// lanes of a row cover 32 contiguous bytes.
//
// Split-K: rung 08's (split_k.h), with this tile's block count; partial
// tiles are FP32 and are added in a fixed order by 08's second pass. The
// kernel and its launcher are mma_rung.cuh's, shared with rung 10.
//   build/sim/bench_cuda_kernels gemm 9
#include "kernels/cuda/gemm/mma_rung.cuh"

namespace anvil::cuda {

using Tf32Rung = gemm_kernels::MmaRung<mma_tile::Wide<mma_tile::Tf32>>;

size_t gemm_rungs::tf32_mma_workspace_floats(int64_t M, int64_t N, int64_t K) {
  return Tf32Rung::workspace_floats(M, N, K);
}

void gemm_rungs::tf32_mma(const GemmArgs& g, cudaStream_t stream) {
  gemm_kernels::by_transpose<Tf32Rung::Run>(g, stream);
}

}  // namespace anvil::cuda
