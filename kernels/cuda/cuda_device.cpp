// Device discovery and per-device state of the CUDA backend: the answers to
// core/cuda_hooks.h for a build with real CUDA or the simulator. Each device
// gets, on first use, a caching allocator, a compute stream and a Backend.
#include <fmt/format.h>

#include <atomic>
#include <cstdlib>
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
  CudaVersions versions;
};

#if !defined(ANVIL_CUDA_SIM)
// Why cudaGetDeviceCount found no device, told apart by its error code and the
// driver's version (0 when no driver library could be loaded: cudart then
// answers cudaErrorInsufficientDriver too, as for a driver that is too old).
std::string no_device_reason(cudaError_t err, CudaVersions v) {
  const std::string runtime = cuda_version_text(v.runtime);
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  const std::string hidden =
      visible ? fmt::format(" (CUDA_VISIBLE_DEVICES={})", visible) : std::string();
  switch (err) {
    case cudaSuccess:
      return fmt::format("no CUDA device: the driver (CUDA {}) reports none{}",
                         cuda_version_text(v.driver), hidden);
    case cudaErrorNoDevice:
      return fmt::format("no CUDA device: the driver (CUDA {}) reports none{} (cudaErrorNoDevice)",
                         cuda_version_text(v.driver), hidden);
    case cudaErrorInsufficientDriver:
      if (v.driver == 0)
        return fmt::format(
            "no CUDA driver: libcuda.so.1 could not be loaded (cudaErrorInsufficientDriver; "
            "this build's runtime is CUDA {})",
            runtime);
      return fmt::format(
          "CUDA driver too old: it supports CUDA {}, this build's runtime is CUDA {} "
          "(cudaErrorInsufficientDriver)",
          cuda_version_text(v.driver), runtime);
    case cudaErrorStubLibrary:
      return "no CUDA driver: libcuda.so.1 is the CUDA toolkit's stub library, not a driver "
             "(cudaErrorStubLibrary)";
    case cudaErrorInitializationError:
      return fmt::format("no CUDA driver: the driver did not initialise (cudaErrorInitializationError: {})",
                         cudaGetErrorString(err));
    default:
      return fmt::format("no usable CUDA device: cudaGetDeviceCount failed with {}: {}",
                         cudaGetErrorName(err), cudaGetErrorString(err));
  }
}
#endif

const Probe& probe() {
  static const Probe result = [] {
    Probe p;
#if !defined(ANVIL_CUDA_SIM)
    // Neither call needs a driver: without one the driver's version is 0.
    if (cudaDriverGetVersion(&p.versions.driver) != cudaSuccess) p.versions.driver = 0;
    if (cudaRuntimeGetVersion(&p.versions.runtime) != cudaSuccess) p.versions.runtime = 0;
#endif
    cudaError_t err = cudaGetDeviceCount(&p.count);
    if (err != cudaSuccess) {
      // No driver, a driver too old, or no device: zero GPUs, not a crash.
      (void)cudaGetLastError();
      p.count = 0;
    }
    if (p.count > 0) return p;
#if defined(ANVIL_CUDA_SIM)
    p.reason = fmt::format("the CUDA simulator has no devices ({}; set ANVIL_SIM_DEVICES)",
                           cudaGetErrorString(err));
#else
    p.reason = no_device_reason(err, p.versions);
#endif
    return p;
  }();
  return result;
}

struct DeviceState {
  std::once_flag once;
  std::atomic<bool> ready{false};      // set once everything below exists
  std::unique_ptr<Allocator> allocator;
  cudaStream_t stream = nullptr;       // kernels and ordinary copies
  cudaStream_t copy_stream = nullptr;  // asynchronous copies that overlap compute
  std::unique_ptr<Backend> backend;
};

// One state per device, never destroyed: tensors in static objects may be
// freed after static destructors would have run. Made before any device is
// touched; each device's state is filled in at its first use (state()).
std::vector<std::unique_ptr<DeviceState>>& states() {
  static auto* all = [] {
    auto* v = new std::vector<std::unique_ptr<DeviceState>>();
    for (int i = 0; i < probe().count; ++i) v->push_back(std::make_unique<DeviceState>());
    return v;
  }();
  return *all;
}

DeviceState& state(int index) {
  DeviceState& s = *states()[size_t(index)];
  std::call_once(s.once, [&] {
    check(cudaSetDevice(index), "cudaSetDevice");
    s.allocator = make_caching_allocator(index);
    check(cudaStreamCreate(&s.stream), "cudaStreamCreate");
    check(cudaStreamCreate(&s.copy_stream), "cudaStreamCreate");
    s.backend = std::make_unique<CudaBackend>(index, s.stream);
    s.ready.store(true, std::memory_order_release);
  });
  return s;
}

}  // namespace

bool initialised(int device) {
  if (device < 0 || device >= probe().count) return false;
  return states()[size_t(device)]->ready.load(std::memory_order_acquire);
}

cudaStream_t compute_stream(int device) { return state(device).stream; }
cudaStream_t copy_stream(int device) { return state(device).copy_stream; }

}  // namespace anvil::cuda

namespace anvil::cuda_hooks {

int device_count() { return cuda::probe().count; }
std::string no_device_reason() { return cuda::probe().reason; }
CudaVersions versions() { return cuda::probe().versions; }

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
  // A device not used yet has nothing queued: waiting for it must not create
  // a context on it (on a machine with several GPUs, a test on cuda:0 touches
  // no other).
  if (!cuda::initialised(index)) return;
  const cuda::DeviceState& s = cuda::state(index);
  cuda::check(cudaSetDevice(index), "cudaSetDevice");
  cuda::check(cudaStreamSynchronize(s.copy_stream), "cudaStreamSynchronize");
  // The compute stream through the backend, which reports a bad label its
  // checks found meanwhile (Backend::check_labels).
  static_cast<cuda::CudaBackend&>(*s.backend).wait();
}

}  // namespace anvil::cuda_hooks
