// What core needs from the CUDA backend, implemented by kernels/cuda (real
// GPUs or the simulator) or by kernels/cuda/cuda_off.cpp in a build without
// one. Internal to the library: users go through device.h and storage.h.
#pragma once
#include <string>

#include "core/device.h"

namespace anvil {
class Backend;
class Allocator;
}  // namespace anvil

namespace anvil::cuda_hooks {

int device_count();                 // asks the runtime once; 0 on any error
std::string no_device_reason();     // "" when there are devices
bool simulated();
DeviceProperties properties(int index);   // index already checked
Backend& backend(int index);              // index already checked
Allocator& allocator(int index);          // index already checked
void synchronize(int index);              // index already checked

}  // namespace anvil::cuda_hooks
