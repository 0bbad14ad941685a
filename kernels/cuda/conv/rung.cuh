// What the convolution rungs share: the shape as the kernels see it, the
// one-thread-per-element launch, and the three GEMMs' sizes.
#pragma once
#include <algorithm>
#include <cstdint>
#include <source_location>
#include <utility>

#include "kernels/cuda/conv/conv.h"
#include "kernels/cuda/conv/operands.cuh"
#include "kernels/cuda/cuda_compat.h"

namespace anvil::cuda::conv_kernels {

constexpr int kThreads = 256;  // block size of the one-thread-per-element kernels

__device__ __forceinline__ int64_t global_index() {
  return int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
}

// The kernels' view of a shape the entry point has checked (int fields).
inline Geo geo(const Conv2dShape& s) {
  return Geo{int(s.N), int(s.C),        int(s.H),        int(s.W),     int(s.K),
             int(s.R), int(s.S),        int(s.stride_h), int(s.stride_w),
             int(s.pad_h), int(s.pad_w), int(s.P),       int(s.Q)};
}

// An element count that remembers where the launch was written (as GridArg).
struct Count {
  int64_t n;
  std::source_location where;
  Count(int64_t v, std::source_location w = std::source_location::current()) : n(v), where(w) {}
};

// One thread per element, kThreads per block; nothing to launch for no
// elements (a grid of 0 blocks is an error).
template <typename... KArgs, typename... Args>
void launch_1d(void (*kernel)(KArgs...), Count count, cudaStream_t stream, Args&&... args) {
  if (count.n <= 0) return;
  const auto blocks = static_cast<unsigned>((count.n + kThreads - 1) / kThreads);
  launch(kernel, GridArg(dim3(blocks), count.where), dim3(kThreads), 0, stream,
         std::forward<Args>(args)...);
}

// The three GEMMs, M x N over a reduction of K.
struct Gemm {
  int64_t M, N, K;
};
inline Gemm forward_gemm(const Conv2dShape& s) { return {s.K, s.N * s.P * s.Q, s.C * s.R * s.S}; }
inline Gemm backward_data_gemm(const Conv2dShape& s) {
  return {s.C, s.N * s.H * s.W, s.K * s.R * s.S};
}
inline Gemm backward_weight_gemm(const Conv2dShape& s) {
  return {s.K, s.C * s.R * s.S, s.N * s.P * s.Q};
}

inline size_t no_workspace(const Conv2dShape&) { return 0; }

}  // namespace anvil::cuda::conv_kernels
