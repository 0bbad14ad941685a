// GEMM rung 01, naive: one thread per element of C, threadIdx.x walking down
// M. Each thread reads a row of op(A) and a column of op(B) from global
// memory. Neighbouring threads of a warp touch addresses lda (for
// untransposed A) and ldc (for C) floats apart, so most loads and every store
// are separate memory transactions.
//   build/sim/bench_cuda_kernels gemm 1
#include "kernels/cuda/gemm/rung.cuh"

namespace anvil::cuda {
namespace gemm_kernels {

constexpr int kNaiveThreads = 32 * 32;

template <bool TA, bool TB>
__global__ void __launch_bounds__(kNaiveThreads)
    gemm_naive(int M, int N, int K, float alpha, OpA<TA> a, OpB<TB> b, float beta,
               float* __restrict__ C, int64_t ldc) {
  int row = blockIdx.x * blockDim.x + threadIdx.x;
  int col = blockIdx.y * blockDim.y + threadIdx.y;
  if (row >= M || col >= N) return;
  float acc = 0.0f;
  for (int k = 0; k < K; ++k) acc += a(row, k) * b(col, k);
  store(C, ldc, row, col, acc, alpha, beta);
}

template <bool TA, bool TB>
struct Naive {
  static void run(const GemmArgs& g, cudaStream_t stream) {
    launch(gemm_naive<TA, TB>, dim3(blocks(g.M, 32), blocks(g.N, 32)), dim3(32, 32), 0, stream,
           g.M, g.N, g.K, g.alpha, OpA<TA>{g.A, g.lda}, OpB<TB>{g.B, g.ldb}, g.beta, g.C, g.ldc);
  }
};

}  // namespace gemm_kernels

void gemm_rungs::naive(const GemmArgs& g, cudaStream_t stream) {
  gemm_kernels::by_transpose<gemm_kernels::Naive>(g, stream);
}

}  // namespace anvil::cuda
