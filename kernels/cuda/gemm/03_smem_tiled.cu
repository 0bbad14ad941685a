// GEMM rung 03, shared-memory tiles: a 32x32 block of threads computes a
// 32x32 tile of C. It walks K in steps of 32: the block stages a 32x32 tile
// of op(A) and one of op(B) into shared memory (one element of each per
// thread), waits (__syncthreads), and every thread takes its 32 multiply-adds
// from shared memory. Each global element is now read by 1/32 as many loads;
// the second barrier keeps the next load from overwriting a tile still being
// read. The tiles are stored [k][j] (j = m for A, n for B) with a row padding
// of one float, and filled in whichever order makes a warp read 32
// consecutive floats of the matrix as stored (along k for A and for
// transposed B, along j otherwise): all four transpose combinations load
// coalesced, and the padding keeps the "column" stores this needs free of
// bank conflicts.
//   build/sim/bench_cuda_kernels gemm 3
#include "kernels/cuda/gemm/rung.cuh"

namespace anvil::cuda {
namespace gemm_kernels {

constexpr int kTile = 32;

template <bool TA, bool TB>
__global__ void __launch_bounds__(kTile* kTile)
    gemm_tiled(int M, int N, int K, float alpha, OpA<TA> a, OpB<TB> b, float beta,
               float* __restrict__ C, int64_t ldc) {
  __shared__ float As[kTile][kTile + 1];  // As[k][m]
  __shared__ float Bs[kTile][kTile + 1];  // Bs[k][n]
  const int tx = threadIdx.x, ty = threadIdx.y, tid = ty * kTile + tx;
  const int m0 = blockIdx.y * kTile, n0 = blockIdx.x * kTile;
  float acc = 0.0f;
  for (int k0 = 0; k0 < K; k0 += kTile) {
    // Out-of-range threads still load (zeros) and reach both barriers:
    // every thread of the block must.
    tile::stage<OpA<TA>::kMajor, kTile, kTile, kTile * kTile>(As, tid, m0, k0, M, K, a);
    tile::stage<OpB<TB>::kMajor, kTile, kTile, kTile * kTile>(Bs, tid, n0, k0, N, K, b);
    __syncthreads();
    for (int k = 0; k < kTile; ++k) acc += As[k][ty] * Bs[k][tx];
    __syncthreads();
  }
  if (m0 + ty < M && n0 + tx < N) store(C, ldc, m0 + ty, n0 + tx, acc, alpha, beta);
}

template <bool TA, bool TB>
struct Tiled {
  static void run(const GemmArgs& g, cudaStream_t stream) {
    launch(gemm_tiled<TA, TB>, dim3(blocks(g.N, kTile), blocks(g.M, kTile)), dim3(kTile, kTile),
           0, stream, g.M, g.N, g.K, g.alpha, OpA<TA>{g.A, g.lda}, OpB<TB>{g.B, g.ldb}, g.beta,
           g.C, g.ldc);
  }
};

}  // namespace gemm_kernels

void gemm_rungs::smem_tiled(const GemmArgs& g, cudaStream_t stream) {
  gemm_kernels::by_transpose<gemm_kernels::Tiled>(g, stream);
}

}  // namespace anvil::cuda
