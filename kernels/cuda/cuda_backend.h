// Internal to kernels/cuda: the pieces cuda_device.cpp assembles per device.
#pragma once
#include <memory>

#include "core/backend.h"
#include "core/storage.h"
#include "kernels/cuda/runtime.h"

namespace anvil::cuda {

// A caching allocator over cudaMalloc for one device (cuda_allocator.cpp).
std::unique_ptr<Allocator> make_caching_allocator(int device);

// The Backend of one device: kernels launched on `stream`, scratch from `allocator`
// (cuda_backend.cpp).
std::unique_ptr<Backend> make_backend(int device, cudaStream_t stream);

// True once the device's state (allocator, streams, backend) exists: a
// device no tensor or stream has used yet is false, and asking does not
// create a context on it.
bool initialised(int device);

// The device's compute stream and copy stream (created with the device's state).
cudaStream_t compute_stream(int device);
cudaStream_t copy_stream(int device);

// For tests of the pinned host allocator (cuda_stream.cpp): the next free
// of a pinned block fails with `err`, as on a device left in an error state
// by a faulted kernel; and how many blocks such failures leaked.
void fail_next_pinned_free(cudaError_t err);
size_t pinned_blocks_leaked();

}  // namespace anvil::cuda
