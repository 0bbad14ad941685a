#include "core/graph.h"

#include <stdexcept>

#include "core/cuda_hooks.h"

namespace anvil {

std::string CudaGraph::unavailable(Device device) {
  if (!device.is_cuda()) return "CUDA graphs run on CUDA devices; " + device.str() + " is not one";
  if (cuda_hooks::device_count() == 0) return "no CUDA device: " + cuda_hooks::no_device_reason();
  check_cuda_device(device);
  return cuda_hooks::graph_unavailable(device.index);
}

CudaGraph::CudaGraph(Device device, const std::function<void()>& work) : device_(device) {
  if (const std::string why = unavailable(device); !why.empty())
    throw std::invalid_argument("CudaGraph: " + why);
  impl_ = cuda_hooks::capture_graph(device.index, work);
}

CudaGraph::~CudaGraph() = default;

void CudaGraph::replay() { impl_->replay(); }

size_t CudaGraph::nodes() const { return impl_->nodes(); }

}  // namespace anvil
