// The one header every kernels/cuda/*.cu includes. Under nvcc it is the real
// CUDA runtime; under the simulator (ANVIL_CUDA_SIM, the .cu compiled as C++
// by g++) it is sim/cuda_sim.h. Op code launches kernels through
// anvil::cuda::launch and never writes <<<>>>, which g++ cannot parse.
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <source_location>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>

#if !defined(__CUDACC__) && !defined(ANVIL_CUDA_SIM)
#error "kernel files need nvcc or the simulator (define ANVIL_CUDA_SIM); host code includes kernels/cuda/runtime.h"
#endif
#include "kernels/cuda/runtime.h"

namespace anvil::cuda {

// A grid size that also records where the launch was written, so that a
// failed launch names the caller's file:line without a macro.
struct GridArg {
  dim3 dims;
  std::source_location where;
  GridArg(dim3 d, std::source_location w = std::source_location::current()) : dims(d), where(w) {}
  GridArg(unsigned d, std::source_location w = std::source_location::current())
      : dims(d), where(w) {}
};

// The block's dynamic shared memory (the launch's shared_bytes), as T*.
// `extern __shared__` cannot be expressed by a macro in the simulator, hence
// a function in both worlds.
template <typename T>
__device__ __forceinline__ T* dynamic_shared() {
#if defined(__CUDACC__)
  extern __shared__ __align__(16) unsigned char anvil_dynamic_smem[];
  return reinterpret_cast<T*>(anvil_dynamic_smem);
#else
  return static_cast<T*>(anvil::sim::dynamic_shared_bytes());
#endif
}

// Lets `kernel` launch with `bytes` of dynamic shared memory, past the 48 KB
// a kernel gets without opting in: cudaFuncSetAttribute(kernel,
// cudaFuncAttributeMaxDynamicSharedMemorySize, bytes), once per kernel and
// device (the attribute is the function's in the current device's
// context). `devices`: the kernel's own, a bit per device already done.
template <typename Kernel>
void opt_in_shared(Kernel kernel, int bytes, std::atomic<uint64_t>& devices,
                   std::source_location where = std::source_location::current()) {
  int device = 0;
  check(cudaGetDevice(&device), "cudaGetDevice", where);
  const uint64_t bit = uint64_t{1} << (device & 63);
  if (devices.load(std::memory_order_acquire) & bit) return;
  check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes),
        "cudaFuncSetAttribute(MaxDynamicSharedMemorySize)", where);
  devices.fetch_or(bit, std::memory_order_release);
}

// kernel<<<grid, block, shared_bytes, stream>>>(args...), then a check that
// the launch was accepted; with ANVIL_CUDA_SYNC=1 also a wait for the kernel
// and a check that it ran. Either failure throws std::runtime_error naming
// the kernel, grid, block and the caller's file:line.
template <typename... KArgs, typename... Args>
void launch(void (*kernel)(KArgs...), GridArg grid, dim3 block, size_t shared_bytes,
            cudaStream_t stream, Args&&... args) {
  static_assert(sizeof...(KArgs) == sizeof...(Args), "kernel argument count mismatch");
  const void* kernel_ptr = reinterpret_cast<const void*>(kernel);
  const bool profiled = profiling();
  if (profiled) profile_launch_begin(kernel_ptr, stream);
#if defined(__CUDACC__)
  kernel<<<grid.dims, block, shared_bytes, stream>>>(std::forward<Args>(args)...);
  if (cudaError_t err = cudaGetLastError(); err != cudaSuccess)
    throw_launch_error(kernel_ptr, grid.dims, block, shared_bytes, grid.where,
                       "was refused at launch", err);
#else
  // Arguments are converted once, as the launch would copy them to the
  // device; every CUDA thread then gets its own copies, as its parameters.
  // The call lives on the heap and the stream queue owns it: the launch may
  // run after this function has returned (deferred streams).
  struct Call final : anvil::sim::KernelCall {
    void (*kernel)(KArgs...);
    std::tuple<KArgs...> params;
    Call(void (*k)(KArgs...), std::tuple<KArgs...>&& p) : kernel(k), params(std::move(p)) {}
    void run_thread() const override { std::apply(kernel, params); }
    const void* kernel_address() const override { return reinterpret_cast<const void*>(kernel); }
  };
  anvil::sim::launch_kernel(
      grid.dims, block, shared_bytes, stream, grid.where,
      std::make_unique<Call>(kernel, std::tuple<KArgs...>(std::forward<Args>(args)...)));
#endif
  if (profiled) profile_launch_end(stream);
  if (sync_launches()) {
    if (cudaError_t err = cudaStreamSynchronize(stream); err != cudaSuccess)
      throw_launch_error(kernel_ptr, grid.dims, block, shared_bytes, grid.where,
                         "failed while running (ANVIL_CUDA_SYNC=1 checks every launch)", err);
  }
}

}  // namespace anvil::cuda
