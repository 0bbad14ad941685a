// Helpers shared by the op layer's source files (core/ops*.cpp): input
// checks whose messages name the op, and output allocation.
#pragma once
#include <stdexcept>
#include <vector>

#include <fmt/format.h>

#include "core/backend.h"
#include "core/tensor.h"

namespace anvil::ops_detail {

using Grads = std::vector<Tensor>;

inline Tensor like(const Tensor& t) { return Tensor::empty(t.shape(), t.dtype(), t.device()); }

inline Backend& backend(const Tensor& t) { return backend_for(t.device()); }

// Ops compute in float32 and take float32 or bfloat16 (core/autocast.h);
// an integer tensor is refused by name.
inline void check_float(const char* op, const char* what, const Tensor& t) {
  if (!t.defined()) throw std::invalid_argument(fmt::format("{}: {} is undefined", op, what));
  if (t.dtype() != DType::Float32 && t.dtype() != DType::BFloat16)
    throw std::invalid_argument(fmt::format("{}: {} must be float32 or bfloat16, got {} (shape {})",
                                            op, what, dtype_name(t.dtype()), shape_str(t.shape())));
}

// Only float32: parameters, running buffers and totals, which autocast keeps
// in float32 (a bfloat16 one here is a caller's mistake).
inline void check_float32(const char* op, const char* what, const Tensor& t) {
  if (!t.defined()) throw std::invalid_argument(fmt::format("{}: {} is undefined", op, what));
  if (t.dtype() != DType::Float32)
    throw std::invalid_argument(fmt::format("{}: {} must be float32, got {} (shape {})", op, what,
                                            dtype_name(t.dtype()), shape_str(t.shape())));
}

// Runs kernels written for float32 on tensors that may be bfloat16: in(t) is
// t, or a float32 copy of a bfloat16 t (exact); out(t) is t, or a float32
// scratch that finish() rounds into the bfloat16 t (to nearest even);
// inout(t) is out(t) holding t's values. Float32 tensors pass through
// without a copy, so float32 runs pay nothing. The copies are memory on
// t's device for one op (or one CPU backend method: core/backend.h lets
// its kernels take bfloat16 outputs, and the CPU's stage them so), freed
// with this object.
class Float32Io {
 public:
  Tensor in(const Tensor& t) {
    if (!t.defined() || t.dtype() != DType::BFloat16) return t;
    return t.detach().to(DType::Float32);
  }
  Tensor out(const Tensor& t) {
    if (!t.defined() || t.dtype() != DType::BFloat16) return t;
    Tensor scratch = Tensor::empty(t.shape(), DType::Float32, t.device());
    outs_.push_back({scratch, t});
    return scratch;
  }
  Tensor inout(const Tensor& t) {
    Tensor scratch = out(t);
    if (scratch.defined() && scratch.dtype() != t.dtype())
      backend_for(t.device()).convert(t, scratch);
    return scratch;
  }
  void finish() {
    for (auto& [scratch, t] : outs_) backend_for(t.device()).convert(scratch, t);
    outs_.clear();
  }

 private:
  std::vector<std::pair<Tensor, Tensor>> outs_;  // (float32 scratch, bfloat16 destination)
};

// An input of an op that autocast runs in bfloat16 (conv2d, linear, matmul):
// `compute` is what the kernels read, `graph` the tensor the op's autograd
// node points to, whose dtype its gradient has. Outside autocast, or for a
// bfloat16 input, both are the input. Under autocast a float32 parameter (a
// leaf that requires grad) is read through the cast cache and keeps its
// float32 gradient (computed from the bfloat16 operands); any other float32
// input is cast differentiably, its gradient cast back by the cast's node.
struct AmpOperand {
  Tensor compute, graph;
};
AmpOperand amp_operand(const Tensor& t, bool amp);

// Is autocast on for this op's inputs (core/autocast.h)?
bool amp_active(const Tensor& x);

// The two operands of conv2d, linear or matmul under the autocast policy:
// amp_operand of each (with autocast on for the first's device), and outside
// autocast two different float dtypes met in float32 (differentiable casts).
struct AmpOperands {
  Tensor a, b;              // what the kernels read
  Tensor a_graph, b_graph;  // what the autograd node points to
  bool amp;
};
AmpOperands amp_operands(const Tensor& a, const Tensor& b);

inline void check_rank(const char* op, const char* what, const Tensor& t, int64_t rank) {
  if (t.dim() != rank)
    throw std::invalid_argument(fmt::format("{}: {} must have {} dimensions, got shape {}", op,
                                            what, rank, shape_str(t.shape())));
}

}  // namespace anvil::ops_detail
