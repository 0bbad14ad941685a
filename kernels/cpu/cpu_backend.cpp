// The CPU Backend's one instance, and its one method without kernels: each
// family's methods are in that family's file (cpu_backend.h lists them).
#include "kernels/cpu/cpu_backend.h"

#include <cstring>
#include <stdexcept>

namespace anvil {

void cpu::CpuBackend::copy(const Tensor& src, const Tensor& dst) {
  if (!src.device().is_cpu() || !dst.device().is_cpu())
    throw std::logic_error("cpu backend asked to copy device memory");
  if (src.nbytes()) std::memmove(dst.raw_data(), src.raw_data(), src.nbytes());
}

Backend& cpu_backend() {
  static cpu::CpuBackend backend;
  return backend;
}

}  // namespace anvil
