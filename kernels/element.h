// The element types the elementwise kernels read and write, on both
// devices: float32, and bfloat16 as storage (autocast's activations, their
// gradients). A kernel loads each element into a float, computes in float,
// and stores it back in its type, bfloat16 rounding to nearest even; so a
// bfloat16 op costs one rounding of its result and half the memory traffic.
#pragma once
#include <stdexcept>
#include <string>

#include "core/bfloat16.h"
#include "core/dtype.h"

namespace anvil {

ANVIL_HOST_DEVICE constexpr float load(float v) { return v; }
ANVIL_HOST_DEVICE constexpr float load(bfloat16 v) { return v.to_float(); }

template <class T> ANVIL_HOST_DEVICE constexpr T store(float v);
template <> ANVIL_HOST_DEVICE constexpr float store<float>(float v) { return v; }
template <> ANVIL_HOST_DEVICE constexpr bfloat16 store<bfloat16>(float v) { return bfloat16(v); }

// Calls f(T{}) with T the C++ type of a float dtype (float, bfloat16), for
// a backend method to pick its kernel's instantiation; throws naming `what`
// for any other dtype.
template <class F>
decltype(auto) visit_float_dtype(DType t, const char* what, F&& f) {
  switch (t) {
    case DType::Float32: return f(float{});
    case DType::BFloat16: return f(bfloat16{});
    default:
      throw std::invalid_argument(std::string(what) + ": no kernel for dtype " +
                                  std::string(dtype_name(t)));
  }
}

}  // namespace anvil
