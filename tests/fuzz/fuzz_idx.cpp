// libFuzzer target: the input is an IDX file as found on disk, raw or (when
// it starts with the gzip magic 1f 8b) gzip-compressed. See idx_properties.h
// for what is checked, docs/fuzzing.md for how to run it.
#include <cstddef>
#include <cstdint>

#include "tests/fuzz/fuzz_input.h"
#include "tests/fuzz/idx_properties.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static anvil::fuzz::ScratchFile file("idx");
  anvil::fuzz::check_idx_file(file.write(data, size));
  return 0;
}
