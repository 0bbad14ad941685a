// What the GEMM rungs share: op(A) and op(B) as operands, C's stores, and the
// pick of a kernel instantiation by the two transpose flags.
//
// Every kernel is a template on the two transpose flags, and reads its
// operands through an index function (tile::Strided, tile.cuh): element
// (j, k) of an operand is p[k*ld + j] or p[j*ld + k] depending on how it is
// stored, so a transpose costs nothing but a different address.
#pragma once
#include <cstdint>
#include <type_traits>

#include "kernels/cuda/cuda_compat.h"
#include "kernels/element.h"
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

// The epilogue's value of one element of C, in FP32: alpha * acc, plus the
// bias of its column n when there is one, plus beta * old (C's value,
// ignored when beta == 0). Every store of every C type goes through it, so
// a bfloat16 C holds exactly the float32 C's values, rounded once.
__device__ __forceinline__ float epilogue(float acc, float alpha, const float* bias, int n,
                                          float beta, float old) {
  float v = alpha * acc;
  if (bias != nullptr) v += bias[n];
  return beta == 0.0f ? v : v + beta * old;
}

// One element of C (float, or bfloat16 rounded to nearest even).
template <class TC>
__device__ __forceinline__ void store(TC* C, int64_t ldc, int m, int n, float acc, float alpha,
                                      float beta, const float* bias = nullptr) {
  TC* c = C + int64_t(m) * ldc + n;
  const float old = beta == 0.0f ? 0.0f : anvil::load(*c);  // beta == 0: C not read
  *c = anvil::store<TC>(epilogue(acc, alpha, bias, n, beta, old));
}

// C = alpha * acc (+ bias[n]) + beta * C for a row quad C[m][n..n+3] of
// which `valid` lie inside N. Float C: one 16-byte store (and load, for
// beta != 0) when aligned. Bfloat16 C: pairs of elements at even n as one
// 4-byte store when aligned (the mma tiles' c0 c1 pairs); each element is
// the float32 C's value rounded to nearest even.
template <class TC>
struct StoreCOf {
  TC* C;
  int64_t ldc;
  float alpha, beta;
  const float* bias;  // null, or N floats: a bias per column of C, added in FP32
  bool aligned;       // float: C 16-byte aligned, ldc % 4 == 0; bfloat16: 4-byte, ldc even
  __device__ __forceinline__ void operator()(int m, int n, const float4& acc, int valid) const {
    TC* c = C + int64_t(m) * ldc + n;
    if constexpr (std::is_same_v<TC, float>) {
      if (valid == 4 && aligned) {
        const float4 old = beta == 0.0f ? make_float4(0.0f, 0.0f, 0.0f, 0.0f) : vec::load4(c);
        vec::store4(c, make_float4(epilogue(acc.x, alpha, bias, n, beta, old.x),
                                   epilogue(acc.y, alpha, bias, n + 1, beta, old.y),
                                   epilogue(acc.z, alpha, bias, n + 2, beta, old.z),
                                   epilogue(acc.w, alpha, bias, n + 3, beta, old.w)));
        return;
      }
    } else {
      if (aligned && n % 2 == 0) {
        int j = 0;
        for (; j + 1 < valid; j += 2) {
          const float v0 = epilogue(vec::at(acc, j), alpha, bias, n + j, beta,
                                    beta == 0.0f ? 0.0f : anvil::load(c[j]));
          const float v1 = epilogue(vec::at(acc, j + 1), alpha, bias, n + j + 1, beta,
                                    beta == 0.0f ? 0.0f : anvil::load(c[j + 1]));
          *reinterpret_cast<uint32_t*>(c + j) =
              uint32_t(float_to_bf16_bits(v0)) | (uint32_t(float_to_bf16_bits(v1)) << 16);
        }
        if (j < valid) store(C, ldc, m, n + j, vec::at(acc, j), alpha, beta, bias);
        return;
      }
    }
    for (int j = 0; j < valid; ++j) store(C, ldc, m, n + j, vec::at(acc, j), alpha, beta, bias);
  }
};
using StoreC = StoreCOf<float>;

template <class TC>
StoreCOf<TC> store_c(TC* C, int64_t ldc, float alpha, float beta, const float* bias = nullptr) {
  const auto address = reinterpret_cast<std::uintptr_t>(C);
  const bool aligned = std::is_same_v<TC, float> ? address % 16 == 0 && ldc % 4 == 0
                                                 : address % 4 == 0 && ldc % 2 == 0;
  return StoreCOf<TC>{C, ldc, alpha, beta, bias, aligned};
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
