#include "nn/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/autograd.h"
#include "core/unfinished_files.h"

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
    case DType::BFloat16: return "BF16";
  }
  return "?";
}

bool parse_dtype(const std::string& s, DType& out) {
  if (s == "F32") out = DType::Float32;
  else if (s == "I64") out = DType::Int64;
  else if (s == "U8") out = DType::UInt8;
  else if (s == "BF16") out = DType::BFloat16;
  else return false;
  return true;
}

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw CheckpointError(fmt::format("{}: {}", path, what));
}

// The header's JSON, refusing a key that appears twice in one object (JSON
// parsers keep one of the two silently: a tensor named twice would load
// whichever the parser kept).
nlohmann::ordered_json parse_header(const std::string& path, const std::string& text) {
  using Json = nlohmann::ordered_json;
  struct Object {
    std::string owner;  // the key this object is the value of ("" at the top)
    std::set<std::string> keys;
    std::string last_key;
  };
  std::vector<Object> open;
  struct Duplicate {
    std::string owner, key;
    bool top_level;  // a tensor's name, rather than a key inside an entry
  };
  std::optional<Duplicate> duplicate;
  auto watch = [&](int, Json::parse_event_t event, Json& parsed) {
    if (event == Json::parse_event_t::object_start) {
      open.push_back({open.empty() ? "" : open.back().last_key, {}, ""});
    } else if (event == Json::parse_event_t::object_end) {
      open.pop_back();
    } else if (event == Json::parse_event_t::key && !open.empty()) {
      Object& o = open.back();
      o.last_key = parsed.get<std::string>();
      if (!o.keys.insert(o.last_key).second && !duplicate)
        duplicate = Duplicate{o.owner, o.last_key, open.size() == 1};
    }
    return true;
  };
  Json header;
  try {
    header = Json::parse(text, watch);
  } catch (const std::exception& e) {
    fail(path, fmt::format("corrupt header JSON: {}", e.what()));
  }
  if (!header.is_object()) fail(path, "corrupt header: not a JSON object");
  if (duplicate && duplicate->top_level)
    fail(path, fmt::format("duplicate tensor name '{}': the header names it twice", duplicate->key));
  if (duplicate)
    fail(path, fmt::format("corrupt header: '{}' has the key '{}' twice", duplicate->owner,
                           duplicate->key));
  return header;
}

// A header number that must be a whole number >= 0. JSON parsers read "3"
// as an unsigned integer, "-1" as a signed one and "1.5" or "1e30" as a
// double; only the first is a size or an offset (the others, cast to an
// integer, would be undefined behaviour or silently rounded).
uint64_t whole_number(const std::string& path, const std::string& name, const char* field,
                      size_t index, const nlohmann::ordered_json& value) {
  if (value.is_number_unsigned()) return value.get<uint64_t>();
  if (value.is_number_integer() && value.get<int64_t>() >= 0) return uint64_t(value.get<int64_t>());
  fail(path, fmt::format("tensor '{}': {}[{}] is {}, not a whole number >= 0", name, field, index,
                         value.dump()));
}

// One tensor's header entry, checked against the data section's size.
struct Entry {
  DType dtype = DType::Float32;
  Shape shape;
  uint64_t begin = 0;  // offset of its bytes in the data section
};

Entry parse_entry(const std::string& path, const std::string& name,
                  const nlohmann::ordered_json& entry, uint64_t data_size) {
  if (!entry.is_object())
    fail(path, fmt::format("tensor '{}': its header entry is {}, not a JSON object", name,
                           entry.type_name()));
  for (const char* key : {"dtype", "shape", "data_offsets"})
    if (!entry.contains(key))
      fail(path, fmt::format("tensor '{}': malformed header entry (no '{}')", name, key));
  Entry e;
  const auto& dtype = entry["dtype"];
  if (!dtype.is_string())
    fail(path, fmt::format("tensor '{}': dtype is {}, not a string", name, dtype.dump()));
  if (!parse_dtype(dtype.get<std::string>(), e.dtype))
    fail(path, fmt::format("tensor '{}': unsupported dtype {}", name, dtype.get<std::string>()));

  const auto& shape = entry["shape"];
  if (!shape.is_array())
    fail(path, fmt::format("tensor '{}': shape is {}, not a list", name, shape.dump()));
  // Every partial product of the dimensions must fit in an int64 (zeros
  // counted as 1), so that no size or stride computed from the shape can
  // overflow: a corrupt or hostile header must not wrap around to a small
  // allocation.
  int64_t extent = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    const uint64_t d = whole_number(path, name, "shape", i, shape[i]);
    if (d > uint64_t(INT64_MAX) ||
        __builtin_mul_overflow(extent, std::max<int64_t>(int64_t(d), 1), &extent) ||
        extent > INT64_MAX / int64_t(dtype_size(e.dtype)))
      fail(path, fmt::format("tensor '{}': shape {} is too large", name, shape.dump()));
    e.shape.push_back(int64_t(d));
  }

  const auto& offsets = entry["data_offsets"];
  if (!offsets.is_array() || offsets.size() != 2)
    fail(path, fmt::format("tensor '{}': data_offsets is {}, not a list [begin, end]", name,
                           offsets.dump()));
  const uint64_t begin = whole_number(path, name, "data_offsets", 0, offsets[0]);
  const uint64_t end = whole_number(path, name, "data_offsets", 1, offsets[1]);
  if (begin > end)
    fail(path, fmt::format("tensor '{}': data_offsets [{}, {}] end before they begin", name,
                           begin, end));
  if (end > data_size)
    fail(path, fmt::format("truncated: tensor '{}' needs data bytes [{}, {}) but the file "
                           "holds only {} data bytes",
                           name, begin, end, data_size));
  const uint64_t expected = uint64_t(shape_numel(e.shape)) * dtype_size(e.dtype);
  if (end - begin != expected)
    fail(path, fmt::format("tensor '{}': {} bytes stored but shape {} of {} needs {}", name,
                           end - begin, shape_str(e.shape), dtype_name(e.dtype), expected));
  e.begin = begin;
  return e;
}

// A bfloat16 tensor loaded into a float32 one: widened, as PyTorch's copy_.
bool widens(const Tensor& src, const Tensor& dst) {
  return src.dtype() == DType::BFloat16 && dst.dtype() == DType::Float32;
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
  // Its name is tracked before the file exists and until it is renamed, so
  // that a signal that ends the process at any moment in between (parallel/'s
  // SIGTERM handler) removes it too: mkstemp's, made by hand (O_EXCL).
  std::string tmp;
  int fd = -1, tracked = -1;
  static const char kLetters[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  std::random_device entropy;
  for (int attempt = 0; fd < 0; ++attempt) {
    tmp = path + ".tmp.";
    for (int i = 0; i < 6; ++i) tmp += kLetters[entropy() % (sizeof kLetters - 1)];
    tracked = track_unfinished_file(tmp);
    fd = ::open(tmp.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd >= 0) break;
    const int error = errno;
    untrack_unfinished_file(tracked);
    if (error != EEXIST || attempt == 100)
      fail(path, fmt::format("cannot create a temporary file next to it: {}", std::strerror(error)));
  }
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
    untrack_unfinished_file(tracked);
    throw;
  }
  untrack_unfinished_file(tracked);
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
  nlohmann::ordered_json header = parse_header(path, text);
  uint64_t data_size = file_size - 8 - header_len;

  NamedTensors out;
  for (auto& [name, entry] : header.items()) {
    if (name == "__metadata__") continue;
    const Entry e = parse_entry(path, name, entry, data_size);
    Tensor t = Tensor::empty(e.shape, e.dtype);
    in.seekg(std::streamoff(8 + header_len + e.begin));
    in.read(static_cast<char*>(t.raw_data()), std::streamsize(t.nbytes()));
    if (!in) fail(path, fmt::format("tensor '{}': truncated data", name));
    out.emplace_back(name, t);
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
    if (src.shape() != t.shape() || (src.dtype() != t.dtype() && !widens(src, t)))
      throw CheckpointError(fmt::format(
          "{}: tensor '{}' is {} {} in the checkpoint but {} {} in the model", source, name,
          dtype_name(src.dtype()), shape_str(src.shape()), dtype_name(t.dtype()),
          shape_str(t.shape())));
  }
}

int64_t load_state_dict(Module& module, const NamedTensors& state, const std::string& source) {
  // Check everything before changing anything: a bad file leaves the model as it was.
  check_state_dict(module, state, source);
  std::map<std::string, Tensor> given(state.begin(), state.end());
  NoGradGuard no_grad;
  int64_t widened = 0;
  for (auto& [name, t] : module.state_dict()) {
    const Tensor& src = given.at(name);
    if (widens(src, t)) {
      t.detach().copy_(src.detach().to(DType::Float32));  // exact: bfloat16 is float32's top half
      ++widened;
    } else {
      t.detach().copy_(src);
    }
  }
  return widened;
}

}  // namespace anvil::nn
