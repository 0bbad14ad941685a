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

void cpu::CpuBackend::copy_rows(const Tensor& src, int64_t src_stride, const Tensor& dst,
                                int64_t dst_stride, int64_t rows, int64_t width) {
  const size_t element = dtype_size(src.dtype()), bytes = size_t(width) * element;
  const auto* from = static_cast<const char*>(src.raw_data());
  auto* to = static_cast<char*>(dst.raw_data());
  for (int64_t i = 0; i < rows; ++i)
    std::memcpy(to + size_t(i * dst_stride) * element, from + size_t(i * src_stride) * element,
                bytes);
}

Backend& cpu_backend() {
  static cpu::CpuBackend backend;
  return backend;
}

}  // namespace anvil
