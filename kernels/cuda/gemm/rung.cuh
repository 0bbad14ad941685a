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
__device__ __forceinline__ float epilogue(float acc, float alpha, bool has_bias, float bias,
                                          float beta, float old) {
  float v = alpha * acc;
  if (has_bias) v += bias;
  return beta == 0.0f ? v : v + beta * old;
}
__device__ __forceinline__ float epilogue(float acc, float alpha, const float* bias, int n,
                                          float beta, float old) {
  return epilogue(acc, alpha, bias != nullptr, bias != nullptr ? bias[n] : 0.0f, beta, old);
}

// One element of C (float, or bfloat16 rounded to nearest even).
template <class TC>
__device__ __forceinline__ void store(TC* C, int64_t ldc, int m, int n, float acc, float alpha,
                                      float beta, const float* bias = nullptr) {
  TC* c = C + int64_t(m) * ldc + n;
  const float old = beta == 0.0f ? 0.0f : anvil::load(*c);  // beta == 0: C not read
  *c = anvil::store<TC>(epilogue(acc, alpha, bias, n, beta, old));
}

// C = alpha * acc (+ bias[n]) + beta * C for row quads C[m][n..n+3] of
// which `valid` lie inside N. Float C: one 16-byte store (and load, for
// beta != 0) when aligned. Bfloat16 C: pairs of elements at even n as one
// 4-byte store when aligned (the mma tiles' c0 c1 pairs); each element is
// the float32 C's value rounded to nearest even. columns(n, valid) fixes
// the columns (their bias loaded once) for a loop over rows m
// (staged_epilogue.cuh's kRows); operator() stores one quad.
template <class TC>
struct StoreCOf {
  TC* C;
  int64_t ldc;
  float alpha, beta;
  const float* bias;  // null, or N floats: a bias per column of C, added in FP32
  bool aligned;       // float: C 16-byte aligned, ldc % 4 == 0; bfloat16: 4-byte, ldc even

  // The elements' values with the columns' bias as loaded: the same
  // arithmetic as epilogue() above.
  struct Columns {
    TC* c;  // C + n
    int64_t ldc;
    float alpha, beta;
    bool has_bias, aligned;
    int n, valid;
    float4 b;  // the columns' bias (zeros without one)
    // Element j (< 4, a constant once unrolled).
    __device__ __forceinline__ float value(float acc, int j, float old) const {
      return epilogue(acc, alpha, has_bias, vec::at(b, j), beta, old);
    }
    __device__ __forceinline__ float old(const TC* p, int j) const {
      return beta == 0.0f ? 0.0f : anvil::load(p[j]);  // beta == 0: C not read
    }
    __device__ __forceinline__ void operator()(int m, const float4& acc) const {
      TC* p = c + int64_t(m) * ldc;
      if constexpr (std::is_same_v<TC, float>) {
        if (valid == 4 && aligned) {
          const float4 o = beta == 0.0f ? make_float4(0.0f, 0.0f, 0.0f, 0.0f) : vec::load4(p);
          vec::store4(p, make_float4(value(acc.x, 0, o.x), value(acc.y, 1, o.y),
                                     value(acc.z, 2, o.z), value(acc.w, 3, o.w)));
          return;
        }
      } else {
        if (aligned && n % 2 == 0) {  // pairs (j, j + 1) as one 4-byte store
          #pragma unroll
          for (int j = 0; j < 4; j += 2) {
            if (j + 1 < valid) {
              const float v0 = value(vec::at(acc, j), j, old(p, j));
              const float v1 = value(vec::at(acc, j + 1), j + 1, old(p, j + 1));
              *reinterpret_cast<uint32_t*>(p + j) =
                  uint32_t(float_to_bf16_bits(v0)) | (uint32_t(float_to_bf16_bits(v1)) << 16);
            } else if (j < valid) {
              p[j] = anvil::store<TC>(value(vec::at(acc, j), j, old(p, j)));
            }
          }
          return;
        }
      }
      #pragma unroll
      for (int j = 0; j < 4; ++j)
        if (j < valid) p[j] = anvil::store<TC>(value(vec::at(acc, j), j, old(p, j)));
    }
  };
  __device__ __forceinline__ Columns columns(int n, int valid) const {
    float b[4];
    #pragma unroll
    for (int j = 0; j < 4; ++j) b[j] = bias != nullptr && j < valid ? bias[n + j] : 0.0f;
    return Columns{C + n, ldc, alpha, beta, bias != nullptr, aligned, n, valid,
                   make_float4(b[0], b[1], b[2], b[3])};
  }
  __device__ __forceinline__ void operator()(int m, int n, const float4& acc, int valid) const {
    columns(n, valid)(m, acc);
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
