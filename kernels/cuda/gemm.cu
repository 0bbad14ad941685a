// Single-precision GEMM, row-major: C[M,N] = alpha * A[M,K] * B[K,N] + beta * C.
//
// Four variants, each a step from the one before (run with gemm(variant, ...)):
//
// 1 naive      One thread per element of C, threadIdx.x walking down M. Each
//              thread reads a row of A and a column of B from global memory.
//              Neighbouring threads of a warp touch addresses K (for A) and N
//              (for C) floats apart, so every load and store is a separate
//              memory transaction.
// 2 coalesced  The same work with threadIdx.x walking along N: a warp now reads
//              32 consecutive floats of B and writes 32 consecutive floats of
//              C (one transaction each), and all its threads read the same
//              element of A (a broadcast).
// 3 tiled      A 32x32 block of threads computes a 32x32 tile of C. It walks K
//              in steps of 32: the block loads a 32x32 tile of A and one of B
//              into shared memory (each thread one element of each, coalesced),
//              waits (__syncthreads), and every thread takes its 32
//              multiply-adds from shared memory. Each global element is now
//              read by 1/32 as many loads; the second barrier keeps the next
//              load from overwriting a tile still being read.
// 4 register   256 threads compute a 64x64 tile of C, 4x4 outputs each, held in
//   blocked    registers. Per step of 16 along K the block stages a 64x16 tile
//              of A (stored transposed, so that a thread's four A values are
//              a column read) and a 16x64 tile of B in shared memory. Each
//              thread then loads 4 values of A and 4 of B into registers and
//              does 16 multiply-adds with them: four times the arithmetic per
//              shared-memory read of variant 3. A thread's rows are ty+16*i
//              and its columns tx+16*j, so neighbouring threads read
//              neighbouring shared-memory words (no bank conflicts) and write
//              neighbouring columns of C.
//
// Every variant handles ragged sizes: threads outside C write nothing, and
// tiles are padded with zeros where they pass the edge of A or B. With
// beta == 0, C is not read (it may hold garbage, as in BLAS).
#include "kernels/cuda/cuda_compat.h"
#include "kernels/cuda/cuda_kernels.h"

namespace anvil::cuda {

namespace gemm_kernels {

__device__ __forceinline__ float epilogue(float acc, float alpha, float beta, float c) {
  return beta == 0.0f ? alpha * acc : alpha * acc + beta * c;
}

__global__ void gemm_naive(int M, int N, int K, float alpha, const float* __restrict__ A,
                           const float* __restrict__ B, float beta, float* __restrict__ C) {
  int row = blockIdx.x * blockDim.x + threadIdx.x;
  int col = blockIdx.y * blockDim.y + threadIdx.y;
  if (row >= M || col >= N) return;
  float acc = 0.0f;
  for (int k = 0; k < K; ++k) acc += A[row * K + k] * B[k * N + col];
  C[row * N + col] = epilogue(acc, alpha, beta, C[row * N + col]);
}

__global__ void gemm_coalesced(int M, int N, int K, float alpha, const float* __restrict__ A,
                               const float* __restrict__ B, float beta, float* __restrict__ C) {
  int col = blockIdx.x * blockDim.x + threadIdx.x;
  int row = blockIdx.y * blockDim.y + threadIdx.y;
  if (row >= M || col >= N) return;
  float acc = 0.0f;
  for (int k = 0; k < K; ++k) acc += A[row * K + k] * B[k * N + col];
  C[row * N + col] = epilogue(acc, alpha, beta, C[row * N + col]);
}

constexpr int kTile = 32;

__global__ void gemm_tiled(int M, int N, int K, float alpha, const float* __restrict__ A,
                           const float* __restrict__ B, float beta, float* __restrict__ C) {
  __shared__ float As[kTile][kTile];
  __shared__ float Bs[kTile][kTile];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int col = blockIdx.x * kTile + tx;
  const int row = blockIdx.y * kTile + ty;
  float acc = 0.0f;
  for (int k0 = 0; k0 < K; k0 += kTile) {
    // Out-of-range threads still load (zeros) and reach both barriers:
    // every thread of the block must.
    As[ty][tx] = (row < M && k0 + tx < K) ? A[row * K + k0 + tx] : 0.0f;
    Bs[ty][tx] = (k0 + ty < K && col < N) ? B[(k0 + ty) * N + col] : 0.0f;
    __syncthreads();
    for (int k = 0; k < kTile; ++k) acc += As[ty][k] * Bs[k][tx];
    __syncthreads();
  }
  if (row < M && col < N) C[row * N + col] = epilogue(acc, alpha, beta, C[row * N + col]);
}

constexpr int kBM = 64, kBN = 64, kBK = 16;   // block tile
constexpr int kTM = 4, kTN = 4;               // outputs per thread
constexpr int kThreads4 = (kBM / kTM) * (kBN / kTN);  // 256
constexpr int kRowThreads = kBN / kTN;        // 16 threads across a tile row

__global__ void gemm_register_blocked(int M, int N, int K, float alpha,
                                      const float* __restrict__ A, const float* __restrict__ B,
                                      float beta, float* __restrict__ C) {
  __shared__ float As[kBK][kBM];  // transposed: As[k][m]
  __shared__ float Bs[kBK][kBN];
  const int tid = threadIdx.x;
  const int tx = tid % kRowThreads, ty = tid / kRowThreads;
  const int m0 = blockIdx.y * kBM, n0 = blockIdx.x * kBN;

  float acc[kTM][kTN] = {};
  float a[kTM], b[kTN];
  for (int k0 = 0; k0 < K; k0 += kBK) {
    // 1024 elements of each tile, 4 per thread; consecutive threads take
    // consecutive elements of a row of A (along K) and of B (along N).
    for (int e = tid; e < kBM * kBK; e += kThreads4) {
      int r = e / kBK, c = e % kBK;
      int gm = m0 + r, gk = k0 + c;
      As[c][r] = (gm < M && gk < K) ? A[gm * K + gk] : 0.0f;
    }
    for (int e = tid; e < kBK * kBN; e += kThreads4) {
      int r = e / kBN, c = e % kBN;
      int gk = k0 + r, gn = n0 + c;
      Bs[r][c] = (gk < K && gn < N) ? B[gk * N + gn] : 0.0f;
    }
    __syncthreads();
    for (int k = 0; k < kBK; ++k) {
      for (int i = 0; i < kTM; ++i) a[i] = As[k][ty + i * (kBM / kTM)];
      for (int j = 0; j < kTN; ++j) b[j] = Bs[k][tx + j * kRowThreads];
      for (int i = 0; i < kTM; ++i)
        for (int j = 0; j < kTN; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
    }
    __syncthreads();
  }
  for (int i = 0; i < kTM; ++i) {
    int row = m0 + ty + i * (kBM / kTM);
    if (row >= M) continue;
    for (int j = 0; j < kTN; ++j) {
      int col = n0 + tx + j * kRowThreads;
      if (col < N) C[row * N + col] = epilogue(acc[i][j], alpha, beta, C[row * N + col]);
    }
  }
}

}  // namespace gemm_kernels

// Host entry: picks the variant's launch configuration. A, B, C are device
// pointers; the launch is asynchronous on `stream` (synchronous in the
// simulator). TEMPORARY: no transposes or strides yet.
void gemm(int variant, bool trans_a, bool trans_b, int64_t M64, int64_t N64, int64_t K64,
          float alpha, const float* A, int64_t lda, const float* B, int64_t ldb, float beta,
          float* C, int64_t ldc, cudaStream_t stream) {
  using namespace gemm_kernels;
  int M = int(M64), N = int(N64), K = int(K64);
  if (trans_a || trans_b || lda != K || ldb != N || ldc != N)
    throw std::invalid_argument("cuda::gemm: transposes and strides not implemented yet");
  if (M < 0 || N < 0 || K < 0)
    throw std::invalid_argument("cuda::gemm: negative size " + std::to_string(M) + "x" +
                                std::to_string(N) + "x" + std::to_string(K));
  if (M == 0 || N == 0) return;
  auto up = [](int n, int d) { return static_cast<unsigned>((n + d - 1) / d); };
  switch (variant) {
    case 1:
      launch(gemm_naive, dim3(up(M, 32), up(N, 32)), dim3(32, 32), 0, stream, M, N, K, alpha, A,
             B, beta, C);
      break;
    case 2:
      launch(gemm_coalesced, dim3(up(N, 32), up(M, 32)), dim3(32, 32), 0, stream, M, N, K,
             alpha, A, B, beta, C);
      break;
    case 3:
      launch(gemm_tiled, dim3(up(N, kTile), up(M, kTile)), dim3(kTile, kTile), 0, stream, M, N,
             K, alpha, A, B, beta, C);
      break;
    case 4:
      launch(gemm_register_blocked, dim3(up(N, kBN), up(M, kBM)), dim3(kThreads4), 0, stream, M,
             N, K, alpha, A, B, beta, C);
      break;
    default:
      throw std::invalid_argument("cuda::gemm: no variant " + std::to_string(variant) +
                                  " (there are 1 to 4)");
  }
}

}  // namespace anvil::cuda
