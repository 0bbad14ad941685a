// GEMM rung 06, warp tiles: a 128x128 tile, K steps of 8, 256 threads as
// 2 x 4 warps, each warp a 64x32 sub-tile and each lane an 8x8 register block
// (2 x 2 quads of 4x4, 32 rows and 16 columns apart): 4 LDS.128 per 64
// multiply-adds, and each staged element feeds 128 threads' FMAs instead of
// 64, so a block reads half as many bytes of global memory per multiply-add
// as rung 05. The lanes of a warp read 8 distinct A quads (128 consecutive
// bytes) and 4 B quads, broadcast to the rest: no bank conflicts. At most 128
// registers per thread (__launch_bounds__(256, 2)): two blocks per SM.
//   build/sim/bench_cuda_kernels gemm 6
#include "kernels/cuda/gemm/rung.cuh"
#include "kernels/cuda/gemm/warp_tile.cuh"

namespace anvil::cuda {
namespace gemm_kernels {

template <bool TA, bool TB>
__global__ void __launch_bounds__(warp_tile::WarpTiled::kThreads, warp_tile::WarpTiled::kMinBlocks)
    gemm_warp_tiled(int M, int N, int K, OpA<TA> a, OpB<TB> b, StoreC c) {
  warp_tile::multiply<warp_tile::WarpTiled>(M, N, K, a, b, c);
}

template <bool TA, bool TB>
struct WarpTiledRung {
  static void run(const GemmArgs& g, cudaStream_t stream) {
    launch_warp_tile<warp_tile::WarpTiled, TA, TB>(gemm_warp_tiled<TA, TB>, g, stream);
  }
};

}  // namespace gemm_kernels

void gemm_rungs::warp_tiled(const GemmArgs& g, cudaStream_t stream) {
  gemm_kernels::by_transpose<gemm_kernels::WarpTiledRung>(g, stream);
}

}  // namespace anvil::cuda
