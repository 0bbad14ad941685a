// Helpers shared by the nn/ and checkpoint tests.
#pragma once
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "core/autograd.h"
#include "core/tensor.h"
#include "nn/module.h"

namespace anvil::testing {

inline std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE(in);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

inline void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), std::streamsize(bytes.size()));
  REQUIRE(out);
}

inline std::string le64(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[size_t(i)] = char((v >> (8 * i)) & 0xff);
  return s;
}

// A hand-made safetensors file: length prefix, the header text as given, data.
inline std::string st_file(const std::string& header, const std::string& data) {
  return le64(header.size()) + header + data;
}

inline std::string tensor_bytes(const Tensor& t) {
  Tensor host = t.detach().to(Device::cpu());
  return std::string(static_cast<const char*>(host.raw_data()), host.nbytes());
}

// Overwrites t's values (outside autograd), keeping the same tensor.
inline void assign(const Tensor& t, const std::vector<float>& values) {
  NoGradGuard no_grad;
  t.detach().copy_(Tensor::from_vector(values, t.shape()));
}

inline double sample_mean(const std::vector<float>& v) {
  double s = 0;
  for (float x : v) s += x;
  return s / double(v.size());
}

inline double sample_std(const std::vector<float>& v) {
  double m = sample_mean(v), s = 0;
  for (float x : v) s += (x - m) * (x - m);
  return std::sqrt(s / double(v.size() - 1));
}

inline const std::vector<std::string> kLeNetKeys = {"0.weight", "0.bias", "3.weight", "3.bias",
                                             "7.weight", "7.bias", "9.weight", "9.bias"};
inline const std::vector<Shape> kLeNetShapes = {{20, 1, 3, 3}, {20}, {50, 20, 5, 5}, {50},
                                         {128, 800},    {128}, {10, 128},     {10}};

// Asserts that every tensor of `a` equals the same-named one of `b`, byte for byte.
inline void require_same_state(const nn::NamedTensors& a, const nn::NamedTensors& b) {
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    INFO("tensor " << a[i].first);
    REQUIRE(a[i].first == b[i].first);
    REQUIRE(a[i].second.dtype() == b[i].second.dtype());
    REQUIRE(a[i].second.shape() == b[i].second.shape());
    REQUIRE(tensor_bytes(a[i].second) == tensor_bytes(b[i].second));
  }
}

inline nn::NamedTensors clone_state(const nn::NamedTensors& s) {
  nn::NamedTensors out;
  for (auto& [name, t] : s) out.emplace_back(name, t.detach().clone());
  return out;
}

}  // namespace anvil::testing
