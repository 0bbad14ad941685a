// What the softmax cross-entropy kernels share.
#pragma once
#include <cmath>
#include <cstdint>

#include "kernels/cuda/cuda_compat.h"
#include "kernels/cuda/softmax/softmax.h"

namespace anvil::cuda::softmax_kernels {

constexpr unsigned kFullMask = 0xffffffffu;

__device__ __forceinline__ float fmax2(float a, float b) { return a > b ? a : b; }

// Whether a row's label indexes its logits. One that does not is left to
// check_labels (reported at the host's next wait): the kernels never read
// it, and the row's loss is nan.
__device__ __forceinline__ bool label_in_row(int64_t label, int64_t C) {
  return label >= 0 && label < C;
}

// A row's loss from its sum of exps s, the gap m - x[label] and the sum of
// the gaps m - x_j (softmax.h).
__device__ __forceinline__ float row_loss(float s, float label_gap, float gap_sum, float e,
                                          int64_t C) {
  return logf(s) + (1.0f - e) * label_gap + (e / float(C)) * gap_sum;
}

}  // namespace anvil::cuda::softmax_kernels
