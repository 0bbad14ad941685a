// What the GEMM rungs share: op(A) and op(B) as operands, C's stores, and the
// pick of a kernel instantiation by the two transpose flags.
//
// Every kernel is a template on the two transpose flags, and reads its
// operands through an index function (tile::Strided, tile.cuh): element
// (j, k) of an operand is p[k*ld + j] or p[j*ld + k] depending on how it is
// stored, so a transpose costs nothing but a different address.
#pragma once
#include <cstdint>

#include "kernels/cuda/cuda_compat.h"
#include "kernels/cuda/gemm/gemm.h"
#include "kernels/cuda/gemm/tile.cuh"
#include "kernels/cuda/vec4.cuh"

namespace anvil::cuda::gemm_kernels {

// op(A) as an operand: (m, k) is A[k*lda + m] when transposed; T is float,
// or bfloat16 for the rung that reads it (10).
template <bool TA, class T = float>
using OpA = tile::Strided<TA, T>;
// op(B) as an operand: (n, k) is B[k*ldb + n] unless transposed.
template <bool TB, class T = float>
using OpB = tile::Strided<!TB, T>;

__device__ __forceinline__ void store(float* C, int64_t ldc, int m, int n, float acc, float alpha,
                                      float beta) {
  float* c = C + int64_t(m) * ldc + n;
  *c = beta == 0.0f ? alpha * acc : alpha * acc + beta * *c;  // beta == 0: C not read
}

// C = alpha * acc + beta * C for a row quad C[m][n..n+3] of which `valid`
// lie inside N: one 16-byte store (and load, for beta != 0) when aligned.
struct StoreC {
  float* C;
  int64_t ldc;
  float alpha, beta;
  bool aligned;  // C on a 16-byte boundary, ldc a multiple of 4
  __device__ __forceinline__ void operator()(int m, int n, const float4& acc, int valid) const {
    float* c = C + int64_t(m) * ldc + n;
    if (valid == 4 && aligned) {
      float4 v = make_float4(alpha * acc.x, alpha * acc.y, alpha * acc.z, alpha * acc.w);
      if (beta != 0.0f) {  // beta == 0: C not read
        const float4 old = vec::load4(c);
        v = make_float4(v.x + beta * old.x, v.y + beta * old.y, v.z + beta * old.z,
                        v.w + beta * old.w);
      }
      vec::store4(c, v);
    } else {
      for (int j = 0; j < valid; ++j) store(C, ldc, m, n + j, vec::at(acc, j), alpha, beta);
    }
  }
};

inline StoreC store_c(float* C, int64_t ldc, float alpha, float beta) {
  return StoreC{C, ldc, alpha, beta,
                reinterpret_cast<std::uintptr_t>(C) % 16 == 0 && ldc % 4 == 0};
}

inline unsigned blocks(int n, int per_block) {
  return static_cast<unsigned>((n + per_block - 1) / per_block);
}

// Calls Launch<TA, TB>::run(g, stream) for g's transpose flags: each rung
// instantiates its kernel four times (per operand type) and picks one at
// run time.
template <template <bool, bool> class Launch, class Args>
void by_transpose(const Args& g, cudaStream_t stream) {
  if (g.trans_a)
    g.trans_b ? Launch<true, true>::run(g, stream) : Launch<true, false>::run(g, stream);
  else
    g.trans_b ? Launch<false, true>::run(g, stream) : Launch<false, false>::run(g, stream);
}

// Rungs 05-07: `Kernel` of tile shape S, one block per S::kBM x S::kBN tile.
template <class S, bool TA, bool TB>
void launch_warp_tile(void (*kernel)(int, int, int, OpA<TA>, OpB<TB>, StoreC), const GemmArgs& g,
                      cudaStream_t stream) {
  launch(kernel, dim3(blocks(g.N, S::kBN), blocks(g.M, S::kBM)), dim3(S::kThreads), 0, stream,
         g.M, g.N, g.K, tile::strided<OpA<TA>::kMajor>(g.A, g.lda),
         tile::strided<OpB<TB>::kMajor>(g.B, g.ldb), store_c(g.C, g.ldc, g.alpha, g.beta));
}

}  // namespace anvil::cuda::gemm_kernels
