// GEMM rung 04, register blocking: 256 threads compute a 64x64 tile of C, 4x4
// outputs each, held in registers (tile::register_blocked, tile.cuh, shared
// with the implicit-GEMM convolutions). Per step of 16 along K the block
// stages a 16x64 tile of op(A) (as [k][m], so a thread's four A values lie in
// a row) and a 16x64 tile of op(B) in shared memory, again in the order that
// keeps global reads coalesced for each layout (rows of 16 floats along k, or
// 64 along m/n). Each thread then loads 4 values of A and 4 of B into
// registers and does 16 multiply-adds with them: four times the arithmetic
// per shared-memory read of rung 03. A thread's rows are ty+16*i and its
// columns tx+16*j, so neighbouring threads read neighbouring shared-memory
// words (no bank conflicts) and write neighbouring columns of C.
//   build/sim/bench_cuda_kernels gemm 4
#include "kernels/cuda/gemm/rung.cuh"

namespace anvil::cuda {
namespace gemm_kernels {

template <bool TA, bool TB>
__global__ void __launch_bounds__(tile::kThreads)
    gemm_register_blocked(int M, int N, int K, float alpha, OpA<TA> a, OpB<TB> b, float beta,
                          float* __restrict__ C, int64_t ldc) {
  tile::register_blocked(M, N, K, a, b,
                         [&](int m, int n, float acc) { store(C, ldc, m, n, acc, alpha, beta); });
}

template <bool TA, bool TB>
struct RegisterBlocked {
  static void run(const GemmArgs& g, cudaStream_t stream) {
    launch(gemm_register_blocked<TA, TB>, dim3(blocks(g.N, tile::kBN), blocks(g.M, tile::kBM)),
           dim3(tile::kThreads), 0, stream, g.M, g.N, g.K, g.alpha, OpA<TA>{g.A, g.lda},
           OpB<TB>{g.B, g.ldb}, g.beta, g.C, g.ldc);
  }
};

}  // namespace gemm_kernels

void gemm_rungs::register_blocked(const GemmArgs& g, cudaStream_t stream) {
  gemm_kernels::by_transpose<gemm_kernels::RegisterBlocked>(g, stream);
}

}  // namespace anvil::cuda
