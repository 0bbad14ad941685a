#include "core/precision.h"

#include <atomic>
#include <stdexcept>

namespace anvil {
namespace {

std::atomic<Fp32Precision> g_conv{Fp32Precision::kDefault};
std::atomic<Fp32Precision> g_matmul{Fp32Precision::kDefault};
thread_local bool t_bf16 = false;  // ScopedBf16Math

std::atomic<Fp32Precision>& slot(OpFamily family) {
  return family == OpFamily::kConv ? g_conv : g_matmul;
}

const char* math_name(Fp32Math m, DeviceType device) {
  switch (m) {
    case Fp32Math::kFp32Fast: return "FP32 (Winograd for 3x3)";
    case Fp32Math::kFp32: return "FP32";
    case Fp32Math::kTf32:
      return device == DeviceType::CUDA ? "TF32 (tensor cores)" : "TF32 (emulated)";
    case Fp32Math::kBf16:
      return device == DeviceType::CUDA ? "BF16 (tensor cores)" : "BF16 (emulated)";
  }
  return "?";
}

}  // namespace

void set_fp32_precision(OpFamily family, Fp32Precision p) { slot(family).store(p); }
void set_fp32_precision(Fp32Precision both) {
  set_fp32_precision(OpFamily::kConv, both);
  set_fp32_precision(OpFamily::kMatmul, both);
}
Fp32Precision fp32_precision(OpFamily family) { return slot(family).load(); }

Fp32Precision parse_fp32_precision(std::string_view word) {
  if (word == "default") return Fp32Precision::kDefault;
  if (word == "ieee") return Fp32Precision::kIeee;
  if (word == "tf32") return Fp32Precision::kTf32;
  throw std::invalid_argument("fp32 precision '" + std::string(word) +
                              "': expected default, ieee or tf32");
}

const char* to_string(Fp32Precision p) {
  switch (p) {
    case Fp32Precision::kDefault: return "default";
    case Fp32Precision::kIeee: return "ieee";
    case Fp32Precision::kTf32: return "tf32";
  }
  return "?";
}

Fp32Math fp32_math(OpFamily family, DeviceType device) {
  if (t_bf16) return Fp32Math::kBf16;
  switch (fp32_precision(family)) {
    case Fp32Precision::kIeee: return Fp32Math::kFp32;
    case Fp32Precision::kTf32: return Fp32Math::kTf32;
    case Fp32Precision::kDefault: break;
  }
  // PyTorch's defaults: cuDNN convolutions may use TF32, matmuls may not;
  // on the CPU neither rounds, and convolutions take the fastest algorithm.
  if (family == OpFamily::kMatmul) return Fp32Math::kFp32;
  return device == DeviceType::CUDA ? Fp32Math::kTf32 : Fp32Math::kFp32Fast;
}

std::string describe_fp32_math(DeviceType device) {
  return std::string("conv ") + math_name(fp32_math(OpFamily::kConv, device), device) +
         ", matmul " + math_name(fp32_math(OpFamily::kMatmul, device), device);
}

ScopedBf16Math::ScopedBf16Math(bool on) : previous_(t_bf16) { t_bf16 = previous_ || on; }
ScopedBf16Math::~ScopedBf16Math() { t_bf16 = previous_; }

ScopedFp32Precision::ScopedFp32Precision(Fp32Precision both)
    : ScopedFp32Precision(both, both) {}
ScopedFp32Precision::ScopedFp32Precision(Fp32Precision conv, Fp32Precision matmul)
    : conv_(fp32_precision(OpFamily::kConv)), matmul_(fp32_precision(OpFamily::kMatmul)) {
  set_fp32_precision(OpFamily::kConv, conv);
  set_fp32_precision(OpFamily::kMatmul, matmul);
}
ScopedFp32Precision::~ScopedFp32Precision() {
  set_fp32_precision(OpFamily::kConv, conv_);
  set_fp32_precision(OpFamily::kMatmul, matmul_);
}

}  // namespace anvil
