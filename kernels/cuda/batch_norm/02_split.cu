// BatchNorm rung 02 (the one that ships), several blocks per channel
// (channel_split.cuh): each channel is cut into S
// contiguous slices, one 256-thread block each, S = floor(1056 / C) (at least
// 512 floats a slice): C*S blocks fill the 8 block slots of every SM once (C =
// 64: 1024 blocks where rung 01 had 64). Each thread issues 4 independent
// loads (float4 when HW is a multiple of 4 and the tensors are 16-byte
// aligned) before using them. Three launches a direction:
//   forward:  stats: each thread folds its values, less the
//             channel's first value (a shift that keeps a large
//             mean from costing the float running mean its
//             precision), into (count, mean, M2) with Welford's
//             update (one unit at a time), the block merges
//             its threads' with Chan's formula (warp shuffles, a
//             fixed tree) and writes the record to the
//             workspace; fold: one warp per channel merges the
//             channel's S records in double in a fixed order and
//             writes save_mean, save_invstd and the running
//             statistics; normalise: y as in rung 01, C*S
//             blocks again (with ReLU in the same pass:
//             forward_normalize_relu_split). x is read twice, not three times,
//             and no sum of squares is ever subtracted from
//             another, so a large mean with a small spread keeps
//             its precision.
//   backward: sums: per-block sum(dy) and sum(dy * (x - mean))
//             (8 loads in flight: 4 of dy, 4 of x); fold: one
//             warp per channel adds the S pairs in double and
//             writes dbeta and dgamma; dx: as rung 01's
//             pass 2, reading those two sums back. After a
//             forward with ReLU, sums and dx also read the
//             forward's y and take ReLU's backward of dy as they
//             load it (backward_sums_relu_split,
//             backward_dx_relu_split): the masked gradient is
//             never stored.
// The workspace holds 3 floats per block
// (batch_norm_workspace_floats), reused by forward and backward.
// x, y, dy and dx are float or bfloat16 (T): a bfloat16 unit of 4 is two
// 32-bit loads, widened to float (channel_split.cuh), and every sum and
// statistic is the float path's; y and dx are rounded as they are stored.
//
//   build/sim/bench_cuda_kernels bn 2
#include <type_traits>

#include "kernels/cuda/batch_norm/rung.cuh"
#include "kernels/element.h"
#include "kernels/cuda/reduce/channel_split.cuh"
#include "core/pointwise.h"

namespace anvil::cuda {
namespace batch_norm_kernels {

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
template <typename Index, typename T>
__device__ __forceinline__ float channel_shift(const T* x, Index c, Index HW, Index units) {
  return units > 0 ? load(x[c * HW]) : 0.0f;
}

// Forward pass 1: the (count, mean, M2) of the block's slice, the values
// less the channel's shift, to stats[block * 3 ...].
template <int V, typename Index, typename T>
__global__ void __launch_bounds__(kSplitThreads, channel_split::kMinBlocks<Index>)
    forward_stats_split(SplitArgs<Index> a, const T* __restrict__ x,
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
template <typename T>
__global__ void __launch_bounds__(kBlock)
    forward_fold(int64_t C, int64_t HW, int64_t M, const T* __restrict__ x, int64_t splits,
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

// The passes that read a third tensor (the backward's y beside dy and x, or
// the forward's residual beside x, with y written): a group of kUnroll<4>
// float4 units of each, 24 floats in flight, does not fit the 32 registers
// of 8 blocks an SM (ptxas spilled), so they take their float4 units one at
// a time (12 floats; an SM still has 2048 threads' loads in flight). The
// backward's passes without ReLU take them so too: the same loop as the
// fused ones, so that the compilers contract the same products into FMAs
// and a fused pass gives the unfused one's bits.
template <int V>
constexpr int kNarrowGroup = V == 4 ? 1 : kUnroll<V>;

// Forward pass 3: y = (x - mean) * gamma*invstd + beta over the block's
// slice, then ReLU (core/pointwise.h) with kRelu: BatchNorm and ReLU in
// one pass (forward_normalize_relu_split). With kResidual (and kRelu):
// y = relu(bn + r), bn rounded to T before the add and the sum after it, as
// batch_norm then add() round them: a residual block's end
// (forward_normalize_add_relu_split).
template <bool kRelu, bool kResidual, int V, typename Index, typename T>
__device__ __forceinline__ void normalize_slice(const SplitArgs<Index>& a, const T* __restrict__ x,
                                                const float* __restrict__ gamma,
                                                const float* __restrict__ beta,
                                                const float* __restrict__ save_mean,
                                                const float* __restrict__ save_invstd,
                                                const T* __restrict__ residual,
                                                T* __restrict__ y) {
  const Slice<Index> slice(a);
  const float mean = save_mean[slice.c], scale = gamma[slice.c] * save_invstd[slice.c],
              shift = beta[slice.c];
  static_assert(kRelu || !kResidual);
  constexpr int G = kResidual ? kNarrowGroup<V> : kUnroll<V>;
  for_each_unit_group<V, G>(a, slice, [&](const Index* off, const bool* live) {
    Unit<V> u[G], r[G];
    load_group<V>(u, x, off, live);
    if constexpr (kResidual) load_group<V>(r, residual, off, live);
#pragma unroll
    for (int k = 0; k < G; ++k) {
      if (!live[k]) continue;
#pragma unroll
      for (int j = 0; j < V; ++j) {
        float v = (u[k].v[j] - mean) * scale + shift;
        if constexpr (kResidual) v = load(store<T>(load(store<T>(v)) + r[k].v[j]));
        u[k].v[j] = kRelu ? Relu::forward(v) : v;
      }
      channel_split::store_unit<V>(y + off[k], u[k]);
    }
  });
}

template <int V, typename Index, typename T>
__global__ void __launch_bounds__(kSplitThreads, channel_split::kMinBlocks<Index>)
    forward_normalize_split(SplitArgs<Index> a, const T* __restrict__ x,
                            const float* __restrict__ gamma, const float* __restrict__ beta,
                            const float* __restrict__ save_mean,
                            const float* __restrict__ save_invstd, T* __restrict__ y) {
  normalize_slice<false, false, V>(a, x, gamma, beta, save_mean, save_invstd,
                                   static_cast<const T*>(nullptr), y);
}
template <int V, typename Index, typename T>
__global__ void __launch_bounds__(kSplitThreads, channel_split::kMinBlocks<Index>)
    forward_normalize_relu_split(SplitArgs<Index> a, const T* __restrict__ x,
                                 const float* __restrict__ gamma, const float* __restrict__ beta,
                                 const float* __restrict__ save_mean,
                                 const float* __restrict__ save_invstd, T* __restrict__ y) {
  normalize_slice<true, false, V>(a, x, gamma, beta, save_mean, save_invstd,
                                  static_cast<const T*>(nullptr), y);
}
template <int V, typename Index, typename T>
__global__ void __launch_bounds__(kSplitThreads, channel_split::kMinBlocks<Index>)
    forward_normalize_add_relu_split(SplitArgs<Index> a, const T* __restrict__ x,
                                     const float* __restrict__ gamma,
                                     const float* __restrict__ beta,
                                     const float* __restrict__ save_mean,
                                     const float* __restrict__ save_invstd,
                                     const T* __restrict__ residual, T* __restrict__ y) {
  normalize_slice<true, true, V>(a, x, gamma, beta, save_mean, save_invstd, residual, y);
}

// The backward's gradient over a group of units: dy as loaded, or with
// kRelu ReLU's backward of it from the forward's output y (core/pointwise.h).
template <bool kRelu, int V, int G, typename Index, typename T>
__device__ __forceinline__ void load_grad(Unit<V> (&g)[G], const T* __restrict__ dy,
                                          const T* __restrict__ y, const Index* off,
                                          const bool* live) {
  load_group<V>(g, dy, off, live);
  if constexpr (kRelu) {
    Unit<V> r[G];
    load_group<V>(r, y, off, live);
#pragma unroll
    for (int k = 0; k < G; ++k)
#pragma unroll
      for (int j = 0; j < V; ++j) g[k].v[j] = Relu::backward(r[k].v[j], g[k].v[j]);
  }
}

// Backward pass 1: the block's sum(g) and sum(g * (x - mean)), g the
// gradient load_grad takes, to sums[block * 3 ...] (the third float unused).
template <bool kRelu, int V, typename Index, typename T>
__device__ __forceinline__ void sums_slice(const SplitArgs<Index>& a, const T* __restrict__ x,
                                           const float* __restrict__ save_mean,
                                           const T* __restrict__ dy, const T* __restrict__ y,
                                           float* __restrict__ sums) {
  __shared__ Sum2<float> warp_vals[channel_split::kWarps];
  const Slice<Index> slice(a);
  const float mean = save_mean[slice.c];
  Sum2<float> acc{};
  for_each_unit_group<V, kNarrowGroup<V>>(a, slice, [&](const Index* off, const bool* live) {
    Unit<V> g[kNarrowGroup<V>], u[kNarrowGroup<V>];
    load_grad<kRelu, V>(g, dy, y, off, live);
    load_group<V>(u, x, off, live);
#pragma unroll
    for (int k = 0; k < kNarrowGroup<V>; ++k)
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

template <int V, typename Index, typename T>
__global__ void __launch_bounds__(kSplitThreads, channel_split::kMinBlocks<Index>)
    backward_sums_split(SplitArgs<Index> a, const T* __restrict__ x,
                        const float* __restrict__ save_mean, const T* __restrict__ dy,
                        const T* __restrict__ y, float* __restrict__ sums) {
  sums_slice<false, V>(a, x, save_mean, dy, y, sums);
}

template <int V, typename Index, typename T>
__global__ void __launch_bounds__(kSplitThreads, channel_split::kMinBlocks<Index>)
    backward_sums_relu_split(SplitArgs<Index> a, const T* __restrict__ x,
                             const float* __restrict__ save_mean, const T* __restrict__ dy,
                             const T* __restrict__ y, float* __restrict__ sums) {
  sums_slice<true, V>(a, x, save_mean, dy, y, sums);
}

// Backward pass 2, one warp per channel: dbeta = sum(g), dgamma = sum(g * xhat).
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

// Backward pass 3: dx = k*g + u*(x - mean) + v over the block's slice; with
// kResidual (and kRelu) dr receives g, the residual's gradient
// (backward_dx_add_relu_split).
template <bool kRelu, bool kResidual, int V, typename Index, typename T>
__device__ __forceinline__ void dx_slice(const SplitArgs<Index>& a, const T* __restrict__ x,
                                         const float* __restrict__ gamma,
                                         const float* __restrict__ save_mean,
                                         const float* __restrict__ save_invstd,
                                         const float* __restrict__ dgamma,
                                         const float* __restrict__ dbeta,
                                         const T* __restrict__ dy, const T* __restrict__ y,
                                         T* __restrict__ dr, T* __restrict__ dx) {
  const Slice<Index> slice(a);
  const Index c = slice.c;
  const float Mf = static_cast<float>(a.units) * V;
  const float mean = save_mean[c], invstd = save_invstd[c];
  const float k_dy = gamma[c] * invstd;
  const float k_x = -k_dy * invstd * dgamma[c] / Mf, k_1 = -k_dy * dbeta[c] / Mf;
  for_each_unit_group<V, kNarrowGroup<V>>(a, slice, [&](const Index* off, const bool* live) {
    Unit<V> g[kNarrowGroup<V>], u[kNarrowGroup<V>];
    load_grad<kRelu, V>(g, dy, y, off, live);
    load_group<V>(u, x, off, live);
#pragma unroll
    for (int k = 0; k < kNarrowGroup<V>; ++k) {
      if (!live[k]) continue;
      if constexpr (kResidual) channel_split::store_unit<V>(dr + off[k], g[k]);
#pragma unroll
      for (int j = 0; j < V; ++j) u[k].v[j] = k_dy * g[k].v[j] + k_x * (u[k].v[j] - mean) + k_1;
      channel_split::store_unit<V>(dx + off[k], u[k]);
    }
  });
}

template <int V, typename Index, typename T>
__global__ void __launch_bounds__(kSplitThreads, channel_split::kMinBlocks<Index>)
    backward_dx_split(SplitArgs<Index> a, const T* __restrict__ x,
                      const float* __restrict__ gamma, const float* __restrict__ save_mean,
                      const float* __restrict__ save_invstd, const float* __restrict__ dgamma,
                      const float* __restrict__ dbeta, const T* __restrict__ dy,
                      const T* __restrict__ y, T* __restrict__ dx) {
  dx_slice<false, false, V>(a, x, gamma, save_mean, save_invstd, dgamma, dbeta, dy, y,
                            static_cast<T*>(nullptr), dx);
}

template <int V, typename Index, typename T>
__global__ void __launch_bounds__(kSplitThreads, channel_split::kMinBlocks<Index>)
    backward_dx_relu_split(SplitArgs<Index> a, const T* __restrict__ x,
                           const float* __restrict__ gamma, const float* __restrict__ save_mean,
                           const float* __restrict__ save_invstd,
                           const float* __restrict__ dgamma, const float* __restrict__ dbeta,
                           const T* __restrict__ dy, const T* __restrict__ y,
                           T* __restrict__ dx) {
  dx_slice<true, false, V>(a, x, gamma, save_mean, save_invstd, dgamma, dbeta, dy, y,
                           static_cast<T*>(nullptr), dx);
}
template <int V, typename Index, typename T>
__global__ void __launch_bounds__(kSplitThreads, channel_split::kMinBlocks<Index>)
    backward_dx_add_relu_split(SplitArgs<Index> a, const T* __restrict__ x,
                               const float* __restrict__ gamma,
                               const float* __restrict__ save_mean,
                               const float* __restrict__ save_invstd,
                               const float* __restrict__ dgamma, const float* __restrict__ dbeta,
                               const T* __restrict__ dy, const T* __restrict__ y,
                               T* __restrict__ dr, T* __restrict__ dx) {
  dx_slice<true, true, V>(a, x, gamma, save_mean, save_invstd, dgamma, dbeta, dy, y, dr, dx);
}

namespace {

// The launches: the plan (the same for every pass of a direction),
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

template <class T>
void forward(const batch_norm_rungs::ForwardOf<T>& f, cudaStream_t stream) {
  const int64_t N = f.N, C = f.C, HW = f.HW;
  if (f.residual != nullptr && !f.relu)
    throw std::invalid_argument(
        "cuda::batch_norm_forward_train: rung 2 adds a residual only before a fused ReLU");
  const Split sp(N, C, HW,
                 channel_split::aligned16(f.x) && channel_split::aligned16(f.y) &&
                     (f.residual == nullptr || channel_split::aligned16(f.residual)));
  launch_split(sp, C, HW, stream,
               [](auto v, auto i) {
                 return forward_stats_split<decltype(v)::value, decltype(i), T>;
               },
               f.x, f.workspace);
  launch(forward_fold<T>, channel_split::fold_blocks(C), dim3(kBlock), 0, stream, C, HW, N * HW, f.x,
         sp.plan.splits, static_cast<const float*>(f.workspace), f.eps, f.momentum,
         f.running_mean, f.running_var, f.save_mean, f.save_invstd);
  auto normalize = [&](auto pick, auto... residual) {
    launch_split(sp, C, HW, stream, pick, f.x, f.gamma, f.beta,
                 static_cast<const float*>(f.save_mean), static_cast<const float*>(f.save_invstd),
                 residual..., f.y);
  };
  if (f.residual != nullptr)
    normalize([](auto v, auto i) { return forward_normalize_add_relu_split<decltype(v)::value, decltype(i), T>; },
              f.residual);
  else if (f.relu)
    normalize([](auto v, auto i) { return forward_normalize_relu_split<decltype(v)::value, decltype(i), T>; });
  else
    normalize([](auto v, auto i) { return forward_normalize_split<decltype(v)::value, decltype(i), T>; });
}

template <class T>
void backward(const batch_norm_rungs::BackwardOf<T>& b, cudaStream_t stream) {
  const int64_t N = b.N, C = b.C, HW = b.HW;
  const bool relu = b.relu_y != nullptr;
  if (b.dresidual != nullptr && !relu)
    throw std::invalid_argument(
        "cuda::batch_norm_backward_train: rung 2 writes a residual's gradient only with ReLU's");
  const Split sp(N, C, HW,
                 channel_split::aligned16(b.x) && channel_split::aligned16(b.dy) &&
                     channel_split::aligned16(b.dx) &&
                     (!relu || channel_split::aligned16(b.relu_y)) &&
                     (b.dresidual == nullptr || channel_split::aligned16(b.dresidual)));
  auto sums = [&](auto pick) {
    launch_split(sp, C, HW, stream, pick, b.x, b.save_mean, b.dy, b.relu_y, b.workspace);
  };
  if (relu)
    sums([](auto v, auto i) { return backward_sums_relu_split<decltype(v)::value, decltype(i), T>; });
  else
    sums([](auto v, auto i) { return backward_sums_split<decltype(v)::value, decltype(i), T>; });
  launch(backward_fold, channel_split::fold_blocks(C), dim3(kBlock), 0, stream, C,
         sp.plan.splits, static_cast<const float*>(b.workspace), b.save_invstd, b.dgamma,
         b.dbeta);
  auto dx = [&](auto pick, auto... dresidual) {
    launch_split(sp, C, HW, stream, pick, b.x, b.gamma, b.save_mean, b.save_invstd,
                 static_cast<const float*>(b.dgamma), static_cast<const float*>(b.dbeta), b.dy,
                 b.relu_y, dresidual..., b.dx);
  };
  if (b.dresidual != nullptr)
    dx([](auto v, auto i) { return backward_dx_add_relu_split<decltype(v)::value, decltype(i), T>; },
       b.dresidual);
  else if (relu)
    dx([](auto v, auto i) { return backward_dx_relu_split<decltype(v)::value, decltype(i), T>; });
  else
    dx([](auto v, auto i) { return backward_dx_split<decltype(v)::value, decltype(i), T>; });
}

size_t workspace(int64_t N, int64_t C, int64_t HW) {
  return C == 0 ? 0 : static_cast<size_t>(C * channel_split::split_count(C, N * HW) * kStatsRecord);
}

}  // namespace
}  // namespace batch_norm_kernels

const batch_norm_rungs::Rung batch_norm_rungs::kSplit = {
    "split",
    batch_norm_kernels::forward<float>,
    batch_norm_kernels::backward<float>,
    batch_norm_kernels::workspace,
    batch_norm_kernels::forward<bfloat16>,
    batch_norm_kernels::backward<bfloat16>};

}  // namespace anvil::cuda
