// Which convolution rung the CUDA backend runs, per layer shape, direction
// and arithmetic: a table measured on a GPU (as cudnn.benchmark measures
// per shape), committed as rung_table.inc, with the arithmetic's default
// rung (kBestConv, kTf32Conv, kBf16Conv) wherever no entry fits.
//
// The table is written by the conv benchmark on a GPU:
//   bench_cuda_kernels conv --conv-set training --write-rung-table rung_table.inc
// which times every rung in each direction on the training runs' layers,
// each checked against the CPU, and keeps per (shape, direction,
// arithmetic) the fastest rung that passed (BF16: as autocast runs it, on
// bfloat16 tensors). tools/gpu/gpu-check.sh --part 6 makes it.
#pragma once
#include <iosfwd>
#include <span>
#include <string_view>

#include "kernels/cuda/gemm/gemm.h"
#include "core/shapes.h"

namespace anvil::cuda {

enum class ConvDirection { kForward, kBackwardData, kBackwardWeight };

// One measured choice. The shape fields are Conv2dShape's inputs (P and Q
// follow from them); an entry fits a shape only if every one is equal.
struct ConvRungEntry {
  gemm_rungs::Math math;
  ConvDirection direction;
  int64_t N, C, H, W, K, R, S, stride_h, stride_w, pad_h, pad_w;
  int rung;
  double ms;  // what it took where it was measured
  // The shape it fits (P and Q left 0: no entry compares them).
  Conv2dShape shape() const {
    return {N, C, H, W, K, R, S, stride_h, stride_w, pad_h, pad_w, 0, 0};
  }
  // Whether it fits (math, direction, s): every input field equal.
  bool fits(gemm_rungs::Math m, ConvDirection d, const Conv2dShape& s) const;
};

// The committed table (rung_table.inc; empty until a GPU has measured).
std::span<const ConvRungEntry> measured_conv_rungs();

// The entry of `table` that fits (math, direction, s)'s rung, or `fallback`.
int pick_conv_rung(std::span<const ConvRungEntry> table, gemm_rungs::Math math,
                   ConvDirection direction, const Conv2dShape& s, int fallback);

// The rung the backend runs: the committed table's, else the arithmetic's
// default; ANVIL_CONV_BF16_RUNG=7 (bf16_conv_rung) overrides both for BF16,
// ANVIL_CONV_TF32_RUNG=6 (tf32_conv_rung) for TF32.
int shipped_conv_rung(gemm_rungs::Math math, ConvDirection direction, const Conv2dShape& s);

// Writes `entries` as rung_table.inc's text: a comment naming `source`
// (the device and date), then one initializer per entry. Throws
// std::invalid_argument naming the entry if a rung does not exist or does
// not compute in the entry's arithmetic.
void write_conv_rung_table(std::ostream& out, std::span<const ConvRungEntry> entries,
                           std::string_view source);

}  // namespace anvil::cuda
