// The CUDA simulator (sim/): simulated device memory, and the errors the
// simulator must report instead of hanging or corrupting memory. (The kernel
// tests, e.g. test_cuda_gemm.cpp, run on it too.)
#if defined(ANVIL_CUDA_SIM)
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cuda/cuda_kernels.h"
#include "tests/cuda_test_util.h"
#include "tests/sync_launches.h"
#include "sim_broken_kernels.cu"

namespace {

using Vec = std::vector<float>;

using DeviceBuffer = cuda_test::DeviceBuffer<float>;

}  // namespace

TEST_CASE("sim: cudaMemcpy checks the kind and the range against the allocation", "[sim][tsan]") {
  Vec host(16, 1.0f);
  DeviceBuffer dev(16);
  SECTION("the right kind and size succeed") {
    REQUIRE(cudaMemcpy(dev.ptr, host.data(), 64, cudaMemcpyHostToDevice) == cudaSuccess);
    REQUIRE(cudaMemcpy(host.data(), dev.ptr, 64, cudaMemcpyDefault) == cudaSuccess);
    REQUIRE(cudaMemcpy(dev.ptr + 8, dev.ptr, 32, cudaMemcpyDeviceToDevice) == cudaSuccess);
  }
  SECTION("a wrong kind is an error with a readable detail") {
    REQUIRE(cudaMemcpy(dev.ptr, host.data(), 64, cudaMemcpyDeviceToHost) ==
            cudaErrorInvalidValue);
    REQUIRE(cudaGetLastError() == cudaErrorInvalidValue);
    REQUIRE(cudaGetLastError() == cudaSuccess);  // reading it resets it
    REQUIRE_THAT(anvil::sim::last_error_detail(), Catch::Contains("cudaMemcpyDeviceToHost"));
    REQUIRE(cudaMemcpy(host.data(), host.data() + 8, 4, cudaMemcpyDeviceToDevice) ==
            cudaErrorInvalidValue);
  }
  SECTION("a range past the allocation is an error") {
    REQUIRE(cudaMemcpy(dev.ptr, host.data(), 68, cudaMemcpyHostToDevice) ==
            cudaErrorInvalidValue);
    REQUIRE_THAT(anvil::sim::last_error_detail(), Catch::Contains("overruns"));
    REQUIRE(cudaMemcpy(host.data(), dev.ptr + 12, 32, cudaMemcpyDeviceToHost) ==
            cudaErrorInvalidValue);
    REQUIRE(cudaMemset(dev.ptr + 1, 0, 64) == cudaErrorInvalidValue);
  }
  SECTION("freeing a pointer that is not a cudaMalloc block is an error") {
    REQUIRE(cudaFree(host.data()) == cudaErrorInvalidValue);
  }
}

TEST_CASE("sim: launches with a bad configuration are refused", "[sim][tsan]") {
  DeviceBuffer out(2048);
  using sim_test_kernels::read_uninitialised_shared;
  SECTION("1025 threads in a block") {
    REQUIRE_THROWS_WITH(anvil::cuda::launch(read_uninitialised_shared, 1, dim3(1025), 4, nullptr,
                                            out.ptr),
                        Catch::Contains("1025 threads, the limit is 1024") &&
                            Catch::Contains("test_sim.cpp"));
  }
  SECTION("a block dimension over its limit") {
    REQUIRE_THROWS_WITH(anvil::cuda::launch(read_uninitialised_shared, 1, dim3(1, 1, 65), 4,
                                            nullptr, out.ptr),
                        Catch::Contains("per-dimension limits"));
  }
  SECTION("a grid y over 65535") {
    REQUIRE_THROWS_WITH(anvil::cuda::launch(read_uninitialised_shared, dim3(1, 65536), dim3(1),
                                            4, nullptr, out.ptr),
                        Catch::Contains("exceeds the limits"));
  }
  SECTION("more than 48 KiB of dynamic shared memory") {
    REQUIRE_THROWS_WITH(anvil::cuda::launch(read_uninitialised_shared, 1, dim3(1), 48 * 1024 + 4,
                                            nullptr, out.ptr),
                        Catch::Contains("dynamic shared memory"));
  }
}

// The CUDA Programming Guide (compute capabilities, shared memory): a block
// may have more than 48 KB of shared memory only as dynamic shared memory,
// after its kernel opts in with cudaFuncSetAttribute(kernel,
// cudaFuncAttributeMaxDynamicSharedMemorySize, bytes), up to the device's
// sharedMemPerBlockOptin (163 KB at compute capability 8.0, the simulated
// device's; 227 KB at 9.0); the Runtime API: a value beyond it is
// cudaErrorInvalidValue, and a launch may ask for at most the kernel's value.
TEST_CASE("sim: more than 48 KB of dynamic shared memory needs the kernel's opt-in", "[sim][tsan]") {
  cudaDeviceProp prop;
  REQUIRE(cudaGetDeviceProperties(&prop, 0) == cudaSuccess);
  REQUIRE(prop.sharedMemPerBlock == 48 * 1024);
  REQUIRE(prop.sharedMemPerBlockOptin == 163 * 1024);
  DeviceBuffer out(1);
  const auto kernel = sim_test_kernels::sum_dynamic_shared;
  const int big = 64 * 1024, floats = big / 4;
  // 48 KB without opting in; one float more is refused, naming the way out.
  anvil::cuda::launch(kernel, 1, dim3(64), 48 * 1024, nullptr, out.ptr, 12 * 1024);
  REQUIRE(out.to_host()[0] == 12 * 1024.0f);
  REQUIRE_THROWS_WITH(anvil::cuda::launch(kernel, 1, dim3(64), 48 * 1024 + 4, nullptr, out.ptr, 1),
                      Catch::Contains("the kernel's limit is 49152") &&
                          Catch::Contains("cudaFuncAttributeMaxDynamicSharedMemorySize"));
  // Beyond the device's opt-in limit: refused, the kernel's limit unchanged.
  REQUIRE(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               int(prop.sharedMemPerBlockOptin) + 1) == cudaErrorInvalidValue);
  REQUIRE(cudaGetLastError() == cudaErrorInvalidValue);
  REQUIRE_THROWS(anvil::cuda::launch(kernel, 1, dim3(64), big, nullptr, out.ptr, floats));
  // Opted in to 64 KB: all of it is there, and no byte more.
  REQUIRE(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, big) ==
          cudaSuccess);
  anvil::cuda::launch(kernel, 1, dim3(64), big, nullptr, out.ptr, floats);
  REQUIRE(out.to_host()[0] == float(floats));
  REQUIRE_THROWS_WITH(anvil::cuda::launch(kernel, 1, dim3(64), big + 4, nullptr, out.ptr, 1),
                      Catch::Contains("the kernel's limit is 65536"));
  // The opt-in is the kernel's: another kernel still has 48 KB.
  REQUIRE_THROWS(anvil::cuda::launch(sim_test_kernels::read_uninitialised_shared, 1, dim3(1), big,
                                     nullptr, out.ptr));
  // Up to the device's limit exactly.
  REQUIRE(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               int(prop.sharedMemPerBlockOptin)) == cudaSuccess);
  anvil::cuda::launch(kernel, 1, dim3(64), prop.sharedMemPerBlockOptin, nullptr, out.ptr,
                      int(prop.sharedMemPerBlockOptin / 4));
  REQUIRE(out.to_host()[0] == float(prop.sharedMemPerBlockOptin / 4));
}

TEST_CASE("sim: a __syncthreads reached by part of a block is reported, not a hang", "[sim][tsan]") {
  DeviceBuffer out(64);
  const cuda_test::SyncLaunches no_sync(false);  // (ANVIL_CUDA_SYNC=1 would report it at once)
  // The launch is accepted; the failure comes back from the sync that runs it.
  anvil::cuda::launch(sim_test_kernels::divergent_sync, 2, dim3(32), 0, nullptr, out.ptr);
  REQUIRE_THROWS_WITH(out.to_host(), Catch::Contains("divergent __syncthreads") &&
                                         Catch::Contains("16 of 32 threads") &&
                                         Catch::Contains("test_sim.cpp"));
  // The simulator is usable again afterwards.
  DeviceBuffer in(Vec(100, 2.0f));
  anvil::cuda::launch(sim_test_kernels::reverse_through_shared, 4, dim3(32), 32 * sizeof(float),
                      nullptr, in.ptr, out.ptr, 64);
  REQUIRE(out.to_host()[0] == 2.0f);
}

TEST_CASE("ANVIL_CUDA_SYNC=1 reports a kernel's fault at its launch, naming kernel, grid and block",
          "[sim][cuda-sync]") {
  DeviceBuffer out(64);
  // As the variable would (it is read once): launch() waits for every kernel.
  cuda_test::SyncLaunches sync_launches(true);
  const int line = __LINE__ + 1;  // the launch's line: that of the macro around it
  REQUIRE_THROWS_WITH(
      anvil::cuda::launch(sim_test_kernels::divergent_sync, dim3(2, 3), dim3(32), 0, nullptr,
                          out.ptr),
      Catch::Contains("test_sim.cpp:" + std::to_string(line)) &&
          Catch::Contains("kernel sim_test_kernels::divergent_sync(float*) failed while running") &&
          Catch::Contains("grid (2, 3, 1), block (32, 1, 1), 0 shared bytes") &&
          Catch::Contains("divergent __syncthreads"));
  // Reported once, at that launch: the next kernel runs and is checked too.
  DeviceBuffer in(Vec(100, 2.0f));
  anvil::cuda::launch(sim_test_kernels::reverse_through_shared, 4, dim3(32), 32 * sizeof(float),
                      nullptr, in.ptr, out.ptr, 64);
  REQUIRE(out.to_host()[0] == 2.0f);
}

TEST_CASE("a launch's kernel has a readable name", "[sim][cuda-sync]") {
  CHECK(anvil::cuda::kernel_name(reinterpret_cast<const void*>(&sim_test_kernels::count_threads)) ==
        "sim_test_kernels::count_threads(int*, float*)");
  const int not_a_kernel = 0;
  CHECK_THAT(anvil::cuda::kernel_name(&not_a_kernel), Catch::StartsWith("kernel at 0x"));
}

TEST_CASE("sim: shared memory, atomics and thread indexing", "[sim][tsan]") {
  SECTION("uninitialised dynamic shared memory reads as NaN") {
    DeviceBuffer out(64);
    anvil::cuda::launch(sim_test_kernels::read_uninitialised_shared, 1, dim3(64),
                        64 * sizeof(float), nullptr, out.ptr);
    for (float v : out.to_host()) REQUIRE(std::isnan(v));
  }
  SECTION("a block reverses its slice through dynamic shared memory") {
    Vec host(100);
    for (size_t i = 0; i < host.size(); ++i) host[i] = float(i);
    DeviceBuffer in(host), out(100);
    anvil::cuda::launch(sim_test_kernels::reverse_through_shared, 4, dim3(32),
                        32 * sizeof(float), nullptr, in.ptr, out.ptr, 100);
    Vec got = out.to_host();
    REQUIRE(got[0] == 31.0f);
    REQUIRE(got[31] == 0.0f);
    REQUIRE(got[96] == 99.0f);  // last, partial block: 96..99 from slots 28..31
  }
  SECTION("atomicAdd counts every thread of a 3D launch") {
    int* counter = nullptr;
    float* sum = nullptr;
    anvil::cuda::check(cudaMalloc(&counter, sizeof(int)), "cudaMalloc");
    anvil::cuda::check(cudaMalloc(&sum, sizeof(float)), "cudaMalloc");
    anvil::cuda::check(cudaMemset(counter, 0, sizeof(int)), "cudaMemset");
    anvil::cuda::check(cudaMemset(sum, 0, sizeof(float)), "cudaMemset");
    anvil::cuda::launch(sim_test_kernels::count_threads, dim3(2, 3, 2), dim3(4, 2, 3), 0,
                        nullptr, counter, sum);
    int n = 0;
    float s = 0;
    cudaMemcpy(&n, counter, sizeof(int), cudaMemcpyDeviceToHost);
    cudaMemcpy(&s, sum, sizeof(float), cudaMemcpyDeviceToHost);
    cudaFree(counter);
    cudaFree(sum);
    REQUIRE(n == 12 * 24);
    REQUIRE(s == 0.5f * 12 * 24);
  }
}

TEST_CASE("sim: devices and streams", "[sim][tsan]") {
  int count = 0;
  REQUIRE(cudaGetDeviceCount(&count) == cudaSuccess);
  REQUIRE(count == 2);  // ANVIL_SIM_DEVICES unset
  REQUIRE(cudaSetDevice(1) == cudaSuccess);
  int device = -1;
  REQUIRE(cudaGetDevice(&device) == cudaSuccess);
  REQUIRE(device == 1);
  REQUIRE(cudaSetDevice(2) == cudaErrorInvalidDevice);
  REQUIRE(cudaSetDevice(0) == cudaSuccess);
  cudaGetLastError();
  cudaDeviceProp prop;
  REQUIRE(cudaGetDeviceProperties(&prop, 0) == cudaSuccess);
  REQUIRE(std::string(prop.name) == "anvil simulated GPU");
  REQUIRE(prop.maxThreadsPerBlock == 1024);
  cudaStream_t stream = nullptr;
  REQUIRE(cudaStreamCreate(&stream) == cudaSuccess);
  DeviceBuffer a(Vec(6, 1.0f)), b(Vec(6, 1.0f)), c(4);
  anvil::cuda::gemm(4, false, false, 2, 2, 3, 1.0f, a.ptr, 3, b.ptr, 2, 0.0f, c.ptr, 2, stream);
  REQUIRE(cudaStreamSynchronize(stream) == cudaSuccess);
  REQUIRE(c.to_host() == Vec(4, 3.0f));
  REQUIRE(cudaStreamDestroy(stream) == cudaSuccess);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
}

#endif  // ANVIL_CUDA_SIM
