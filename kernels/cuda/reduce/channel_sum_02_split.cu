// Channel-sum rung 02 (the one that ships), split: several blocks per channel
// (channel_split.cuh): the channel is cut into S contiguous slices, S =
// floor(1056 / C) so that the C*S blocks fill every SM's 8 block slots once
// (64 channels: 1024 blocks), but with at least 512 floats per slice. Each
// thread issues 4 independent scalar loads, or 2 float4 loads when inner is a
// multiple of 4 and dy is 16-byte aligned, before adding them. Each block's
// sum goes to workspace[c*S + s]; a second kernel (one warp per channel) adds
// each channel's S partials in double, in a fixed order. The default
// (kBestChannelSum): C*S blocks fill the GPU where rung 1's C blocks leave
// most SMs idle. With inner == 1 (a linear layer's bias gradient: dy is an
// [outer, C] matrix) a channel is a column, one float every C, and a block
// over it would read one 32-byte sector per float. Rung 2 then sums columns
// instead (column_sum_rows): thread c of block (x, s) adds column c over row
// slice s (at least 8 rows, slices enough for a wave of blocks), so a warp
// reads 32 consecutive floats of each row; the slices' partials go through the
// same fixed-order fold. Both passes 1 also read a bfloat16 dy (autocast's
// gradients) as stored, two bytes an element, widened to float as loaded.
//   build/sim/bench_cuda_kernels csum 2
#include <algorithm>

#include "kernels/cuda/reduce/block_sum.cuh"
#include "kernels/cuda/reduce/channel_split.cuh"
#include "kernels/element.h"

namespace anvil::cuda {
namespace reduce_kernels {

// Pass 1: partials[block] = the sum of the block's slice of its
// channel (block = c*S + s). V elements per unit (4: float4 loads, or two
// 32-bit loads of bfloat16 pairs); Index int when dy has fewer than 2^31
// elements. dy is float or bfloat16, widened as loaded and added in the
// same order: each kernel is overloaded on it (one name for the audits).
template <int V, typename Index, typename T>
__device__ __forceinline__ void channel_sum_slice(const channel_split::SplitArgs<Index>& a,
                                                  const T* __restrict__ dy,
                                                  float* __restrict__ partials) {
  using namespace channel_split;
  __shared__ Sum2<float> warp_vals[kWarps];
  const Slice<Index> slice(a);
  float acc = 0.0f;
  for_each_unit_group<V>(a, slice, [&](const Index* off, const bool* live) {
    Unit<V> u[kUnroll<V>];
    load_group<V>(u, dy, off, live);
#pragma unroll
    for (int k = 0; k < kUnroll<V>; ++k)
#pragma unroll
      for (int j = 0; j < V; ++j) acc += u[k].v[j];
  });
  const Sum2<float> total = block_reduce(Sum2<float>{acc, 0.0f}, warp_vals);
  if (threadIdx.x == 0) partials[blockIdx.x] = total.a;
}
template <int V, typename Index>
__global__ void __launch_bounds__(channel_split::kThreads, channel_split::kMinBlocks<Index>)
    channel_sum_split(channel_split::SplitArgs<Index> a, const float* __restrict__ dy,
                      float* __restrict__ partials) {
  channel_sum_slice<V>(a, dy, partials);
}
template <int V, typename Index>
__global__ void __launch_bounds__(channel_split::kThreads, channel_split::kMinBlocks<Index>)
    channel_sum_split(channel_split::SplitArgs<Index> a, const bfloat16* __restrict__ dy,
                      float* __restrict__ partials) {
  channel_sum_slice<V>(a, dy, partials);
}

// With inner == 1, pass 1: partials[c*S + s] = the sum of column c
// of dy [outer, C] over rows [s*rows, (s+1)*rows); consecutive threads, consecutive
// columns. dy float or bfloat16, as above.
template <typename T>
__device__ __forceinline__ void column_sum(int64_t outer, int64_t C, int64_t rows,
                                           const T* __restrict__ dy,
                                           float* __restrict__ partials) {
  const int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= C) return;
  const int64_t s = blockIdx.y, begin = s * rows;
  const int64_t end = begin + rows < outer ? begin + rows : outer;
  float acc = 0.0f;
#pragma unroll 8
  for (int64_t o = begin; o < end; ++o) acc += anvil::load(dy[o * C + c]);
  partials[c * gridDim.y + s] = acc;
}
__global__ void __launch_bounds__(channel_split::kThreads)
    column_sum_rows(int64_t outer, int64_t C, int64_t rows, const float* __restrict__ dy,
                    float* __restrict__ partials) {
  column_sum(outer, C, rows, dy, partials);
}
__global__ void __launch_bounds__(channel_split::kThreads)
    column_sum_rows(int64_t outer, int64_t C, int64_t rows, const bfloat16* __restrict__ dy,
                    float* __restrict__ partials) {
  column_sum(outer, C, rows, dy, partials);
}

// Pass 2: db[c] = the sum of channel c's S partials (one warp per
// channel, in double, in a fixed order).
__global__ void __launch_bounds__(channel_split::kThreads)
    channel_sum_fold(int64_t C, int64_t splits, const float* __restrict__ partials,
                     float* __restrict__ db) {
  using channel_split::Sum2;
  int64_t c;
  Sum2<double> total;
  const bool mine = channel_split::fold_partials(C, splits, c, total, [&](int64_t ch, int64_t s) {
    return Sum2<double>{partials[ch * splits + s], 0.0};
  });
  if (mine && threadIdx.x % 32 == 0) db[c] = static_cast<float>(total.a);
}

template <typename Index, typename T>
void launch_channel_sum_split(const channel_split::Plan& p, int64_t C, int64_t inner,
                              const T* dy, float* partials, cudaStream_t stream) {
  using Kernel = void (*)(channel_split::SplitArgs<Index>, const T*, float*);
  const Kernel pass1 =
      p.vec == 4 ? Kernel(channel_sum_split<4, Index>) : Kernel(channel_sum_split<1, Index>);
  launch(pass1, static_cast<unsigned>(p.blocks(C)), dim3(channel_split::kThreads), 0, stream,
         channel_split::SplitArgs<Index>::make(p, C, inner), dy, partials);
}

// Row slices of the column sums (inner == 1): enough for a wave of
// blocks, each at least kMinColumnRows rows. Short slices keep each thread's
// loads few and in flight together (a batch of 256 rows: 32 slices of 8, one
// round trip to memory each, where 4 slices of 64 would be 16 in a row).
constexpr int64_t kMinColumnRows = 8;
int64_t column_slices(int64_t C, int64_t outer) {
  const int64_t column_blocks = (C + channel_split::kThreads - 1) / channel_split::kThreads;
  const int64_t most = (outer + kMinColumnRows - 1) / kMinColumnRows;
  const int64_t s = std::min(channel_split::kWaveBlocks / column_blocks, most);
  return std::max<int64_t>(1, s);
}

// The number of partials per channel pass 1 writes (its workspace / C).
int64_t channel_sum_slices(int64_t outer, int64_t C, int64_t inner) {
  return inner == 1 ? column_slices(C, outer) : channel_split::split_count(C, outer * inner);
}

}  // namespace reduce_kernels

size_t channel_sum_rungs::split_workspace_floats(int64_t outer, int64_t C, int64_t inner) {
  return C == 0 ? 0 : static_cast<size_t>(C * reduce_kernels::channel_sum_slices(outer, C, inner));
}

namespace reduce_kernels {

template <typename T>
void split_sum(int64_t outer, int64_t C, int64_t inner, const T* dy, float* db, float* workspace,
               cudaStream_t stream) {
  // Pass 1 writes `splits` partials per channel (column sums or slices);
  // pass 2 folds them.
  int64_t splits;
  if (inner == 1) {
    splits = column_slices(C, outer);
    const dim3 grid(static_cast<unsigned>((C + kThreads - 1) / kThreads),
                    static_cast<unsigned>(splits));
    using Kernel = void (*)(int64_t, int64_t, int64_t, const T*, float*);
    launch(Kernel(column_sum_rows), grid, dim3(kThreads), 0, stream, outer, C,
           (outer + splits - 1) / splits, dy, workspace);
  } else {
    const channel_split::Plan p =
        channel_split::split_plan(outer, C, inner, channel_split::aligned16(dy));
    splits = p.splits;
    if (channel_split::int_indices(outer * C * inner, C * inner))
      launch_channel_sum_split<int>(p, C, inner, dy, workspace, stream);
    else
      launch_channel_sum_split<int64_t>(p, C, inner, dy, workspace, stream);
  }
  launch(channel_sum_fold, channel_split::fold_blocks(C), dim3(channel_split::kThreads), 0, stream,
         C, splits, workspace, db);
}

}  // namespace reduce_kernels

void channel_sum_rungs::split(int64_t outer, int64_t C, int64_t inner, const float* dy, float* db,
                              float* workspace, cudaStream_t stream) {
  reduce_kernels::split_sum(outer, C, inner, dy, db, workspace, stream);
}
void channel_sum_rungs::split(int64_t outer, int64_t C, int64_t inner, const bfloat16* dy,
                              float* db, float* workspace, cudaStream_t stream) {
  reduce_kernels::split_sum(outer, C, inner, dy, db, workspace, stream);
}

}  // namespace anvil::cuda
