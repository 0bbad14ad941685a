#include "core/device.h"

#include <charconv>
#include <stdexcept>

#include <fmt/format.h>

#include "core/cuda_hooks.h"

namespace anvil {

Device Device::parse(std::string_view text) {
  if (text == "cpu") return cpu();
  if (text == "cuda") return cuda(0);
  if (text.starts_with("cuda:")) {
    std::string_view num = text.substr(5);
    int index = -1;
    auto [end, ec] = std::from_chars(num.data(), num.data() + num.size(), index);
    if (ec == std::errc() && end == num.data() + num.size() && !num.empty() && index >= 0)
      return cuda(index);
  }
  throw std::invalid_argument(
      fmt::format("invalid device '{}': expected 'cpu', 'cuda' or 'cuda:N'", text));
}

std::string Device::str() const {
  return is_cpu() ? std::string("cpu") : fmt::format("cuda:{}", index);
}

int device_count() { return cuda_hooks::device_count(); }

std::string no_gpu_reason() { return cuda_hooks::no_device_reason(); }

bool devices_are_simulated() { return cuda_hooks::simulated(); }

CudaVersions cuda_versions() { return cuda_hooks::versions(); }

std::string cuda_version_text(int version) {
  if (version <= 0) return "none";
  return fmt::format("{}.{}", version / 1000, version % 1000 / 10);
}

void check_cuda_device(Device device) {
  if (!device.is_cuda()) return;
  int n = device_count();
  if (n == 0)
    throw std::runtime_error(
        fmt::format("device {} is not available: {}", device.str(), no_gpu_reason()));
  if (device.index >= n)
    throw std::runtime_error(fmt::format("device {} is not available: there {} {} CUDA device{} "
                                         "(cuda:0{})",
                                         device.str(), n == 1 ? "is" : "are", n,
                                         n == 1 ? "" : "s",
                                         n == 1 ? "" : fmt::format("..cuda:{}", n - 1)));
}

DeviceProperties device_properties(Device device) {
  if (device.is_cpu()) throw std::invalid_argument("device_properties: cpu is not a CUDA device");
  check_cuda_device(device);
  return cuda_hooks::properties(device.index);
}

void synchronize(Device device) {
  if (device.is_cpu()) return;
  check_cuda_device(device);
  cuda_hooks::synchronize(device.index);
}

std::string device_summary() {
  int n = device_count();
  if (n == 0) return fmt::format("no CUDA devices: {}\n", no_gpu_reason());
  std::string out;
  for (int i = 0; i < n; ++i) {
    DeviceProperties p = cuda_hooks::properties(i);
    out += fmt::format("cuda:{}  {}  {:.1f} GiB  compute capability {}.{}  {} SMs{}\n", i, p.name,
                       double(p.total_memory) / double(size_t{1} << 30), p.major, p.minor,
                       p.multiprocessors, p.simulated ? "  (simulated)" : "");
  }
  return out;
}

Device try_gpu(int i) { return device_count() > i ? Device::cuda(i) : Device::cpu(); }

std::vector<Device> try_all_gpus() {
  std::vector<Device> out;
  for (int i = 0; i < device_count(); ++i) out.push_back(Device::cuda(i));
  if (out.empty()) out.push_back(Device::cpu());
  return out;
}

}  // namespace anvil
