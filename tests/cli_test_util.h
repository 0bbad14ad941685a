// Helpers for the tests that run anvil-train as a user would: run it with
// arguments, capture its output and exit status, expect an orderly failure,
// and write small IDX data sets for it to read.
#pragma once
#include <catch2/catch.hpp>
#include <sys/wait.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <sstream>
#include <string>
#include <vector>

#include "tests/test_util.h"

namespace anvil::testing::cli {

using Catch::Contains;

inline void write_file(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
  REQUIRE(out);
}

inline std::string quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

struct CliResult {
  int code = -1;       // exit status (128 + signal when killed)
  std::string output;  // stdout and stderr together
  double seconds = 0;
};

// Runs anvil-train with `args` (already shell-quoted where needed).
inline CliResult run_cli(const std::string& args) {
  TempDir dir;
  std::string out = dir.file("output.txt");
  std::string cmd = quote(ANVIL_TRAIN_BIN) + " " + args + " > " + quote(out) + " 2>&1 < /dev/null";
  auto start = std::chrono::steady_clock::now();
  int rc = std::system(cmd.c_str());
  CliResult r;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  REQUIRE(rc != -1);
  if (WIFEXITED(rc)) r.code = WEXITSTATUS(rc);
  else if (WIFSIGNALED(rc)) r.code = 128 + WTERMSIG(rc);
  r.output = read_file(out);
  return r;
}

// A failure must be an orderly error message, never an abort or a crash.
inline void check_no_crash(const CliResult& r) {
  INFO("output:\n" << r.output);
  CHECK(r.code < 128);
  for (const char* bad : {"terminate called", "Aborted", "Segmentation fault", "core dumped",
                          "AddressSanitizer", "LeakSanitizer", "runtime error:", "what():"})
    CHECK_THAT(r.output, !Contains(bad));
}

inline std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

inline int count_lines_containing(const std::string& text, const std::string& what) {
  int n = 0;
  for (auto& l : lines_of(text)) n += l.find(what) != std::string::npos;
  return n;
}

// Expects a failure (non-zero exit, no crash) whose output contains every part.
inline CliResult expect_failure(const std::string& args, std::initializer_list<std::string> parts) {
  CliResult r = run_cli(args);
  INFO("anvil-train " << args << "\nexit " << r.code << ", output:\n" << r.output);
  CHECK(r.code != 0);
  check_no_crash(r);
  for (auto& p : parts) CHECK_THAT(r.output, Contains(p));
  // Nothing was trained.
  CHECK_THAT(r.output, !Contains("epoch "));
  return r;
}

inline void put_be32(std::vector<uint8_t>& b, uint32_t v) {
  for (int s = 24; s >= 0; s -= 8) b.push_back(uint8_t(v >> s));
}

// IDX images [count, 28, 28] with `data_bytes` bytes of data (a full file
// has count * 784).
inline std::vector<uint8_t> idx_images(uint32_t count, size_t data_bytes, uint8_t seed) {
  std::vector<uint8_t> b = {0, 0, 0x08, 3};
  put_be32(b, count);
  put_be32(b, 28);
  put_be32(b, 28);
  for (size_t i = 0; i < data_bytes; ++i) b.push_back(uint8_t((i * 31 + seed * 7) % 251));
  return b;
}

inline std::vector<uint8_t> idx_labels(uint32_t count) {
  std::vector<uint8_t> b = {0, 0, 0x08, 1};
  put_be32(b, count);
  for (uint32_t i = 0; i < count; ++i) b.push_back(uint8_t(i % 10));
  return b;
}

// tests/golden/make_lenet_bf16_golden.py's images: image i has label
// (7 i + 3) mod 10 and a band of 4 bright rows placed by its label, over
// integer noise (0..63), so that a LeNet learns them in a few steps.
inline int64_t banded_label(uint32_t i) { return (7 * int64_t(i) + 3) % 10; }
inline uint8_t banded_pixel(uint32_t i, int r, int col) {
  const uint64_t noise = ((uint64_t(i) * 784 + uint64_t(r) * 28 + uint64_t(col)) * 2654435761u %
                          (uint64_t(1) << 32)) >> 26;
  const int64_t c = banded_label(i);
  return uint8_t(noise + (2 * c + 3 <= r && r < 2 * c + 7 ? 150 : 0));
}

// A Fashion-MNIST-like directory of banded images: `test` test images 0..,
// `train` training images 1000.. (the golden script's sets).
inline void write_banded_split(const std::filesystem::path& dir, uint32_t train, uint32_t test) {
  std::filesystem::create_directories(dir);
  auto write = [&](const std::string& stem, uint32_t count, uint32_t first) {
    std::vector<uint8_t> images = {0, 0, 0x08, 3}, labels = {0, 0, 0x08, 1};
    put_be32(images, count);
    put_be32(images, 28);
    put_be32(images, 28);
    put_be32(labels, count);
    for (uint32_t k = 0; k < count; ++k) {
      for (int r = 0; r < 28; ++r)
        for (int col = 0; col < 28; ++col) images.push_back(banded_pixel(first + k, r, col));
      labels.push_back(uint8_t(banded_label(first + k)));
    }
    write_file((dir / (stem + "-images-idx3-ubyte")).string(), images);
    write_file((dir / (stem + "-labels-idx1-ubyte")).string(), labels);
  };
  write("train", train, 1000);
  write("t10k", test, 0);
}

// A small well-formed Fashion-MNIST-like directory (plain IDX files).
inline void write_synthetic_split(const std::filesystem::path& dir, uint32_t train, uint32_t test) {
  std::filesystem::create_directories(dir);
  write_file((dir / "train-images-idx3-ubyte").string(),
             idx_images(train, size_t(train) * 784, 1));
  write_file((dir / "train-labels-idx1-ubyte").string(), idx_labels(train));
  write_file((dir / "t10k-images-idx3-ubyte").string(), idx_images(test, size_t(test) * 784, 2));
  write_file((dir / "t10k-labels-idx1-ubyte").string(), idx_labels(test));
}

}  // namespace anvil::testing::cli
