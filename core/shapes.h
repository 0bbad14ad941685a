// Shape descriptors shared by every backend's kernels (CPU and CUDA).
// Plain structs of int64 so one description of a convolution or pooling
// window serves the op layer, the CPU kernels and the CUDA kernels alike.
#pragma once
#include <cstdint>

namespace anvil {

// NCHW convolution: x[N,C,H,W] * w[K,C,R,S] -> y[N,K,P,Q].
struct Conv2dShape {
  int64_t N, C, H, W;   // input
  int64_t K, R, S;      // output channels, kernel height, kernel width
  int64_t stride_h, stride_w, pad_h, pad_w;
  int64_t P, Q;         // output height, width
  static int64_t out_size(int64_t in, int64_t k, int64_t stride, int64_t pad) {
    int64_t span = in + 2 * pad - k;
    return span < 0 ? 0 : span / stride + 1;  // 0: the window does not fit
  }
};

// NCHW pooling window over x[N,C,H,W] -> y[N,C,P,Q].
struct Pool2dShape {
  int64_t N, C, H, W;
  int64_t kernel_h, kernel_w, stride_h, stride_w, pad_h, pad_w;
  int64_t P, Q;
};

}  // namespace anvil
