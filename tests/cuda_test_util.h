// Helpers for tests of kernels/cuda: device buffers, random inputs and a
// tolerance check against the CPU reference. Used by the kernel tests, which
// run on the simulator (ANVIL_CUDA=SIM builds) or on a real GPU when present.
#pragma once
#if defined(ANVIL_CUDA_BACKEND)
#include <catch2/catch.hpp>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "core/device.h"
#include "kernels/cuda/runtime.h"

namespace cuda_test {

// True when there is a CUDA device to run on; otherwise the caller returns
// (a real-CUDA build on a machine without a GPU: the simulator build runs these).
inline bool have_device() {
  if (anvil::device_count() > 0) {
    anvil::cuda::check(cudaSetDevice(0), "cudaSetDevice");
    return true;
  }
  WARN("no CUDA device (" << anvil::no_gpu_reason() << "): CUDA kernel test not run");
  return false;
}

inline std::vector<float> random_floats(size_t n, uint32_t seed, float lo = -1.0f,
                                        float hi = 1.0f) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(gen);
  return v;
}

// A device buffer of T, freed at scope exit (the ASan build checks for leaks).
template <typename T>
struct DeviceBuffer {
  T* ptr = nullptr;
  size_t count = 0;
  explicit DeviceBuffer(size_t n) : count(n) {
    anvil::cuda::check(cudaMalloc(reinterpret_cast<void**>(&ptr), std::max<size_t>(n, 1) * sizeof(T)),
                       "cudaMalloc");
  }
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size()) {
    if (!host.empty())
      anvil::cuda::check(
          cudaMemcpy(ptr, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice),
          "cudaMemcpy");
  }
  ~DeviceBuffer() { cudaFree(ptr); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  // Waits for the device, then copies back.
  std::vector<T> to_host() const {
    anvil::cuda::check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    std::vector<T> v(count);
    if (count)
      anvil::cuda::check(cudaMemcpy(v.data(), ptr, count * sizeof(T), cudaMemcpyDeviceToHost),
                         "cudaMemcpy");
    return v;
  }
};

// Every element within atol + rtol*|want|; names the first element that is not.
inline void require_close(const std::vector<float>& got, const std::vector<float>& want,
                          float rtol = 1e-5f, float atol = 1e-5f) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    if (!(std::fabs(got[i] - want[i]) <= atol + rtol * std::fabs(want[i]))) {
      INFO("element " << i << ": got " << got[i] << ", want " << want[i]);
      REQUIRE(std::fabs(got[i] - want[i]) <= atol + rtol * std::fabs(want[i]));
    }
  }
}

}  // namespace cuda_test
#endif
