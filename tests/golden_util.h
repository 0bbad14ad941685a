// The golden files of tests/golden/: PyTorch's values, written by the
// make_*.py scripts beside them, each file parsed once per test run.
#pragma once
#include <fstream>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

namespace anvil::testing {

// tests/golden/<name>, parsed; throws naming the path when it cannot be read.
inline const nlohmann::json& golden_file(const std::string& name) {
  static std::mutex mutex;
  static std::map<std::string, nlohmann::json> files;  // node-based: references stay valid
  std::lock_guard<std::mutex> lock(mutex);
  auto it = files.find(name);
  if (it == files.end()) {
    const std::string path = std::string(ANVIL_TEST_DATA_DIR) + "/golden/" + name;
    std::ifstream in(path);
    if (!in) throw std::runtime_error("cannot open " + path);
    it = files.emplace(name, nlohmann::json::parse(in)).first;
  }
  return it->second;
}

}  // namespace anvil::testing
