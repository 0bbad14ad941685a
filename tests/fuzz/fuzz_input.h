// What every fuzz target shares: the parsers read files, so each input is
// written to a scratch file of this process first, and a failed property is
// reported as a crash (abort) so that libFuzzer keeps the input.
#pragma once
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

namespace anvil::fuzz {

// A property the parser broke: abort with the reason, so that libFuzzer (or
// the replay driver) reports the input as a finding.
[[noreturn]] inline void fail(const std::string& what) {
  std::fprintf(stderr, "anvil fuzz property failed: %s\n", what.c_str());
  std::abort();
}

// A scratch path of this process in the temporary directory, removed at exit.
class ScratchFile {
 public:
  explicit ScratchFile(const std::string& tag)
      : path_((std::filesystem::temp_directory_path() /
               ("anvil-fuzz-" + tag + "-" + std::to_string(::getpid())))
                  .string()) {}
  ~ScratchFile() { std::remove(path_.c_str()); }
  ScratchFile(const ScratchFile&) = delete;
  ScratchFile& operator=(const ScratchFile&) = delete;

  // Replaces the file's contents with n bytes.
  const std::string& write(const uint8_t* data, size_t n) {
    std::ofstream out(path_, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data), std::streamsize(n));
    out.close();
    if (!out) fail("cannot write the scratch file " + path_);
    return path_;
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace anvil::fuzz
