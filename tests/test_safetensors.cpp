// Tests for checkpoints: the safetensors format (round trips, layout, every
// load error, atomic saves), load_state_dict's strict checks, and an interop
// check that PyTorch reads our checkpoints into the same network with the
// same outputs.
#include <catch2/catch.hpp>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/autograd.h"
#include "core/ops.h"
#include "core/random.h"
#include "core/tensor.h"
#include "nn/layers.h"
#include "nn/models.h"
#include "nn/module.h"
#include "nn/optim.h"
#include "nn/safetensors.h"
#include "tests/test_util.h"


namespace fs = std::filesystem;
using namespace anvil;
using Catch::Contains;

#include "tests/nn_test_util.h"

using namespace anvil::testing;
// ---------------------------------------------------------------- safetensors

TEST_CASE("safetensors round trip of a LeNet state dict is exact", "[nn][safetensors]") {
  TempDir dir;
  Generator gen(51);
  auto net = models::lenet(models::Init::Default, &gen);
  std::string path = dir.file("lenet.safetensors");
  nn::save_safetensors(path, net->state_dict());
  auto loaded = nn::load_safetensors(path);
  require_same_state(net->state_dict(), loaded);
  for (auto& [name, t] : loaded) {
    CHECK(t.device() == Device::cpu());
    CHECK_FALSE(t.requires_grad());
  }
  // Saving the loaded tensors again gives the identical file.
  std::string again = dir.file("again.safetensors");
  nn::save_safetensors(again, loaded);
  CHECK(read_bytes(path) == read_bytes(again));
  // No temporary left behind.
  CHECK(dir.temporaries() == 0);
  CHECK(std::distance(fs::directory_iterator(dir.path), fs::directory_iterator()) == 2);
}

TEST_CASE("safetensors round trip of mixed dtypes, scalars and empty tensors",
          "[nn][safetensors]") {
  TempDir dir;
  std::string path = dir.file("mixed.safetensors");
  Tensor f = Tensor::from_vector(std::vector<float>{1.5f, -2.0f, 3.25f, 0.0f, 1e-30f, -7.0f},
                                 {2, 3});
  Tensor scalar = Tensor::from_vector(std::vector<int64_t>{-1234567890123LL}, {});
  std::vector<uint8_t> bytes = {0, 1, 127, 128, 255};
  Tensor u8 = Tensor::from_host(bytes.data(), {5}, DType::UInt8);
  Tensor empty = Tensor::zeros({0, 4});
  nn::save_safetensors(path, {{"f", f}, {"count", scalar}, {"mask", u8}, {"none", empty}});
  auto loaded = nn::load_safetensors(path);
  REQUIRE(loaded.size() == 4);
  CHECK(loaded[0].first == "f");
  CHECK(loaded[0].second.dtype() == DType::Float32);
  CHECK(loaded[0].second.shape() == Shape{2, 3});
  CHECK(loaded[0].second.to_vector() == f.to_vector());
  CHECK(loaded[1].first == "count");
  CHECK(loaded[1].second.dtype() == DType::Int64);
  CHECK(loaded[1].second.shape() == Shape{});
  CHECK(loaded[1].second.to_int_vector() == std::vector<int64_t>{-1234567890123LL});
  CHECK(loaded[2].first == "mask");
  CHECK(loaded[2].second.dtype() == DType::UInt8);
  CHECK(loaded[2].second.shape() == Shape{5});
  const uint8_t* m = loaded[2].second.data<uint8_t>();
  CHECK(std::vector<uint8_t>(m, m + 5) == bytes);
  CHECK(loaded[3].first == "none");
  CHECK(loaded[3].second.shape() == Shape{0, 4});
  CHECK(loaded[3].second.numel() == 0);
}

TEST_CASE("safetensors file layout: LE length, JSON header, aligned data", "[nn][safetensors]") {
  TempDir dir;
  std::string path = dir.file("layout.safetensors");
  Tensor f = Tensor::from_vector(std::vector<float>{1, 2, 3}, {3});
  Tensor i = Tensor::from_vector(std::vector<int64_t>{7}, {});
  std::vector<uint8_t> ub = {9, 8};
  Tensor u = Tensor::from_host(ub.data(), {2, 1}, DType::UInt8);
  nn::save_safetensors(path, {{"a.weight", f}, {"b.steps", i}, {"c", u}});
  std::string file = read_bytes(path);
  REQUIRE(file.size() >= 8);
  uint64_t n = 0;
  for (int k = 7; k >= 0; --k) n = (n << 8) | uint8_t(file[size_t(k)]);
  REQUIRE(8 + n <= file.size());
  CHECK((8 + n) % 8 == 0);
  auto header = nlohmann::json::parse(file.substr(8, n));
  REQUIRE(header.is_object());
  CHECK(header.contains("__metadata__"));
  const std::string data = file.substr(8 + n);
  struct Want {
    const char* name;
    const char* dtype;
    std::vector<int64_t> shape;
    std::string bytes;
  };
  std::vector<Want> wants = {{"a.weight", "F32", {3}, tensor_bytes(f)},
                             {"b.steps", "I64", {}, tensor_bytes(i)},
                             {"c", "U8", {2, 1}, std::string("\x09\x08", 2)}};
  uint64_t total = 0;
  for (auto& w : wants) {
    INFO(w.name);
    REQUIRE(header.contains(w.name));
    auto& e = header[w.name];
    CHECK(e["dtype"] == w.dtype);
    CHECK(e["shape"].get<std::vector<int64_t>>() == w.shape);
    CHECK(e["shape"].is_array());
    auto off = e["data_offsets"].get<std::vector<uint64_t>>();
    REQUIRE(off.size() == 2);
    REQUIRE(off[1] <= data.size());
    CHECK(off[1] - off[0] == w.bytes.size());
    CHECK(data.substr(off[0], off[1] - off[0]) == w.bytes);
    total += off[1] - off[0];
  }
  // The data section is exactly the tensors, nothing more.
  CHECK(total == data.size());
  CHECK(header.size() == 4);
}

namespace {

// Expects load_safetensors(path) to throw a CheckpointError whose message
// names the file and contains `what`.
void expect_load_error(const std::string& path, const std::string& what) {
  INFO("file " << path << ", expecting '" << what << "'");
  try {
    nn::load_safetensors(path);
    FAIL("load_safetensors did not throw");
  } catch (const nn::CheckpointError& e) {
    std::string msg = e.what();
    INFO("message: " << msg);
    CHECK_THAT(msg, Contains(path));
    CHECK_THAT(msg, Contains(what));
  }
}

}  // namespace

TEST_CASE("load_safetensors reports each kind of bad file, naming it", "[nn][safetensors]") {
  TempDir dir;
  const std::string good_header =
      R"({"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}})";
  const std::string good_data(16, '\x01');
  // Sanity: the hand-made file itself loads.
  write_bytes(dir.file("ok.st"), st_file(good_header, good_data));
  auto ok = nn::load_safetensors(dir.file("ok.st"));
  REQUIRE(ok.size() == 1);
  CHECK(ok[0].second.shape() == Shape{2, 2});

  SECTION("missing file") {
    expect_load_error(dir.file("nope.safetensors"), "cannot open");
  }
  SECTION("a directory") {
    fs::create_directory(dir.file("adir"));
    expect_load_error(dir.file("adir"), "is a directory");
  }
  SECTION("shorter than the length prefix") {
    write_bytes(dir.file("short.st"), std::string("\x05\x00\x00", 3));
    expect_load_error(dir.file("short.st"), "only 3 bytes");
    write_bytes(dir.file("empty.st"), "");
    expect_load_error(dir.file("empty.st"), "only 0 bytes");
  }
  SECTION("header length beyond the end of the file") {
    write_bytes(dir.file("long.st"), le64(1000) + good_header);
    expect_load_error(dir.file("long.st"), "header length 1000");
    write_bytes(dir.file("huge.st"), le64(~uint64_t{0}) + good_header);
    expect_load_error(dir.file("huge.st"), "header length");
  }
  SECTION("corrupt JSON") {
    write_bytes(dir.file("json.st"), st_file(R"({"w":{"dtype":"F32",)", good_data));
    expect_load_error(dir.file("json.st"), "corrupt header JSON");
    write_bytes(dir.file("array.st"), st_file("[1, 2, 3]", ""));
    expect_load_error(dir.file("array.st"), "not a JSON object");
  }
  SECTION("malformed entries") {
    write_bytes(dir.file("nodtype.st"),
                st_file(R"({"w":{"shape":[4],"data_offsets":[0,16]}})", good_data));
    expect_load_error(dir.file("nodtype.st"), "'w'");
    write_bytes(dir.file("notobj.st"), st_file(R"({"w":5})", good_data));
    expect_load_error(dir.file("notobj.st"), "'w'");
    write_bytes(dir.file("badoff.st"),
                st_file(R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[16,0]}})", good_data));
    expect_load_error(dir.file("badoff.st"), "'w'");
    write_bytes(dir.file("negdim.st"),
                st_file(R"({"w":{"dtype":"F32","shape":[-1,4],"data_offsets":[0,16]}})",
                        good_data));
    expect_load_error(dir.file("negdim.st"), "shape[0] is -1, not a whole number >= 0");
  }
  SECTION("truncated data") {
    write_bytes(dir.file("trunc.st"), st_file(good_header, good_data.substr(0, 10)));
    expect_load_error(dir.file("trunc.st"), "truncated");
    // A real checkpoint cut short.
    Generator gen(61);
    auto net = models::lenet(models::Init::Default, &gen);
    nn::save_safetensors(dir.file("full.st"), net->state_dict());
    std::string full = read_bytes(dir.file("full.st"));
    // 100 bytes short: all of 9.bias (40 bytes) and the end of 9.weight,
    // which comes first in the header.
    write_bytes(dir.file("cut.st"), full.substr(0, full.size() - 100));
    expect_load_error(dir.file("cut.st"), "truncated");
    expect_load_error(dir.file("cut.st"), "'9.weight'");
  }
  SECTION("offsets disagree with shape and dtype") {
    write_bytes(dir.file("mismatch.st"),
                st_file(R"({"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,16]}})",
                        good_data));
    expect_load_error(dir.file("mismatch.st"), "'w'");
    expect_load_error(dir.file("mismatch.st"), "[2, 3]");
    write_bytes(dir.file("mismatch64.st"),
                st_file(R"({"w":{"dtype":"I64","shape":[2,2],"data_offsets":[0,16]}})",
                        good_data));
    expect_load_error(dir.file("mismatch64.st"), "needs 32");
  }
  SECTION("a shape too large for any file") {
    write_bytes(dir.file("big.st"),
                st_file(R"({"w":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,16]}})",
                        good_data));
    expect_load_error(dir.file("big.st"), "'w'");
    write_bytes(dir.file("big0.st"),
                st_file(R"({"w":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,0]}})",
                        ""));
    expect_load_error(dir.file("big0.st"), "too large");
  }
  SECTION("unsupported dtype") {
    write_bytes(dir.file("f16.st"),
                st_file(R"({"w":{"dtype":"F16","shape":[2,4],"data_offsets":[0,16]}})",
                        good_data));
    expect_load_error(dir.file("f16.st"), "unsupported dtype F16");
    expect_load_error(dir.file("f16.st"), "'w'");
  }
}

TEST_CASE("load_safetensors ignores __metadata__ and accepts unaligned headers",
          "[nn][safetensors]") {
  TempDir dir;
  // Header of odd length (other writers need not pad), tensors in reverse
  // order in the data section.
  std::string header =
      R"({"__metadata__":{"format":"pt","note":"x"},"b":{"dtype":"U8","shape":[3],"data_offsets":[4,7]},"a":{"dtype":"F32","shape":[],"data_offsets":[0,4]}})";
  float one = 1.0f;
  std::string data(reinterpret_cast<const char*>(&one), 4);
  data += std::string("\x01\x02\x03", 3);
  write_bytes(dir.file("x.st"), st_file(header, data));
  auto t = nn::load_safetensors(dir.file("x.st"));
  REQUIRE(t.size() == 2);
  CHECK(t[0].first == "b");
  CHECK(t[0].second.shape() == Shape{3});
  CHECK(t[0].second.data<uint8_t>()[2] == 3);
  CHECK(t[1].first == "a");
  CHECK(t[1].second.shape() == Shape{});
  CHECK(t[1].second.item() == 1.0);
}

TEST_CASE("save_safetensors is atomic", "[nn][safetensors]") {
  TempDir dir;
  Generator gen(71);
  auto net = models::lenet(models::Init::Default, &gen);

  SECTION("a path in a missing directory throws and creates nothing") {
    std::string path = dir.file("missing/sub/model.safetensors");
    try {
      nn::save_safetensors(path, net->state_dict());
      FAIL("save_safetensors did not throw");
    } catch (const nn::CheckpointError& e) {
      CHECK_THAT(std::string(e.what()), Contains(path));
    }
    CHECK_FALSE(fs::exists(path));
    CHECK(dir.temporaries() == 0);
    CHECK_FALSE(fs::exists(dir.file("missing")));
  }
  SECTION("saving over a checkpoint replaces it completely") {
    std::string path = dir.file("model.safetensors");
    nn::save_safetensors(path, net->state_dict());
    auto big = fs::file_size(path);
    Tensor small = Tensor::from_vector(std::vector<float>{4, 5}, {2});
    nn::save_safetensors(path, {{"only", small}});
    CHECK(fs::file_size(path) < big);
    auto loaded = nn::load_safetensors(path);
    REQUIRE(loaded.size() == 1);
    CHECK(loaded[0].first == "only");
    CHECK(loaded[0].second.to_vector() == std::vector<float>{4, 5});
    for (auto& e : fs::directory_iterator(dir.path))
      CHECK(e.path().filename().string() == "model.safetensors");
  }
  SECTION("a rename that fails after the write removes the temporary file") {
    // The path is a directory: the data is written, the rename over it fails.
    std::string path = dir.file("a_directory");
    fs::create_directories(path);
    try {
      nn::save_safetensors(path, net->state_dict());
      FAIL("save_safetensors did not throw");
    } catch (const nn::CheckpointError& e) {
      CHECK_THAT(std::string(e.what()), Contains(path));
      CHECK_THAT(std::string(e.what()), Contains("cannot replace"));
    }
    CHECK(fs::is_directory(path));
    CHECK(dir.temporaries() == 0);
  }
  SECTION("duplicate names are refused and leave the old file") {
    std::string path = dir.file("dup.safetensors");
    Tensor a = Tensor::ones({1});
    nn::save_safetensors(path, {{"a", a}});
    std::string before = read_bytes(path);
    CHECK_THROWS_WITH(nn::save_safetensors(path, {{"a", a}, {"a", a}}), Contains("'a'"));
    CHECK(read_bytes(path) == before);
    CHECK(dir.temporaries() == 0);
  }
}

// ---------------------------------------------------------------- load_state_dict

namespace {

// Expects load_state_dict to throw a CheckpointError containing every string
// of `parts`, and leaves the model unchanged.
void expect_state_error(nn::Module& model, const nn::NamedTensors& state,
                        std::initializer_list<std::string> parts) {
  auto before = clone_state(model.state_dict());
  try {
    nn::load_state_dict(model, state, "ckpt.safetensors");
    FAIL("load_state_dict did not throw");
  } catch (const nn::CheckpointError& e) {
    std::string msg = e.what();
    INFO("message: " << msg);
    CHECK_THAT(msg, Contains("ckpt.safetensors"));
    for (auto& p : parts) CHECK_THAT(msg, Contains(p));
  }
  require_same_state(before, model.state_dict());
}

}  // namespace

TEST_CASE("load_state_dict copies a matching state in place", "[nn][safetensors]") {
  Generator gen(81);
  auto src = models::lenet(models::Init::Default, &gen);
  auto dst = models::lenet(models::Init::Seed, &gen);
  auto own = dst->state_dict();
  nn::load_state_dict(*dst, src->state_dict(), "src");
  require_same_state(src->state_dict(), dst->state_dict());
  auto now = dst->state_dict();
  for (size_t i = 0; i < own.size(); ++i) {
    CHECK(now[i].second.same(own[i].second));  // same tensors, new values
    CHECK(now[i].second.requires_grad());
    CHECK(now[i].second.is_leaf());
  }
  // Same outputs.
  Tensor x = Tensor::randn({1, 1, 28, 28}, &gen);
  CHECK((*dst)(x).to_vector() == (*src)(x).to_vector());
  // The copy is independent of the source.
  assign(src->state_dict()[1].second, std::vector<float>(20, 9.0f));
  CHECK(dst->state_dict()[1].second.to_vector() != std::vector<float>(20, 9.0f));
}

TEST_CASE("load_state_dict refuses mismatched states, naming the tensor, changing nothing",
          "[nn][safetensors]") {
  Generator gen(91);
  auto model = models::lenet(models::Init::Default, &gen);
  auto donor = models::lenet(models::Init::Default, &gen);
  auto good = clone_state(donor->state_dict());

  SECTION("missing key") {
    auto s = good;
    s.pop_back();  // 9.bias
    expect_state_error(*model, s, {"9.bias", "missing"});
  }
  SECTION("unexpected key") {
    auto s = good;
    s.emplace_back("10.weight", Tensor::zeros({3}));
    expect_state_error(*model, s, {"10.weight", "unexpected"});
  }
  SECTION("shape mismatch after good tensors") {
    auto s = good;
    s[4].second = Tensor::zeros({128, 801});
    expect_state_error(*model, s, {"7.weight", "[128, 801]", "[128, 800]"});
  }
  SECTION("dtype mismatch in the last tensor") {
    auto s = good;
    s[7].second = Tensor::zeros({10}, DType::Int64);
    expect_state_error(*model, s, {"9.bias", "int64", "float32"});
  }
  SECTION("BatchNorm's int64 counter must stay int64") {
    nn::BatchNorm2d bn(2);
    auto s = clone_state(bn.state_dict());
    s[4].second = Tensor::zeros({});
    expect_state_error(bn, s, {"num_batches_tracked"});
    s[4].second = Tensor::zeros({1}, DType::Int64);
    expect_state_error(bn, s, {"num_batches_tracked"});
  }
}

// A LeNet state dict in bfloat16, as safetensors.torch.save_file writes it
// (tests/golden/make_lenet_bf16_golden.py): each tensor goes into the
// float32 model widened exactly, as PyTorch's load_state_dict copies it;
// bfloat16 into an int64 tensor, or float32 into a bfloat16 one, is still
// refused.
TEST_CASE("load_state_dict widens PyTorch's bfloat16 tensors exactly into float32 weights",
          "[nn][safetensors][bf16]") {
  const std::string path = ANVIL_TEST_DATA_DIR "/golden/lenet_bf16.safetensors";
  const nn::NamedTensors file = nn::load_safetensors(path);
  REQUIRE(file.size() == 8);
  for (auto& [name, t] : file) CHECK(t.dtype() == DType::BFloat16);
  auto model = models::lenet();
  CHECK(nn::load_state_dict(*model, file, path) == 8);
  std::map<std::string, Tensor> by_name(file.begin(), file.end());
  for (auto& [name, w] : model->state_dict()) {
    INFO(name);
    REQUIRE(w.dtype() == DType::Float32);
    const Tensor& src = by_name.at(name);
    const auto* half = static_cast<const uint16_t*>(src.raw_data());
    const auto* full = static_cast<const uint32_t*>(w.raw_data());
    int64_t differ = 0;
    for (int64_t i = 0; i < w.numel(); ++i) differ += full[i] != uint32_t(half[i]) << 16;
    CHECK(differ == 0);  // the float32 value is the bfloat16 one, bit for bit
  }
  // A float32 state still loads as it is, widening nothing.
  auto other = models::lenet();
  CHECK(nn::load_state_dict(*other, model->state_dict(), "model") == 0);
  nn::BatchNorm2d bn(2);
  auto s = clone_state(bn.state_dict());
  s[4].second = Tensor::zeros({}, DType::Float32).to(DType::BFloat16);
  expect_state_error(bn, s, {"num_batches_tracked", "bfloat16", "int64"});
}

TEST_CASE("A checkpoint restores a model through save and load", "[nn][safetensors]") {
  TempDir dir;
  Generator gen(101);
  nn::Sequential model;
  model.add(std::make_shared<nn::Conv2d>(1, 3, 3, 1, 1))
      .add(std::make_shared<nn::BatchNorm2d>(3))
      .add(std::make_shared<nn::ReLU>())
      .add(std::make_shared<nn::AdaptiveAvgPool2d>(1))
      .add(std::make_shared<nn::Flatten>())
      .add(std::make_shared<nn::Linear>(3, 2));
  Tensor x = Tensor::randn({4, 1, 5, 5}, &gen);
  model(x);
  model(x);  // running statistics and the counter move
  model.eval();
  std::vector<float> want = model(x).to_vector();
  nn::save_safetensors(dir.file("m.st"), model.state_dict());

  nn::Sequential fresh;
  fresh.add(std::make_shared<nn::Conv2d>(1, 3, 3, 1, 1))
      .add(std::make_shared<nn::BatchNorm2d>(3))
      .add(std::make_shared<nn::ReLU>())
      .add(std::make_shared<nn::AdaptiveAvgPool2d>(1))
      .add(std::make_shared<nn::Flatten>())
      .add(std::make_shared<nn::Linear>(3, 2));
  nn::load_state_dict(fresh, nn::load_safetensors(dir.file("m.st")), dir.file("m.st"));
  fresh.eval();
  CHECK(fresh(x).to_vector() == want);
  auto& bn = dynamic_cast<nn::BatchNorm2d&>(fresh[1]);
  CHECK(bn.num_batches_tracked.to_int_vector() == std::vector<int64_t>{2});
}

// ---------------------------------------------------------------- PyTorch interop

namespace {

bool torch_available() {
  if (::access("/usr/bin/python3", X_OK) != 0) return false;
  int rc = std::system("/usr/bin/python3 -c 'import torch' >/dev/null 2>&1");
  return rc != -1 && WIFEXITED(rc) && WEXITSTATUS(rc) == 0;
}

void write_floats(const std::string& path, const std::vector<float>& v) {
  write_bytes(path, std::string(reinterpret_cast<const char*>(v.data()), v.size() * 4));
}

std::vector<float> read_floats(const std::string& path) {
  std::string b = read_bytes(path);
  std::vector<float> v(b.size() / 4);
  std::memcpy(v.data(), b.data(), v.size() * 4);
  return v;
}

// Parses a safetensors file with nothing but the standard library and torch
// (no safetensors package), loads it strictly into PyTorch's own LeNet and
// BatchNorm2d, and writes their outputs on the inputs we give.
const char* kInteropScript = R"PY(
import json, struct, sys
import torch
from torch import nn

def load(path):
    with open(path, 'rb') as f:
        blob = f.read()
    (n,) = struct.unpack('<Q', blob[:8])
    header = json.loads(blob[8:8 + n])
    data = bytearray(blob[8 + n:])
    types = {'F32': torch.float32, 'I64': torch.int64, 'U8': torch.uint8}
    out = {}
    for name, e in header.items():
        if name == '__metadata__':
            continue
        a, b = e['data_offsets']
        t = torch.frombuffer(data[a:b], dtype=types[e['dtype']]) if b > a else \
            torch.empty(0, dtype=types[e['dtype']])
        out[name] = t.reshape(e['shape']).clone()
    return out

def save(path, t):  # raw little-endian float32, without needing numpy
    v = t.detach().flatten().tolist()
    with open(path, 'wb') as f:
        f.write(struct.pack('<%df' % len(v), *v))

d = sys.argv[1]
torch.set_num_threads(1)
net = nn.Sequential(nn.Conv2d(1, 20, 3), nn.ReLU(), nn.AvgPool2d(2, 2),
                    nn.Conv2d(20, 50, 5), nn.ReLU(), nn.AvgPool2d(2, 2), nn.Flatten(),
                    nn.Linear(800, 128), nn.ReLU(), nn.Linear(128, 10))
sd = load(d + '/lenet.safetensors')
assert list(sd.keys()) == list(net.state_dict().keys()), list(sd.keys())
net.load_state_dict(sd, strict=True)
x = torch.frombuffer(bytearray(open(d + '/x.bin', 'rb').read()), dtype=torch.float32)
with torch.no_grad():
    y = net(x.reshape(3, 1, 28, 28))
save(d + '/torch_y.bin', y)

bn = nn.BatchNorm2d(3)
bsd = load(d + '/bn.safetensors')
assert bsd['num_batches_tracked'].dtype == torch.int64
assert bsd['num_batches_tracked'].shape == torch.Size([])
bn.load_state_dict(bsd, strict=True)
bn.eval()
bx = torch.frombuffer(bytearray(open(d + '/bx.bin', 'rb').read()), dtype=torch.float32)
with torch.no_grad():
    by = bn(bx.reshape(2, 3, 4, 4))
save(d + '/torch_by.bin', by)
print('nbt', int(bsd['num_batches_tracked']))
)PY";

}  // namespace

TEST_CASE("PyTorch loads our safetensors into its own modules with the same outputs",
          "[nn][safetensors][interop]") {
  if (!torch_available()) {
    WARN("skipped: /usr/bin/python3 with torch is not available");
    return;
  }
  TempDir dir;
  Generator gen(111);
  auto net = models::lenet(models::Init::Default, &gen);
  Tensor x = Tensor::randn({3, 1, 28, 28}, &gen);
  std::vector<float> y = (*net)(x).to_vector();
  nn::save_safetensors(dir.file("lenet.safetensors"), net->state_dict());
  write_floats(dir.file("x.bin"), x.to_vector());

  nn::BatchNorm2d bn(3);
  assign(bn.weight, {0.5f, 2.0f, -1.0f});
  assign(bn.bias, {0.1f, -0.2f, 0.3f});
  Tensor bx = Tensor::randn({2, 3, 4, 4}, &gen);
  bn(bx);
  bn(scale(bx, 3.0));
  bn.eval();
  std::vector<float> by = bn(bx).to_vector();
  nn::save_safetensors(dir.file("bn.safetensors"), bn.state_dict());
  write_floats(dir.file("bx.bin"), bx.to_vector());

  write_bytes(dir.file("interop.py"), kInteropScript);
  std::string cmd = "/usr/bin/python3 '" + dir.file("interop.py") + "' '" + dir.path.string() +
                    "' > '" + dir.file("log.txt") + "' 2>&1";
  int rc = std::system(cmd.c_str());
  std::string log = read_bytes(dir.file("log.txt"));
  INFO("python output:\n" << log);
  REQUIRE(WIFEXITED(rc));
  REQUIRE(WEXITSTATUS(rc) == 0);
  CHECK_THAT(log, Contains("nbt 2"));

  auto ty = read_floats(dir.file("torch_y.bin"));
  REQUIRE(ty.size() == y.size());
  for (size_t i = 0; i < y.size(); ++i) CHECK(ty[i] == Approx(y[i]).margin(1e-4));
  auto tby = read_floats(dir.file("torch_by.bin"));
  REQUIRE(tby.size() == by.size());
  for (size_t i = 0; i < by.size(); ++i) CHECK(tby[i] == Approx(by[i]).margin(1e-4));
}
