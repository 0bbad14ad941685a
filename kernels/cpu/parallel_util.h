// Internal helpers shared by the CPU kernel files (not part of the kernel API).
// One place for the "is this worth an OpenMP region" threshold, so every
// loop makes the same trade-off: forking the team costs a few microseconds,
// which only pays off once a loop touches tens of thousands of floats.
#pragma once
#include <cstdint>

namespace anvil::cpu::detail {

inline constexpr int64_t kMinParallel = 32768;

// Floor / ceiling division for a positive divisor and any sign of numerator.
inline int64_t floor_div(int64_t a, int64_t b) {
  int64_t q = a / b;
  return (a % b != 0 && a < 0) ? q - 1 : q;
}
inline int64_t ceil_div(int64_t a, int64_t b) { return -floor_div(-a, b); }

}  // namespace anvil::cpu::detail
