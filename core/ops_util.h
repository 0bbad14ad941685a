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

// Every op computes in float32. A bfloat16 input is refused by name, so
// that a mixed-precision caller learns which op needs a float32 copy.
inline void check_float(const char* op, const char* what, const Tensor& t) {
  if (!t.defined()) throw std::invalid_argument(fmt::format("{}: {} is undefined", op, what));
  if (t.dtype() == DType::BFloat16)
    throw std::invalid_argument(fmt::format(
        "{}: {} has dtype bfloat16 (shape {}), which {} does not support; convert it with "
        ".to(DType::Float32)",
        op, what, shape_str(t.shape()), op));
  if (t.dtype() != DType::Float32)
    throw std::invalid_argument(fmt::format("{}: {} must be float32, got {} (shape {})", op, what,
                                            dtype_name(t.dtype()), shape_str(t.shape())));
}

inline void check_rank(const char* op, const char* what, const Tensor& t, int64_t rank) {
  if (t.dim() != rank)
    throw std::invalid_argument(fmt::format("{}: {} must have {} dimensions, got shape {}", op,
                                            what, rank, shape_str(t.shape())));
}

}  // namespace anvil::ops_detail
