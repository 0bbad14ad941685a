// FNV-1a fingerprints for the collectives' agreement: what a rank says it is
// about to reduce (a bucket's parameter names and shapes, a SyncBN layer's
// forward), so that ranks about to reduce different things are refused
// rather than summing one thing into another. h = 0 starts a fingerprint.
#pragma once
#include <cstdint>
#include <string_view>

namespace anvil::parallel {

inline uint64_t fingerprint_of(uint64_t h, std::string_view text) {
  if (h == 0) h = 0xcbf29ce484222325ull;
  for (unsigned char ch : text) h = (h ^ ch) * 0x100000001b3ull;
  return h;
}
inline uint64_t fingerprint_of(uint64_t h, int64_t value) {
  return fingerprint_of(h, std::string_view(reinterpret_cast<const char*>(&value), sizeof value));
}

}  // namespace anvil::parallel
