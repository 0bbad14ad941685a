// Convolution rung 07, BF16 tensor cores: rung 06 with BF16 operands, as
// GEMM rung 10 is rung 09 with them: products of bfloat16 operands
// (mma.sync.m16n8k16), FP32 accumulation. Each product carries a relative
// error up to about 2^-7 against unrounded float32 operands
// (tests/test_cuda_conv_tf32.cpp holds every direction to the derived
// bound): this is the arithmetic of BF16 mixed-precision training, which no
// FP32 setting selects.
//
// What it reads from global memory: x, w and dy (forward x and w,
// backward-data dy and w, backward-weight x and dy) either as bfloat16 (the
// backend's choice for bfloat16 tensors, as autocast makes them: 2 bytes an
// element, and nothing to convert) or as float32, rounded to nearest even
// (cvt.rn.bf16x2.f32) as they are staged; one kernel instantiation per
// element type (conv2d_*'s bfloat16 overloads, conv.h). Either way shared
// memory holds the same bf16 words, so bfloat16 inputs and float32 inputs
// of the same values give bitwise the same outputs. dw, the bias and the
// split-K partials are float32; y and dx are float32 or bfloat16 (the
// kernels' overloads on the output pointer, warp_tile_kernels.cuh): the
// FP32 sum, plus the bias for y, rounded once to nearest even in the
// epilogue, or by add_partials when the direction is split.
//
// Threads and data are as in rung 06, with GEMM rung 10's staging and
// fragments (10_bf16_mma.cu; mma_tile.cuh's Bf16): k steps of 16 through
// two shared-memory stages, each word a pair of k. The gathered operands'
// quads are rung 06's (operands.cuh's readers, instantiated for the element
// type), two per staged unit where the stage is k-major; a bfloat16 quad is
// gathered as four 2-byte loads sharing their index arithmetic, and the
// weights' quads of forward (w as stored, [K, C*R*S]) one 8-byte load where
// C*R*S is a multiple of 4.
//   build/sim/bench_cuda_kernels conv 7
#include "kernels/cuda/conv/warp_tile_kernels.cuh"

namespace anvil::cuda {

// constinit: rung 08 copies this rung during its dynamic initialisation.
constinit const conv_rungs::Rung conv_rungs::kBf16Mma =
    conv_kernels::MmaRung<mma_tile::Bf16>::rung("bf16 mma", gemm_rungs::Math::kBf16);

}  // namespace anvil::cuda
