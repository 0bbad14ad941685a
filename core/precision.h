// How float32 convolutions and matrix products may trade precision for
// speed: the analogue of PyTorch's torch.backends.cudnn.conv.fp32_precision
// (torch.backends.cudnn.allow_tf32) and torch.backends.cuda.matmul.fp32_precision
// (torch.set_float32_matmul_precision), with PyTorch's defaults.
//
//   setting   CUDA                                   CPU
//   kDefault  conv: TF32 (tensor cores)               conv: the fastest FP32 algorithm
//             matmul: FP32                             (Winograd for 3x3 layers); matmul: FP32
//   kIeee     FP32 products and sums (the FP32 rungs)  FP32, no Winograd (highest precision)
//   kTf32     operands rounded to TF32, FP32 sums      the same rounding, emulated: operands
//             (the mma.sync rungs)                     rounded to TF32, then FP32 (exact
//                                                      products, FP32 sums), no Winograd
//
// TF32 keeps float32's range and 10 of its 23 mantissa bits, so a product's
// relative error grows from 2^-24 to about 2^-11 (docs/precision.md). The
// CPU's emulation computes what a tensor core computes, up to the order of
// the FP32 additions, so a TF32 run's accuracy can be measured without a GPU.
//
// The settings are process-wide, as PyTorch's, read at each op's launch (the
// data-parallel replicas' threads included); set them before training.
#pragma once
#include <string>
#include <string_view>

#include "core/device.h"

namespace anvil {

enum class OpFamily { kConv, kMatmul };
enum class Fp32Precision { kDefault, kIeee, kTf32 };

void set_fp32_precision(OpFamily family, Fp32Precision p);
void set_fp32_precision(Fp32Precision both);  // convolutions and matmuls alike
Fp32Precision fp32_precision(OpFamily family);

// "default", "ieee", "tf32" (PyTorch's words); anything else throws
// std::invalid_argument naming the accepted words.
Fp32Precision parse_fp32_precision(std::string_view word);
const char* to_string(Fp32Precision p);

// What a family computes on a device type under the current setting.
enum class Fp32Math {
  kFp32Fast,  // FP32, the fastest algorithm (the CPU's Winograd convolutions)
  kFp32,      // FP32 products and sums
  kTf32,      // operands rounded to TF32, FP32 accumulation
  kBf16,      // operands rounded to BF16, FP32 accumulation (autocast, core/autocast.h)
};
Fp32Math fp32_math(OpFamily family, DeviceType device);

// Within this scope, on the calling thread only, convolutions and matmuls
// compute as kBf16 whatever the setting: the op layer sets it around the
// kernels of an op that autocast runs in bfloat16, whose operands are
// bfloat16 values held in float32. On CUDA that picks the BF16 mma.sync
// rungs; the CPU rounds the operands to BF16 (an identity on such values)
// and sums in FP32, so both compute what a BF16 tensor core computes.
class ScopedBf16Math {
 public:
  explicit ScopedBf16Math(bool on = true);  // on = false: changes nothing
  ~ScopedBf16Math();
  ScopedBf16Math(const ScopedBf16Math&) = delete;
  ScopedBf16Math& operator=(const ScopedBf16Math&) = delete;

 private:
  bool previous_;
};

// One line for a run's header, e.g. "conv TF32 (tensor cores), matmul FP32".
std::string describe_fp32_math(DeviceType device);

// Sets both families for a scope and restores them on exit (tests, benches).
class ScopedFp32Precision {
 public:
  explicit ScopedFp32Precision(Fp32Precision both);
  ScopedFp32Precision(Fp32Precision conv, Fp32Precision matmul);
  ~ScopedFp32Precision();
  ScopedFp32Precision(const ScopedFp32Precision&) = delete;
  ScopedFp32Precision& operator=(const ScopedFp32Precision&) = delete;

 private:
  Fp32Precision conv_, matmul_;
};

}  // namespace anvil
