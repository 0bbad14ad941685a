#include "data/idx.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string_view>
#include <utility>

#include <fmt/core.h>

namespace anvil::data {

namespace {

namespace fs = std::filesystem;

template <typename... Args>
[[noreturn]] void fail(const std::string& path, fmt::format_string<Args...> what, Args&&... args) {
  throw DataError(fmt::format("{}: {}", path, fmt::format(what, std::forward<Args>(args)...)));
}

std::string dims_string(const std::vector<int64_t>& dims) {
  std::string s;
  for (size_t i = 0; i < dims.size(); ++i) {
    if (i) s += " x ";
    s += std::to_string(dims[i]);
  }
  return s;
}

int64_t product(const std::vector<int64_t>& dims) {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  return n;
}

const char* type_name(int code) {
  switch (code) {
    case 0x08: return "unsigned byte";
    case 0x09: return "signed byte";
    case 0x0B: return "int16";
    case 0x0C: return "int32";
    case 0x0D: return "float32";
    case 0x0E: return "float64";
    default: return nullptr;
  }
}

uint32_t be32(const unsigned char* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

// zlib's last error text, without the "<fd:N>: " that gzdopen streams prefix.
std::string zlib_message(gzFile gz, int* code) {
  const char* msg = gzerror(gz, code);
  std::string m = msg ? msg : "unknown zlib error";
  if (m.rfind("<fd:", 0) == 0) {
    if (size_t colon = m.find(": "); colon != std::string::npos) m.erase(0, colon + 2);
  }
  return m;
}

// A gzip-compressed or raw file read through zlib (gzread passes raw files
// through unchanged). Read errors and corrupt gzip data throw DataError.
class IdxStream {
 public:
  explicit IdxStream(const std::string& path) : path_(path) {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      int err = errno;
      fail(path_, "cannot open: {}", std::strerror(err));
    }
    struct stat st {};
    if (::fstat(fd, &st) == 0 && S_ISDIR(st.st_mode)) {
      ::close(fd);
      fail(path_, "cannot read: is a directory, not an IDX file");
    }
    if (S_ISREG(st.st_mode)) file_size_ = static_cast<int64_t>(st.st_size);
    // Recognise gzip by its magic bytes; pread leaves the file offset at 0.
    unsigned char magic[2] = {0, 0};
    gzip_ = ::pread(fd, magic, 2, 0) == 2 && magic[0] == 0x1f && magic[1] == 0x8b;
    gz_ = gzdopen(fd, "rb");
    if (!gz_) {
      ::close(fd);
      fail(path_, "cannot open: zlib could not allocate a reader");
    }
    gzbuffer(gz_, 1u << 17);
  }
  ~IdxStream() {
    if (gz_) gzclose(gz_);
  }
  IdxStream(const IdxStream&) = delete;
  IdxStream& operator=(const IdxStream&) = delete;

  bool gzip() const { return gzip_; }
  // The size of a regular file on disk; -1 for pipes and devices.
  int64_t file_size() const { return file_size_; }

  // Reads up to n bytes into dst; fewer only at the end of the input.
  size_t read(void* dst, size_t n) {
    auto* p = static_cast<unsigned char*>(dst);
    size_t done = 0;
    while (done < n) {
      unsigned chunk = static_cast<unsigned>(std::min<size_t>(n - done, size_t{1} << 30));
      int got = gzread(gz_, p + done, chunk);
      if (got < 0) {
        int code = Z_OK;
        const std::string msg = zlib_message(gz_, &code);
        const bool corrupt = gzip_ && code != Z_ERRNO;
        fail(path_, "{}: {}", corrupt ? "corrupt gzip data" : "read error", msg);
      }
      if (got == 0) break;
      done += static_cast<size_t>(got);
    }
    return done;
  }

  // Appended to "truncated" messages: says whether the gzip stream itself
  // was cut short (as opposed to a complete stream holding too little data).
  std::string truncation_note() {
    if (!gzip_) return "";
    if (std::string why = cut_short(); !why.empty())
      return fmt::format(" (the gzip stream is cut short: {})", why);
    return " (after gzip decompression)";
  }

  // Once the input is exhausted: zlib's message when the gzip stream ended
  // before its end (gzread reports that as a plain end of input), else "".
  std::string cut_short() {
    if (!gzip_) return "";
    int code = Z_OK;
    std::string msg = zlib_message(gz_, &code);
    return code == Z_BUF_ERROR ? msg : "";
  }

 private:
  std::string path_;
  gzFile gz_ = nullptr;
  bool gzip_ = false;
  int64_t file_size_ = -1;
};

IdxHeader parse_header(IdxStream& in, const std::string& path, int expected_ndims) {
  IdxHeader h;
  h.gzip = in.gzip();
  unsigned char magic[4];
  size_t got = in.read(magic, 4);
  if (got == 0) fail(path, "empty file: expected an IDX header");
  if (got < 4) fail(path, "truncated header: expected 4 magic bytes, found {}{}", got, in.truncation_note());
  const uint32_t m = be32(magic);
  if (magic[0] != 0 || magic[1] != 0)
    fail(path,
         "bad magic number 0x{:08X}: not an IDX file (an IDX file starts with the bytes 00 00 "
         "<type code> <number of dims>){}",
         m, h.gzip ? "" : " [the file is not gzip-compressed either]");
  h.type_code = magic[2];
  if (h.type_code != kIdxTypeUbyte) {
    if (const char* name = type_name(h.type_code))
      fail(path,
           "unsupported IDX element type 0x{:02X} ({}) in magic number 0x{:08X}: only type 0x08 "
           "(unsigned byte) is supported",
           h.type_code, name, m);
    fail(path,
         "unknown IDX element type code 0x{:02X} in magic number 0x{:08X}: only type 0x08 "
         "(unsigned byte) is supported",
         h.type_code, m);
  }
  const int ndims = magic[3];
  if (ndims == 0) fail(path, "bad header: magic number 0x{:08X} declares 0 dimensions", m);
  if (expected_ndims > 0 && ndims != expected_ndims)
    fail(path, "wrong number of dimensions: expected {} (magic 0x{:08X}), found {} (magic 0x{:08X})",
         expected_ndims, 0x0800u | static_cast<unsigned>(expected_ndims), ndims, m);

  std::vector<unsigned char> raw(4 * static_cast<size_t>(ndims));
  got = in.read(raw.data(), raw.size());
  if (got < raw.size())
    fail(path, "truncated header: expected {} bytes for {} dimensions, found {}{}", raw.size(), ndims,
         got, in.truncation_note());
  uint64_t total = 1;
  h.dims.resize(ndims);
  for (int i = 0; i < ndims; ++i) h.dims[i] = be32(&raw[4 * i]);
  for (int i = 0; i < ndims; ++i) {
    if (h.dims[i] == 0) fail(path, "bad header: dimension {} is zero (dims {})", i, dims_string(h.dims));
    total *= static_cast<uint64_t>(h.dims[i]);  // < 2^31 * 2^32: no overflow
    if (total > kIdxMaxElements)
      fail(path, "bad header: dims {} describe more than the limit of 2^31 = {} elements",
           dims_string(h.dims), kIdxMaxElements);
  }
  return h;
}

// Appends up to n bytes from `in` to `out`, growing it as the data arrives
// (from `first_chunk` bytes, doubling), so that a gzip stream whose header
// declares more than it holds costs memory for what it holds, not for what
// it declares. Returns the number of bytes appended: fewer than n only at
// the end of the input.
size_t read_growing(IdxStream& in, std::vector<uint8_t>& out, size_t n, size_t first_chunk) {
  const size_t start = out.size();
  size_t done = 0;
  while (done < n) {
    const size_t step = std::min(n - done, std::max(first_chunk, out.size() - start));
    const size_t old = out.size();
    out.resize(old + step);
    const size_t got = in.read(out.data() + old, step);
    out.resize(old + got);
    done += got;
    if (got < step) break;
  }
  out.shrink_to_fit();
  return out.size() - start;
}

// Reads and discards up to n bytes; returns how many there were.
uint64_t skip(IdxStream& in, uint64_t n) {
  std::vector<unsigned char> scratch(size_t{1} << 16);
  uint64_t done = 0;
  while (done < n) {
    const size_t step = static_cast<size_t>(std::min<uint64_t>(n - done, scratch.size()));
    const size_t got = in.read(scratch.data(), step);
    done += got;
    if (got < step) break;
  }
  return done;
}

// `base` or `base.gz` in `dir`, whichever exists (plain first).
std::string find_split_file(const std::string& dir, const std::string& base, const std::string& split,
                            const std::string& prefix) {
  std::error_code ec;
  for (const std::string& name : {base, base + ".gz"}) {
    fs::path p = fs::path(dir) / name;
    if (fs::exists(p, ec) && !fs::is_directory(p, ec)) return p.string();
  }
  if (!fs::is_directory(dir, ec))
    fail(dir, "data directory does not exist or is not a directory (looking for the Fashion-MNIST {} split)",
         split);
  fail(dir, "neither {0} nor {0}.gz found in this directory (the Fashion-MNIST {1} split needs "
            "{2}-images-idx3-ubyte[.gz] and {2}-labels-idx1-ubyte[.gz])",
       base, split, prefix);
}

}  // namespace

int64_t IdxHeader::numel() const { return product(dims); }
int64_t IdxArray::numel() const { return product(dims); }

IdxHeader read_idx_header(const std::string& path, int expected_ndims) {
  IdxStream in(path);
  return parse_header(in, path, expected_ndims);
}

IdxArray read_idx(const std::string& path, const IdxReadOptions& options) {
  if (options.max_items < 0) fail(path, "invalid max_items {}: must be >= 0", options.max_items);
  IdxStream in(path);
  IdxHeader h = parse_header(in, path, options.expected_ndims);

  const int64_t file_items = h.dims[0];
  const int64_t item_size = h.numel() / file_items;
  const int64_t items = options.max_items > 0 ? std::min(options.max_items, file_items) : file_items;
  const size_t declared = static_cast<size_t>(h.numel());
  const size_t want = static_cast<size_t>(items * item_size);
  // A short or long file is refused even when only a prefix is kept: a cut
  // download must not pass because a limit happened not to reach the cut.
  const std::string limited =
      items < file_items
          ? fmt::format(" (only the first {} of {} items are used, but the whole file is checked)",
                        items, file_items)
          : "";
  auto truncated = [&](size_t found) {
    fail(path, "truncated: expected {} data bytes (dims {}), found {}{}{}", declared,
         dims_string(h.dims), found, in.truncation_note(), limited);
  };
  auto trailing = [&](uint64_t extra) {
    fail(path, "trailing garbage: {} extra bytes after the {} data bytes declared by dims {}", extra,
         declared, dims_string(h.dims));
  };
  // A raw file's size is known before reading: a header that declares more
  // than the file holds is refused before anything is allocated for it.
  const bool size_checked = !h.gzip && in.file_size() >= 0;
  if (size_checked) {
    const uint64_t header_bytes = 4 + 4 * h.dims.size();
    const uint64_t data_bytes = std::max<int64_t>(in.file_size() - int64_t(header_bytes), 0);
    if (data_bytes < declared) truncated(data_bytes);
    if (data_bytes > declared) trailing(data_bytes - declared);
  }

  IdxArray out;
  out.dims = h.dims;
  out.dims[0] = items;
  // A checked file holds the data: one buffer of its size. Otherwise (gzip,
  // a pipe) the buffer grows from 64 KiB as the data arrives.
  const size_t got = read_growing(in, out.data, want, size_checked ? want : size_t{1} << 16);
  if (got < want) truncated(got);
  const size_t rest = skip(in, declared - want);
  if (rest < declared - want) truncated(want + rest);
  // Everything declared has been read: anything else is garbage.
  if (const uint64_t extra = skip(in, SIZE_MAX); extra > 0) trailing(extra);
  // A gzip stream cut in its trailer holds all the data but was never
  // checked against its CRC: the file is damaged all the same.
  if (const std::string why = in.cut_short(); !why.empty())
    fail(path, "truncated: the gzip stream is cut short ({}) after all {} data bytes", why,
         declared);
  return out;
}

void check_labels(const IdxArray& labels, int64_t num_classes, const std::string& path) {
  if (labels.dims.size() != 1)
    fail(path, "labels must be 1-D, found {} dimensions ({})", labels.dims.size(), dims_string(labels.dims));
  if (num_classes <= 0) fail(path, "invalid num_classes {}", num_classes);
  for (size_t i = 0; i < labels.data.size(); ++i) {
    if (labels.data[i] >= num_classes)
      fail(path, "label out of range: label[{}] = {}, expected 0 <= label < {}", i, labels.data[i],
           num_classes);
  }
}

ImageSet load_mnist_split(const std::string& dir, bool train, int64_t limit, int64_t num_classes) {
  if (limit < 0) fail(dir, "invalid limit {}: must be >= 0 (0 = all)", limit);
  const std::string split = train ? "training" : "test";
  const std::string prefix = train ? "train" : "t10k";
  const std::string images_path = find_split_file(dir, prefix + "-images-idx3-ubyte", split, prefix);
  const std::string labels_path = find_split_file(dir, prefix + "-labels-idx1-ubyte", split, prefix);

  // Compare the full counts from the headers before reading (a limit must not
  // hide a mismatched pair of files).
  const IdxHeader ih = read_idx_header(images_path, 3);
  const IdxHeader lh = read_idx_header(labels_path, 1);
  if (ih.dims[0] != lh.dims[0])
    fail(images_path, "count mismatch: this images file holds {} images but the labels file {} holds {} labels",
         ih.dims[0], labels_path, lh.dims[0]);

  IdxArray images = read_idx(images_path, {.expected_ndims = 3, .max_items = limit});
  IdxArray labels = read_idx(labels_path, {.expected_ndims = 1, .max_items = limit});
  if (images.dims[0] != labels.dims[0])  // only if a file changed between the two reads
    fail(images_path, "count mismatch: read {} images but {} labels from {}", images.dims[0], labels.dims[0],
         labels_path);
  check_labels(labels, num_classes, labels_path);

  ImageSet set;
  set.count = images.dims[0];
  set.rows = images.dims[1];
  set.cols = images.dims[2];
  set.pixels = std::move(images.data);
  set.labels.assign(labels.data.begin(), labels.data.end());
  return set;
}

}  // namespace anvil::data
