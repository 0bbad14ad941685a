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

#ifdef ANVIL_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace {
// What the CUDA driver reports, asked once.
struct GpuProbe {
  int found = 0;
  std::string reason;
};

const GpuProbe& probe() {
  static const GpuProbe result = [] {
    GpuProbe p;
#ifdef ANVIL_HAVE_CUDA
    cudaError_t err = cudaGetDeviceCount(&p.found);
    if (err != cudaSuccess) {
      // No driver (cudaErrorInsufficientDriver / NoDevice): zero GPUs, not a crash.
      p.found = 0;
      p.reason = fmt::format("no usable CUDA driver or device: {}", cudaGetErrorString(err));
    } else if (p.found == 0) {
      p.reason = "the CUDA driver reports no GPU";
    } else {
      p.reason = fmt::format("{} CUDA GPU(s) present, but this build has no CUDA kernels yet",
                             p.found);
    }
#else
    p.reason = "this build of anvil has no CUDA support (configured with ANVIL_CUDA=OFF or without nvcc)";
#endif
    return p;
  }();
  return result;
}
}  // namespace

// GPUs anvil can run on. The CUDA backend (kernels/cuda) is not part of this
// build yet, so none is usable whatever the driver reports.
int device_count() { return 0; }

std::string no_gpu_reason() { return probe().reason; }

Device try_gpu(int i) { return device_count() > i ? Device::cuda(i) : Device::cpu(); }

std::vector<Device> try_all_gpus() {
  std::vector<Device> out;
  for (int i = 0; i < device_count(); ++i) out.push_back(Device::cuda(i));
  if (out.empty()) out.push_back(Device::cpu());
  return out;
}

}  // namespace anvil
