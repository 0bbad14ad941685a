#include "core/device.h"

#include <charconv>
#include <stdexcept>

#include <fmt/format.h>

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

// The CUDA runtime layer (kernels/cuda, issue #3) is not part of this build
// yet, so no GPU is usable whatever the machine holds.
int device_count() { return 0; }

std::string no_gpu_reason() {
  return "this build of anvil has no CUDA backend";
}

Device try_gpu(int i) { return device_count() > i ? Device::cuda(i) : Device::cpu(); }

std::vector<Device> try_all_gpus() {
  std::vector<Device> out;
  for (int i = 0; i < device_count(); ++i) out.push_back(Device::cuda(i));
  if (out.empty()) out.push_back(Device::cpu());
  return out;
}

}  // namespace anvil
