#include "kernels/cuda/conv/rung_table.h"

#include <ostream>
#include <stdexcept>
#include <string>

#include "kernels/cuda/conv/conv.h"

namespace anvil::cuda {
namespace {

using gemm_rungs::Math;
using Direction = ConvDirection;

// The table, and a last entry that fits no shape (an array may not be
// empty; N = 0 is no convolution's).
constexpr ConvRungEntry kMeasured[] = {
#include "kernels/cuda/conv/rung_table.inc"
    {Math::kFp32, Direction::kForward, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, kBestConv, 0.0},
};

const char* math_word(Math m) {
  return m == Math::kFp32 ? "kFp32" : m == Math::kTf32 ? "kTf32" : "kBf16";
}
const char* direction_word(Direction d) {
  return d == Direction::kForward        ? "kForward"
         : d == Direction::kBackwardData ? "kBackwardData"
                                         : "kBackwardWeight";
}

}  // namespace

bool ConvRungEntry::fits(Math m, Direction d, const Conv2dShape& s) const {
  return math == m && direction == d && N == s.N && C == s.C && H == s.H && W == s.W &&
         K == s.K && R == s.R && S == s.S && stride_h == s.stride_h && stride_w == s.stride_w &&
         pad_h == s.pad_h && pad_w == s.pad_w;
}

std::span<const ConvRungEntry> measured_conv_rungs() {
  return std::span(kMeasured).first(std::size(kMeasured) - 1);
}

int pick_conv_rung(std::span<const ConvRungEntry> table, Math math, Direction direction,
                   const Conv2dShape& s, int fallback) {
  for (const ConvRungEntry& e : table)
    if (e.fits(math, direction, s)) return e.rung;
  return fallback;
}

int shipped_conv_rung(Math math, Direction direction, const Conv2dShape& s) {
  if (math == Math::kBf16 && bf16_conv_rung() != kBf16Conv) return bf16_conv_rung();
  if (math == Math::kTf32 && tf32_conv_rung() != kTf32Conv) return tf32_conv_rung();
  const int fallback = math == Math::kFp32 ? kBestConv : math == Math::kTf32 ? kTf32Conv : kBf16Conv;
  return pick_conv_rung(measured_conv_rungs(), math, direction, s, fallback);
}

void write_conv_rung_table(std::ostream& out, std::span<const ConvRungEntry> entries,
                           std::string_view source) {
  for (const ConvRungEntry& e : entries) {
    const std::string name = std::string(math_word(e.math)) + " " + direction_word(e.direction) +
                             " N" + std::to_string(e.N) + " C" + std::to_string(e.C) + " K" +
                             std::to_string(e.K);
    if (e.rung < 1 || e.rung > kConvRungs)
      throw std::invalid_argument("write_conv_rung_table: " + name + ": rung " +
                                  std::to_string(e.rung) + " does not exist");
    if (conv_rungs::rung(e.rung).math != e.math)
      throw std::invalid_argument("write_conv_rung_table: " + name + ": rung " +
                                  std::to_string(e.rung) + " computes in another arithmetic");
  }
  out << "// The measured convolution rungs (rung_table.h), written by\n"
      << "// bench_cuda_kernels conv --write-rung-table: " << source << ".\n"
      << "// {math, direction, N, C, H, W, K, R, S, stride_h, stride_w, pad_h, pad_w, rung, ms}\n";
  for (const ConvRungEntry& e : entries)
    out << "{Math::" << math_word(e.math) << ", Direction::" << direction_word(e.direction)
        << ", " << e.N << ", " << e.C << ", " << e.H << ", " << e.W << ", " << e.K << ", " << e.R
        << ", " << e.S << ", " << e.stride_h << ", " << e.stride_w << ", " << e.pad_h << ", "
        << e.pad_w << ", " << e.rung << ", " << e.ms << "},\n";
}

}  // namespace anvil::cuda
