#include "core/backend.h"

#include "core/cuda_hooks.h"
#include "core/profile.h"
#include "core/profile_backend.h"

namespace anvil {

Backend& cpu_backend();  // kernels/cpu/cpu_backend.cpp

Backend& backend_for(Device device) {
  if (device.is_cpu())
    return profile::enabled() ? profiling_backend(cpu_backend(), device) : cpu_backend();
  check_cuda_device(device);
  Backend& b = cuda_hooks::backend(device.index);
  return profile::enabled() ? profiling_backend(b, device) : b;
}

}  // namespace anvil
