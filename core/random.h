// Seeded random numbers. Normal samples use Box-Muller over our own uniform
// draws so the same seed gives the same tensors on every platform (the
// standard library's distributions are implementation-defined).
#pragma once
#include <cstdint>
#include <random>

namespace anvil {

class Generator {
 public:
  explicit Generator(uint64_t seed = 0) : engine_(seed) {}
  void seed(uint64_t s) { engine_.seed(s); has_spare_ = false; }
  float uniform();  // [0, 1)
  float normal();   // mean 0, std 1
  uint64_t next_u64() { return engine_(); }

 private:
  std::mt19937_64 engine_;
  bool has_spare_ = false;
  float spare_ = 0.f;
};

// The calling thread's generator (seed 0 until manual_seed): each thread has
// its own, so replicas on threads of one process neither race nor share draws.
Generator& default_generator();
void manual_seed(uint64_t seed);  // seeds the calling thread's generator

}  // namespace anvil
