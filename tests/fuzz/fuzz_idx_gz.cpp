// libFuzzer target: the input is the content of an IDX file, which this
// target gzips, so that mutations explore the IDX parser behind zlib rather
// than zlib's own checks. The gzipped copy must get the verdict and the data
// of the raw one, and the same stream cut short must be refused.
#include <zlib.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "tests/fuzz/fuzz_input.h"
#include "tests/fuzz/idx_properties.h"

namespace {

std::vector<uint8_t> gzip(const uint8_t* data, size_t size) {
  z_stream z{};
  // windowBits 15 + 16: a gzip wrapper, as gzip(1) writes.
  if (deflateInit2(&z, Z_DEFAULT_COMPRESSION, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) != Z_OK)
    anvil::fuzz::fail("deflateInit2 failed");
  std::vector<uint8_t> out(deflateBound(&z, uLong(size)) + 32);
  z.next_in = const_cast<uint8_t*>(data);
  z.avail_in = uInt(size);
  z.next_out = out.data();
  z.avail_out = uInt(out.size());
  if (deflate(&z, Z_FINISH) != Z_STREAM_END) anvil::fuzz::fail("deflate did not finish");
  out.resize(z.total_out);
  deflateEnd(&z);
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using anvil::fuzz::check_idx_file;
  using anvil::fuzz::fail;
  static anvil::fuzz::ScratchFile raw("idx-raw"), packed("idx-gz");
  const auto plain = check_idx_file(raw.write(data, size));
  const std::vector<uint8_t> gz = gzip(data, size);
  const auto unpacked = check_idx_file(packed.write(gz.data(), gz.size()));
  // An input that is itself gzip is read as such raw, but not once wrapped again.
  const bool input_is_gzip = size >= 2 && data[0] == 0x1f && data[1] == 0x8b;
  if (!input_is_gzip) {
    if (plain.has_value() != unpacked.has_value())
      fail("the raw and the gzipped copy of one file get different verdicts");
    if (plain && (plain->dims != unpacked->dims || plain->data != unpacked->data))
      fail("the raw and the gzipped copy of one file load differently");
  }
  // Cut the stream short, within its 8-byte trailer or before it: refused.
  const size_t cut = 1 + size % 16;
  if (gz.size() > cut && check_idx_file(packed.write(gz.data(), gz.size() - cut)))
    fail("a gzip stream cut short was accepted");
  return 0;
}
