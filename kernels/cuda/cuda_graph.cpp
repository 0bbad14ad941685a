// CUDA graphs: the CUDA side of core/graph.h. A capture is global-mode
// stream capture of the device's compute stream (cudaStreamBeginCapture),
// with the device's caching allocator serving the capturing thread from a
// new private pool (cuda_allocator.cpp) and the backend counting the label
// checks it captures; a replay is one cudaGraphLaunch on the compute
// stream. Whatever breaks a capture rule while `work` runs (a wait for
// the device, a copy from pageable memory) is reported by the call that
// broke it, or by cudaStreamEndCapture, with CUDA's error.
#include <fmt/format.h>

#include <stdexcept>

#include "core/cuda_hooks.h"
#include "kernels/cuda/cuda_backend.h"

namespace anvil::cuda {
namespace {

class CudaGraph final : public cuda_hooks::GraphImpl {
 public:
  explicit CudaGraph(int device) : device_(device), allocator_(cuda_hooks::allocator(device)) {}
  ~CudaGraph() override {
    // Not checked: a destructor must not throw (an exec still running is
    // freed by the runtime when its launches finish).
    if (exec_) (void)cudaGraphExecDestroy(exec_);
    release_graph_pool(allocator_, pool_);
  }
  CudaGraph(const CudaGraph&) = delete;
  CudaGraph& operator=(const CudaGraph&) = delete;

  void capture(const std::function<void()>& work) {
    auto& backend = static_cast<CudaBackend&>(cuda_hooks::backend(device_));
    check(cudaSetDevice(device_), "cudaSetDevice");
    const cudaStream_t stream = compute_stream(device_);
    pool_ = begin_graph_pool(allocator_);
    check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), "cudaStreamBeginCapture");
    backend.begin_capture();
    cudaGraph_t graph = nullptr;
    try {
      work();
    } catch (...) {
      backend.end_capture();
      end_graph_pool(allocator_);
      if (cudaStreamEndCapture(stream, &graph) == cudaSuccess && graph) (void)cudaGraphDestroy(graph);
      (void)cudaGetLastError();
      throw;
    }
    label_checks_ = backend.end_capture();
    end_graph_pool(allocator_);
    check(cudaStreamEndCapture(stream, &graph), "cudaStreamEndCapture");
    cudaError_t err = cudaGraphGetNodes(graph, nullptr, &nodes_);
    if (err == cudaSuccess) err = cudaGraphInstantiate(&exec_, graph, 0);
    (void)cudaGraphDestroy(graph);  // the executable graph keeps what it needs
    check(err, "cudaGraphInstantiate");
  }

  void replay() override {
    check(cudaSetDevice(device_), "cudaSetDevice");
    check(cudaGraphLaunch(exec_, compute_stream(device_)), "cudaGraphLaunch");
    static_cast<CudaBackend&>(cuda_hooks::backend(device_)).replayed(label_checks_);
  }

  size_t nodes() const override { return nodes_; }

 private:
  const int device_;
  Allocator& allocator_;
  uint64_t pool_ = 0;
  cudaGraphExec_t exec_ = nullptr;
  size_t nodes_ = 0;
  int64_t label_checks_ = 0;
};

}  // namespace
}  // namespace anvil::cuda

namespace anvil::cuda_hooks {

std::unique_ptr<GraphImpl> capture_graph(int index, const std::function<void()>& work) {
  auto graph = std::make_unique<cuda::CudaGraph>(index);
  graph->capture(work);
  return graph;
}

std::string graph_unavailable(int) {
  if (cuda::sync_launches())
    return "ANVIL_CUDA_SYNC=1 waits for the device after every launch, which a capture cannot hold";
  if (cuda::profiling())
    return "the profiler (--profile) times every launch with events of its own";
  return "";
}

}  // namespace anvil::cuda_hooks
