// Reader for IDX files, the format of (Fashion-)MNIST.
//
// Layout (all integers big-endian):
//   byte 0, 1 : 0x00 0x00
//   byte 2    : element type code (0x08 = unsigned byte; the only one supported)
//   byte 3    : number of dimensions n (>= 1)
//   n x uint32: the dimensions, outermost first
//   data      : prod(dims) elements, row-major
// So MNIST images have magic 0x00000803 (ubyte, 3-D: count x rows x cols) and
// labels 0x00000801 (ubyte, 1-D: count).
//
// Files may be gzip-compressed or raw; compression is recognised by the gzip
// magic bytes 1f 8b, not by the file name. Every problem is reported as a
// DataError whose message starts with the file's path and then says what is
// wrong, e.g.
//   "/d/train-images-idx3-ubyte.gz: truncated: expected 47040000 data bytes, found 1000"
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace anvil::data {

// Any problem with a data file or data directory.
struct DataError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The largest number of elements an IDX file may declare (2^31).
inline constexpr uint64_t kIdxMaxElements = uint64_t{1} << 31;

// IDX element type code for unsigned bytes.
inline constexpr int kIdxTypeUbyte = 0x08;

// What the header of an IDX file says.
struct IdxHeader {
  int type_code = 0;          // byte 2 of the magic; always 0x08 once validated
  std::vector<int64_t> dims;  // every dimension >= 1, product <= kIdxMaxElements
  bool gzip = false;          // file starts with the gzip magic 1f 8b
  int64_t numel() const;      // product of dims
};

// A whole (or, with max_items, the leading part of an) IDX array of ubytes.
struct IdxArray {
  std::vector<int64_t> dims;  // dims[0] is the number of items actually read
  std::vector<uint8_t> data;  // row-major, data.size() == numel()
  int64_t numel() const;      // product of dims
};

struct IdxReadOptions {
  // If > 0, the file must have exactly this many dimensions.
  int expected_ndims = 0;
  // If > 0, keep only the first min(max_items, dims[0]) items (slices along
  // dimension 0). The rest of the file is still read and checked: a file
  // shorter or longer than its header says is refused either way.
  // 0 = keep everything. Negative: error.
  int64_t max_items = 0;
};

// Reads and validates only the header (magic, type code, dims).
// Throws DataError.
IdxHeader read_idx_header(const std::string& path, int expected_ndims = 0);

// Reads and validates a ubyte IDX file: header as above, then the data size
// must match the dims exactly (a short file is "truncated", extra bytes are
// "trailing garbage"), with or without max_items. A raw file's size is
// checked against its header before any data buffer is allocated; a gzipped
// file's buffer grows as the data arrives, so a header that declares more
// than the file holds never costs more memory than the file's contents.
// Throws DataError.
IdxArray read_idx(const std::string& path, const IdxReadOptions& options = {});

// Checks that `labels` is 1-D and that every value is < num_classes.
// Throws DataError naming `path`, the first bad index and its value.
void check_labels(const IdxArray& labels, int64_t num_classes, const std::string& path);

// An image classification split: `count` grey-scale images of rows x cols bytes.
struct ImageSet {
  int64_t count = 0, rows = 0, cols = 0;
  std::vector<uint8_t> pixels;  // count * rows * cols, row-major, 0..255
  std::vector<int64_t> labels;  // count, each in [0, num_classes)
};

// Loads a (Fashion-)MNIST split from `dir`: train-images-idx3-ubyte +
// train-labels-idx1-ubyte when `train`, else t10k-images-idx3-ubyte +
// t10k-labels-idx1-ubyte; each either plain or with a ".gz" suffix (the plain
// name wins if both exist). Checks that both files agree on the number of
// items and that every label is < num_classes. `limit` > 0 keeps only the
// first `limit` examples (0 = all; negative is an error); both files are
// still checked whole against their headers.
// Throws DataError.
ImageSet load_mnist_split(const std::string& dir, bool train, int64_t limit = 0,
                          int64_t num_classes = 10);

}  // namespace anvil::data
