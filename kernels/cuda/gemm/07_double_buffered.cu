// GEMM rung 07, double buffering: rung 06 with two shared-memory stages. The
// global loads of step t+1 go out into registers before the multiply-adds of
// step t and are stored into the other stage after them, so their latency
// hides behind 512 FMAs per thread; one __syncthreads per step instead of
// two.
//   build/sim/bench_cuda_kernels gemm 7
#include "kernels/cuda/gemm/rung.cuh"
#include "kernels/cuda/gemm/warp_tile.cuh"

namespace anvil::cuda {
namespace gemm_kernels {

template <bool TA, bool TB>
__global__ void __launch_bounds__(warp_tile::DoubleBuffered::kThreads, warp_tile::DoubleBuffered::kMinBlocks)
    gemm_double_buffered(int M, int N, int K, OpA<TA> a, OpB<TB> b, StoreC c) {
  warp_tile::multiply<warp_tile::DoubleBuffered>(M, N, K, a, b, c);
}

template <bool TA, bool TB>
struct DoubleBufferedRung {
  static void run(const GemmArgs& g, cudaStream_t stream) {
    launch_warp_tile<warp_tile::DoubleBuffered, TA, TB>(gemm_double_buffered<TA, TB>, g, stream);
  }
};

}  // namespace gemm_kernels

void gemm_rungs::double_buffered(const GemmArgs& g, cudaStream_t stream) {
  gemm_kernels::by_transpose<gemm_kernels::DoubleBufferedRung>(g, stream);
}

}  // namespace anvil::cuda
