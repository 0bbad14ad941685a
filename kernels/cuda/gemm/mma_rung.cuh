// What the tensor-core GEMM rungs 09 (TF32), 10 (BF16), 11 (TF32) and 12
// (BF16) share: the kernel on a tensor-core tile of shape S (mma_tile.cuh's,
// or the multistage one of mma_ldmatrix.cuh; S::multiply computes it) over
// one K-slice per blockIdx.z, and the launcher with rung 08's split-K
// (split_k.h): where the tiles fill less than one wave and K is long,
// grid.z chunks of K write FP32 partial tiles to the workspace and rung
// 08's second pass adds them in a fixed order. A shape whose stages live in
// dynamic shared memory (S::kDynamicSharedBytes, past 48 KB) is launched
// with it, opted in to once per kernel and device.
#pragma once
#include <atomic>
#include <cstdint>

#include "kernels/cuda/gemm/mma_tile.cuh"
#include "kernels/cuda/gemm/rung.cuh"
#include "kernels/cuda/gemm/split_k.h"
#include "kernels/cuda/gemm/warp_tile.cuh"

namespace anvil::cuda::gemm_kernels {

// The K-slice [z*chunk, z*chunk + chunk) of z = blockIdx.z, its tile stored
// through c at c.C + z*M*N (split: c is the workspace of partials, alpha 1,
// beta 0, no bias; unsplit: C itself, chunk = K). The kernel is overloaded
// on C's type (float, bfloat16: unsplit only), one name for the audits.
template <class S, bool TA, bool TB, class T, class TC>
__device__ __forceinline__ void gemm_mma_tile(int M, int N, int K, int chunk,
                                              const OpA<TA, T>& a, const OpB<TB, T>& b,
                                              StoreCOf<TC> c) {
  const int k0 = int(blockIdx.z) * chunk, length = K - k0 < chunk ? K - k0 : chunk;
  c.C += int64_t(blockIdx.z) * M * N;
  S::multiply(M, N, length, warp_tile::KSlice(a, k0), warp_tile::KSlice(b, k0), c);
}
template <class S, bool TA, bool TB, class T>
__global__ void __launch_bounds__(S::kThreads, S::kMinBlocks)
    gemm_mma(int M, int N, int K, int chunk, OpA<TA, T> a, OpB<TB, T> b, StoreCOf<float> c) {
  gemm_mma_tile<S, TA, TB, T>(M, N, K, chunk, a, b, c);
}
template <class S, bool TA, bool TB, class T>
__global__ void __launch_bounds__(S::kThreads, S::kMinBlocks)
    gemm_mma(int M, int N, int K, int chunk, OpA<TA, T> a, OpB<TB, T> b, StoreCOf<bfloat16> c) {
  gemm_mma_tile<S, TA, TB, T>(M, N, K, chunk, a, b, c);
}

// The dynamic shared memory a shape's kernel is launched with: 0 for static.
template <class S>
constexpr int dynamic_shared_bytes() {
  if constexpr (requires { S::kDynamicSharedBytes; }) return S::kDynamicSharedBytes;
  return 0;
}

// Launches kernel with S's dynamic shared memory, opted in to first where
// it has any (`devices`: the kernel's own).
template <class S, class Kernel, class... Args>
void launch_on(Kernel kernel, dim3 grid, cudaStream_t stream, std::atomic<uint64_t>& devices,
               Args&&... args) {
  constexpr int kBytes = dynamic_shared_bytes<S>();
  if constexpr (kBytes > 0) opt_in_shared(kernel, kBytes, devices);
  launch(kernel, grid, dim3(S::kThreads), kBytes, stream, std::forward<Args>(args)...);
}

template <class S>
split_k::Plan mma_split_plan(int64_t M, int64_t N, int64_t K) {
  const int64_t tiles = ((M + S::kBM - 1) / S::kBM) * ((N + S::kBN - 1) / S::kBN);
  return split_k::plan(M, N, K, tiles, S::kMinBlocks);
}

template <class S>
struct MmaRung {
  // Operands of T (g: GemmArgsOf<T, TC>): float, or bfloat16 where S's Math
  // reads it (mma_tile::Bf16); C of TC (float; bfloat16 for rung 10).
  template <bool TA, bool TB>
  struct Run {
    template <class T, class TC>
    static void run(const GemmArgsOf<T, TC>& g, cudaStream_t stream) {
      const split_k::Plan plan = mma_split_plan<S>(g.M, g.N, g.K);
      const dim3 grid(blocks(g.N, S::kBN), blocks(g.M, S::kBM),
                      static_cast<unsigned>(plan.splits));
      const auto a = tile::strided<OpA<TA>::kMajor>(g.A, g.lda);
      const auto b = tile::strided<OpB<TB>::kMajor>(g.B, g.ldb);
      using ToC = void (*)(int, int, int, int, OpA<TA, T>, OpB<TB, T>, StoreCOf<TC>);
      using ToPartials = void (*)(int, int, int, int, OpA<TA, T>, OpB<TB, T>, StoreCOf<float>);
      if (plan.splits == 1) {
        static std::atomic<uint64_t> to_c{0};  // the devices opted in, per kernel
        launch_on<S>(ToC(gemm_mma<S, TA, TB, T>), grid, stream, to_c, g.M, g.N, g.K, g.K, a, b,
                     store_c(g.C, g.ldc, g.alpha, g.beta, g.bias));
        return;
      }
      static std::atomic<uint64_t> to_partials{0};
      launch_on<S>(ToPartials(gemm_mma<S, TA, TB, T>), grid, stream, to_partials, g.M, g.N, g.K,
                   int(plan.chunk), a, b, store_c(g.workspace, g.N, 1.0f, 0.0f));
      split_k::sum_split_k(plan.splits, g.M, g.N, g.workspace, g.alpha, g.beta, g.bias, g.C,
                           g.ldc, stream);
    }
  };
  static size_t workspace_floats(int64_t M, int64_t N, int64_t K) {
    return static_cast<size_t>(split_k::workspace_floats(mma_split_plan<S>(M, N, K), M, N));
  }
};

}  // namespace anvil::cuda::gemm_kernels
