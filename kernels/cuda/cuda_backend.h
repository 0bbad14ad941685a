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

// The device's compute stream and copy stream (created with the device's state).
cudaStream_t compute_stream(int device);
cudaStream_t copy_stream(int device);

}  // namespace anvil::cuda
