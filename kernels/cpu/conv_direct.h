// Internal: direct (no im2col) convolution for layers whose reduction
// C*R*S is tiny, e.g. a first layer on 1-3 input channels. Used by conv.cpp.
#pragma once
#include "core/shapes.h"

namespace anvil::cpu::detail {

// True when the direct kernels handle this shape and beat im2col + GEMM.
bool conv_direct_suits(const Conv2dShape& s);
void conv2d_forward_direct(const Conv2dShape& s, const float* x, const float* w,
                           const float* bias, float* y);
void conv2d_backward_weight_direct(const Conv2dShape& s, const float* x, const float* dy,
                                   float* dw);

}  // namespace anvil::cpu::detail
