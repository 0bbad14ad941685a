// The register-blocked GEMM tile shared by GEMM rung 04 (gemm/) and the
// implicit-GEMM convolutions (conv/): one block of 256 threads computes a
// 64x64 tile of C = op(A) * op(B) (an M x N result, reduction length K), 4x4
// outputs per thread held in registers, walking K in steps of 16 through two
// shared-memory tiles.
//
// The operands are not pointers but accessors, so that the same core reads a
// row-major matrix, its transpose, or a matrix that exists only as an index
// function (the column matrix of a convolution, gathered from the image):
//
//   struct Operand {
//     static constexpr bool kMajor;                 // see stage() below
//     __device__ float operator()(int j, int k) const;
//   };
//
// For A, j is the row m of op(A); for B, j is the column n of op(B); k runs
// along the reduction in both. The core only asks for (j, k) inside the
// matrix and puts zeros in the tiles past its edges. The result goes through
// `put(m, n, acc)`, called once per element of C inside M x N.
//
// Shared memory holds both tiles indexed [k][j] (A's tile is "transposed":
// a thread's four A values for one k are a row of it). Each row is padded by
// kPad = 2 floats: whichever way a tile is filled (below), the 32 stores of
// a warp then land in 32 different banks, and the reads of the inner loop
// stay conflict-free (16 threads read one A word (broadcast) and 16
// consecutive B words).
#pragma once
#include <cstdint>

#include "kernels/cuda/cuda_compat.h"
#include "kernels/cuda/vec4.cuh"

namespace anvil::cuda::tile {

constexpr int kBM = 64, kBN = 64, kBK = 16;           // block tile
constexpr int kTM = 4, kTN = 4;                       // outputs per thread
constexpr int kThreads = (kBM / kTM) * (kBN / kTN);   // 256
constexpr int kRowThreads = kBN / kTN;                // 16 threads across a tile row
constexpr int kPad = 2;

// Stages S[k][j] = get(j0 + j, k0 + k) for k < BK, j < BJ (zero outside
// J x Kd), the block's NT threads (this one is `tid`) taking elements in
// turn. The order decides which global addresses a warp touches together:
// kMajor operands (stored with j contiguous, e.g. B[k][n] or A^T stored
// [k][m]) give consecutive threads consecutive j; the others (stored with k
// contiguous, e.g. A[m][k]) consecutive k. Either way a warp reads runs of
// consecutive floats of the stored matrix.
template <bool KMajor, int BK, int BJ, int NT, int LD, class Get>
__device__ __forceinline__ void stage(float (*S)[LD], int tid, int j0, int k0, int J, int Kd,
                                      const Get& get) {
  for (int e = tid; e < BK * BJ; e += NT) {
    const int k = KMajor ? e / BJ : e % BK;
    const int j = KMajor ? e % BJ : e / BK;
    const int gj = j0 + j, gk = k0 + k;
    S[k][j] = (gj < J && gk < Kd) ? get(gj, gk) : 0.0f;
  }
}

// C tile (blockIdx.y, blockIdx.x) of the M x N result; launch with
// grid (ceil(N / kBN), ceil(M / kBM)) and kThreads threads.
template <class GetA, class GetB, class Put>
__device__ __forceinline__ void register_blocked(int M, int N, int K, const GetA& ga,
                                                 const GetB& gb, const Put& put) {
  __shared__ float As[kBK][kBM + kPad];  // As[k][m]
  __shared__ float Bs[kBK][kBN + kPad];  // Bs[k][n]
  const int tid = threadIdx.x;
  const int tx = tid % kRowThreads, ty = tid / kRowThreads;
  const int m0 = blockIdx.y * kBM, n0 = blockIdx.x * kBN;

  float acc[kTM][kTN] = {};
  float a[kTM], b[kTN];
  for (int k0 = 0; k0 < K; k0 += kBK) {
    stage<GetA::kMajor, kBK, kBM, kThreads>(As, tid, m0, k0, M, K, ga);
    stage<GetB::kMajor, kBK, kBN, kThreads>(Bs, tid, n0, k0, N, K, gb);
    __syncthreads();
    for (int k = 0; k < kBK; ++k) {
      for (int i = 0; i < kTM; ++i) a[i] = As[k][ty + i * (kBM / kTM)];
      for (int j = 0; j < kTN; ++j) b[j] = Bs[k][tx + j * kRowThreads];
      for (int i = 0; i < kTM; ++i)
        for (int j = 0; j < kTN; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
    }
    __syncthreads();  // the next stage() must not overwrite tiles still being read
  }
  // Rows ty + 16i, columns tx + 16j: neighbouring threads write neighbouring
  // columns of C.
  for (int i = 0; i < kTM; ++i) {
    const int row = m0 + ty + i * (kBM / kTM);
    if (row >= M) continue;
    for (int j = 0; j < kTN; ++j) {
      const int col = n0 + tx + j * kRowThreads;
      if (col < N) put(row, col, acc[i][j]);
    }
  }
}

// A row-major matrix of T (float, or bfloat16 for the BF16 tensor-core
// tile, mma_tile.cuh) with row stride ld, read as an operand: element (j, k)
// is p[k * ld + j] when KMajor (B as stored, or A stored transposed) and
// p[j * ld + k] otherwise (A as stored, or B stored transposed).
//
// The tiles of warp_tile.cuh also read four elements at once along the
// contiguous index (j when KMajor, else k) with one load (128-bit for
// float, 64-bit for bfloat16), starting at a multiple of 4, when `aligned`
// says that is safe: p on a boundary of 4 elements and ld a multiple of 4
// (see strided() below).
template <bool KMajor, class T = float>
struct Strided {
  static constexpr bool kMajor = KMajor;
  const T* p;
  int64_t ld;
  bool aligned = false;
  __device__ __forceinline__ T operator()(int j, int k) const {
    return KMajor ? p[int64_t(k) * ld + j] : p[int64_t(j) * ld + k];
  }
  // Elements (j..j+3, k) when KMajor, else (j, k..k+3); all inside the matrix.
  __device__ __forceinline__ auto quad(int j, int k) const { return vec::load4(at(j, k)); }
  // Where element (j, k) is (for copies that take an address: cp.async).
  __device__ __forceinline__ const T* at(int j, int k) const {
    return KMajor ? p + int64_t(k) * ld + j : p + int64_t(j) * ld + k;
  }
};

// Host side: the operand, with `aligned` worked out from p and ld.
template <bool KMajor, class T>
Strided<KMajor, T> strided(const T* p, int64_t ld) {
  return Strided<KMajor, T>{
      p, ld, reinterpret_cast<std::uintptr_t>(p) % (4 * sizeof(T)) == 0 && ld % 4 == 0};
}

}  // namespace anvil::cuda::tile
