#include "core/backend.h"

#include "core/cuda_hooks.h"

namespace anvil {

Backend& cpu_backend();  // kernels/cpu/cpu_backend.cpp

Backend& backend_for(Device device) {
  if (device.is_cpu()) return cpu_backend();
  check_cuda_device(device);
  return cuda_hooks::backend(device.index);
}

}  // namespace anvil
