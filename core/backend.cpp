#include "core/backend.h"

#include <stdexcept>

#include <fmt/format.h>

namespace anvil {

Backend& cpu_backend();  // kernels/cpu/cpu_backend.cpp

Backend& backend_for(Device device) {
  if (device.is_cpu()) return cpu_backend();
  throw std::runtime_error(
      fmt::format("device {} is not available: {}", device.str(), no_gpu_reason()));
}

}  // namespace anvil
