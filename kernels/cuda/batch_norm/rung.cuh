// What the BatchNorm kernels share.
#pragma once
#include <cstdint>

#include "kernels/cuda/batch_norm/batch_norm.h"
#include "kernels/cuda/cuda_compat.h"

namespace anvil::cuda::batch_norm_kernels {

constexpr int kBlock = 256;  // a power of two: rung 01's tree halves it
constexpr int64_t kMaxBlocks = 2048;
constexpr int kStatsRecord = 3;  // rung 02's workspace: floats per block

}  // namespace anvil::cuda::batch_norm_kernels
