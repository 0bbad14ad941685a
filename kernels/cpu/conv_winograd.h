// Internal: Winograd F(4x4, 3x3) convolution for 3x3 stride-1 layers with
// enough channels that the transforms are cheap next to the products
// (ResNet's 3x3 layers after the stem). Used by conv.cpp.
#pragma once
#include "core/shapes.h"

namespace anvil::cpu::detail {

// True when the Winograd kernels handle this shape (all three directions)
// and need fewer multiplications than im2col + GEMM by a clear margin.
bool conv_winograd_suits(const Conv2dShape& s);
void conv2d_forward_winograd(const Conv2dShape& s, const float* x, const float* w,
                             const float* bias, float* y);
void conv2d_backward_data_winograd(const Conv2dShape& s, const float* dy, const float* w,
                                   float* dx);
// dw only; the caller computes dbias.
void conv2d_backward_weight_winograd(const Conv2dShape& s, const float* x, const float* dy,
                                     float* dw);

}  // namespace anvil::cpu::detail
