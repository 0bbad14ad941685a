// The out-of-line half of anvil::cuda::launch (cuda_compat.h): the
// ANVIL_CUDA_SYNC switch and the text of a failed launch.
#include <fmt/format.h>

#include <atomic>
#include <cstdlib>
#include <cstring>

#include "core/symbol_name.h"
#include "kernels/cuda/runtime.h"

namespace anvil::cuda {
namespace {

std::atomic<bool>& sync_flag() {
  static std::atomic<bool> flag = [] {
    const char* v = std::getenv("ANVIL_CUDA_SYNC");
    return v != nullptr && *v != '\0' && std::strcmp(v, "0") != 0;
  }();
  return flag;
}

}  // namespace

bool sync_launches() { return sync_flag().load(std::memory_order_relaxed); }
void set_sync_launches(bool on) { sync_flag().store(on, std::memory_order_relaxed); }

std::string kernel_name(const void* kernel) {
#if !defined(ANVIL_CUDA_SIM)
  const char* name = nullptr;
  if (cudaFuncGetName(&name, kernel) == cudaSuccess && name != nullptr) return demangle(name);
  (void)cudaGetLastError();
#endif
  return kernel_name_at(kernel);
}

void throw_launch_error(const void* kernel, dim3 grid, dim3 block, size_t shared_bytes,
                        std::source_location where, const char* when, cudaError_t err) {
  (void)cudaGetLastError();
  throw std::runtime_error(fmt::format(
      "{}:{}: kernel {} {}: grid ({}, {}, {}), block ({}, {}, {}), {} shared bytes: {}",
      where.file_name(), where.line(), kernel_name(kernel), when, grid.x, grid.y, grid.z,
      block.x, block.y, block.z, shared_bytes, cudaGetErrorString(err)));
}

}  // namespace anvil::cuda
