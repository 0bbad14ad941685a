// Convolution rung 07, BF16 tensor cores: rung 06 with BF16 operands, as
// GEMM rung 10 is rung 09 with them. The operands are rounded to bfloat16
// (8 significant bits, nearest, ties to even: cvt.rn.bf16x2.f32) as they
// are staged in shared memory, two per 32-bit word along k, and multiplied
// by mma.sync.m16n8k16 with FP32 accumulation; inputs and outputs stay
// float32 in memory. Each product carries a relative error up to about 2^-7
// (tests/test_cuda_conv_tf32.cpp holds every direction to the derived
// bound): this is the arithmetic of BF16 mixed-precision training, which no
// FP32 setting selects.
//
// Threads and data are as in rung 06, with GEMM rung 10's staging and
// fragments (10_bf16_mma.cu; mma_tile.cuh's Bf16): k steps of 16 through
// two shared-memory stages, each word a pair of k. The gathered operands'
// quads are rung 06's, two per staged unit where the stage is k-major.
//   build/sim/bench_cuda_kernels conv 7
#include "kernels/cuda/conv/warp_tile_kernels.cuh"

namespace anvil::cuda {

const conv_rungs::Rung conv_rungs::kBf16Mma =
    conv_kernels::MmaRung<mma_tile::Bf16>::rung("bf16 mma", gemm_rungs::Math::kBf16);

}  // namespace anvil::cuda
