// The driver of the fuzz targets in builds without libFuzzer (g++, the
// release and sanitizer presets): runs LLVMFuzzerTestOneInput once on every
// file in the directories given, as `fuzz_x -runs=0 DIR...` does, so that
// ctest replays the seed corpus and the inputs that once found a bug.
// An input that makes the process's resident memory pass 1 GiB fails, as
// libFuzzer's -rss_limit_mb does: a small file must not cost gigabytes.
#include <sys/resource.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

constexpr int64_t kMaxResidentBytes = int64_t(1) << 30;

int64_t peak_resident_bytes() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return int64_t(usage.ru_maxrss) * 1024;
}

}  // namespace

int main(int argc, char** argv) {
  namespace fs = std::filesystem;
  std::vector<fs::path> inputs;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.starts_with("-")) continue;  // libFuzzer flags, meaningless here
    std::error_code ec;
    if (!fs::is_directory(arg, ec)) {
      std::fprintf(stderr, "%s: not a directory of inputs\n", arg.c_str());
      return 2;
    }
    for (const auto& entry : fs::directory_iterator(arg))
      if (entry.is_regular_file()) inputs.push_back(entry.path());
  }
  std::sort(inputs.begin(), inputs.end());
  for (const fs::path& input : inputs) {
    std::ifstream in(input, std::ios::binary);
    std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), {});
    if (!in.eof() && !in) {
      std::fprintf(stderr, "%s: cannot read\n", input.c_str());
      return 2;
    }
    std::fprintf(stderr, "Running: %s\n", input.c_str());
    LLVMFuzzerTestOneInput(bytes.data(), bytes.size());
    if (peak_resident_bytes() > kMaxResidentBytes) {
      std::fprintf(stderr, "%s: resident memory reached %lld MiB (limit %lld MiB)\n",
                   input.c_str(), static_cast<long long>(peak_resident_bytes() >> 20),
                   static_cast<long long>(kMaxResidentBytes >> 20));
      return 1;
    }
  }
  std::fprintf(stderr, "Executed %zu inputs, no finding\n", inputs.size());
  return inputs.empty() ? 1 : 0;
}
