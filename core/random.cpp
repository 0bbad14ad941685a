#include "core/random.h"

#include <cmath>
#include <numbers>

namespace anvil {

float Generator::uniform() {
  // 24 random bits: every float in [0,1) with spacing 2^-24, never 1.0.
  return float(engine_() >> 40) * (1.0f / 16777216.0f);
}

float Generator::normal() {
  if (has_spare_) {
    has_spare_ = false;
    return spare_;
  }
  double u1 = (double(engine_() >> 11) + 1.0) * (1.0 / 9007199254740993.0);  // (0, 1]
  double u2 = double(engine_() >> 11) * (1.0 / 9007199254740992.0);          // [0, 1)
  double r = std::sqrt(-2.0 * std::log(u1));
  double theta = 2.0 * std::numbers::pi * u2;
  spare_ = float(r * std::sin(theta));
  has_spare_ = true;
  return float(r * std::cos(theta));
}

// One per thread: data-parallel training runs one replica per GPU on its own
// host thread, and each must draw (and seed) without racing the others.
Generator& default_generator() {
  thread_local Generator gen(0);
  return gen;
}

void manual_seed(uint64_t seed) { default_generator().seed(seed); }

}  // namespace anvil
