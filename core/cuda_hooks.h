// What core needs from the CUDA backend, implemented by kernels/cuda (real
// GPUs or the simulator) or by kernels/cuda/cuda_off.cpp in a build without
// one. Internal to the library: users go through device.h and storage.h.
#pragma once
#include <functional>
#include <memory>
#include <string>

#include "core/device.h"
#include "core/stream.h"

namespace anvil {
class Backend;
class Allocator;
}  // namespace anvil

namespace anvil::cuda_hooks {

int device_count();                 // asks the runtime once; 0 on any error
std::string no_device_reason();     // "" when there are devices
bool simulated();
CudaVersions versions();            // {0, 0} without a driver, CUDA build or real runtime
DeviceProperties properties(int index);   // index already checked
Backend& backend(int index);              // index already checked
Allocator& allocator(int index);          // index already checked
void synchronize(int index);              // index already checked

// Events and the copy stream (core/stream.h). `index` is the CUDA device
// that runs the copy; dst/src are device or host pointers as their devices say.
std::unique_ptr<Event::Impl> make_event(int index, bool timing);
void copy_async(int index, Stream stream, void* dst, Device dst_device, const void* src,
                Device src_device, size_t bytes);
// Page-locked host memory (cudaHostAlloc), cached; throws without CUDA devices.
Allocator& pinned_allocator();

// CUDA graphs (core/graph.h): `work` captured from the device's compute
// stream, what it allocates from a private pool of the device's allocator.
struct GraphImpl {
  virtual ~GraphImpl() = default;
  virtual void replay() = 0;
  virtual size_t nodes() const = 0;
};
std::unique_ptr<GraphImpl> capture_graph(int index, const std::function<void()>& work);
// Why no graph can be captured on the device now ("" when one can).
std::string graph_unavailable(int index);

}  // namespace anvil::cuda_hooks
