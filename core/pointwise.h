// Pointwise ops written once for every device. Each op is a struct whose
// forward and backward are plain float functions, compiled for the host and
// (under nvcc) for the GPU; the CPU kernel (kernels/cpu/elementwise.cpp)
// and the CUDA kernel (kernels/cuda/elementwise.cu) are templates over it,
// and the op layer (core/ops.cpp, pointwise()) records its backward. So a
// new pointwise op is its struct here, its enumerator, its line in
// visit_pointwise, and the op's two lines in core/ops.{h,cpp}
// (docs/adding-an-op.md walks through SiLU).
//
// backward(saved, dy) gets the op's input or its output, as kSaved says:
// the output where the derivative is cheaper from it (ReLU's y > 0), the
// input otherwise. Math functions are the C ones (expf, tanhf, ...), which
// both the host and CUDA device code have; on a GPU they may differ from
// the host's by an ulp or two (the CUDA C Programming Guide's table of
// maximum errors), which the tests allow for.
#pragma once
#include <math.h>

#include <stdexcept>
#include <string>

#include "core/host_device.h"

namespace anvil {

enum class PointwiseOp { kRelu, kSilu };

// Which tensor an op's backward reads besides dy.
enum class Saved { kInput, kOutput };

// ReLU, as torch.relu: y = max(x, 0), written `x < 0 ? 0 : x` so that NaN
// stays NaN (as PyTorch's); dx = dy where y > 0, else 0 (also at y == 0
// exactly and for a NaN y), read from the output.
struct Relu {
  static constexpr const char* kName = "relu";
  static constexpr const char* kBackwardName = "ReluBackward";
  static constexpr Saved kSaved = Saved::kOutput;
  ANVIL_HOST_DEVICE static float forward(float x) { return x < 0.0f ? 0.0f : x; }
  ANVIL_HOST_DEVICE static float backward(float y, float dy) { return y > 0.0f ? dy : 0.0f; }
};

// SiLU (swish), as torch.nn.SiLU: y = x * sigmoid(x) = x / (1 + e^-x).
// dy/dx = s + x s (1 - s) = s (1 + x (1 - s)), with s = sigmoid(x).
// For x below about -88, e^-x overflows to inf: y is -0 and s is 0, the
// limits of both; NaN stays NaN.
struct Silu {
  static constexpr const char* kName = "silu";
  static constexpr const char* kBackwardName = "SiluBackward";  // its autograd node
  static constexpr Saved kSaved = Saved::kInput;
  ANVIL_HOST_DEVICE static float forward(float x) { return x / (1.0f + expf(-x)); }
  ANVIL_HOST_DEVICE static float backward(float x, float dy) {
    const float s = 1.0f / (1.0f + expf(-x));
    return dy * (s * (1.0f + x * (1.0f - s)));
  }
};

// f(Op{}) for the struct of `op`: how the kernels and the op layer turn the
// enumerator back into its type.
template <class F>
decltype(auto) visit_pointwise(PointwiseOp op, F&& f) {
  switch (op) {
    case PointwiseOp::kRelu: return f(Relu{});
    case PointwiseOp::kSilu: return f(Silu{});
  }
  throw std::invalid_argument("visit_pointwise: unknown op " + std::to_string(int(op)));
}

}  // namespace anvil
