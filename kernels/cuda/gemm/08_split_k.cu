// GEMM rung 08, split-K (the one that ships): rung 07's tile and threads,
// plus a third grid dimension over the reduction when the tiles alone cannot
// fill the GPU and K is long (split_k.h). A result of 4 x 4 tiles with
// K = 50,000 is 16 blocks on 132 SMs, so blockIdx.z = 0..splits-1 each take a
// chunk of K (a multiple of 16, at least 128 long; a K-slice of the operands,
// warp_tile::KSlice) and write their partial tile to the workspace, and a
// second kernel (add_partials, one thread per element of C, consecutive
// threads along n; from 32 splits add_partials_by_warp, one warp per element)
// adds the partials in a fixed order and applies alpha and beta. Where the
// tiles fill less than one wave (132 SMs x 2 resident blocks) the split takes
// the fewest chunks whose blocks best fill whole waves (at most 4). Without
// atomics the sum's order is fixed, so results are bitwise the same from run
// to run. Where the tiles already fill a wave or K is short it is rung 07
// (no workspace). The convolutions' split-K shares the second pass.
//   build/sim/bench_cuda_kernels gemm 8
#include <cstdint>

#include "kernels/cuda/gemm/rung.cuh"
#include "kernels/cuda/gemm/split_k.h"
#include "kernels/cuda/gemm/warp_tile.cuh"

namespace anvil::cuda {
namespace gemm_kernels {

// Rung 07 on the K-slice [z*chunk, z*chunk + chunk) of
// z = blockIdx.z, its tile stored through c at c.C + z*M*N (split: c is the
// workspace of partials, alpha 1, beta 0; unsplit: C itself, chunk = K).
template <bool TA, bool TB>
__global__ void __launch_bounds__(warp_tile::DoubleBuffered::kThreads,
                                  warp_tile::DoubleBuffered::kMinBlocks)
    gemm_split_k(int M, int N, int K, int chunk, OpA<TA> a, OpB<TB> b, StoreC c) {
  const int k0 = int(blockIdx.z) * chunk, length = K - k0 < chunk ? K - k0 : chunk;
  c.C += int64_t(blockIdx.z) * M * N;
  warp_tile::multiply<warp_tile::DoubleBuffered>(M, N, length, warp_tile::KSlice(a, k0),
                                                 warp_tile::KSlice(b, k0), c);
}

// The second pass of a split (split_k.h). Below kWarpSplits partials per
// element: one thread per element of C, consecutive threads along n
// (coalesced), adding z = 0, 1, ... in order. C is float or bfloat16 (the
// kernel is overloaded on it, one name for the audits: the same pass).
constexpr int kSumThreads = 256, kWarpSplits = 32;
template <class TC>
__device__ __forceinline__ void add_partials_thread(int splits, int M, int N,
                                                    const float* __restrict__ partials,
                                                    const StoreCOf<TC>& c) {
  const int64_t i = int64_t(blockIdx.x) * kSumThreads + threadIdx.x, MN = int64_t(M) * N;
  if (i >= MN) return;
  float acc = 0.0f;
  for (int z = 0; z < splits; ++z) acc += partials[z * MN + i];
  store(c.C, c.ldc, int(i / N), int(i % N), acc, c.alpha, c.beta, c.bias);
}
__global__ void __launch_bounds__(kSumThreads)
    add_partials(int splits, int M, int N, const float* __restrict__ partials, StoreCOf<float> c) {
  add_partials_thread(splits, M, N, partials, c);
}
__global__ void __launch_bounds__(kSumThreads)
    add_partials(int splits, int M, int N, const float* __restrict__ partials,
                 StoreCOf<bfloat16> c) {
  add_partials_thread(splits, M, N, partials, c);
}

// From kWarpSplits partials per element: one warp per element of C, lane l
// adding z = l, l + 32, ... in order, then a shuffle tree (a fixed order
// too); the reads are scattered, but there are few elements.
template <class TC>
__device__ __forceinline__ void add_partials_warp(int splits, int M, int N,
                                                  const float* __restrict__ partials,
                                                  const StoreCOf<TC>& c) {
  const int64_t i = (int64_t(blockIdx.x) * kSumThreads + threadIdx.x) / 32, MN = int64_t(M) * N;
  const int lane = int(threadIdx.x) % 32;
  if (i >= MN) return;  // i is the same for the whole warp: all its lanes leave
  float acc = 0.0f;
  for (int z = lane; z < splits; z += 32) acc += partials[z * MN + i];
  for (int offset = 16; offset > 0; offset /= 2) acc += __shfl_down_sync(0xffffffffu, acc, offset);
  if (lane == 0) store(c.C, c.ldc, int(i / N), int(i % N), acc, c.alpha, c.beta, c.bias);
}
__global__ void __launch_bounds__(kSumThreads)
    add_partials_by_warp(int splits, int M, int N, const float* __restrict__ partials,
                         StoreCOf<float> c) {
  add_partials_warp(splits, M, N, partials, c);
}
__global__ void __launch_bounds__(kSumThreads)
    add_partials_by_warp(int splits, int M, int N, const float* __restrict__ partials,
                         StoreCOf<bfloat16> c) {
  add_partials_warp(splits, M, N, partials, c);
}

template <class TC>
void sum_partials(int splits, int M, int N, const float* partials, const StoreCOf<TC>& c,
                  cudaStream_t stream) {
  const int64_t MN = int64_t(M) * N;
  if (MN == 0) return;
  const bool by_warp = splits >= kWarpSplits;
  using Kernel = void (*)(int, int, int, const float*, StoreCOf<TC>);
  const Kernel pass = by_warp ? Kernel(add_partials_by_warp) : Kernel(add_partials);
  const int64_t threads = by_warp ? MN * 32 : MN;
  launch(pass, dim3(static_cast<unsigned>((threads + kSumThreads - 1) / kSumThreads)),
         dim3(kSumThreads), 0, stream, splits, M, N, partials, c);
}

split_k::Plan split_plan(int64_t M, int64_t N, int64_t K) {
  using S = warp_tile::DoubleBuffered;
  const int64_t tiles = ((M + S::kBM - 1) / S::kBM) * ((N + S::kBN - 1) / S::kBN);
  return split_k::plan(M, N, K, tiles, S::kMinBlocks);
}

template <bool TA, bool TB>
struct SplitK {
  static void run(const GemmArgs& g, cudaStream_t stream) {
    using S = warp_tile::DoubleBuffered;
    const split_k::Plan plan = split_plan(g.M, g.N, g.K);
    const dim3 grid(blocks(g.N, S::kBN), blocks(g.M, S::kBM), static_cast<unsigned>(plan.splits));
    const auto a = tile::strided<OpA<TA>::kMajor>(g.A, g.lda);
    const auto b = tile::strided<OpB<TB>::kMajor>(g.B, g.ldb);
    if (plan.splits == 1) {
      launch(gemm_split_k<TA, TB>, grid, dim3(S::kThreads), 0, stream, g.M, g.N, g.K, g.K, a, b,
             store_c(g.C, g.ldc, g.alpha, g.beta));
      return;
    }
    launch(gemm_split_k<TA, TB>, grid, dim3(S::kThreads), 0, stream, g.M, g.N, g.K,
           int(plan.chunk), a, b, store_c(g.workspace, g.N, 1.0f, 0.0f));
    split_k::sum_split_k(plan.splits, g.M, g.N, g.workspace, g.alpha, g.beta, nullptr, g.C, g.ldc,
                         stream);
  }
};

}  // namespace gemm_kernels

void split_k::sum_split_k(int splits, int M, int N, const float* partials, float alpha,
                          float beta, const float* bias, float* C, int64_t ldc,
                          cudaStream_t stream) {
  gemm_kernels::sum_partials(
      splits, M, N, partials, gemm_kernels::StoreCOf<float>{C, ldc, alpha, beta, bias, false},
      stream);
}
void split_k::sum_split_k(int splits, int M, int N, const float* partials, float alpha,
                          float beta, const float* bias, bfloat16* C, int64_t ldc,
                          cudaStream_t stream) {
  gemm_kernels::sum_partials(
      splits, M, N, partials, gemm_kernels::StoreCOf<bfloat16>{C, ldc, alpha, beta, bias, false},
      stream);
}

size_t gemm_rungs::split_k_workspace_floats(int64_t M, int64_t N, int64_t K) {
  return static_cast<size_t>(
      cuda::split_k::workspace_floats(gemm_kernels::split_plan(M, N, K), M, N));
}

void gemm_rungs::split_k(const GemmArgs& g, cudaStream_t stream) {
  gemm_kernels::by_transpose<gemm_kernels::SplitK>(g, stream);
}

}  // namespace anvil::cuda
