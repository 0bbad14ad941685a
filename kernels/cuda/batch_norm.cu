// Batch normalisation over x[N, C, HW] per channel (training forward, eval
// forward, training backward), the same semantics as kernels/cpu/batch_norm.cpp
// (PyTorch's): the batch mean and biased variance normalise; save_mean and
// save_invstd = 1/sqrt(var + eps) are kept for the backward; the running
// statistics move towards the batch mean and the unbiased variance
// (M/(M-1), M = N*HW; with M == 1 the biased value) with `momentum`.
// Every kernel is launched with 256 threads (__launch_bounds__).
//
// Training forward and backward come in two variants (the first argument;
// kBestBatchNorm is the backend's). Both are deterministic: every addition
// happens in an order fixed by the shape, never by timing (no atomics).
//
// 1 block per  ONE BLOCK PER CHANNEL (gridDim.x = C), kBlock = 256 threads.
//   channel    A channel's M = N*HW values are N runs of HW contiguous floats,
//              CHW apart. Thread t takes the channel's elements t, t + 256,
//              t + 512, ... (in the channel's own n-major order), so a warp
//              reads 32 consecutive floats of a run (coalesced whenever
//              HW >= 32). Each thread keeps a private partial sum in a
//              register, then the block adds the 256 partials with a
//              shared-memory tree (8 halving steps, a __syncthreads after
//              each). A channel is owned by one block, so the per-channel
//              results (save_*, running_*, dgamma, dbeta) are written by its
//              thread 0 and no cross-block step is needed.
//                forward:  pass 1 sum -> mean; pass 2 sum of (x - mean)^2 ->
//                          variance (not E[x^2] - E[x]^2, which cancels badly
//                          when |mean| >> std); pass 3 writes
//                          y = (x - mean) * gamma*invstd + beta.
//                backward: pass 1 sums dy and dy * (x - mean) together;
//                          pass 2 writes dx = k*dy + u*(x - mean) + v with
//                          k = gamma*invstd, u = -k*invstd*sum(dy*xhat)/M,
//                          v = -k*sum(dy)/M.
//              Sums are in float: a few hundred values per thread and a tree
//              of depth 8 round to around 1e-6 relative. But C blocks leave
//              an H100's 132 SMs mostly idle (ResNet-18's stage 1: 64 blocks
//              each making 3 passes over 200,704 values at batch 256, one
//              load in flight per thread).
// 2 split      SEVERAL BLOCKS PER CHANNEL (channel_split.cuh): each channel
//              is cut into S contiguous slices, one 256-thread block each,
//              S = floor(1056 / C) (at least 512 floats a slice): C*S blocks
//              fill the 8 block slots of every SM once (C = 64: 1024 blocks
//              where variant 1 had 64). Each thread issues 4 independent
//              loads (float4 when HW is a multiple of 4 and the tensors are
//              16-byte aligned) before using them. Three launches a direction:
//                forward:  stats: each thread folds its values, less the
//                          channel's first value (a shift that keeps a large
//                          mean from costing the float running mean its
//                          precision), into (count, mean, M2) with Welford's
//                          update (one unit at a time), the block merges
//                          its threads' with Chan's formula (warp shuffles, a
//                          fixed tree) and writes the record to the
//                          workspace; fold: one warp per channel merges the
//                          channel's S records in double in a fixed order and
//                          writes save_mean, save_invstd and the running
//                          statistics; normalise: y as in variant 1, C*S
//                          blocks again. x is read twice, not three times,
//                          and no sum of squares is ever subtracted from
//                          another, so a large mean with a small spread keeps
//                          its precision.
//                backward: sums: per-block sum(dy) and sum(dy * (x - mean))
//                          (8 loads in flight: 4 of dy, 4 of x); fold: one
//                          warp per channel adds the S pairs in double and
//                          writes dbeta and dgamma; dx: as variant 1's
//                          pass 2, reading those two sums back.
//              The workspace holds 3 floats per block
//              (batch_norm_workspace_floats), reused by forward and backward.
//
// Eval forward is elementwise: a grid-stride loop over all N*C*HW elements
// (coalesced as in elementwise.cu), each thread computing its channel's scale
// from running_var (the per-channel values stay in cache).
#include <stdexcept>
#include <string>
#include <type_traits>

#include "kernels/cuda/channel_split.cuh"
#include "kernels/cuda/cuda_compat.h"
#include "kernels/cuda/cuda_kernels.h"

namespace anvil::cuda {

namespace batch_norm_kernels {

constexpr int kBlock = 256;  // a power of two: the tree halves it
constexpr int64_t kMaxBlocks = 2048;
constexpr int kStatsRecord = 3;  // variant 2's workspace: floats per block

// Walks the calling thread's elements of channel c: the channel's m-th value
// (m = n*HW + i) sits at n*CHW + c*HW + i. Stepping m by blockDim.x moves n
// by dn and i by di (with one carry at most), so the loop needs no division.
struct ChannelWalk {
  int64_t m, i, off;       // position in the channel, in the run, in memory
  int64_t M, HW, CHW, dn, di;
  __device__ ChannelWalk(int64_t N, int64_t C, int64_t HW_, int64_t c)
      : M(N * HW_), HW(HW_), CHW(C * HW_) {
    const int64_t step = blockDim.x;
    m = threadIdx.x;
    dn = HW > 0 ? step / HW : 0;
    di = HW > 0 ? step % HW : 0;
    const int64_t n0 = HW > 0 ? m / HW : 0;
    i = HW > 0 ? m % HW : 0;
    off = n0 * CHW + c * HW + i;
  }
  __device__ bool more() const { return m < M; }
  __device__ void next() {
    m += blockDim.x;
    i += di;
    off += dn * CHW + di;
    if (i >= HW) {
      i -= HW;
      off += CHW - HW;
    }
  }
};

// The sum of every thread's v, returned to all threads. buf: kBlock floats
// of shared memory, free again when this returns.
__device__ __forceinline__ float block_sum(float v, float* buf) {
  const int t = threadIdx.x;
  buf[t] = v;
  __syncthreads();
  for (int s = kBlock / 2; s > 0; s >>= 1) {
    if (t < s) buf[t] += buf[t + s];
    __syncthreads();
  }
  const float total = buf[0];
  __syncthreads();  // everyone has read buf[0] before buf is reused
  return total;
}

// Two sums at once (one barrier per step for both trees).
__device__ __forceinline__ void block_sum2(float& a, float& b, float* buf_a, float* buf_b) {
  const int t = threadIdx.x;
  buf_a[t] = a;
  buf_b[t] = b;
  __syncthreads();
  for (int s = kBlock / 2; s > 0; s >>= 1) {
    if (t < s) {
      buf_a[t] += buf_a[t + s];
      buf_b[t] += buf_b[t + s];
    }
    __syncthreads();
  }
  a = buf_a[0];
  b = buf_b[0];
  __syncthreads();
}

__global__ void __launch_bounds__(kBlock)
    forward_train_kernel(int64_t N, int64_t C, int64_t HW, const float* __restrict__ x,
                         const float* __restrict__ gamma, const float* __restrict__ beta, float eps,
                         float momentum, float* __restrict__ running_mean,
                         float* __restrict__ running_var, float* __restrict__ save_mean,
                         float* __restrict__ save_invstd, float* __restrict__ y) {
  __shared__ float buf[kBlock];
  const int64_t c = blockIdx.x;
  const int64_t M = N * HW;
  const float Mf = static_cast<float>(M);

  float part = 0.0f;
  for (ChannelWalk e(N, C, HW, c); e.more(); e.next()) part += x[e.off];
  const float sum = block_sum(part, buf);
  const float mean = M > 0 ? sum / Mf : 0.0f;

  part = 0.0f;
  for (ChannelWalk e(N, C, HW, c); e.more(); e.next()) {
    const float d = x[e.off] - mean;
    part += d * d;
  }
  const float ss = block_sum(part, buf);
  const float var = M > 0 ? ss / Mf : 0.0f;
  const float invstd = 1.0f / sqrtf(var + eps);

  if (threadIdx.x == 0) {
    save_mean[c] = mean;
    save_invstd[c] = invstd;
    if (running_mean) running_mean[c] = (1.0f - momentum) * running_mean[c] + momentum * mean;
    if (running_var) {
      const float unbiased = M > 1 ? ss / static_cast<float>(M - 1) : var;
      running_var[c] = (1.0f - momentum) * running_var[c] + momentum * unbiased;
    }
  }

  const float a = gamma[c] * invstd, b = beta[c];
  for (ChannelWalk e(N, C, HW, c); e.more(); e.next()) y[e.off] = (x[e.off] - mean) * a + b;
}

__global__ void __launch_bounds__(kBlock)
    backward_train_kernel(int64_t N, int64_t C, int64_t HW, const float* __restrict__ x,
                          const float* __restrict__ gamma, const float* __restrict__ save_mean,
                          const float* __restrict__ save_invstd, const float* __restrict__ dy,
                          float* __restrict__ dx, float* __restrict__ dgamma,
                          float* __restrict__ dbeta) {
  __shared__ float buf_dy[kBlock];
  __shared__ float buf_dyx[kBlock];
  const int64_t c = blockIdx.x;
  const int64_t M = N * HW;
  const float mean = save_mean[c], invstd = save_invstd[c];

  float sdy = 0.0f, sdyx = 0.0f;  // sum(dy), sum(dy * (x - mean))
  for (ChannelWalk e(N, C, HW, c); e.more(); e.next()) {
    const float g = dy[e.off];
    sdy += g;
    sdyx += g * (x[e.off] - mean);
  }
  block_sum2(sdy, sdyx, buf_dy, buf_dyx);
  const float sdyxhat = sdyx * invstd;  // sum(dy * xhat)
  if (threadIdx.x == 0) {
    dbeta[c] = sdy;
    dgamma[c] = sdyxhat;
  }
  if (M == 0) return;  // the same for every thread of the block

  const float Mf = static_cast<float>(M);
  const float k = gamma[c] * invstd;
  const float u = -k * invstd * sdyxhat / Mf;
  const float v = -k * sdy / Mf;
  for (ChannelWalk e(N, C, HW, c); e.more(); e.next())
    dx[e.off] = k * dy[e.off] + u * (x[e.off] - mean) + v;
}

// ---- variant 2: several blocks per channel (channel_split.cuh) ----

using channel_split::Moments;
using channel_split::Slice;
using channel_split::Sum2;
using channel_split::Unit;
using channel_split::for_each_unit_group;
using channel_split::kUnroll;
using channel_split::load_group;
using channel_split::SplitArgs;

constexpr int kSplitThreads = channel_split::kThreads;

// The value every block of channel c subtracts before taking moments: the
// channel's first value (0 for an empty channel, which has none).
template <typename Index>
__device__ __forceinline__ float channel_shift(const float* x, Index c, Index HW, Index units) {
  return units > 0 ? x[c * HW] : 0.0f;
}

// Forward pass 1: the (count, mean, M2) of the block's slice, the values
// less the channel's shift, to stats[block * 3 ...].
template <int V, typename Index>
__global__ void __launch_bounds__(kSplitThreads, channel_split::kMinBlocks<Index>)
    forward_stats_split(SplitArgs<Index> a, const float* __restrict__ x,
                        float* __restrict__ stats) {
  __shared__ Moments<float> warp_vals[channel_split::kWarps];
  const Slice<Index> slice(a);
  const float shift = channel_shift(x, slice.c, a.HW, a.units);
  Moments<float> m{};
  for_each_unit_group<V>(a, slice, [&](const Index* off, const bool* live) {
    Unit<V> u[kUnroll<V>];
    load_group<V>(u, x, off, live);
#pragma unroll
    for (int k = 0; k < kUnroll<V>; ++k)
      if (live[k]) channel_split::add_unit<V>(m, u[k], shift);
  });
  m = channel_split::block_reduce(m, warp_vals);
  if (threadIdx.x == 0) {
    float* rec = stats + int64_t{blockIdx.x} * kStatsRecord;
    rec[0] = m.n, rec[1] = m.mean, rec[2] = m.m2;
  }
}

// Forward pass 2, one warp per channel: merges the channel's S records.
__global__ void __launch_bounds__(kBlock)
    forward_fold(int64_t C, int64_t HW, int64_t M, const float* __restrict__ x, int64_t splits,
                 const float* __restrict__ stats, float eps, float momentum,
                 float* __restrict__ running_mean, float* __restrict__ running_var,
                 float* __restrict__ save_mean, float* __restrict__ save_invstd) {
  int64_t c;
  Moments<double> m;
  const bool mine = channel_split::fold_partials(C, splits, c, m, [&](int64_t ch, int64_t s) {
    const float* rec = stats + (ch * splits + s) * kStatsRecord;
    return Moments<double>{rec[0], rec[1], rec[2]};
  });
  if (!mine || threadIdx.x % 32 != 0) return;
  const double mean = m.mean + channel_shift(x, c, HW, M);
  const double var = M > 0 ? m.m2 / m.n : 0.0;
  const double invstd = 1.0 / sqrt(var + static_cast<double>(eps));
  save_mean[c] = static_cast<float>(mean);
  save_invstd[c] = static_cast<float>(invstd);
  if (running_mean)
    running_mean[c] = static_cast<float>((1.0 - momentum) * running_mean[c] + momentum * mean);
  if (running_var) {
    const double unbiased = M > 1 ? m.m2 / (m.n - 1) : var;
    running_var[c] = static_cast<float>((1.0 - momentum) * running_var[c] + momentum * unbiased);
  }
}

// Forward pass 3: y = (x - mean) * gamma*invstd + beta over the block's slice.
template <int V, typename Index>
__global__ void __launch_bounds__(kSplitThreads, channel_split::kMinBlocks<Index>)
    forward_normalize_split(SplitArgs<Index> a, const float* __restrict__ x,
                            const float* __restrict__ gamma, const float* __restrict__ beta,
                            const float* __restrict__ save_mean,
                            const float* __restrict__ save_invstd, float* __restrict__ y) {
  const Slice<Index> slice(a);
  const float mean = save_mean[slice.c], scale = gamma[slice.c] * save_invstd[slice.c],
              shift = beta[slice.c];
  for_each_unit_group<V>(a, slice, [&](const Index* off, const bool* live) {
    Unit<V> u[kUnroll<V>];
    load_group<V>(u, x, off, live);
#pragma unroll
    for (int k = 0; k < kUnroll<V>; ++k) {
      if (!live[k]) continue;
#pragma unroll
      for (int j = 0; j < V; ++j) u[k].v[j] = (u[k].v[j] - mean) * scale + shift;
      channel_split::store_unit<V>(y + off[k], u[k]);
    }
  });
}

// Backward pass 1: the block's sum(dy) and sum(dy * (x - mean)), to
// sums[block * 3 ...] (the third float unused).
template <int V, typename Index>
__global__ void __launch_bounds__(kSplitThreads, channel_split::kMinBlocks<Index>)
    backward_sums_split(SplitArgs<Index> a, const float* __restrict__ x,
                        const float* __restrict__ save_mean, const float* __restrict__ dy,
                        float* __restrict__ sums) {
  __shared__ Sum2<float> warp_vals[channel_split::kWarps];
  const Slice<Index> slice(a);
  const float mean = save_mean[slice.c];
  Sum2<float> acc{};
  for_each_unit_group<V>(a, slice, [&](const Index* off, const bool* live) {
    Unit<V> g[kUnroll<V>], u[kUnroll<V>];
    load_group<V>(g, dy, off, live);
    load_group<V>(u, x, off, live);
#pragma unroll
    for (int k = 0; k < kUnroll<V>; ++k)
      if (live[k])
#pragma unroll
        for (int j = 0; j < V; ++j) {
          acc.a += g[k].v[j];
          acc.b += g[k].v[j] * (u[k].v[j] - mean);
        }
  });
  acc = channel_split::block_reduce(acc, warp_vals);
  if (threadIdx.x == 0) {
    float* rec = sums + int64_t{blockIdx.x} * kStatsRecord;
    rec[0] = acc.a, rec[1] = acc.b;
  }
}

// Backward pass 2, one warp per channel: dbeta = sum(dy), dgamma = sum(dy * xhat).
__global__ void __launch_bounds__(kBlock)
    backward_fold(int64_t C, int64_t splits, const float* __restrict__ sums,
                  const float* __restrict__ save_invstd, float* __restrict__ dgamma,
                  float* __restrict__ dbeta) {
  int64_t c;
  Sum2<double> t;
  const bool mine = channel_split::fold_partials(C, splits, c, t, [&](int64_t ch, int64_t s) {
    const float* rec = sums + (ch * splits + s) * kStatsRecord;
    return Sum2<double>{rec[0], rec[1]};
  });
  if (!mine || threadIdx.x % 32 != 0) return;
  dbeta[c] = static_cast<float>(t.a);
  dgamma[c] = static_cast<float>(t.b * save_invstd[c]);
}

// Backward pass 3: dx = k*dy + u*(x - mean) + v over the block's slice.
template <int V, typename Index>
__global__ void __launch_bounds__(kSplitThreads, channel_split::kMinBlocks<Index>)
    backward_dx_split(SplitArgs<Index> a, const float* __restrict__ x,
                      const float* __restrict__ gamma, const float* __restrict__ save_mean,
                      const float* __restrict__ save_invstd, const float* __restrict__ dgamma,
                      const float* __restrict__ dbeta, const float* __restrict__ dy,
                      float* __restrict__ dx) {
  const Slice<Index> slice(a);
  const Index c = slice.c;
  const float Mf = static_cast<float>(a.units) * V;
  const float mean = save_mean[c], invstd = save_invstd[c];
  const float k_dy = gamma[c] * invstd;
  const float k_x = -k_dy * invstd * dgamma[c] / Mf, k_1 = -k_dy * dbeta[c] / Mf;
  for_each_unit_group<V>(a, slice, [&](const Index* off, const bool* live) {
    Unit<V> g[kUnroll<V>], u[kUnroll<V>];
    load_group<V>(g, dy, off, live);
    load_group<V>(u, x, off, live);
#pragma unroll
    for (int k = 0; k < kUnroll<V>; ++k) {
      if (!live[k]) continue;
#pragma unroll
      for (int j = 0; j < V; ++j) u[k].v[j] = k_dy * g[k].v[j] + k_x * (u[k].v[j] - mean) + k_1;
      channel_split::store_unit<V>(dx + off[k], u[k]);
    }
  });
}

// Flat grid-stride loop; Index is int when every index fits in 31 bits.
template <typename Index>
__global__ void __launch_bounds__(kBlock)
    forward_eval_kernel(Index total, Index C, Index HW, const float* __restrict__ x,
                        const float* __restrict__ gamma, const float* __restrict__ beta,
                        const float* __restrict__ running_mean,
                        const float* __restrict__ running_var, float eps, float* __restrict__ y) {
  const Index stride = static_cast<Index>(gridDim.x) * static_cast<Index>(blockDim.x);
  for (Index i = static_cast<Index>(blockIdx.x) * static_cast<Index>(blockDim.x) +
                 static_cast<Index>(threadIdx.x);
       i < total; i += stride) {
    const Index c = (i / HW) % C;
    const float a = gamma[c] / sqrtf(running_var[c] + eps);
    y[i] = (x[i] - running_mean[c]) * a + beta[c];
  }
}

void check_sizes(int64_t N, int64_t C, int64_t HW, const char* who) {
  if (N < 0 || C < 0 || HW < 0)
    throw std::invalid_argument(std::string("cuda::") + who + ": negative size " +
                                std::to_string(N) + "x" + std::to_string(C) + "x" +
                                std::to_string(HW));
  if (C > INT32_MAX)
    throw std::invalid_argument(std::string("cuda::") + who + ": more than 2^31-1 channels");
}

void check_variant(int variant, const char* who) {
  if (variant < 1 || variant > kBatchNormVariants)
    throw std::invalid_argument(std::string("cuda::") + who + ": no variant " +
                                std::to_string(variant) + " (there are 1 to " +
                                std::to_string(kBatchNormVariants) + ")");
}

// Variant 2's launches: the plan (the same for every pass of a direction),
// and the kernel for its unit width and index type.
struct Split {
  channel_split::Plan plan;
  bool int_index;
  Split(int64_t N, int64_t C, int64_t HW, bool aligned)
      : plan(channel_split::split_plan(N, C, HW, aligned)),
        int_index(channel_split::int_indices(N * C * HW, C * HW)) {}
  unsigned blocks(int64_t C) const { return static_cast<unsigned>(plan.blocks(C)); }
};

// Launches one split pass, the instantiation kernel<V, Index> for the plan's
// unit width and index type. pick(V tag, Index tag) returns that kernel
// (a lambda, as a kernel template cannot be passed by name).
template <typename Pick, typename... Args>
void launch_split(const Split& sp, int64_t C, int64_t HW, cudaStream_t stream, Pick pick,
                  const Args&... args) {
  auto go = [&](auto vec_tag, auto index_tag) {
    using Index = decltype(index_tag);
    launch(pick(vec_tag, index_tag), sp.blocks(C), dim3(kSplitThreads), 0, stream,
           SplitArgs<Index>::make(sp.plan, C, HW), args...);
  };
  using V1 = std::integral_constant<int, 1>;
  using V4 = std::integral_constant<int, 4>;
  if (sp.int_index && sp.plan.vec == 4)
    go(V4{}, int{});
  else if (sp.int_index)
    go(V1{}, int{});
  else if (sp.plan.vec == 4)
    go(V4{}, int64_t{});
  else
    go(V1{}, int64_t{});
}

void require_workspace(const float* workspace, const char* who) {
  if (workspace == nullptr)
    throw std::invalid_argument(std::string("cuda::") + who +
                                ": variant 2 needs batch_norm_workspace_floats of workspace");
}

}  // namespace batch_norm_kernels

using namespace batch_norm_kernels;

size_t batch_norm_workspace_floats(int variant, int64_t N, int64_t C, int64_t HW) {
  check_variant(variant, "batch_norm_workspace_floats");
  check_sizes(N, C, HW, "batch_norm_workspace_floats");
  if (variant == 1 || C == 0) return 0;
  return static_cast<size_t>(C * channel_split::split_count(C, N * HW) * kStatsRecord);
}

void batch_norm_forward_train(int variant, int64_t N, int64_t C, int64_t HW, const float* x,
                              const float* gamma, const float* beta, float eps, float momentum,
                              float* running_mean, float* running_var, float* save_mean,
                              float* save_invstd, float* y, float* workspace,
                              cudaStream_t stream) {
  check_variant(variant, "batch_norm_forward_train");
  check_sizes(N, C, HW, "batch_norm_forward_train");
  if (C == 0) return;
  if (variant == 1) {
    launch(forward_train_kernel, dim3(static_cast<unsigned>(C)), dim3(kBlock), 0, stream, N, C,
           HW, x, gamma, beta, eps, momentum, running_mean, running_var, save_mean, save_invstd,
           y);
    return;
  }
  require_workspace(workspace, "batch_norm_forward_train");
  const Split sp(N, C, HW, channel_split::aligned16(x) && channel_split::aligned16(y));
  launch_split(sp, C, HW, stream,
               [](auto v, auto i) { return forward_stats_split<decltype(v)::value, decltype(i)>; },
               x, workspace);
  launch(forward_fold, channel_split::fold_blocks(C), dim3(kBlock), 0, stream, C, HW, N * HW, x,
         sp.plan.splits, static_cast<const float*>(workspace), eps, momentum, running_mean,
         running_var, save_mean, save_invstd);
  launch_split(sp, C, HW, stream,
               [](auto v, auto i) {
                 return forward_normalize_split<decltype(v)::value, decltype(i)>;
               },
               x, gamma, beta, static_cast<const float*>(save_mean),
               static_cast<const float*>(save_invstd), y);
}

void batch_norm_forward_eval(int64_t N, int64_t C, int64_t HW, const float* x,
                             const float* gamma, const float* beta, const float* running_mean,
                             const float* running_var, float eps, float* y,
                             cudaStream_t stream) {
  check_sizes(N, C, HW, "batch_norm_forward_eval");
  const int64_t total = N * C * HW;
  if (total == 0) return;
  const int64_t blocks = (total + kBlock - 1) / kBlock;
  const dim3 grid(static_cast<unsigned>(blocks < kMaxBlocks ? blocks : kMaxBlocks));
  if (total <= INT32_MAX - kMaxBlocks * kBlock)  // i + stride stays below 2^31
    launch(forward_eval_kernel<int>, grid, dim3(kBlock), 0, stream, static_cast<int>(total),
           static_cast<int>(C), static_cast<int>(HW), x, gamma, beta, running_mean, running_var,
           eps, y);
  else
    launch(forward_eval_kernel<int64_t>, grid, dim3(kBlock), 0, stream, total, C, HW, x, gamma,
           beta, running_mean, running_var, eps, y);
}

void batch_norm_backward_train(int variant, int64_t N, int64_t C, int64_t HW, const float* x,
                               const float* gamma, const float* save_mean,
                               const float* save_invstd, const float* dy, float* dx,
                               float* dgamma, float* dbeta, float* workspace,
                               cudaStream_t stream) {
  check_variant(variant, "batch_norm_backward_train");
  check_sizes(N, C, HW, "batch_norm_backward_train");
  if (C == 0) return;
  if (variant == 1) {
    launch(backward_train_kernel, dim3(static_cast<unsigned>(C)), dim3(kBlock), 0, stream, N, C,
           HW, x, gamma, save_mean, save_invstd, dy, dx, dgamma, dbeta);
    return;
  }
  require_workspace(workspace, "batch_norm_backward_train");
  const Split sp(N, C, HW,
                 channel_split::aligned16(x) && channel_split::aligned16(dy) &&
                     channel_split::aligned16(dx));
  launch_split(sp, C, HW, stream,
               [](auto v, auto i) { return backward_sums_split<decltype(v)::value, decltype(i)>; },
               x, save_mean, dy, workspace);
  launch(backward_fold, channel_split::fold_blocks(C), dim3(kBlock), 0, stream, C,
         sp.plan.splits, static_cast<const float*>(workspace), save_invstd, dgamma, dbeta);
  launch_split(sp, C, HW, stream,
               [](auto v, auto i) { return backward_dx_split<decltype(v)::value, decltype(i)>; },
               x, gamma, save_mean, save_invstd, static_cast<const float*>(dgamma),
               static_cast<const float*>(dbeta), dy, dx);
}

}  // namespace anvil::cuda
