// The CUDA backend's kernels, as host entry points taking device pointers.
// Built by nvcc, or by g++ against the simulator (anvil_cuda_sim).
#pragma once
#include "kernels/cuda/cuda_compat.h"

namespace anvil::cuda {

// Row-major C[M,N] = alpha * A[M,K] * B[K,N] + beta * C with the handwritten
// variant 1..4 (see gemm.cu); C is not read when beta == 0.
void gemm(int variant, int M, int N, int K, float alpha, const float* A, const float* B,
          float beta, float* C, cudaStream_t stream);

}  // namespace anvil::cuda
