// Convolution rung 06, TF32 tensor cores: rung 5's three implicit GEMMs (the
// same operand readers, operands.cuh; the same split-K, split_k.h; the same
// output index functions, warp_tile_kernels.cuh) on GEMM rung 09's tile
// (mma_tile::multiply): operands rounded to TF32 (tc::cvt_tf32) as
// they are staged in shared memory, mma.sync.m16n8k8 with FP32
// accumulation. Not FP32: each product carries a relative error up to about
// 2^-10 (tests/test_cuda_conv_tf32.cpp derives the bound), so the backend's
// default stays rung 05.
//
// Threads and data are as in GEMM rung 09 (09_tf32_mma.cu has the fragment
// mapping, the shared-memory layouts and why their fragment loads are free
// of bank conflicts): each warp a 64 x 32 sub-tile of the GEMM's result,
// 4 x 4 mma tiles of 16 x 8, k steps of 8 through two shared-memory stages,
// the gathers of step s+1 in flight during the mma of step s. Results of more
// than 64 rows (forward and backward-weight: K output channels;
// backward-data: C input channels) use the 128 x 128 tile of 2 x 4 warps; 64
// rows or fewer the 64 x 128 tile of 1 x 4 warps (mma_tile::Narrow), as
// rung 4 does. The gathered operands are staged as rung 4's: a quad of four
// scalar loads sharing their index arithmetic (Walk), zeros outside the
// image; the shared-memory layout follows each reader's kMajor (the [k][j]
// layout for ColByNpq and DyTaps, [j][k] for the weights, DyRows and
// ColByCrs). Results are written as pairs of consecutive GEMM columns (c0 c1,
// c2 c3 of the mma's C fragment) through rung 4's index functions.
//   build/sim/bench_cuda_kernels conv 6
#include "kernels/cuda/conv/warp_tile_kernels.cuh"

namespace anvil::cuda {

const conv_rungs::Rung conv_rungs::kTf32Mma =
    conv_kernels::MmaRung<mma_tile::Tf32>::rung("tf32 mma", gemm_rungs::Math::kTf32);

}  // namespace anvil::cuda
