// Reductions: the sum of a vector (four variants), per-channel sums of a
// gradient (bias gradients, two variants), and the min and max of int64
// labels. Every kernel is launched with 256 threads (__launch_bounds__).
//
// sum(variant, n, x, out): out[0] = x[0] + ... + x[n-1]. Each variant is a
// step from the one before (run with sum(variant, ...)):
//
// 1 atomic     One thread per element (grid-stride when n is larger than the
//              grid), each doing atomicAdd(out, x[i]). Loads are coalesced,
//              but every atomic lands on the same address, so the memory
//              system performs them one after another: n serialised
//              read-modify-writes. The result depends on their order.
// 2 tree       256 threads per block. Each thread first adds up its
//              grid-stride slice of x in a register (x[i], x[i + 256*grid],
//              ...), so the number of partial sums is the number of threads
//              in the grid, not n. The block then halves its 256 partials in
//              shared memory, smem[t] += smem[t + s] for s = 128, 64, ..., 1,
//              with a __syncthreads after each step, and thread 0 issues one
//              atomicAdd per block: atomics drop from n to the grid size.
// 3 shuffle    The same per-thread accumulation, but a warp adds its 32 values
//              with five __shfl_down_sync steps: registers move between the
//              lanes of a warp without shared memory and without a barrier
//              (a warp executes together). Lane 0 of each warp writes its warp's
//              sum to smem[warp] (8 floats), one __syncthreads, and warp 0
//              adds those 8 with shuffles; one atomicAdd per block. Eight
//              shared-memory tree steps and their barriers become one.
// 4 two-pass   As 3, but each block writes its sum to workspace[block]
//   determin-  instead of an atomic; a second launch of one 256-thread block
//   istic      reduces the partials the same way. Every addition happens in an
//              order fixed by n alone (the grid size is a function of n), so
//              the result is bitwise the same on every run, and out needs no
//              zeroing and no atomics. The second launch costs a few
//              microseconds, nothing next to a large vector.
//
// Variants 1-3 zero out[0] on the stream (cudaMemsetAsync) before their
// kernel. The grid is capped (kMaxBlocks), each thread looping over its
// grid-stride slice; indices are int64, so n may exceed 2^31. n == 0 gives 0.
//
// channel_sum(variant, outer, C, inner, dy, db, workspace): db[c] = the sum
// of dy[o, c, i] over o and i, overwriting db; deterministic in both
// variants (no atomics). A channel is `outer` runs of `inner` contiguous
// floats, C*inner apart.
//
// 1 block per  One 256-thread block per channel walks the channel's
//   channel    outer*inner elements as one flat range k (o = k / inner,
//              i = k % inner): consecutive threads read consecutive i,
//              coalesced when inner is large. The block sum is done as in sum
//              variant 3. The grid is C blocks: 64 channels fill 64 of an
//              H100's 132 SMs, each thread with one load in flight at a time.
// 2 split      Several blocks per channel (channel_split.cuh): the channel is
//              cut into S contiguous slices, S = floor(1056 / C) so that the
//              C*S blocks fill every SM's 8 block slots once (64 channels:
//              1024 blocks), but with at least 512 floats per slice. Each
//              thread issues 4 independent scalar loads, or 2 float4 loads
//              when inner is a multiple of 4 and dy is 16-byte aligned,
//              before adding them. Each block's sum goes to workspace[c*S +
//              s]; a second kernel (one warp per channel) adds each channel's
//              S partials in double, in a fixed order. The default
//              (kBestChannelSum): C*S blocks fill the GPU where variant 1's C
//              blocks leave most SMs idle.
//              With inner == 1 (a linear layer's bias gradient: dy is an
//              [outer, C] matrix) a channel is a column, one float every C,
//              and a block over it would read one 32-byte sector per float.
//              Variant 2 then sums columns instead (column_sum_rows): thread
//              c of block (x, s) adds column c over row slice s (at least 8
//              rows, slices enough for a wave of blocks), so a warp reads 32
//              consecutive floats of each row; the slices' partials go
//              through the same fixed-order fold.
//
// label_min_max(n, labels, out): one block of 256 threads (labels are a
// batch, a few thousand at most), each thread keeping the min and max of its
// strided slice, then warp shuffles of the int64 values (__shfl_xor_sync
// moves 8-byte types) and a shared-memory step across the 8 warps.
#include <algorithm>
#include <stdexcept>
#include <string>

#include "kernels/cuda/channel_split.cuh"
#include "kernels/cuda/cuda_compat.h"
#include "kernels/cuda/cuda_kernels.h"

namespace anvil::cuda {

namespace reduce_kernels {

constexpr int kThreads = 256;  // every kernel here: 8 full warps
constexpr int kWarps = kThreads / 32;
constexpr int64_t kMaxBlocks = 1024;
constexpr unsigned kFullMask = 0xffffffffu;

// The sum of the warp's 32 values, in lane 0 (the other lanes hold partials).
__device__ __forceinline__ float warp_sum(float v) {
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_down_sync(kFullMask, v, offset);
  return v;
}

// The sum of v over the block (kThreads threads), valid in thread 0.
// warp_sums: kWarps floats of shared memory, not in use by anyone else.
__device__ __forceinline__ float block_sum(float v, float* warp_sums) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  v = warp_sum(v);
  if (lane == 0) warp_sums[warp] = v;
  __syncthreads();
  v = 0.0f;
  if (warp == 0) v = warp_sum(lane < kWarps ? warp_sums[lane] : 0.0f);
  return v;
}

// This thread's grid-stride slice of x, summed in a register.
__device__ __forceinline__ float thread_slice_sum(int64_t n, const float* __restrict__ x) {
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  float acc = 0.0f;
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += stride) acc += x[i];
  return acc;
}

__global__ void __launch_bounds__(kThreads)
    sum_atomic(int64_t n, const float* __restrict__ x, float* out) {
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += stride)
    atomicAdd(out, x[i]);
}

__global__ void __launch_bounds__(kThreads)
    sum_tree(int64_t n, const float* __restrict__ x, float* out) {
  __shared__ float partial[kThreads];
  const int t = threadIdx.x;
  partial[t] = thread_slice_sum(n, x);
  __syncthreads();
  for (int s = kThreads / 2; s > 0; s /= 2) {
    if (t < s) partial[t] += partial[t + s];
    __syncthreads();
  }
  if (t == 0) atomicAdd(out, partial[0]);
}

__global__ void __launch_bounds__(kThreads)
    sum_shuffle(int64_t n, const float* __restrict__ x, float* out) {
  __shared__ float warp_sums[kWarps];
  const float total = block_sum(thread_slice_sum(n, x), warp_sums);
  if (threadIdx.x == 0) atomicAdd(out, total);
}

// Pass 1 of variant 4: partials[block] = the block's sum.
__global__ void __launch_bounds__(kThreads)
    sum_partials(int64_t n, const float* __restrict__ x, float* __restrict__ partials) {
  __shared__ float warp_sums[kWarps];
  const float total = block_sum(thread_slice_sum(n, x), warp_sums);
  if (threadIdx.x == 0) partials[blockIdx.x] = total;
}

// Pass 2 of variant 4 (one block): out[0] = the sum of the partials.
__global__ void __launch_bounds__(kThreads)
    sum_final(int64_t count, const float* __restrict__ partials, float* out) {
  __shared__ float warp_sums[kWarps];
  const float total = block_sum(thread_slice_sum(count, partials), warp_sums);
  if (threadIdx.x == 0) out[0] = total;
}

__global__ void __launch_bounds__(kThreads)
    channel_sum_kernel(int64_t outer, int64_t C, int64_t inner, const float* __restrict__ dy,
                       float* __restrict__ db) {
  __shared__ float warp_sums[kWarps];
  const int64_t c = blockIdx.x, count = outer * inner;
  float acc = 0.0f;
  for (int64_t k = threadIdx.x; k < count; k += kThreads) {
    const int64_t o = k / inner, i = k - o * inner;
    acc += dy[(o * C + c) * inner + i];
  }
  const float total = block_sum(acc, warp_sums);
  if (threadIdx.x == 0) db[c] = total;
}

// Variant 2, pass 1: partials[block] = the sum of the block's slice of its
// channel (block = c*S + s). V floats per unit (4: float4 loads); Index int
// when dy has fewer than 2^31 floats.
template <int V, typename Index>
__global__ void __launch_bounds__(channel_split::kThreads, channel_split::kMinBlocks<Index>)
    channel_sum_split(channel_split::SplitArgs<Index> a, const float* __restrict__ dy,
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

// Variant 2 with inner == 1, pass 1: partials[c*S + s] = the sum of column c
// of dy [outer, C] over rows [s*rows, (s+1)*rows); consecutive threads, consecutive
// columns.
__global__ void __launch_bounds__(channel_split::kThreads)
    column_sum_rows(int64_t outer, int64_t C, int64_t rows, const float* __restrict__ dy,
                    float* __restrict__ partials) {
  const int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= C) return;
  const int64_t s = blockIdx.y, begin = s * rows;
  const int64_t end = begin + rows < outer ? begin + rows : outer;
  float acc = 0.0f;
#pragma unroll 8
  for (int64_t o = begin; o < end; ++o) acc += dy[o * C + c];
  partials[c * gridDim.y + s] = acc;
}

// Variant 2, pass 2: db[c] = the sum of channel c's S partials (one warp per
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

__global__ void __launch_bounds__(kThreads)
    label_min_max_kernel(int64_t n, const int64_t* __restrict__ labels, int64_t* __restrict__ out) {
  __shared__ int64_t warp_min[kWarps], warp_max[kWarps];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  int64_t lo = labels[0], hi = labels[0];  // n >= 1; a neutral start for idle threads
  for (int64_t i = threadIdx.x; i < n; i += kThreads) {
    const int64_t v = labels[i];
    lo = v < lo ? v : lo;
    hi = v > hi ? v : hi;
  }
  for (int offset = 16; offset > 0; offset /= 2) {
    const int64_t other_lo = __shfl_xor_sync(kFullMask, lo, offset);
    const int64_t other_hi = __shfl_xor_sync(kFullMask, hi, offset);
    lo = other_lo < lo ? other_lo : lo;
    hi = other_hi > hi ? other_hi : hi;
  }
  if (lane == 0) warp_min[warp] = lo, warp_max[warp] = hi;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kWarps; ++w) {
      lo = warp_min[w] < lo ? warp_min[w] : lo;
      hi = warp_max[w] > hi ? warp_max[w] : hi;
    }
    out[0] = lo;
    out[1] = hi;
  }
}

// Blocks for a grid-stride pass over n elements (n > 0).
int64_t blocks_for(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return b < kMaxBlocks ? b : kMaxBlocks;
}

void check_variant(int variant) {
  if (variant < 1 || variant > kSumVariants)
    throw std::invalid_argument("cuda::sum: no variant " + std::to_string(variant) +
                                " (there are 1 to " + std::to_string(kSumVariants) + ")");
}

template <typename Index>
void launch_channel_sum_split(const channel_split::Plan& p, int64_t C, int64_t inner,
                              const float* dy, float* partials, cudaStream_t stream) {
  const auto pass1 = p.vec == 4 ? channel_sum_split<4, Index> : channel_sum_split<1, Index>;
  launch(pass1, static_cast<unsigned>(p.blocks(C)), dim3(channel_split::kThreads), 0, stream,
         channel_split::SplitArgs<Index>::make(p, C, inner), dy, partials);
}

// Row slices of variant 2's column sums (inner == 1): enough for a wave of
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

// The number of partials per channel variant 2 writes (its workspace / C).
int64_t channel_sum_slices(int64_t outer, int64_t C, int64_t inner) {
  return inner == 1 ? column_slices(C, outer) : channel_split::split_count(C, outer * inner);
}

void check_channel_sum_variant(int variant) {
  if (variant < 1 || variant > kChannelSumVariants)
    throw std::invalid_argument("cuda::channel_sum: no variant " + std::to_string(variant) +
                                " (there are 1 to " + std::to_string(kChannelSumVariants) + ")");
}

void check_count(const char* what, int64_t v) {
  if (v < 0)
    throw std::invalid_argument(std::string(what) + " = " + std::to_string(v) + " is negative");
}

}  // namespace reduce_kernels

size_t sum_workspace_floats(int variant, int64_t n) {
  using namespace reduce_kernels;
  check_variant(variant);
  check_count("cuda::sum_workspace_floats: n", n);
  return variant == 4 && n > 0 ? static_cast<size_t>(blocks_for(n)) : 0;
}

void sum(int variant, int64_t n, const float* x, float* out, float* workspace,
         cudaStream_t stream) {
  using namespace reduce_kernels;
  check_variant(variant);
  check_count("cuda::sum: n", n);
  if (variant != 4 || n == 0) {
    check(cudaMemsetAsync(out, 0, sizeof(float), stream), "cuda::sum: zeroing out");
    if (n == 0) return;
  }
  const unsigned blocks = static_cast<unsigned>(blocks_for(n));
  switch (variant) {
    case 1: {
      const int64_t b = (n + kThreads - 1) / kThreads;  // up to one element per thread
      launch(sum_atomic, static_cast<unsigned>(b < 65536 ? b : 65536), dim3(kThreads), 0, stream,
             n, x, out);
      break;
    }
    case 2: launch(sum_tree, blocks, dim3(kThreads), 0, stream, n, x, out); break;
    case 3: launch(sum_shuffle, blocks, dim3(kThreads), 0, stream, n, x, out); break;
    default:
      if (workspace == nullptr)
        throw std::invalid_argument("cuda::sum: variant 4 needs sum_workspace_floats(4, n) floats "
                                    "of workspace");
      launch(sum_partials, blocks, dim3(kThreads), 0, stream, n, x, workspace);
      launch(sum_final, 1u, dim3(kThreads), 0, stream, int64_t{blocks}, workspace, out);
      break;
  }
}

size_t channel_sum_workspace_floats(int variant, int64_t outer, int64_t C, int64_t inner) {
  using namespace reduce_kernels;
  check_channel_sum_variant(variant);
  check_count("cuda::channel_sum_workspace_floats: outer", outer);
  check_count("cuda::channel_sum_workspace_floats: C", C);
  check_count("cuda::channel_sum_workspace_floats: inner", inner);
  if (variant == 1 || C == 0) return 0;
  return static_cast<size_t>(C * channel_sum_slices(outer, C, inner));
}

void channel_sum(int variant, int64_t outer, int64_t C, int64_t inner, const float* dy, float* db,
                 float* workspace, cudaStream_t stream) {
  using namespace reduce_kernels;
  check_channel_sum_variant(variant);
  check_count("cuda::channel_sum: outer", outer);
  check_count("cuda::channel_sum: C", C);
  check_count("cuda::channel_sum: inner", inner);
  if (C > INT32_MAX) throw std::invalid_argument("cuda::channel_sum: C is 2^31 or more");
  if (C == 0) return;
  if (variant == 1) {
    launch(channel_sum_kernel, static_cast<unsigned>(C), dim3(kThreads), 0, stream, outer, C,
           inner, dy, db);
    return;
  }
  if (workspace == nullptr)
    throw std::invalid_argument("cuda::channel_sum: variant 2 needs channel_sum_workspace_floats "
                                "floats of workspace");
  // Pass 1 writes `splits` partials per channel (column sums or slices);
  // pass 2 folds them.
  int64_t splits;
  if (inner == 1) {
    splits = column_slices(C, outer);
    const dim3 grid(static_cast<unsigned>((C + kThreads - 1) / kThreads),
                    static_cast<unsigned>(splits));
    launch(column_sum_rows, grid, dim3(kThreads), 0, stream, outer, C,
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

void label_min_max(int64_t n, const int64_t* labels, int64_t* out, cudaStream_t stream) {
  using namespace reduce_kernels;
  if (n < 1)
    throw std::invalid_argument("cuda::label_min_max: n = " + std::to_string(n) +
                                " (needs n >= 1)");
  launch(label_min_max_kernel, 1u, dim3(kThreads), 0, stream, n, labels, out);
}

}  // namespace anvil::cuda
