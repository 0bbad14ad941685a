// GEMM rung 10, BF16 tensor cores: rung 09 with bf16 operands (8
// significant bits) multiplied by mma.sync.m16n8k16 (FP32 accumulation). It
// reads its operands from global memory in either of two types, one kernel
// instantiation each (mma_tile.cuh's Bf16 stager):
//   - bfloat16 (gemm()'s bfloat16 overload; the backend's choice for
//     bfloat16 tensors, as autocast makes): 2 bytes an element, half of
//     float32's traffic, and staged as stored: a thread's quad of 4
//     elements is one 8-byte load, and its bits go to shared memory without
//     arithmetic;
//   - float32: rounded to nearest even (cvt.rn.bf16x2.f32) as they are
//     staged, 16 bytes a quad: the same words in shared memory as the
//     bfloat16 of the same values, so the two give bitwise the same C.
// C is float32, or bfloat16 (autocast's outputs; gemm_mma's overload on the
// store, so the audits see one kernel): the epilogue computes alpha * acc +
// bias + beta * C in FP32 for either (rung.cuh's epilogue) and stores a
// bfloat16 C rounded once to nearest even, a pair of columns per 4-byte
// store where C allows. A split's partials stay float32: its second pass
// (add_partials) adds the bias and rounds. The bias is a float per column
// of C (a linear layer's). Each product carries a relative error up to
// about 2^-7 against the unrounded float32 operands
// (tests/test_cuda_gemm_mma.cpp derives the bound).
//
// Fragments (the PTX ISA's m16n8k16 .bf16, as kernels/cuda/mma.cuh documents
// them): two elements per 32-bit register along k, the smaller k in the low
// half. With g = lane / 4 and t = lane % 4: A a[0] (g, 2t..2t+1),
// a[1] (g+8, 2t..2t+1), a[2] (g, 2t+8..2t+9), a[3] (g+8, 2t+8..2t+9);
// B b[0] (k = 2t..2t+1, n = g), b[1] (k = 2t+8..2t+9, n = g). Counting k in
// pairs p (k = 2p, 2p+1), that is TF32's layout with p for k: a0 (g, p = t),
// a1 (g+8, t), a2 (g, t+4), a3 (g+8, t+4), b0 (p = t, g), b1 (t+4, g).
//
// So the shared-memory stage holds 16 of k as 8 rows of words, each word a
// packed pair, in rung 09's two layouts ([p][j], rows of BJ + 8 words, for
// an operand contiguous along j; [j][p], rows of 8 + 4 words, otherwise),
// and the fragment loads are rung 09's, with the same bank analysis (a lane
// reads word p * (BJ + 8) + j or j * 12 + p: 8t + g or 12g + t, 32 banks).
// Staging differs: a thread packs pairs along k before its store. For an
// operand contiguous along j it fetches the quads (j..j+3, k) and
// (j..j+3, k+1) and stores their 4 packed words (element i of each quad in
// word i: a rounding of two floats, or two bfloat16 halves put side by
// side) with one 16-byte store; for one contiguous along k it fetches
// (j, k..k+3) and stores 2 words with one 8-byte store, which for a
// bfloat16 quad are its 8 bytes as loaded (a half warp, rows j..j+3, covers
// words 0-7, 12-19, 24-31 and 36-43: banks 4-7 twice, a two-way conflict
// paid once per element staged). A bfloat16 quad's 8-byte load needs the
// operand 8-byte aligned with ld a multiple of 4 (tile::strided), else its
// elements are read one by one, as a float quad's at ragged edges; either
// way a warp's loads cover runs of consecutive elements of a stored row.
//
// Tiling, pipeline, ragged edges, C's stores and split-K: rung 09's
// (mma_tile.cuh, mma_rung.cuh): 128 x 128 blocks of 2 x 4 warps, 64 x 32
// per warp, two stages one mma deep (16 mma per warp per stage, half as
// many stages as rung 09 for the same K).
//   build/sim/bench_cuda_kernels gemm 10
#include "kernels/cuda/gemm/mma_rung.cuh"

namespace anvil::cuda {

using Bf16Rung = gemm_kernels::MmaRung<mma_tile::Wide<mma_tile::Bf16>>;

size_t gemm_rungs::bf16_mma_workspace_floats(int64_t M, int64_t N, int64_t K) {
  return Bf16Rung::workspace_floats(M, N, K);
}

void gemm_rungs::bf16_mma(const GemmArgs& g, cudaStream_t stream) {
  gemm_kernels::by_transpose<Bf16Rung::Run>(g, stream);
}

void gemm_rungs::bf16_mma_of_bf16(const Bf16GemmArgs& g, cudaStream_t stream) {
  gemm_kernels::by_transpose<Bf16Rung::Run>(g, stream);
}

void gemm_rungs::bf16_mma_to_bf16(const Bf16OutGemmArgs& g, cudaStream_t stream) {
  gemm_kernels::by_transpose<Bf16Rung::Run>(g, stream);
}

}  // namespace anvil::cuda
