// The CUDA hooks of a build without a CUDA backend (ANVIL_CUDA=OFF, or AUTO
// without nvcc): zero devices, and a reason that says how to get some.
#include <stdexcept>

#include "core/cuda_hooks.h"

namespace anvil::cuda_hooks {

int device_count() { return 0; }

std::string no_device_reason() {
  return "this build of anvil has no CUDA backend (configured with ANVIL_CUDA=OFF or without "
         "nvcc; ANVIL_CUDA=SIM gives simulated devices)";
}

bool simulated() { return false; }

CudaVersions versions() { return {}; }

[[noreturn]] static void unreachable() {
  throw std::logic_error("cuda_hooks called in a build without CUDA (device checks bypassed)");
}
DeviceProperties properties(int) { unreachable(); }
Backend& backend(int) { unreachable(); }
Allocator& allocator(int) { unreachable(); }
void synchronize(int) { unreachable(); }
std::unique_ptr<Event::Impl> make_event(int, bool) { unreachable(); }
void copy_async(int, Stream, void*, Device, const void*, Device, size_t) { unreachable(); }
Allocator& pinned_allocator() { unreachable(); }
std::unique_ptr<GraphImpl> capture_graph(int, const std::function<void()>&) { unreachable(); }
std::string graph_unavailable(int) { unreachable(); }

}  // namespace anvil::cuda_hooks
