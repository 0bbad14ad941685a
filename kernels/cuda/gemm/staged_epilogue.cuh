// The epilogue of the tensor-core kernels (GEMM rungs 09-12, convolution
// rungs 06-09; the multistage mainloop's and mma_tile.cuh's): each warp's
// accumulators go through shared memory, the pipeline's stages (free once
// the mainloop is done), and come back four consecutive elements a thread,
// in the order the store wants; one loop, not unrolled, hands them to put.
//
// Why. Stored straight from the mma fragments, put is inlined once per
// accumulator pair, 64 times a thread for a 64 x 64 warp tile. With a put
// that applies alpha, beta, a bias and bfloat16 rounding (GEMM), or finds a
// pixel's NCHW address (conv), those copies were most of nvcc's time on
// these kernels (docs/kernels.md, "The epilogue"). Here put is emitted once
// per pass (one, two or four a kernel), what it needs of a thread's fixed
// index is computed once, outside the loop, and a warp's stores cover whole
// runs of C's rows or of y's pixels rather than 8-byte pieces of eight rows.
//
// Orders. A thread's four rows or four columns stay the same through a
// pass: put(fixed, valid) is called once for them and returns a store,
// called per element of the other index with v, four FP32 sums:
//   kRows     put(n, valid); store(m, v), v = C[m][n..n+3], `valid` of them
//             inside N (a row-major C: GEMM, the bias of the columns loaded
//             once).
//   kColumns  put(m, valid); store(n, v), v = C[m..m+3][n], `valid` of them
//             inside M (an NCHW y, whose rows of C are pixels: conv, the
//             pixels' addresses found once).
//
// Shared memory, per warp, R x W floats (W = the warp tile's columns; R = 64,
// its rows, or 32 or 16 in passes where the stages hold less), unpadded:
//   kRows     row-major; 16-byte chunk c of row m at c ^ 2 key(m), key(m)
//             = m % 4 (PermRows: m / 2 % 4).
//   kColumns  column-major; element m of column n at m ^ 8 (n / 2 % 4).
// Banks. A fragment's lane (g, t) holds rows g and g + 8 (PermRows: 2g and
// 2g + 1) at columns n, n + 1, n = 8j + 2t.
//   kRows writes 8-byte pairs; a half-warp (g = 0..3 or 4..7, t = 0..3)
//   covers chunks {2j, 2j + 1} ^ 2 key, key = g % 4: the 8 chunks of one
//   aligned group of 8, all 32 banks. Its reads are 16-byte chunks, a
//   quarter-warp 8 consecutive chunks of one row, which the XOR permutes
//   within their group of 8: all 32 banks.
//   kColumns writes single floats (rows g, g + 8: m ^ 8t takes 32 banks for
//   the 32 lanes) or, PermRows, pairs along m (rows 2g, 2g + 1: a
//   half-warp's 16 pairs at 2g ^ 8t, 32 banks). Its reads are chunks of 4
//   rows of a column (the XOR leaves bits 0-2 alone), a quarter-warp 32
//   consecutive rows of one column, permuted in blocks of 8: all 32 banks.
#pragma once
#include "kernels/cuda/cp_async.cuh"
#include "kernels/cuda/cuda_compat.h"
#include "kernels/cuda/vec4.cuh"

namespace anvil::cuda::epilogue {

enum class Order { kRows, kColumns };

// The rows of a pass: the warp tile's (kWarpM) where every warp's fits
// the stages' bytes, else 32 (two passes), else 16 (four; kRows only:
// kColumns's swizzle needs 32 rows).
template <class S>
inline constexpr int kBytesPerRow = S::kWarpsM * S::kWarpsN * S::kWarpN * int(sizeof(float));
template <class S, int Bytes>
inline constexpr int kPassRows = S::kWarpM * kBytesPerRow<S> <= Bytes ? S::kWarpM
                                 : 32 * kBytesPerRow<S> <= Bytes     ? 32
                                                                     : 16;

// The float offset of (m, n) in a pass's R x W tile.
template <Order O, bool PermRows, int R, int W>
__device__ __forceinline__ int at(int m, int n) {
  if constexpr (O == Order::kRows) {
    const int key = PermRows ? (m >> 1) & 3 : m & 3;
    return m * W + ((((n >> 2) ^ (key << 1))) << 2) + (n & 3);
  } else {
    return n * R + (m ^ (((n >> 1) & 3) << 3));
  }
}

// A warp's accumulators (S::kTilesM x S::kTilesN mma tiles from (row0, col0)
// of the M x N result; PermRows: the rows permuted as a kPermutedRows A's
// fragments, mma rows g and g + 8 of tile i being rows 16i + 2g and
// 16i + 2g + 1) through `stages` (Bytes of them, the block's) to put. Every
// thread of the block calls it once, after the mainloop.
template <class S, bool PermRows, Order O, int Bytes = S::kSharedBytes, class Put>
__device__ __forceinline__ void put_warp_tile(int M, int N, int row0, int col0, int lane,
                                              int warp,
                                              const float (&acc)[S::kTilesM][S::kTilesN][4],
                                              void* stages, const Put& put) {
  constexpr int R = kPassRows<S, Bytes>, W = S::kWarpN, kPasses = S::kWarpM / R;
  static_assert(R * kBytesPerRow<S> <= Bytes, "16 rows of every warp fit the stages");
  static_assert(O == Order::kRows || R >= 32, "kColumns's swizzle takes 32 rows or more");
  constexpr int kTilesPerPass = R / 16;
  static_assert(W % 32 == 0 && S::kTilesN * 8 == W && S::kTilesM * 16 == S::kWarpM);
  float* tile = static_cast<float*>(stages) + warp * R * W;
  const int g = lane >> 2, t = lane & 3;
  cp_async::wait_all();  // nothing is in flight (the last groups are empty)
  __syncthreads();       // every warp is past its last mma: the stages are free
  #pragma unroll
  for (int pass = 0; pass < kPasses; ++pass) {
    if (pass > 0) __syncwarp();  // the previous pass's reads are done
    #pragma unroll
    for (int ii = 0; ii < kTilesPerPass; ++ii) {
      const int i = pass * kTilesPerPass + ii;
      #pragma unroll
      for (int j = 0; j < S::kTilesN; ++j) {
        const float* a = acc[i][j];
        const int n = 8 * j + 2 * t;
        const int m0 = 16 * ii + (PermRows ? 2 * g : g), m1 = PermRows ? m0 + 1 : m0 + 8;
        if constexpr (O == Order::kRows) {
          vec::store2(tile + at<O, PermRows, R, W>(m0, n), a[0], a[1]);
          vec::store2(tile + at<O, PermRows, R, W>(m1, n), a[2], a[3]);
        } else if constexpr (PermRows) {
          vec::store2(tile + at<O, PermRows, R, W>(m0, n), a[0], a[2]);
          vec::store2(tile + at<O, PermRows, R, W>(m0, n + 1), a[1], a[3]);
        } else {
          tile[at<O, PermRows, R, W>(m0, n)] = a[0];
          tile[at<O, PermRows, R, W>(m0, n + 1)] = a[1];
          tile[at<O, PermRows, R, W>(m1, n)] = a[2];
          tile[at<O, PermRows, R, W>(m1, n + 1)] = a[3];
        }
      }
    }
    __syncwarp();  // the warp's writes are visible to its lanes
    const int first = row0 + pass * R;
    if constexpr (O == Order::kRows) {
      constexpr int kChunks = W / 4, kRowsPerStep = 32 / kChunks;
      const int c = lane % kChunks, n = col0 + 4 * c;
      if (n < N) {
        const auto store = put(n, N - n < 4 ? N - n : 4);
        #pragma unroll 1
        for (int r = lane / kChunks; r < R && first + r < M; r += kRowsPerStep)
          store(first + r, vec::load4(tile + at<O, PermRows, R, W>(r, 4 * c)));
      }
    } else {
      constexpr int kLanesPerColumn = R / 4, kColumnsPerStep = 32 / kLanesPerColumn;
      const int q = lane % kLanesPerColumn, m = first + 4 * q;
      if (m < M) {
        const auto store = put(m, M - m < 4 ? M - m : 4);
        #pragma unroll 1
        for (int c = lane / kLanesPerColumn; c < W && col0 + c < N; c += kColumnsPerStep)
          store(col0 + c, vec::load4(tile + at<O, PermRows, R, W>(4 * q, c)));
      }
    }
  }
}

}  // namespace anvil::cuda::epilogue
