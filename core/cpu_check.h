// The CPU features the host code was compiled to use, checked against the
// CPU it runs on. Host code is compiled for x86-64-v3 (AVX2 + FMA), or with
// ANVIL_NATIVE=ON for the build machine's CPU: run on a CPU that lacks an
// instruction it uses (a native build directory kept across machines, say),
// it would die of SIGILL at the first such instruction. Instead, loading libanvil checks every feature the
// compiler was allowed to use and, if one is missing, prints one error
// naming them and how to rebuild, and exits with status 1.
#pragma once
#include <functional>
#include <string>
#include <vector>

namespace anvil::detail {

// The features this file was compiled with (-march), by the names of GCC's
// __builtin_cpu_supports ("avx2", "avx512f", ...).
std::vector<std::string> cpu_features_built_for();

// Those of cpu_features_built_for() that `has` says the CPU lacks, joined
// with ", "; empty when none.
std::string missing_cpu_features(const std::function<bool(const std::string&)>& has);

// Checks this CPU (once, at load; the first call returns the result).
bool cpu_matches_build();

}  // namespace anvil::detail
