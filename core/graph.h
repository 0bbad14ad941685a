// CUDA graphs, as torch.cuda.CUDAGraph: the device work a function issues
// to a device's compute stream, captured once and then launched whole, one
// cudaGraphLaunch, as often as needed.
//
//   CudaGraph graph(device, [&] { step(static_x, static_y); });  // runs nothing
//   for (...) { static_x.copy_(batch); graph.replay(); }         // each: the step's kernels
//
// The capture follows CUDA's rules: no wait for the device, no copy to or
// from pageable host memory, no cudaMalloc outside the allocator (a
// broken rule throws, with CUDA's error). A replay runs the kernels with
// the arguments and addresses they were captured with: the inputs must be
// written into the tensors the capture read (static buffers), and scalars
// that change (a learning rate) must live in device memory. What the
// capture allocates comes from the graph's private memory pool of the
// device's caching allocator and is given to nothing else while the graph
// lives (MemoryStats::graph_reserved): every replay writes it again.
#pragma once
#include <cstddef>
#include <functional>
#include <memory>
#include <string>

#include "core/device.h"

namespace anvil {

namespace cuda_hooks {
struct GraphImpl;
}

class CudaGraph {
 public:
  // Captures `work` on `device` (a CUDA device on which available() is "").
  // Throws std::invalid_argument for a device without graphs, and what the
  // capture's CUDA calls throw (std::runtime_error naming the call and
  // CUDA's error) when `work` breaks a rule; nothing is captured then.
  CudaGraph(Device device, const std::function<void()>& work);
  ~CudaGraph();
  CudaGraph(const CudaGraph&) = delete;
  CudaGraph& operator=(const CudaGraph&) = delete;

  // Queues the graph on the device's compute stream (the host does not wait).
  void replay();
  size_t nodes() const;  // kernels, copies and memsets captured
  Device device() const { return device_; }

  // "" when a graph can be captured on `device`, else why not (the CPU, a
  // build without CUDA, ANVIL_CUDA_SYNC=1, the profiler).
  static std::string unavailable(Device device);

 private:
  Device device_;
  std::unique_ptr<cuda_hooks::GraphImpl> impl_;
};

}  // namespace anvil
