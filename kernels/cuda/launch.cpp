// The out-of-line half of anvil::cuda::launch (cuda_compat.h): the
// ANVIL_CUDA_SYNC switch and the text of a failed launch.
#include <cxxabi.h>
#include <dlfcn.h>
#include <fmt/format.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <memory>

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

std::string demangle(const char* symbol) {
  int status = 0;
  std::unique_ptr<char, decltype(&std::free)> text(
      abi::__cxa_demangle(symbol, nullptr, nullptr, &status), &std::free);
  return status == 0 && text ? std::string(text.get()) : std::string(symbol);
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
  Dl_info info{};
  if (dladdr(kernel, &info) != 0 && info.dli_sname != nullptr) return demangle(info.dli_sname);
  return fmt::format("kernel at {}", kernel);
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
