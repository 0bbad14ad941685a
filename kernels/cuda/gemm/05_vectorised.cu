// GEMM rung 05, vectorised: rung 04's 64x64 tile, 4x4 outputs and K steps of
// 16, moved in 16-byte pieces (warp_tile::multiply, warp_tile.cuh): each
// thread fetches one float4 of op(A) and one of op(B) per step (one
// LDG.E.128 each where the matrix is 16-byte aligned with a row stride that
// is a multiple of 4 and the four floats are inside it; four scalar loads at
// ragged edges), and owns 4 consecutive rows and 4 consecutive columns of C
// (not rung 04's strided ones), so its A and B values for one k are one
// LDS.128 each: 2 shared-memory loads per 16 multiply-adds instead of 8. C
// is written as float4 rows where aligned.
//   build/sim/bench_cuda_kernels gemm 5
#include "kernels/cuda/gemm/rung.cuh"
#include "kernels/cuda/gemm/warp_tile.cuh"

namespace anvil::cuda {
namespace gemm_kernels {

template <bool TA, bool TB>
__global__ void __launch_bounds__(warp_tile::Vectorised::kThreads, warp_tile::Vectorised::kMinBlocks)
    gemm_vectorised(int M, int N, int K, OpA<TA> a, OpB<TB> b, StoreC c) {
  warp_tile::multiply<warp_tile::Vectorised>(M, N, K, a, b, c);
}

template <bool TA, bool TB>
struct VectorisedRung {
  static void run(const GemmArgs& g, cudaStream_t stream) {
    launch_warp_tile<warp_tile::Vectorised, TA, TB>(gemm_vectorised<TA, TB>, g, stream);
  }
};

}  // namespace gemm_kernels

void gemm_rungs::vectorised(const GemmArgs& g, cudaStream_t stream) {
  gemm_kernels::by_transpose<gemm_kernels::VectorisedRung>(g, stream);
}

}  // namespace anvil::cuda
