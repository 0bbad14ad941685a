#include "nn/safetensors.h"

#include <bit>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/autograd.h"

namespace anvil::nn {

static_assert(std::endian::native == std::endian::little,
              "safetensors stores little-endian data; this host is big-endian");

namespace {

constexpr uint64_t kMaxHeader = 100u << 20;  // the format's own limit

const char* st_dtype(DType t) {
  switch (t) {
    case DType::Float32: return "F32";
    case DType::Int64: return "I64";
    case DType::UInt8: return "U8";
  }
  return "?";
}

bool parse_dtype(const std::string& s, DType& out) {
  if (s == "F32") out = DType::Float32;
  else if (s == "I64") out = DType::Int64;
  else if (s == "U8") out = DType::UInt8;
  else return false;
  return true;
}

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw CheckpointError(fmt::format("{}: {}", path, what));
}

}  // namespace

void save_safetensors(const std::string& path, const NamedTensors& tensors) {
  nlohmann::ordered_json header;
  header["__metadata__"] = {{"format", "pt"}};
  uint64_t offset = 0;
  std::set<std::string> names;
  for (auto& [name, t] : tensors) {
    if (!names.insert(name).second) fail(path, fmt::format("duplicate tensor name '{}'", name));
    uint64_t bytes = t.nbytes();
    header[name] = {{"dtype", st_dtype(t.dtype())},
                    {"shape", t.shape()},
                    {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // keeps the data 8-byte aligned

  std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) fail(path, fmt::format("cannot open '{}' for writing", tmp));
    uint64_t n = text.size();
    out.write(reinterpret_cast<const char*>(&n), 8);
    out.write(text.data(), std::streamsize(text.size()));
    for (auto& [name, t] : tensors) {
      Tensor host = t.detach().to(Device::cpu());
      out.write(static_cast<const char*>(host.raw_data()), std::streamsize(host.nbytes()));
    }
    out.flush();
    if (!out) {
      out.close();
      std::remove(tmp.c_str());
      fail(path, "write failed (disk full?); the previous file, if any, is unchanged");
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::remove(tmp.c_str());
    fail(path, fmt::format("cannot replace the file: {}", ec.message()));
  }
}

NamedTensors load_safetensors(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path, "cannot open checkpoint (no such file or not readable)");
  if (std::filesystem::is_directory(path)) fail(path, "is a directory, not a checkpoint file");
  in.seekg(0, std::ios::end);
  uint64_t file_size = uint64_t(in.tellg());
  in.seekg(0);
  if (file_size < 8) fail(path, fmt::format("not a safetensors file: only {} bytes", file_size));
  uint64_t header_len = 0;
  in.read(reinterpret_cast<char*>(&header_len), 8);
  if (header_len > kMaxHeader || header_len > file_size - 8)
    fail(path, fmt::format("not a safetensors file: header length {} but file has {} bytes",
                           header_len, file_size));
  std::string text(header_len, '\0');
  in.read(text.data(), std::streamsize(header_len));
  if (!in) fail(path, "cannot read the header");
  nlohmann::ordered_json header;
  try {
    header = nlohmann::ordered_json::parse(text);
  } catch (const std::exception& e) {
    fail(path, fmt::format("corrupt header JSON: {}", e.what()));
  }
  if (!header.is_object()) fail(path, "corrupt header: not a JSON object");
  uint64_t data_size = file_size - 8 - header_len;

  NamedTensors out;
  for (auto& [name, entry] : header.items()) {
    if (name == "__metadata__") continue;
    DType dtype;
    try {
      std::string ds = entry.at("dtype").get<std::string>();
      if (!parse_dtype(ds, dtype))
        fail(path, fmt::format("tensor '{}': unsupported dtype {}", name, ds));
      Shape shape = entry.at("shape").get<Shape>();
      auto offsets = entry.at("data_offsets").get<std::vector<uint64_t>>();
      if (offsets.size() != 2 || offsets[0] > offsets[1])
        fail(path, fmt::format("tensor '{}': data_offsets out of range (data is {} bytes)", name,
                               data_size));
      if (offsets[1] > data_size)
        fail(path, fmt::format("truncated: tensor '{}' needs data bytes [{}, {}) but the file "
                               "holds only {} data bytes",
                               name, offsets[0], offsets[1], data_size));
      // The element count, refusing shapes whose size overflows (a corrupt or
      // hostile header must not wrap around to a small allocation).
      int64_t numel = 1, nbytes = 0;
      for (int64_t d : shape) {
        if (d < 0) fail(path, fmt::format("tensor '{}': negative dimension", name));
        if (__builtin_mul_overflow(numel, d, &numel) ||
            __builtin_mul_overflow(numel, int64_t(dtype_size(dtype)), &nbytes))
          fail(path, fmt::format("tensor '{}': shape {} is too large", name, shape_str(shape)));
      }
      uint64_t expected = uint64_t(numel) * dtype_size(dtype);
      if (offsets[1] - offsets[0] != expected)
        fail(path, fmt::format("tensor '{}': {} bytes stored but shape {} of {} needs {}", name,
                               offsets[1] - offsets[0], shape_str(shape), dtype_name(dtype),
                               expected));
      Tensor t = Tensor::empty(shape, dtype);
      in.seekg(std::streamoff(8 + header_len + offsets[0]));
      in.read(static_cast<char*>(t.raw_data()), std::streamsize(expected));
      if (!in) fail(path, fmt::format("tensor '{}': truncated data", name));
      out.emplace_back(name, t);
    } catch (const nlohmann::json::exception& e) {
      fail(path, fmt::format("tensor '{}': malformed header entry ({})", name, e.what()));
    }
  }
  return out;
}

void load_state_dict(Module& module, const NamedTensors& state, const std::string& source) {
  std::map<std::string, Tensor> given(state.begin(), state.end());
  NamedTensors own = module.state_dict();
  std::vector<std::string> missing;
  for (auto& [name, t] : own)
    if (!given.count(name)) missing.push_back(name);
  std::set<std::string> known;
  for (auto& [name, t] : own) known.insert(name);
  std::vector<std::string> unexpected;
  for (auto& [name, t] : state)
    if (!known.count(name)) unexpected.push_back(name);
  if (!missing.empty() || !unexpected.empty()) {
    std::string msg = fmt::format("{}: does not match the model:", source);
    if (!missing.empty()) msg += fmt::format(" missing tensors: {};", fmt::join(missing, ", "));
    if (!unexpected.empty())
      msg += fmt::format(" unexpected tensors: {};", fmt::join(unexpected, ", "));
    msg.pop_back();
    throw CheckpointError(msg);
  }
  // Check everything before changing anything: a bad file leaves the model as it was.
  for (auto& [name, t] : own) {
    const Tensor& src = given.at(name);
    if (src.shape() != t.shape() || src.dtype() != t.dtype())
      throw CheckpointError(fmt::format(
          "{}: tensor '{}' is {} {} in the checkpoint but {} {} in the model", source, name,
          dtype_name(src.dtype()), shape_str(src.shape()), dtype_name(t.dtype()),
          shape_str(t.shape())));
  }
  NoGradGuard no_grad;
  for (auto& [name, t] : own) t.detach().copy_(given.at(name));
}

}  // namespace anvil::nn
