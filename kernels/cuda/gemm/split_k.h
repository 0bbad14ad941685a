// Split-K: how many chunks to cut a GEMM's reduction into when its M x N
// tiles are too few to fill the GPU (GEMM rung 08, gemm/08_split_k.cu; the
// weight gradient of convolution rungs 02 and 05, conv/), and the second pass
// that adds the chunks' partial tiles. Host code; the tests include it to
// check that their shapes do split.
//
// Blocks (tile, chunk z) write their partial M x N tiles to the workspace,
// partial z at z*M*N; sum_split_k then adds them in the order z = 0, 1, ...
// for every element: no atomics, so results are bitwise the same from run to
// run (and the same on every GPU: the plan depends on the shape only).
#pragma once
#include <algorithm>
#include <cstdint>

#include "core/bfloat16.h"
#include "kernels/cuda/runtime.h"

namespace anvil::cuda::split_k {

// The GPU the splits are sized for: an H100 (132 SMs). A wave is 132 SMs x
// the kernel's resident blocks per SM; a split aims at full waves (at most
// four), since a last wave only partly full idles the rest of the GPU for as
// long as a full one.
constexpr int64_t kSMs = 132, kMaxWaves = 4;
// Every chunk but the last does at least 128 steps of k (16 of the warp
// tile's BK = 8): per 128x128 tile that is 2M multiply-adds against 64 KB of
// partial written and read back, 32 FMA per byte, above an H100's ~20
// FLOP/byte ridge. (The bound is on the aligned chunk, not on K / 128: K =
// 500 takes 4 chunks of 128, 116, not 3 of 176, 176, 148.)
constexpr int64_t kMinChunk = 128;
// Chunks start on multiples of 16, so that a K-slice of an aligned operand
// stays 16-byte aligned and every chunk but the last is whole BK steps.
constexpr int64_t kChunkAlign = 16;
// Enough for two waves of a one-tile result at 3 blocks per SM (792).
constexpr int64_t kMaxSplits = 1024;
constexpr int64_t kMaxPartialFloats = int64_t(1) << 26;  // 256 MB of partials at most

struct Plan {
  int splits;     // grid.z; 1: no split, no workspace, no second pass
  int64_t chunk;  // k-steps per split (a multiple of kChunkAlign unless splits == 1)
};

// K cut into `splits` chunks: each ceil(K / splits), rounded up to kChunkAlign.
inline int64_t chunk_length(int64_t K, int64_t splits) {
  const int64_t chunk = (K + splits - 1) / splits;
  return (chunk + kChunkAlign - 1) / kChunkAlign * kChunkAlign;
}

// The most chunks K can be cut into with every chunk but the last at least
// kMinChunk long (the aligned chunk shrinks as the count grows).
inline int64_t max_splits(int64_t K) {
  int64_t s = K / kMinChunk;
  while (s >= 1) {
    const int64_t next = chunk_length(K, s + 1);
    if (next < kMinChunk || (K + next - 1) / next != s + 1) break;
    ++s;
  }
  return s;
}

// The plan for an M x N result of `tiles` blocks, reduction length K, of a
// kernel that keeps `blocks_per_sm` blocks resident on an SM. Tiles that
// fill a wave already are left alone: splitting them would add the
// partials' memory traffic for little more than a shorter tail.
inline Plan plan(int64_t M, int64_t N, int64_t K, int64_t tiles, int64_t blocks_per_sm) {
  const int64_t wave = kSMs * blocks_per_sm;
  if (tiles >= wave || tiles < 1) return {1, K};
  const int64_t most = std::min({max_splits(K), kMaxSplits,
                                 kMaxPartialFloats / std::max<int64_t>(1, M * N)});
  // The fewest splits whose blocks best fill their waves (blocks / (waves *
  // wave)); unsplit, the tiles fill tiles / wave of one.
  int64_t splits = 1;
  double best = double(tiles) / double(wave);
  for (int64_t s = 2; s <= most; ++s) {
    const int64_t blocks = tiles * s, waves = (blocks + wave - 1) / wave;
    if (waves > kMaxWaves) break;
    const double fill = double(blocks) / double(waves * wave);
    if (fill > best) best = fill, splits = s;
  }
  if (splits <= 1) return {1, K};
  const int64_t chunk = chunk_length(K, splits);
  return {int((K + chunk - 1) / chunk), chunk};  // no empty chunk
}

// Floats of workspace the plan's partials take (0 without a split).
inline int64_t workspace_floats(const Plan& p, int64_t M, int64_t N) {
  return p.splits > 1 ? p.splits * M * N : 0;
}

// C[m*ldc + n] = alpha * sum over z of partials[z*M*N + m*N + n] (+ bias[n]
// when bias is not null) + beta * C (C not read when beta == 0), in an order
// fixed by `splits` (gemm/08_split_k.cu): below 32 splits one thread per
// element of C adds z = 0, 1, ...; from 32, one warp per element, lane l
// adding z = l, l + 32, ..., then a shuffle tree across the lanes, so that
// hundreds of partials (a one-tile weight gradient) are not one thread's
// chain of dependent adds. A bfloat16 C gets the float32 C's value rounded
// once, to nearest even (the partials stay float32).
void sum_split_k(int splits, int M, int N, const float* partials, float alpha, float beta,
                 const float* bias, float* C, int64_t ldc, cudaStream_t stream);
void sum_split_k(int splits, int M, int N, const float* partials, float alpha, float beta,
                 const float* bias, bfloat16* C, int64_t ldc, cudaStream_t stream);

}  // namespace anvil::cuda::split_k
