// GEMM rung 02, coalesced: rung 01's work with threadIdx.x walking along N.
// A warp writes 32 consecutive floats of C (one transaction), all its threads
// read the same element of op(A) (a broadcast), and it reads 32 consecutive
// floats of B when B is untransposed. With trans_b the B reads are ldb apart:
// a thread-per-output kernel cannot be coalesced for both C and a transposed
// B; rung 03 fixes it.
//   build/sim/bench_cuda_kernels gemm 2
#include "kernels/cuda/gemm/rung.cuh"

namespace anvil::cuda {
namespace gemm_kernels {

constexpr int kCoalescedThreads = 32 * 32;

template <bool TA, bool TB>
__global__ void __launch_bounds__(kCoalescedThreads)
    gemm_coalesced(int M, int N, int K, float alpha, OpA<TA> a, OpB<TB> b, float beta,
                   float* __restrict__ C, int64_t ldc) {
  int col = blockIdx.x * blockDim.x + threadIdx.x;
  int row = blockIdx.y * blockDim.y + threadIdx.y;
  if (row >= M || col >= N) return;
  float acc = 0.0f;
  for (int k = 0; k < K; ++k) acc += a(row, k) * b(col, k);
  store(C, ldc, row, col, acc, alpha, beta);
}

template <bool TA, bool TB>
struct Coalesced {
  static void run(const GemmArgs& g, cudaStream_t stream) {
    launch(gemm_coalesced<TA, TB>, dim3(blocks(g.N, 32), blocks(g.M, 32)), dim3(32, 32), 0,
           stream, g.M, g.N, g.K, g.alpha, OpA<TA>{g.A, g.lda}, OpB<TB>{g.B, g.ldb}, g.beta, g.C,
           g.ldc);
  }
};

}  // namespace gemm_kernels

void gemm_rungs::coalesced(const GemmArgs& g, cudaStream_t stream) {
  gemm_kernels::by_transpose<gemm_kernels::Coalesced>(g, stream);
}

}  // namespace anvil::cuda
