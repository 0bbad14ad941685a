// The backends' side of an SGD step (core/backend.h's sgd_step): the op
// layer's tensors as the kernels' entries (kernels/sgd.h). Host code only.
#pragma once
#include <span>
#include <vector>

#include "core/sgd.h"
#include "kernels/sgd.h"

namespace anvil {

// Raw pointers, null where a tensor is undefined.
inline std::vector<SgdEntry> sgd_entries(std::span<const SgdTensors> tensors) {
  auto ptr = [](const Tensor& t) { return t.defined() ? t.data<float>() : nullptr; };
  std::vector<SgdEntry> entries;
  entries.reserve(tensors.size());
  for (const SgdTensors& t : tensors)
    entries.push_back({ptr(t.param), ptr(t.grad), ptr(t.momentum_buf),
                       t.param_copy.defined() ? t.param_copy.data<bfloat16>() : nullptr,
                       t.param.numel(), t.first_step});
  return entries;
}

}  // namespace anvil
