// Devices: "cpu" and "cuda:N", and the discovery helpers of the seed
// documents (try_gpu, try_all_gpus). Without a CUDA driver, or in a build
// without CUDA, there are zero GPUs and everything runs on the CPU.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace anvil {

enum class DeviceType : uint8_t { CPU, CUDA };

struct Device {
  DeviceType type = DeviceType::CPU;
  int index = 0;

  static Device cpu() { return {DeviceType::CPU, 0}; }
  static Device cuda(int i) { return {DeviceType::CUDA, i}; }
  // Accepts "cpu", "cuda" (= cuda:0) and "cuda:N"; throws std::invalid_argument
  // naming the text otherwise.
  static Device parse(std::string_view text);

  bool is_cpu() const { return type == DeviceType::CPU; }
  bool is_cuda() const { return type == DeviceType::CUDA; }
  std::string str() const;
  bool operator==(const Device&) const = default;
};

// Number of usable CUDA devices: 0 when the build has no CUDA backend or no
// driver answers. In a simulator build (ANVIL_CUDA=SIM) these are simulated
// devices (ANVIL_SIM_DEVICES, default 2).
int device_count();
// Why device_count() is zero, in one line (empty when there are devices).
std::string no_gpu_reason();
// True when cuda:N are simulated devices (ANVIL_CUDA=SIM build).
bool devices_are_simulated();
// The CUDA driver's and runtime's versions as CUDA encodes them (12040 is
// 12.4); 0 when there is none: no driver installed, a build without CUDA, or
// the simulator (which has neither).
struct CudaVersions {
  int driver = 0;
  int runtime = 0;
};
CudaVersions cuda_versions();
// "12.4" for 12040, "none" for 0.
std::string cuda_version_text(int version);

struct DeviceProperties {
  std::string name;
  size_t total_memory = 0;  // bytes
  int major = 0, minor = 0;  // compute capability
  int multiprocessors = 0;
  bool simulated = false;
};
// Properties of cuda:N; throws naming the device when it does not exist.
DeviceProperties device_properties(Device device);
// Throws "device cuda:N is not available: ..." unless cuda:N exists (cpu passes).
void check_cuda_device(Device device);
// Waits until every kernel and copy queued on the device (its compute and copy
// streams) has finished (no-op on cpu).
void synchronize(Device device);
// One line per device (index, name, memory, compute capability), like
// nvidia-smi's summary, or one line saying there is none and why.
std::string device_summary();
// cuda:i when it exists, else cpu.
Device try_gpu(int i = 0);
// Every GPU, or [cpu] when there is none.
std::vector<Device> try_all_gpus();

}  // namespace anvil
