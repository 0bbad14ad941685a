// Helpers shared by the test files: scratch directories, file I/O and
// where the real Fashion-MNIST lives.
#pragma once
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

namespace anvil::testing {

inline const char* kFashionDir = "/usr/share/datasets/fashion-mnist";

inline bool have_fashion_mnist() {
  namespace fs = std::filesystem;
  return fs::exists(fs::path(kFashionDir) / "train-images-idx3-ubyte.gz") ||
         fs::exists(fs::path(kFashionDir) / "train-images-idx3-ubyte");
}

// A fresh directory under the system temp dir, removed afterwards.
struct TempDir {
  std::filesystem::path path;
  explicit TempDir(const std::string& tag = "test") {
    static std::atomic<int> counter{0};
    path = std::filesystem::temp_directory_path() /
           ("anvil_" + tag + "_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string file(const std::string& name) const { return (path / name).string(); }
  // Temporary files a save left behind (save_safetensors names them
  // "<file>.tmp.XXXXXX"): none after a save, failed or not.
  int temporaries() const {
    int n = 0;
    for (auto& e : std::filesystem::directory_iterator(path))
      n += e.path().filename().string().find(".tmp") != std::string::npos;
    return n;
  }
};

// Whole file as bytes; empty when it cannot be opened.
inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

}  // namespace anvil::testing
