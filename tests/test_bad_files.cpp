// Bad input files, each refused with one error naming the file
// (or flag) and what is wrong: IDX files shorter or longer than their header
// says even when a limit keeps only a prefix, headers that declare more data
// than the file holds (refused without allocating for it), safetensors
// headers with numbers that are not whole numbers >= 0 or with a name given
// twice, and output paths where no file can be created.
#include <catch2/catch.hpp>
#include <sys/resource.h>
#include <unistd.h>
#include <zlib.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "data/idx.h"
#include "nn/models.h"
#include "nn/safetensors.h"
#include "tests/cli_test_util.h"
#include "tests/nn_test_util.h"
#include "tests/test_util.h"

namespace fs = std::filesystem;
using namespace anvil;
using namespace anvil::testing;
using namespace anvil::testing::cli;
using Catch::Contains;

namespace {

using Bytes = std::vector<uint8_t>;

void write_gz(const std::string& path, const Bytes& bytes) {
  gzFile g = gzopen(path.c_str(), "wb");
  REQUIRE(g != nullptr);
  REQUIRE(gzwrite(g, bytes.data(), unsigned(bytes.size())) == int(bytes.size()));
  REQUIRE(gzclose(g) == Z_OK);
}

Bytes read_all(const std::string& path) {
  std::string s = read_file(path);
  return Bytes(s.begin(), s.end());
}

// Labels whose header says `declared` but which hold `present` labels.
Bytes short_labels(uint32_t declared, uint32_t present) {
  Bytes b = idx_labels(declared);
  b.resize(b.size() - (declared - present));
  return b;
}

std::string read_idx_error(const std::string& path, const data::IdxReadOptions& options) {
  try {
    data::read_idx(path, options);
  } catch (const data::DataError& e) {
    return e.what();
  }
  FAIL("read_idx(" << path << ") did not throw");
  return "";
}

std::string load_error(const std::string& path) {
  try {
    nn::load_safetensors(path);
  } catch (const nn::CheckpointError& e) {
    return e.what();
  }
  FAIL("load_safetensors(" << path << ") did not throw");
  return "";
}

// The largest resident set of any child process waited for so far, bytes.
int64_t children_peak_rss() {
  rusage usage{};
  REQUIRE(getrusage(RUSAGE_CHILDREN, &usage) == 0);
  return int64_t(usage.ru_maxrss) * 1024;
}

}  // namespace

TEST_CASE("read_idx checks the whole file against its header when a limit keeps a prefix",
          "[data][idx][bad-files]") {
  TempDir dir;
  const std::string p = dir.file("labels");
  SECTION("a labels file 10 labels short") {
    write_file(p, short_labels(100, 90));
    for (int64_t limit : {0, 20, 90, 100}) {
      INFO("max_items " << limit);
      std::string msg = read_idx_error(p, {.expected_ndims = 1, .max_items = limit});
      CHECK_THAT(msg, Contains(p + ": truncated: expected 100 data bytes (dims 100), found 90"));
      if (limit == 20) CHECK_THAT(msg, Contains("only the first 20 of 100 items are used"));
    }
  }
  SECTION("trailing bytes after the data") {
    Bytes b = idx_labels(100);
    b.insert(b.end(), {7, 7, 7});
    write_file(p, b);
    CHECK_THAT(read_idx_error(p, {.max_items = 5}),
               Contains(p + ": trailing garbage: 3 extra bytes after the 100 data bytes"));
  }
  SECTION("a gzip stream cut short") {
    const std::string gz = dir.file("images.gz");
    write_gz(gz, idx_images(100, 100 * 784, 1));
    Bytes whole = read_all(gz);
    write_file(gz, Bytes(whole.begin(), whole.begin() + long(whole.size() / 2)));
    std::string msg = read_idx_error(gz, {.max_items = 2});
    CHECK_THAT(msg, Contains(gz + ": truncated: expected 78400 data bytes (dims 100 x 28 x 28)"));
    CHECK_THAT(msg, Contains("the gzip stream is cut short"));
  }
  SECTION("a gzip stream cut in its trailer, after all the data") {
    const std::string gz = dir.file("labels.gz");
    write_gz(gz, idx_labels(100));
    Bytes whole = read_all(gz);
    for (size_t cut : {1, 4, 8}) {
      INFO("the last " << cut << " bytes cut");
      write_file(gz, Bytes(whole.begin(), whole.end() - long(cut)));
      CHECK_THAT(read_idx_error(gz, {}),
                 Contains(gz + ": truncated: the gzip stream is cut short (unexpected end of "
                               "file) after all 100 data bytes"));
    }
  }
  SECTION("a complete gzip stream holding too little") {
    const std::string gz = dir.file("labels.gz");
    write_gz(gz, short_labels(100, 90));
    CHECK_THAT(read_idx_error(gz, {.max_items = 10}),
               Contains(gz + ": truncated: expected 100 data bytes (dims 100), found 90 (after "
                             "gzip decompression)"));
  }
  SECTION("load_mnist_split with a limit names the short file") {
    write_synthetic_split(dir.path, 100, 20);
    const std::string labels = dir.file("t10k-labels-idx1-ubyte");
    write_file(labels, short_labels(20, 10));
    try {
      data::load_mnist_split(dir.path.string(), false, 5);
      FAIL("a labels file 10 labels short was accepted");
    } catch (const data::DataError& e) {
      CHECK_THAT(e.what(), Contains(labels + ": truncated: expected 20 data bytes"));
    }
  }
}

TEST_CASE("A Fashion-MNIST images file cut at 1 MB is refused under --limit-train",
          "[data][idx][bad-files][fashion]") {
  if (!have_fashion_mnist()) {
    WARN("Fashion-MNIST not found in " << kFashionDir);
    return;
  }
  TempDir dir;
  for (const char* f : {"train-labels-idx1-ubyte.gz", "t10k-labels-idx1-ubyte.gz",
                        "t10k-images-idx3-ubyte.gz", "train-images-idx3-ubyte.gz"})
    fs::copy_file(fs::path(kFashionDir) / f, dir.path / f);
  const std::string images = dir.file("train-images-idx3-ubyte.gz");
  Bytes whole = read_all(images);
  REQUIRE(whole.size() > (1u << 20));
  write_file(images, Bytes(whole.begin(), whole.begin() + (1 << 20)));
  CliResult r = expect_failure(
      "--device cpu --limit-train 256 --limit-test 64 --data-dir " + quote(dir.path.string()),
      {images + ": truncated: expected 47040000 data bytes (dims 60000 x 28 x 28)",
       "the gzip stream is cut short", "only the first 256 of 60000 items are used"});
  CHECK(count_lines_containing(r.output, "error") == 1);
}

TEST_CASE("An IDX header declaring 2^31 bytes in a small file costs no 2 GiB",
          "[data][idx][bad-files][cli]") {
  // 2739128 images of 28x28: just under the 2^31-element limit, 2 GiB of
  // pixels declared; the files hold 8 of them. anvil-train must refuse the
  // files without allocating what the header declares (its peak memory is
  // measured as a child process's).
  const uint32_t count = 2739128;
  TempDir dir;
  write_synthetic_split(dir.path, 100, 20);
  write_file(dir.file("train-labels-idx1-ubyte"), short_labels(count, 8));
  const Bytes images = idx_images(count, 8 * 784, 1);
  const std::string raw = dir.file("train-images-idx3-ubyte");
  SECTION("raw: the file's size is checked first") {
    write_file(raw, images);
  }
  SECTION("gzip: the buffer grows as data arrives") {
    fs::remove(raw);
    write_gz(raw + ".gz", images);
  }
  const std::string path = fs::exists(raw) ? raw : raw + ".gz";
  expect_failure("--device cpu --data-dir " + quote(dir.path.string()),
                 {path + ": truncated: expected 2147476352 data bytes", "found 6272"});
  const int64_t peak = children_peak_rss();
  INFO("peak resident memory of anvil-train: " << peak / (1 << 20) << " MiB");
  CHECK(peak < (int64_t(1) << 30));
}

TEST_CASE("Safetensors headers: sizes and offsets must be whole numbers >= 0",
          "[nn][safetensors][bad-files]") {
  TempDir dir;
  const std::string data(16, '\x01');
  auto header = [](const std::string& shape, const std::string& offsets) {
    return R"({"w":{"dtype":"F32","shape":)" + shape + R"(,"data_offsets":)" + offsets + "}}";
  };
  struct Case {
    std::string shape, offsets, message;
  };
  const std::vector<Case> cases = {
      {"[1e30]", "[0,16]", "tensor 'w': shape[0] is 1e+30, not a whole number >= 0"},
      {"[-1.5]", "[0,16]", "tensor 'w': shape[0] is -1.5, not a whole number >= 0"},
      {"[1.5]", "[0,16]", "tensor 'w': shape[0] is 1.5, not a whole number >= 0"},
      {"[2,2.0]", "[0,16]", "tensor 'w': shape[1] is 2.0, not a whole number >= 0"},
      {"[-4]", "[0,16]", "tensor 'w': shape[0] is -4, not a whole number >= 0"},
      {R"(["4"])", "[0,16]", "tensor 'w': shape[0] is \"4\", not a whole number >= 0"},
      {"[18446744073709551615]", "[0,16]", "tensor 'w': shape [18446744073709551615] is too large"},
      {"[0,4294967296,4294967296]", "[0,0]", "tensor 'w': shape [0,4294967296,4294967296] is too large"},
      {"4", "[0,16]", "tensor 'w': shape is 4, not a list"},
      {"[4]", "[0,16.0]", "tensor 'w': data_offsets[1] is 16.0, not a whole number >= 0"},
      {"[4]", "[-0.5,16]", "tensor 'w': data_offsets[0] is -0.5, not a whole number >= 0"},
      {"[4]", "[0,1e30]", "tensor 'w': data_offsets[1] is 1e+30, not a whole number >= 0"},
      {"[4]", "[0]", "tensor 'w': data_offsets is [0], not a list [begin, end]"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    const std::string path = dir.file("case" + std::to_string(i) + ".safetensors");
    write_bytes(path, st_file(header(c.shape, c.offsets), data));
    INFO("shape " << c.shape << ", data_offsets " << c.offsets);
    CHECK_THAT(load_error(path), Contains(path + ": " + c.message));
  }
  // The well-formed file loads: the cases above fail for their numbers alone.
  write_bytes(dir.file("good.safetensors"), st_file(header("[4]", "[0,16]"), data));
  CHECK(nn::load_safetensors(dir.file("good.safetensors"))[0].second.shape() == Shape{4});
}

TEST_CASE("Safetensors headers: a name given twice is refused, naming it",
          "[nn][safetensors][bad-files]") {
  TempDir dir;
  const std::string entry = R"({"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  const std::string data(8, '\x02');
  SECTION("a tensor") {
    const std::string path = dir.file("twice.safetensors");
    write_bytes(path, st_file(R"({"w":)" + entry + R"(,"v":)" + entry + R"(,"w":)" + entry + "}",
                              data));
    CHECK_THAT(load_error(path),
               Contains(path + ": duplicate tensor name 'w': the header names it twice"));
  }
  SECTION("a key of a tensor's entry") {
    const std::string path = dir.file("dtype-twice.safetensors");
    write_bytes(path, st_file(R"({"w":{"dtype":"F32","dtype":"I64","shape":[2],"data_offsets":[0,8]}})",
                              data));
    CHECK_THAT(load_error(path), Contains(path + ": corrupt header: 'w' has the key 'dtype' twice"));
  }
  SECTION("anvil-train --init-from refuses a LeNet file with a weight named twice") {
    // The file is LeNet's state with 0.bias's entry given a second time: a
    // parser that kept the last entry would train on it.
    auto net = models::lenet(models::Init::Default);
    const std::string good = dir.file("lenet.safetensors");
    nn::save_safetensors(good, net->state_dict());
    std::string bytes = read_bytes(good);
    uint64_t len = 0;
    for (int i = 7; i >= 0; --i) len = (len << 8) | uint8_t(bytes[size_t(i)]);
    std::string text = bytes.substr(8, len), rest = bytes.substr(8 + len);
    const size_t at = text.find("\"0.bias\":");
    REQUIRE(at != std::string::npos);
    const std::string bias_entry = text.substr(at, text.find('}', at) + 1 - at);
    text.insert(text.rfind('}'), "," + bias_entry);
    text.append((8 - text.size() % 8) % 8, ' ');
    const std::string path = dir.file("lenet-twice.safetensors");
    write_bytes(path, st_file(text, rest));
    CliResult r = expect_failure("--device cpu --data-dir /nonexistent --init-from " + quote(path),
                                 {path + ": duplicate tensor name '0.bias'"});
    CHECK(count_lines_containing(r.output, "error") == 1);
  }
}

TEST_CASE("anvil-train refuses an output path where no file can be created, before training",
          "[cli][bad-files]") {
  // /proc exists and passes access(W_OK) for root, but no file can be made in it.
  FILE* probe = std::fopen("/proc/anvil-probe", "w");
  if (probe) {
    std::fclose(probe);
    std::remove("/proc/anvil-probe");
    WARN("files can be created in /proc here; nothing to test");
    return;
  }
  // Small data, so that a missed check costs seconds of training, not minutes.
  TempDir data;
  write_synthetic_split(data.path, 64, 32);
  for (const char* flag : {"--save", "--metrics", "--checkpoint"}) {
    CliResult r = expect_failure("--device cpu --epochs 2 --data-dir " + quote(data.path.string()) +
                                     " " + flag + " /proc/x",
                                 {std::string(flag) + " /proc/x: cannot create a file in directory "
                                                      "'/proc'"});
    CHECK(r.code == 2);
    CHECK(r.seconds < 30);
  }
  // Where a file can be created, the check leaves nothing behind.
  TempDir dir;
  expect_failure("--device cpu --save " + quote(dir.file("w.safetensors")) + " --metrics " +
                     quote(dir.file("m.jsonl")) + " --data-dir " + quote(dir.file("nodata")),
                 {dir.file("nodata")});
  CHECK(std::distance(fs::directory_iterator(dir.path), fs::directory_iterator()) == 0);
}
