// Single-precision GEMM, row-major as cblas_sgemm:
//   C[M,N] = alpha * op(A)[M,K] * op(B)[K,N] + beta * C,  op(X) = X or X^T.
// A is stored M x K with row stride lda (K x M when trans_a), B K x N with
// row stride ldb (N x K when trans_b), C M x N with row stride ldc.
//
// Every kernel is a template on the two transpose flags, and reads its
// operands through an index function (tile::Strided, gemm_tile.cuh): element
// (j, k) of an operand is p[k*ld + j] or p[j*ld + k] depending on how it is
// stored, so a transpose costs nothing but a different address.
//
// Eight variants, each a step from the one before (run with gemm(variant, ...)):
//
// 1 naive      One thread per element of C, threadIdx.x walking down M. Each
//              thread reads a row of op(A) and a column of op(B) from global
//              memory. Neighbouring threads of a warp touch addresses lda
//              (for untransposed A) and ldc (for C) floats apart, so most
//              loads and every store are separate memory transactions.
// 2 coalesced  The same work with threadIdx.x walking along N: a warp writes
//              32 consecutive floats of C (one transaction), all its threads
//              read the same element of op(A) (a broadcast), and it reads 32
//              consecutive floats of B when B is untransposed. With trans_b
//              the B reads are ldb apart: a thread-per-output kernel cannot
//              be coalesced for both C and a transposed B; variant 3 fixes it.
// 3 tiled      A 32x32 block of threads computes a 32x32 tile of C. It walks K
//              in steps of 32: the block stages a 32x32 tile of op(A) and one
//              of op(B) into shared memory (one element of each per thread),
//              waits (__syncthreads), and every thread takes its 32
//              multiply-adds from shared memory. Each global element is now
//              read by 1/32 as many loads; the second barrier keeps the next
//              load from overwriting a tile still being read. The tiles are
//              stored [k][j] (j = m for A, n for B) with a row padding of one
//              float, and filled in whichever order makes a warp read 32
//              consecutive floats of the matrix as stored (along k for A and
//              for transposed B, along j otherwise): all four transpose
//              combinations load coalesced, and the padding keeps the
//              "column" stores this needs free of bank conflicts.
// 4 register   256 threads compute a 64x64 tile of C, 4x4 outputs each, held in
//   blocked    registers (tile::register_blocked, shared with the implicit-GEMM
//              convolutions). Per step of 16 along K the block stages a 16x64
//              tile of op(A) (as [k][m], so a thread's four A values lie in a
//              row) and a 16x64 tile of op(B) in shared memory, again in the
//              order that keeps global reads coalesced for each layout (rows
//              of 16 floats along k, or 64 along m/n). Each thread then loads
//              4 values of A and 4 of B into registers and does 16
//              multiply-adds with them: four times the arithmetic per
//              shared-memory read of variant 3. A thread's rows are ty+16*i
//              and its columns tx+16*j, so neighbouring threads read
//              neighbouring shared-memory words (no bank conflicts) and write
//              neighbouring columns of C.
// 5 vectorised The same 64x64 tile, 4x4 outputs and K steps of 16, moved in
//              16-byte pieces (warp_tile::multiply, gemm_warp_tile.cuh): each
//              thread fetches one float4 of op(A) and one of op(B) per step
//              (one LDG.E.128 each where the matrix is 16-byte aligned with a
//              row stride that is a multiple of 4 and the four floats are
//              inside it; four scalar loads at ragged edges), and owns 4
//              consecutive rows and 4 consecutive columns of C (not variant
//              4's strided ones), so its A and B values for one k are one
//              LDS.128 each: 2 shared-memory loads per 16 multiply-adds
//              instead of 8. C is written as float4 rows where aligned.
// 6 warp-tiled A 128x128 tile, K steps of 8, 256 threads as 2 x 4 warps, each
//              warp a 64x32 sub-tile and each lane an 8x8 register block
//              (2 x 2 quads of 4x4, 32 rows and 16 columns apart): 4 LDS.128
//              per 64 multiply-adds, and each staged element feeds 128
//              threads' FMAs instead of 64, so a block reads half as many
//              bytes of global memory per multiply-add as variant 5. The
//              lanes of a warp read 8 distinct A quads (128 consecutive
//              bytes) and 4 B quads, broadcast to the rest: no bank conflicts.
//              At most 128 registers per thread (__launch_bounds__(256, 2)):
//              two blocks per SM.
// 7 double-    Variant 6 with two shared-memory stages: the global loads of
//   buffered   step t+1 go out into registers before the multiply-adds of step
//              t and are stored into the other stage after them, so their
//              latency hides behind 512 FMAs per thread; one __syncthreads
//              per step instead of two.
// 8 split-K    Variant 7's tile and threads, plus a third grid dimension over
//              the reduction when the tiles alone cannot fill the GPU and K is
//              long (split_k.h): a result of 4 x 4 tiles with K = 50,000 is 16
//              blocks on 132 SMs, so blockIdx.z = 0..splits-1 each take a
//              chunk of K (a multiple of 16, at least 128 long; a K-slice of
//              the operands, warp_tile::KSlice) and write their partial tile
//              to the workspace, and a second kernel (add_partials, one thread
//              per element of C, consecutive threads along n; from 32 splits
//              add_partials_by_warp, one warp per element) adds the partials
//              in a fixed order and applies alpha and beta. Where the tiles
//              fill less than one wave (132 SMs x 2 resident blocks) the
//              split takes the fewest chunks whose blocks best fill whole
//              waves (at most 4). Without
//              atomics the sum's order is fixed, so results are bitwise the
//              same from run to run. Where the tiles already fill a wave or
//              K is short it is variant 7 (no workspace).
//
// Every variant handles ragged sizes: threads outside C write nothing, and
// tiles are padded with zeros where they pass the edge of op(A) or op(B).
// With beta == 0, C is not read (it may hold garbage or NaN, as in BLAS).
// Limits: M, N, K below 2^31 (indices are int); addresses are 64-bit.
#include <cstdint>
#include <string>

#include "kernels/cuda/cuda_compat.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/gemm_tile.cuh"
#include "kernels/cuda/gemm_warp_tile.cuh"
#include "kernels/cuda/split_k.h"

namespace anvil::cuda {

namespace gemm_kernels {

using tile::Strided;

// op(A) as an operand: (m, k) is A[k*lda + m] when transposed.
template <bool TA>
using OpA = Strided<TA>;
// op(B) as an operand: (n, k) is B[k*ldb + n] unless transposed.
template <bool TB>
using OpB = Strided<!TB>;

__device__ __forceinline__ void store(float* C, int64_t ldc, int m, int n, float acc,
                                      float alpha, float beta) {
  float* c = C + int64_t(m) * ldc + n;
  *c = beta == 0.0f ? alpha * acc : alpha * acc + beta * *c;  // beta == 0: C not read
}

constexpr int kNaiveThreads = 32 * 32;  // variants 1-3: 32 x 32 threads per block

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
__global__ void __launch_bounds__(kNaiveThreads)
    gemm_coalesced(int M, int N, int K, float alpha, OpA<TA> a, OpB<TB> b, float beta,
                   float* __restrict__ C, int64_t ldc) {
  int col = blockIdx.x * blockDim.x + threadIdx.x;
  int row = blockIdx.y * blockDim.y + threadIdx.y;
  if (row >= M || col >= N) return;
  float acc = 0.0f;
  for (int k = 0; k < K; ++k) acc += a(row, k) * b(col, k);
  store(C, ldc, row, col, acc, alpha, beta);
}

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
__global__ void __launch_bounds__(tile::kThreads)
    gemm_register_blocked(int M, int N, int K, float alpha, OpA<TA> a, OpB<TB> b, float beta,
                          float* __restrict__ C, int64_t ldc) {
  tile::register_blocked(M, N, K, a, b,
                         [&](int m, int n, float acc) { store(C, ldc, m, n, acc, alpha, beta); });
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

template <bool TA, bool TB>
__global__ void __launch_bounds__(warp_tile::Vectorised::kThreads,
                                  warp_tile::Vectorised::kMinBlocks)
    gemm_vectorised(int M, int N, int K, OpA<TA> a, OpB<TB> b, StoreC c) {
  warp_tile::multiply<warp_tile::Vectorised>(M, N, K, a, b, c);
}

template <bool TA, bool TB>
__global__ void __launch_bounds__(warp_tile::WarpTiled::kThreads,
                                  warp_tile::WarpTiled::kMinBlocks)
    gemm_warp_tiled(int M, int N, int K, OpA<TA> a, OpB<TB> b, StoreC c) {
  warp_tile::multiply<warp_tile::WarpTiled>(M, N, K, a, b, c);
}

template <bool TA, bool TB>
__global__ void __launch_bounds__(warp_tile::DoubleBuffered::kThreads,
                                  warp_tile::DoubleBuffered::kMinBlocks)
    gemm_double_buffered(int M, int N, int K, OpA<TA> a, OpB<TB> b, StoreC c) {
  warp_tile::multiply<warp_tile::DoubleBuffered>(M, N, K, a, b, c);
}

// Variant 8: variant 7 on the K-slice [z*chunk, z*chunk + chunk) of
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
// (coalesced), adding z = 0, 1, ... in order.
constexpr int kSumThreads = 256, kWarpSplits = 32;
__global__ void __launch_bounds__(kSumThreads)
    add_partials(int splits, int M, int N, const float* __restrict__ partials, float alpha,
                 float beta, float* __restrict__ C, int64_t ldc) {
  const int64_t i = int64_t(blockIdx.x) * kSumThreads + threadIdx.x, MN = int64_t(M) * N;
  if (i >= MN) return;
  float acc = 0.0f;
  for (int z = 0; z < splits; ++z) acc += partials[z * MN + i];
  store(C, ldc, int(i / N), int(i % N), acc, alpha, beta);
}

// From kWarpSplits partials per element: one warp per element of C, lane l
// adding z = l, l + 32, ... in order, then a shuffle tree (a fixed order
// too); the reads are scattered, but there are few elements.
__global__ void __launch_bounds__(kSumThreads)
    add_partials_by_warp(int splits, int M, int N, const float* __restrict__ partials, float alpha,
                         float beta, float* __restrict__ C, int64_t ldc) {
  const int64_t i = (int64_t(blockIdx.x) * kSumThreads + threadIdx.x) / 32, MN = int64_t(M) * N;
  const int lane = int(threadIdx.x) % 32;
  if (i >= MN) return;  // i is the same for the whole warp: all its lanes leave
  float acc = 0.0f;
  for (int z = lane; z < splits; z += 32) acc += partials[z * MN + i];
  for (int offset = 16; offset > 0; offset /= 2) acc += __shfl_down_sync(0xffffffffu, acc, offset);
  if (lane == 0) store(C, ldc, int(i / N), int(i % N), acc, alpha, beta);
}

StoreC store_c(float* C, int64_t ldc, float alpha, float beta) {
  return StoreC{C, ldc, alpha, beta,
                reinterpret_cast<std::uintptr_t>(C) % 16 == 0 && ldc % 4 == 0};
}

split_k::Plan split_plan(int64_t M, int64_t N, int64_t K) {
  using S = warp_tile::DoubleBuffered;
  const int64_t tiles = ((M + S::kBM - 1) / S::kBM) * ((N + S::kBN - 1) / S::kBN);
  return split_k::plan(M, N, K, tiles, S::kMinBlocks);
}

// Variant 8 (see the top of this file).
template <bool TA, bool TB>
void launch_split_k(int M, int N, int K, float alpha, const float* A, int64_t lda,
                    const float* B, int64_t ldb, float beta, float* C, int64_t ldc,
                    float* workspace, cudaStream_t stream) {
  using S = warp_tile::DoubleBuffered;
  auto up = [](int n, int d) { return static_cast<unsigned>((n + d - 1) / d); };
  const split_k::Plan plan = split_plan(M, N, K);
  const dim3 grid(up(N, S::kBN), up(M, S::kBM), static_cast<unsigned>(plan.splits));
  const auto a = tile::strided<OpA<TA>::kMajor>(A, lda);
  const auto b = tile::strided<OpB<TB>::kMajor>(B, ldb);
  if (plan.splits == 1) {
    launch(gemm_split_k<TA, TB>, grid, dim3(S::kThreads), 0, stream, M, N, K, K, a, b,
           store_c(C, ldc, alpha, beta));
    return;
  }
  launch(gemm_split_k<TA, TB>, grid, dim3(S::kThreads), 0, stream, M, N, K, int(plan.chunk), a,
         b, store_c(workspace, N, 1.0f, 0.0f));
  split_k::sum_split_k(plan.splits, M, N, workspace, alpha, beta, C, ldc, stream);
}

// Variants 5-7: the kernel of tile shape S, one block per S::kBM x S::kBN tile.
template <class S, bool TA, bool TB>
void launch_warp_tile(void (*kernel)(int, int, int, OpA<TA>, OpB<TB>, StoreC), int M, int N,
                      int K, float alpha, const float* A, int64_t lda, const float* B,
                      int64_t ldb, float beta, float* C, int64_t ldc, cudaStream_t stream) {
  auto up = [](int n, int d) { return static_cast<unsigned>((n + d - 1) / d); };
  const StoreC c = store_c(C, ldc, alpha, beta);
  launch(kernel, dim3(up(N, S::kBN), up(M, S::kBM)), dim3(S::kThreads), 0, stream, M, N, K,
         tile::strided<OpA<TA>::kMajor>(A, lda), tile::strided<OpB<TB>::kMajor>(B, ldb), c);
}

template <bool TA, bool TB>
void run(int variant, int M, int N, int K, float alpha, const float* A, int64_t lda,
         const float* B, int64_t ldb, float beta, float* C, int64_t ldc, float* workspace,
         cudaStream_t stream) {
  auto up = [](int n, int d) { return static_cast<unsigned>((n + d - 1) / d); };
  const OpA<TA> a{A, lda};
  const OpB<TB> b{B, ldb};
  switch (variant) {
    case 1:
      launch(gemm_naive<TA, TB>, dim3(up(M, 32), up(N, 32)), dim3(32, 32), 0, stream, M, N, K,
             alpha, a, b, beta, C, ldc);
      break;
    case 2:
      launch(gemm_coalesced<TA, TB>, dim3(up(N, 32), up(M, 32)), dim3(32, 32), 0, stream, M, N,
             K, alpha, a, b, beta, C, ldc);
      break;
    case 3:
      launch(gemm_tiled<TA, TB>, dim3(up(N, kTile), up(M, kTile)), dim3(kTile, kTile), 0, stream,
             M, N, K, alpha, a, b, beta, C, ldc);
      break;
    case 4:
      launch(gemm_register_blocked<TA, TB>, dim3(up(N, tile::kBN), up(M, tile::kBM)),
             dim3(tile::kThreads), 0, stream, M, N, K, alpha, a, b, beta, C, ldc);
      break;
    case 5:
      launch_warp_tile<warp_tile::Vectorised, TA, TB>(gemm_vectorised<TA, TB>, M, N, K, alpha, A, lda, B,
                                              ldb, beta, C, ldc, stream);
      break;
    case 6:
      launch_warp_tile<warp_tile::WarpTiled, TA, TB>(gemm_warp_tiled<TA, TB>, M, N, K, alpha, A, lda, B,
                                             ldb, beta, C, ldc, stream);
      break;
    case 7:
      launch_warp_tile<warp_tile::DoubleBuffered, TA, TB>(gemm_double_buffered<TA, TB>, M, N, K, alpha, A,
                                                  lda, B, ldb, beta, C, ldc, stream);
      break;
    default:  // 8 (checked by the caller)
      launch_split_k<TA, TB>(M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, workspace, stream);
      break;
  }
}

namespace {

void check_variant(int variant) {
  if (variant < 1 || variant > kGemmVariants)
    throw std::invalid_argument("cuda::gemm: no variant " + std::to_string(variant) +
                                " (there are 1 to " + std::to_string(kGemmVariants) + ")");
}

void check_size(const char* name, int64_t v) {
  if (v < 0 || v > INT32_MAX)
    throw std::invalid_argument(std::string("cuda::gemm: ") + name + " = " + std::to_string(v) +
                                " is out of range [0, 2^31)");
}

void check_ld(const char* name, int64_t ld, int64_t row, const char* what) {
  if (ld < row)
    throw std::invalid_argument(std::string("cuda::gemm: ") + name + " = " + std::to_string(ld) +
                                " is smaller than a row of " + what + " (" +
                                std::to_string(row) + " floats)");
}

}  // namespace

}  // namespace gemm_kernels

void split_k::sum_split_k(int splits, int M, int N, const float* partials, float alpha,
                          float beta, float* C, int64_t ldc, cudaStream_t stream) {
  using namespace gemm_kernels;
  const int64_t MN = int64_t(M) * N;
  if (MN == 0) return;
  const bool by_warp = splits >= kWarpSplits;
  const int64_t threads = by_warp ? MN * 32 : MN;
  launch(by_warp ? add_partials_by_warp : add_partials,
         dim3(static_cast<unsigned>((threads + kSumThreads - 1) / kSumThreads)),
         dim3(kSumThreads), 0, stream, splits, M, N, partials, alpha, beta, C, ldc);
}

size_t gemm_workspace_floats(int variant, int64_t M, int64_t N, int64_t K) {
  using namespace gemm_kernels;
  check_variant(variant);
  check_size("M", M);
  check_size("N", N);
  check_size("K", K);
  if (variant != 8) return 0;
  return static_cast<size_t>(split_k::workspace_floats(split_plan(M, N, K), M, N));
}

// Host entry: checks the arguments, picks the variant's kernel (one of four
// instantiations, by the transpose flags) and its launch configuration. A, B,
// C and the workspace are device pointers; the launch is asynchronous on
// `stream` (synchronous in the simulator).
void gemm(int variant, bool trans_a, bool trans_b, int64_t M64, int64_t N64, int64_t K64,
          float alpha, const float* A, int64_t lda, const float* B, int64_t ldb, float beta,
          float* C, int64_t ldc, float* workspace, cudaStream_t stream) {
  using namespace gemm_kernels;
  check_variant(variant);
  check_size("M", M64);
  check_size("N", N64);
  check_size("K", K64);
  check_ld("lda", lda, trans_a ? M64 : K64, trans_a ? "A (stored K x M)" : "A (stored M x K)");
  check_ld("ldb", ldb, trans_b ? K64 : N64, trans_b ? "B (stored N x K)" : "B (stored K x N)");
  check_ld("ldc", ldc, N64, "C (M x N)");
  if (workspace == nullptr && gemm_workspace_floats(variant, M64, N64, K64) > 0)
    throw std::invalid_argument("cuda::gemm: variant " + std::to_string(variant) + " needs " +
                                std::to_string(gemm_workspace_floats(variant, M64, N64, K64)) +
                                " floats of workspace for this shape (null given)");
  const int M = int(M64), N = int(N64), K = int(K64);
  if (M == 0 || N == 0) return;
  auto* entry = trans_a ? (trans_b ? run<true, true> : run<true, false>)
                         : (trans_b ? run<false, true> : run<false, false>);
  entry(variant, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, workspace, stream);
}

void gemm(int variant, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
          const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
          int64_t ldc, cudaStream_t stream) {
  gemm(variant, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, nullptr, stream);
}

}  // namespace anvil::cuda
