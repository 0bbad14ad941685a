#include "core/cpu_check.h"

#include <cstdio>
#include <cstdlib>

namespace anvil::detail {

namespace {

// X(macro defined by -march, name for __builtin_cpu_supports). The macro
// list is what GCC's -march=native defines on the x86-64 machines anvil is
// built on, AMD (Zen 3 and 4) and Intel (AVX2 and AVX-512).
#define ANVIL_CPU_FEATURES(X)                                                                   \
  X(__SSE4_2__, "sse4.2") X(__SSE4A__, "sse4a") X(__AVX__, "avx") X(__AVX2__, "avx2")           \
  X(__FMA__, "fma") X(__F16C__, "f16c") X(__BMI__, "bmi") X(__BMI2__, "bmi2")                   \
  X(__LZCNT__, "lzcnt") X(__MOVBE__, "movbe") X(__AVXVNNI__, "avxvnni") X(__VAES__, "vaes")     \
  X(__VPCLMULQDQ__, "vpclmulqdq") X(__GFNI__, "gfni") X(__AVX512F__, "avx512f")                 \
  X(__AVX512CD__, "avx512cd") X(__AVX512BW__, "avx512bw") X(__AVX512DQ__, "avx512dq")           \
  X(__AVX512VL__, "avx512vl") X(__AVX512IFMA__, "avx512ifma") X(__AVX512VBMI__, "avx512vbmi")   \
  X(__AVX512VBMI2__, "avx512vbmi2") X(__AVX512VNNI__, "avx512vnni")                              \
  X(__AVX512BITALG__, "avx512bitalg") X(__AVX512VPOPCNTDQ__, "avx512vpopcntdq")                 \
  X(__AVX512BF16__, "avx512bf16") X(__AVX512VP2INTERSECT__, "avx512vp2intersect")

// __builtin_cpu_supports takes a string literal, so each feature is one case.
bool cpu_has(const std::string& name) {
#if defined(__x86_64__) && defined(__GNUC__)
  __builtin_cpu_init();  // may run before the constructors that would call it
#define ANVIL_CPU_CASE(macro, feature) \
  if (name == feature) return __builtin_cpu_supports(feature);
  ANVIL_CPU_FEATURES(ANVIL_CPU_CASE)
#undef ANVIL_CPU_CASE
#endif
  (void)name;
  return true;
}

}  // namespace

// A feature macro that -march defined expands to 1; one it did not stays
// its own name. So the feature was built for when the two spellings differ.
std::vector<std::string> cpu_features_built_for() {
  std::vector<std::string> built;
#define ANVIL_CPU_BUILT(macro, feature) \
  if (std::string(#macro) != std::string(ANVIL_CPU_STR(macro))) built.push_back(feature);
#define ANVIL_CPU_STR(x) ANVIL_CPU_STR2(x)
#define ANVIL_CPU_STR2(x) #x
  ANVIL_CPU_FEATURES(ANVIL_CPU_BUILT)
#undef ANVIL_CPU_BUILT
  return built;
}

std::string missing_cpu_features(const std::function<bool(const std::string&)>& has) {
  std::string missing;
  for (const std::string& f : cpu_features_built_for())
    if (!has(f)) missing += (missing.empty() ? "" : ", ") + f;
  return missing;
}

bool cpu_matches_build() {
  static const bool ok = [] {
    const std::string missing = missing_cpu_features(cpu_has);
    if (missing.empty()) return true;
    std::fprintf(stderr,
                 "anvil: this build's CPU code uses instructions this CPU lacks (%s): it was "
                 "compiled for another CPU (-march). Configure a fresh build directory on "
                 "this machine without -DANVIL_NATIVE=ON (the default, x86-64-v3, needs AVX2 "
                 "and FMA).\n",
                 missing.c_str());
    std::_Exit(1);
  }();
  return ok;
}

}  // namespace anvil::detail
