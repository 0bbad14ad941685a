// Device discovery and per-device state of the CUDA backend: the answers to
// core/cuda_hooks.h for a build with real CUDA or the simulator. Each device
// gets, on first use, a caching allocator, a compute stream and a Backend.
#include <fmt/format.h>

#include <cstring>
#include <memory>
#include <mutex>
#include <vector>

#include "core/cuda_hooks.h"
#include "kernels/cuda/cuda_backend.h"

namespace anvil::cuda {
namespace {

struct Probe {
  int count = 0;
  std::string reason;
};

const Probe& probe() {
  static const Probe result = [] {
    Probe p;
    cudaError_t err = cudaGetDeviceCount(&p.count);
    if (err != cudaSuccess) {
      // No driver (cudaErrorInsufficientDriver) or no device: zero GPUs, not a crash.
      (void)cudaGetLastError();
      p.count = 0;
#if defined(ANVIL_CUDA_SIM)
      p.reason = fmt::format("the CUDA simulator has no devices ({}; set ANVIL_SIM_DEVICES)",
                             cudaGetErrorString(err));
#else
      p.reason = fmt::format("no usable CUDA driver or device: {}", cudaGetErrorString(err));
#endif
    } else if (p.count == 0) {
      p.reason = "the CUDA driver reports no GPU";
    }
    return p;
  }();
  return result;
}

struct DeviceState {
  std::once_flag once;
  std::unique_ptr<Allocator> allocator;
  cudaStream_t stream = nullptr;       // kernels and ordinary copies
  cudaStream_t copy_stream = nullptr;  // asynchronous copies that overlap compute
  std::unique_ptr<Backend> backend;
};

// One state per device, created at first use and never destroyed: tensors in
// static objects may be freed after static destructors would have run.
DeviceState& state(int index) {
  static auto* states = [] {
    auto* v = new std::vector<std::unique_ptr<DeviceState>>();
    for (int i = 0; i < probe().count; ++i) v->push_back(std::make_unique<DeviceState>());
    return v;
  }();
  DeviceState& s = *(*states)[size_t(index)];
  std::call_once(s.once, [&] {
    check(cudaSetDevice(index), "cudaSetDevice");
    s.allocator = make_caching_allocator(index);
    check(cudaStreamCreate(&s.stream), "cudaStreamCreate");
    check(cudaStreamCreate(&s.copy_stream), "cudaStreamCreate");
    s.backend = make_backend(index, s.stream);
  });
  return s;
}

}  // namespace

cudaStream_t compute_stream(int device) { return state(device).stream; }
cudaStream_t copy_stream(int device) { return state(device).copy_stream; }

}  // namespace anvil::cuda

namespace anvil::cuda_hooks {

int device_count() { return cuda::probe().count; }
std::string no_device_reason() { return cuda::probe().reason; }

bool simulated() {
#if defined(ANVIL_CUDA_SIM)
  return true;
#else
  return false;
#endif
}

DeviceProperties properties(int index) {
  cudaDeviceProp prop;
  std::memset(&prop, 0, sizeof prop);
  cuda::check(cudaGetDeviceProperties(&prop, index), "cudaGetDeviceProperties");
  DeviceProperties p;
  p.name = prop.name;
  p.total_memory = prop.totalGlobalMem;
  p.major = prop.major;
  p.minor = prop.minor;
  p.multiprocessors = prop.multiProcessorCount;
  p.simulated = simulated();
  return p;
}

Backend& backend(int index) { return *cuda::state(index).backend; }
Allocator& allocator(int index) { return *cuda::state(index).allocator; }

void synchronize(int index) {
  const cuda::DeviceState& s = cuda::state(index);
  cuda::check(cudaSetDevice(index), "cudaSetDevice");
  cuda::check(cudaStreamSynchronize(s.stream), "cudaStreamSynchronize");
  cuda::check(cudaStreamSynchronize(s.copy_stream), "cudaStreamSynchronize");
}

}  // namespace anvil::cuda_hooks
