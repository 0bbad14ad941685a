// The properties both IDX fuzz targets check on a file: read_idx either
// loads it or throws DataError (nothing else, no crash, no sanitizer report),
// and a load agrees with the header, with a limited read of the same file
// and with check_labels.
#pragma once
#include <algorithm>
#include <optional>
#include <string>

#include "data/idx.h"
#include "tests/fuzz/fuzz_input.h"

namespace anvil::fuzz {

// The whole file's array, or nullopt when read_idx refused it.
inline std::optional<data::IdxArray> check_idx_file(const std::string& path) {
  std::optional<data::IdxArray> whole, limited;
  try {
    whole = data::read_idx(path);
  } catch (const data::DataError&) {
  }
  constexpr int64_t kLimit = 2;
  try {
    limited = data::read_idx(path, {.max_items = kLimit});
  } catch (const data::DataError&) {
  }
  // A limit keeps a prefix but checks the whole file: same verdict.
  if (whole.has_value() != limited.has_value())
    fail(whole ? "a limited read refused a file that loads whole"
               : "a limited read accepted a file refused whole");
  if (!whole) return whole;

  if (whole->dims.empty() || whole->data.size() != size_t(whole->numel()))
    fail("a loaded array's data does not match its dims");
  const data::IdxHeader header = data::read_idx_header(path);
  if (header.dims != whole->dims) fail("read_idx_header and read_idx disagree on the dims");
  const int64_t items = std::min(kLimit, whole->dims[0]);
  if (limited->dims[0] != items ||
      !std::equal(limited->data.begin(), limited->data.end(), whole->data.begin()) ||
      limited->data.size() != size_t(limited->numel()))
    fail("a limited read is not the prefix of the whole one");
  if (whole->dims.size() == 1) {
    try {
      data::check_labels(*whole, 10, path);
    } catch (const data::DataError&) {
    }
  }
  return whole;
}

}  // namespace anvil::fuzz
