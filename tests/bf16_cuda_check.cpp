// float32 -> bf16 rounding (core/bfloat16.h's float_to_bf16_bits, which the
// simulator's pack_bf16x2 uses) against CUDA's own __float2bfloat16_rn, the
// host code of cuda_bf16.h. Built as its own program, without the simulator
// (cuda_bf16.h's float4 clashes with the simulator's), and without any
// anvil library. Exits 0 when every number converts to the same bits and
// every NaN to a NaN; 1 on a difference; 77 (a skip for ctest) when
// cuda_bf16.h is not found.
#include <cstdint>
#include <cstdio>
#include <cstring>

#if defined(ANVIL_HAVE_CUDA_BF16)
#include <cuda_bf16.h>

#include <random>

#include "core/bfloat16.h"

namespace {

int failures = 0;
long checked = 0, nans = 0, nan_payloads_differ = 0;

uint16_t cuda_bits(float f) {
  const __nv_bfloat16 b = __float2bfloat16_rn(f);
  uint16_t u;
  std::memcpy(&u, &b, 2);
  return u;
}

void check(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  const uint16_t want = cuda_bits(f), got = anvil::float_to_bf16_bits(f);
  ++checked;
  if ((u & 0x7fffffffu) > 0x7f800000u) {
    // NaN: both must be NaN; CUDA's host code gives the canonical 0x7fff,
    // anvil keeps the sign and payload (quiet), so only NaN-ness is compared.
    ++nans;
    const bool both_nan = (want & 0x7fffu) > 0x7f80u && (got & 0x7fffu) > 0x7f80u;
    nan_payloads_differ += want != got;
    if (both_nan) return;
  } else if (want == got) {
    return;
  }
  if (++failures <= 10)
    std::printf("float bits 0x%08x: __float2bfloat16_rn 0x%04x, anvil 0x%04x\n", u, want, got);
}

}  // namespace

int main() {
  // Edge cases: zeros, ties (even and odd kept part, both signs), carries
  // into the exponent, the largest finite values rounding to Inf or not,
  // subnormals, Inf, NaNs.
  const uint32_t edges[] = {0x00000000u, 0x80000000u, 0x3f808000u, 0x3f818000u, 0xbf808000u,
                            0xbf818000u, 0x3f807fffu, 0x3f808001u, 0x3fffffffu, 0x7f7f0000u,
                            0x7f7f7fffu, 0x7f7f8000u, 0x7f7fffffu, 0xff7f8000u, 0x00000001u,
                            0x00008000u, 0x00018000u, 0x007fffffu, 0x807f8000u, 0x7f800000u,
                            0xff800000u, 0x7fc00000u, 0x7f800001u, 0xffffffffu, 0x7f808000u};
  for (uint32_t u : edges) check(u);
  // Every high half with low halves below, at and above the tie.
  const uint32_t lows[] = {0x0000, 0x0001, 0x4000, 0x7fff, 0x8000, 0x8001, 0xc000, 0xffff};
  for (uint32_t high = 0; high < 0x10000u; ++high)
    for (uint32_t low : lows) check(high << 16 | low);
  // And a random sample of all bit patterns.
  std::mt19937 rng(32);
  for (int i = 0; i < (1 << 22); ++i) check(static_cast<uint32_t>(rng()));
  std::printf("bf16: %ld float patterns checked (%ld NaN, %ld of them with other NaN bits than "
              "CUDA's canonical 0x7fff), %d differences\n",
              checked, nans, nan_payloads_differ, failures);
  return failures == 0 ? 0 : 1;
}

#else
int main() {
  std::printf("cuda_bf16.h not found: the comparison with __float2bfloat16_rn is skipped\n");
  return 77;
}
#endif
