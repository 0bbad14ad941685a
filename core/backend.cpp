#include "core/backend.h"

#include <fmt/format.h>

#include "core/cuda_hooks.h"
#include "core/profile.h"
#include "core/profile_backend.h"

namespace anvil {

Backend& cpu_backend();  // kernels/cpu/cpu_backend.cpp

std::string label_error(int64_t label, int64_t classes, int64_t position, int64_t size,
                        const std::string& found) {
  return fmt::format("cross_entropy: label {} out of range [0, {}) for {} classes, at position {} "
                     "of a batch of {}{}{}",
                     label, classes, classes, position, size, found.empty() ? "" : " (", found) +
         (found.empty() ? "" : ")");
}

Backend& backend_for(Device device) {
  if (device.is_cpu())
    return profile::enabled() ? profiling_backend(cpu_backend(), device) : cpu_backend();
  check_cuda_device(device);
  Backend& b = cuda_hooks::backend(device.index);
  return profile::enabled() ? profiling_backend(b, device) : b;
}

}  // namespace anvil
