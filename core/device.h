// Devices: "cpu" and "cuda:N", and the discovery helpers of the seed
// documents (try_gpu, try_all_gpus). Without a CUDA driver, or in a build
// without CUDA, there are zero GPUs and everything runs on the CPU.
#pragma once
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

// Number of usable CUDA GPUs: 0 when the build has no CUDA or no driver answers.
int device_count();
// Why device_count() is zero, in one line (empty when there are GPUs).
std::string no_gpu_reason();
// cuda:i when it exists, else cpu.
Device try_gpu(int i = 0);
// Every GPU, or [cpu] when there is none.
std::vector<Device> try_all_gpus();

}  // namespace anvil
