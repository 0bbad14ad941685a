// Helpers for tests of kernels/cuda: the one place a CUDA test decides
// whether it can run (have_device), the banner the test runners print, device
// buffers, random inputs and a tolerance check against the CPU reference.
// The kernel tests run on the simulator (ANVIL_CUDA=SIM builds) or on a real
// GPU when present.
#pragma once
#include <catch2/catch.hpp>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>

#include "core/device.h"
#if defined(ANVIL_CUDA_BACKEND)
#include "kernels/cuda/runtime.h"
#endif

namespace cuda_test {

// ANVIL_REQUIRE_CUDA=1 (tools/gpu/gpu-check.sh sets it when nvidia-smi lists a
// GPU): a CUDA test that finds no usable device fails instead of skipping,
// so that a GPU run cannot pass by running nothing.
inline bool cuda_required() {
  static const bool required = [] {
    const char* v = std::getenv("ANVIL_REQUIRE_CUDA");
    return v != nullptr && *v != '\0' && std::strcmp(v, "0") != 0;
  }();
  return required;
}

// One line for the start of a test run: cuda:0's name and compute
// capability (the device the tests use), the CUDA driver's and runtime's
// versions, or why there is no device and what the CUDA tests will do.
inline std::string device_banner() {
  const anvil::CudaVersions v = anvil::cuda_versions();
  const std::string versions = "CUDA driver " + anvil::cuda_version_text(v.driver) +
                               ", runtime " + anvil::cuda_version_text(v.runtime);
  const int n = anvil::device_count();
  if (n == 0)
    return "CUDA: no usable device: " + anvil::no_gpu_reason() + "; " + versions + "; " +
           (cuda_required() ? "ANVIL_REQUIRE_CUDA=1: the CUDA tests fail"
                            : "the CUDA tests skip (ANVIL_REQUIRE_CUDA=1 makes them fail)");
  std::string line;
  try {
    const anvil::DeviceProperties p = anvil::device_properties(anvil::Device::cuda(0));
    line = "CUDA: tests run on cuda:0, " + p.name + (p.simulated ? " (simulated)" : "") +
           ", compute capability " + std::to_string(p.major) + "." + std::to_string(p.minor);
  } catch (const std::exception& e) {
    line = std::string("CUDA: cuda:0's properties could not be read: ") + e.what();
  }
  return line + "; " + std::to_string(n) + " device" + (n == 1 ? "" : "s") + " visible; " +
         versions + (cuda_required() ? "; ANVIL_REQUIRE_CUDA=1" : "");
}

// True when cuda:0 is there to test on (and is then the current device).
// Otherwise the caller's CUDA part must not run: with ANVIL_REQUIRE_CUDA=1
// the test fails here, naming the reason (no driver, driver too old, no
// device); without it, it warns and returns false, and the caller returns
// or runs its CPU part only (a real-CUDA build on a machine without a GPU;
// the simulator build runs these).
inline bool have_device(const char* what = "CUDA kernel test") {
  if (anvil::device_count() > 0) {
#if defined(ANVIL_CUDA_BACKEND)
    // The kernel tests call the runtime themselves (cudaMalloc): on cuda:0.
    anvil::cuda::check(cudaSetDevice(0), "cudaSetDevice");
#endif
    return true;
  }
  if (cuda_required())
    FAIL("ANVIL_REQUIRE_CUDA=1 and no usable CUDA device: " << anvil::no_gpu_reason() << " ("
         << what << " not run)");
  WARN("no CUDA device (" << anvil::no_gpu_reason() << "): " << what << " not run");
  return false;
}

}  // namespace cuda_test

#if defined(ANVIL_CUDA_BACKEND)
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

namespace cuda_test {

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
