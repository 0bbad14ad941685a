// The measured convolution rung table (kernels/cuda/conv/rung_table.h):
// which entry fits a shape, the default where none does, the committed
// table's entries, and the text the conv benchmark writes for it.
#if defined(ANVIL_CUDA_BACKEND)
#include <catch2/catch.hpp>
#include <sstream>
#include <string>

#include "kernels/cuda/conv/conv.h"
#include "kernels/cuda/conv/rung_table.h"

namespace cu = anvil::cuda;
using anvil::Conv2dShape;
using Math = cu::gemm_rungs::Math;
using Direction = cu::ConvDirection;

TEST_CASE("conv rung table: an entry fits its own shape, direction and arithmetic only, the "
          "default rung elsewhere",
          "[conv][rung-table]") {
  // ResNet-18's 64-channel 3x3 layer at batch 256 (a TF32 layer measured
  // fastest on rung 09 in one direction, on rung 06 in another).
  const cu::ConvRungEntry table[] = {
      {Math::kBf16, Direction::kBackwardWeight, 256, 64, 28, 28, 64, 3, 3, 1, 1, 1, 1, 8, 0.5},
      {Math::kTf32, Direction::kForward, 256, 64, 28, 28, 64, 3, 3, 1, 1, 1, 1, 6, 0.75},
      {Math::kTf32, Direction::kBackwardData, 256, 64, 28, 28, 64, 3, 3, 1, 1, 1, 1, 9, 0.25}};
  const Conv2dShape s = table[0].shape();
  CHECK(cu::pick_conv_rung(table, Math::kBf16, Direction::kBackwardWeight, s, 7) == 8);
  CHECK(cu::pick_conv_rung(table, Math::kTf32, Direction::kForward, s, 0) == 6);
  CHECK(cu::pick_conv_rung(table, Math::kTf32, Direction::kBackwardData, s, 6) == 9);
  CHECK(cu::pick_conv_rung(table, Math::kTf32, Direction::kBackwardWeight, s, 6) == 6);
  CHECK(cu::pick_conv_rung(table, Math::kBf16, Direction::kForward, s, 7) == 7);
  CHECK(cu::pick_conv_rung(table, Math::kFp32, Direction::kBackwardWeight, s, 5) == 5);
  // Any other input field (the last, smaller batch; a padding) is another shape.
  for (int field = 0; field < 11; ++field) {
    Conv2dShape other = s;
    int64_t* inputs[] = {&other.N, &other.C, &other.H, &other.W, &other.K, &other.R,
                         &other.S, &other.stride_h, &other.stride_w, &other.pad_h, &other.pad_w};
    *inputs[field] += 1;
    INFO("input field " << field << " differs");
    CHECK(cu::pick_conv_rung(table, Math::kBf16, Direction::kBackwardWeight, other, 7) == 7);
  }

  SECTION("the text the benchmark writes is the table's initializers") {
    std::ostringstream out;
    cu::write_conv_rung_table(out, table, "a test");
    const std::string text = out.str();
    CHECK(text.find("a test.") != std::string::npos);
    CHECK(text.find("{Math::kBf16, Direction::kBackwardWeight, 256, 64, 28, 28, 64, 3, 3, 1, 1, "
                    "1, 1, 8, 0.5},\n") != std::string::npos);
    CHECK(text.find("{Math::kTf32, Direction::kForward, 256, 64, 28, 28, 64, 3, 3, 1, 1, 1, 1, "
                    "6, 0.75},\n") != std::string::npos);
    CHECK(text.find("{Math::kTf32, Direction::kBackwardData, 256, 64, 28, 28, 64, 3, 3, 1, 1, 1, "
                    "1, 9, 0.25},\n") != std::string::npos);
    cu::ConvRungEntry wrong = table[1];
    wrong.rung = cu::kConvRungs + 1;
    CHECK_THROWS_WITH(cu::write_conv_rung_table(out, {&wrong, 1}, ""),
                      Catch::Contains("kTf32 kForward N256 C64 K64: rung " +
                                      std::to_string(cu::kConvRungs + 1) + " does not exist"));
    wrong.rung = 7;  // a BF16 rung named for TF32
    CHECK_THROWS_WITH(cu::write_conv_rung_table(out, {&wrong, 1}, ""),
                      Catch::Contains("rung 7 computes in another arithmetic"));
  }

  SECTION("the committed table: each rung in its entry's arithmetic, and what ships for it") {
    for (const cu::ConvRungEntry& e : cu::measured_conv_rungs()) {
      INFO("entry N" << e.N << " C" << e.C << " K" << e.K << " rung " << e.rung);
      REQUIRE(cu::conv_rungs::rung(e.rung).math == e.math);
      const bool overridden = (e.math == Math::kBf16 && cu::bf16_conv_rung() != cu::kBf16Conv) ||
                              (e.math == Math::kTf32 && cu::tf32_conv_rung() != cu::kTf32Conv);
      if (!overridden) CHECK(cu::shipped_conv_rung(e.math, e.direction, e.shape()) == e.rung);
    }
    // A shape no GPU has measured (batch 3) runs its arithmetic's default.
    Conv2dShape unmeasured = s;
    unmeasured.N = 3;
    CHECK(cu::shipped_conv_rung(Math::kFp32, Direction::kForward, unmeasured) == cu::kBestConv);
    CHECK(cu::shipped_conv_rung(Math::kTf32, Direction::kBackwardData, unmeasured) ==
          cu::tf32_conv_rung());
    CHECK(cu::shipped_conv_rung(Math::kBf16, Direction::kBackwardWeight, unmeasured) ==
          cu::bf16_conv_rung());
  }
}
#endif  // ANVIL_CUDA_BACKEND
