#include "nn/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
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

  // A temporary file of its own next to path (two runs saving to one path do
  // not share it), flushed to the disk before the rename and the directory
  // after it: an interrupted save, even by a power cut, leaves either the old
  // file or the new one, never a mix. Removed on any failure.
  std::string tmp = path + ".tmp.XXXXXX";
  int fd = mkstemp(tmp.data());
  if (fd < 0)
    fail(path, fmt::format("cannot create a temporary file next to it: {}", std::strerror(errno)));
  auto write_all = [&](const void* data, size_t n) {
    const char* p = static_cast<const char*>(data);
    while (n > 0) {
      ssize_t w = ::write(fd, p, n);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0)
        fail(path, fmt::format("write failed ({}); the previous file, if any, is unchanged",
                               std::strerror(errno)));
      p += w;
      n -= size_t(w);
    }
  };
  try {
    if (fchmod(fd, 0644) != 0)
      fail(path, fmt::format("cannot set the permissions of '{}': {}", tmp, std::strerror(errno)));
    uint64_t n = text.size();
    write_all(&n, 8);
    write_all(text.data(), text.size());
    for (auto& [name, t] : tensors) {
      Tensor host = t.detach().to(Device::cpu());
      write_all(host.raw_data(), host.nbytes());
    }
    if (fsync(fd) != 0)
      fail(path, fmt::format("fsync failed ({}); the previous file, if any, is unchanged",
                             std::strerror(errno)));
    int closed = ::close(fd);
    fd = -1;
    if (closed != 0) fail(path, fmt::format("close failed: {}", std::strerror(errno)));
    std::error_code ec;
    std::filesystem::rename(tmp, path, ec);
    if (ec) fail(path, fmt::format("cannot replace the file: {}", ec.message()));
  } catch (...) {
    if (fd >= 0) ::close(fd);
    std::remove(tmp.c_str());
    throw;
  }
  // The rename is durable once the directory is on the disk too.
  std::filesystem::path dir = std::filesystem::path(path).parent_path();
  int dir_fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (dir_fd >= 0) {
    (void)fsync(dir_fd);  // best effort: some filesystems refuse fsync on directories
    ::close(dir_fd);
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

void check_state_dict(const Module& module, const NamedTensors& state, const std::string& source) {
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
  for (auto& [name, t] : own) {
    const Tensor& src = given.at(name);
    if (src.shape() != t.shape() || src.dtype() != t.dtype())
      throw CheckpointError(fmt::format(
          "{}: tensor '{}' is {} {} in the checkpoint but {} {} in the model", source, name,
          dtype_name(src.dtype()), shape_str(src.shape()), dtype_name(t.dtype()),
          shape_str(t.shape())));
  }
}

void load_state_dict(Module& module, const NamedTensors& state, const std::string& source) {
  // Check everything before changing anything: a bad file leaves the model as it was.
  check_state_dict(module, state, source);
  std::map<std::string, Tensor> given(state.begin(), state.end());
  NoGradGuard no_grad;
  for (auto& [name, t] : module.state_dict()) t.detach().copy_(given.at(name));
}

}  // namespace anvil::nn
