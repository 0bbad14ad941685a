// Tensors the tests draw from a seed, defined once so every test file gets
// the same values from the same seed.
#pragma once
#include <cstdint>

#include "core/device.h"
#include "core/ops.h"
#include "core/random.h"
#include "core/tensor.h"

namespace anvil::test {

// Uniform in [lo, hi): Tensor::rand from a Generator seeded with `seed`,
// drawn on the CPU (the same values for every device), then scaled.
inline Tensor uniform(const Shape& shape, uint64_t seed, double lo = -1, double hi = 1) {
  Generator gen(seed);
  return add(scale(Tensor::rand(shape, &gen), hi - lo), Tensor::full({}, lo));
}

// The same in [-1, 1), moved to `device`.
inline Tensor uniform(const Shape& shape, uint64_t seed, Device device) {
  return uniform(shape, seed).to(device);
}

}  // namespace anvil::test
