// Element types. The dtype is a run-time property of a tensor, never a
// template parameter of the framework.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "core/bfloat16.h"

namespace anvil {

// BFloat16 is storage for mixed precision: conversions (Tensor::to), copies,
// printing and files handle it; an op that computes only in float32 refuses
// it with an error naming the op and the dtype.
enum class DType : uint8_t { Float32, Int64, UInt8, BFloat16 };

constexpr size_t dtype_size(DType t) {
  switch (t) {
    case DType::Float32: return 4;
    case DType::Int64: return 8;
    case DType::UInt8: return 1;
    case DType::BFloat16: return 2;
  }
  return 0;
}

constexpr std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::Float32: return "float32";
    case DType::Int64: return "int64";
    case DType::UInt8: return "uint8";
    case DType::BFloat16: return "bfloat16";
  }
  return "?";
}

template <typename T> constexpr DType dtype_of();
template <> constexpr DType dtype_of<float>() { return DType::Float32; }
template <> constexpr DType dtype_of<int64_t>() { return DType::Int64; }
template <> constexpr DType dtype_of<uint8_t>() { return DType::UInt8; }
template <> constexpr DType dtype_of<bfloat16>() { return DType::BFloat16; }

}  // namespace anvil
