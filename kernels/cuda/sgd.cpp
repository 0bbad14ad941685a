// The CUDA backend's optimizer methods (cuda_backend.h); the kernels are sgd.cu's.
#include <vector>

#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/sgd_entries.h"

namespace anvil::cuda {

void CudaBackend::sgd_step(std::span<const SgdTensors> tensors, const SgdHyper& h) {
  activate();
  const std::vector<SgdEntry> entries = sgd_entries(tensors);
  cuda::sgd_update(entries.data(), entries.size(), floats(h.lr_on_device), h.lr, h.momentum,
                   h.weight_decay, h.nesterov, stream_);
}

void CudaBackend::zero_tensors(std::span<const Tensor> tensors) {
  activate();
  std::vector<FloatRange> ranges;
  ranges.reserve(tensors.size());
  for (const Tensor& t : tensors) ranges.push_back({floats(t), t.numel()});
  cuda::zero_floats(ranges.data(), ranges.size(), stream_);
}

}  // namespace anvil::cuda
