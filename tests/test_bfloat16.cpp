// DType::BFloat16: the float32 <-> bfloat16 conversions checked against a
// reference written from the definition (double arithmetic, not the bit
// trick of core/bfloat16.h) over every bfloat16 pattern and a large sample of
// float32 patterns; Tensor::to both ways on the CPU and on a CUDA device;
// printing as PyTorch prints; random init; the op layer's refusal; and
// safetensors BF16 files, read from PyTorch and written for it
// (tests/test_bf16_interop.py reads the one written here).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <sstream>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/bfloat16.h"
#include "core/ops.h"
#include "core/random.h"
#include "core/tensor.h"
#include "nn/init.h"
#include "nn/safetensors.h"
#include "tests/cuda_test_util.h"
#include "tests/test_util.h"

using namespace anvil;
using Catch::Contains;

namespace {

float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint32_t to_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// The value of bfloat16 bits from the format's definition: sign, 8 exponent
// bits (bias 127), 7 mantissa bits; exponent 0 holds the denormals M * 2^-133.
double bf16_value(uint16_t b) {
  const double sign = (b & 0x8000) ? -1.0 : 1.0;
  const int E = (b >> 7) & 0xff, M = b & 0x7f;
  if (E == 0xff) return M ? std::numeric_limits<double>::quiet_NaN() : sign * INFINITY;
  if (E == 0) return sign * std::ldexp(double(M), -133);
  return sign * std::ldexp(double(128 + M), E - 134);
}

// The bfloat16 value nearest to x (not NaN), ties to the even mantissa, in
// double: +-Inf and +-0 are themselves; within the binade [2^e, 2^(e+1)) bfloat16 values are the multiples
// of 2^(e-7); below 2^-126 those of 2^-133. Every step is exact in double.
// Values from the halfway point past the largest bfloat16 upward give Inf.
double reference_round(float xf) {
  const double x = xf, a = std::fabs(x);
  if (a == 0 || std::isinf(a)) return x;
  const int e = std::max(std::ilogb(a), -126);
  const double q = std::ldexp(1.0, e - 7);
  double k = std::floor(a / q);
  const double rest = a - k * q;
  if (rest > q / 2 || (rest == q / 2 && std::fmod(k, 2.0) == 1.0)) k += 1;
  double r = k * q;
  if (r >= std::ldexp(1.0, 128)) r = INFINITY;
  return std::copysign(r, x);
}

bool is_nan_bits(uint16_t b) { return (b & 0x7f80) == 0x7f80 && (b & 0x7f) != 0; }

// One float32 pattern through float_to_bf16_bits, against the reference:
// "" when right, else what went wrong. (One Catch2 assertion per pattern
// would cost more than the conversions, under the sanitizers above all.)
std::string rounding_error(uint32_t u) {
  const float x = from_bits(u);
  const uint16_t got = float_to_bf16_bits(x);
  bool ok;
  if (std::isnan(x)) {
    // A quiet NaN of the same sign (never Inf, whatever the payload).
    ok = is_nan_bits(got) && (got & 0x0040) != 0 && (got >> 15) == (u >> 31);
  } else {
    const double want = reference_round(x), have = bf16_value(got);
    ok = have == want && std::signbit(have) == std::signbit(want);
  }
  if (ok) return "";
  std::ostringstream os;
  os << "float32 0x" << std::hex << u << " (" << x << ") -> bfloat16 0x" << got << " ("
     << bf16_value(got) << "), reference " << reference_round(x);
  return os.str();
}

void check_rounding(uint32_t u) {
  if (std::string e = rounding_error(u); !e.empty()) FAIL(e);
}

std::vector<uint16_t> bits_of(const Tensor& t) {
  const bfloat16* p = t.to(Device::cpu()).data<bfloat16>();
  std::vector<uint16_t> out(size_t(t.numel()));
  for (size_t i = 0; i < out.size(); ++i) out[i] = p[i].bits;
  return out;
}

Tensor bf16_from_bits(const std::vector<uint16_t>& bits, const Shape& shape) {
  return Tensor::from_host(bits.data(), shape, DType::BFloat16);
}

// Special values and ties, as float32 bit patterns.
const std::vector<uint32_t> kSpecials = {
    0x00000000, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00001, 0x7F800001,
    0x7F7FFFFF, 0x7F7F7FFF, 0x7F7F8000, 0x3F808000, 0x3F818000, 0x3F808001, 0x3F80FFFF,
    0x00000001, 0x00008000, 0x00018000, 0x00008001, 0x007FFFFF, 0x80018000, 0x3EAAAAAB};

void require_invalid(const std::function<void()>& f, const std::vector<std::string>& parts) {
  try {
    f();
    FAIL("no exception");
  } catch (const std::invalid_argument& e) {
    for (const std::string& p : parts) CHECK_THAT(e.what(), Contains(p));
  }
}

}  // namespace

TEST_CASE("bfloat16: every pattern has its defined value and converts back unchanged",
          "[bf16]") {
  int nans = 0;
  for (uint32_t b = 0; b < 0x10000; ++b) {
    const uint16_t bits = uint16_t(b);
    const float f = bf16_bits_to_float(bits);
    bool ok;
    if (is_nan_bits(bits)) {
      // NaNs come back quiet, with their sign and payload otherwise kept.
      ok = std::isnan(f) && float_to_bf16_bits(f) == uint16_t(bits | 0x0040);
      ++nans;
    } else {
      ok = double(f) == bf16_value(bits) && float_to_bf16_bits(f) == bits;
    }
    if (!ok)
      FAIL("bfloat16 0x" << std::hex << b << " -> float32 0x" << to_bits(f) << " -> bfloat16 0x"
                         << float_to_bf16_bits(f));
  }
  CHECK(nans == 2 * 127);
}

TEST_CASE("bfloat16: float32 rounds to nearest even, against a reference from the definition",
          "[bf16]") {
  SECTION("special values, ties, denormals, overflow") {
    for (uint32_t u : kSpecials) check_rounding(u);
    CHECK(float_to_bf16_bits(from_bits(0x3F808000)) == 0x3F80);  // tie, even below
    CHECK(float_to_bf16_bits(from_bits(0x3F818000)) == 0x3F82);  // tie, even above
    CHECK(float_to_bf16_bits(from_bits(0x3F808001)) == 0x3F81);  // just past the tie
    CHECK(float_to_bf16_bits(from_bits(0x7F7F7FFF)) == 0x7F7F);  // the largest bfloat16
    CHECK(float_to_bf16_bits(from_bits(0x7F7F8000)) == 0x7F80);  // its tie overflows to Inf
    CHECK(float_to_bf16_bits(std::numeric_limits<float>::max()) == 0x7F80);
    CHECK(float_to_bf16_bits(-std::numeric_limits<float>::max()) == 0xFF80);
    CHECK(float_to_bf16_bits(INFINITY) == 0x7F80);
    CHECK(float_to_bf16_bits(-INFINITY) == 0xFF80);
    CHECK(float_to_bf16_bits(from_bits(0x7F800001)) == 0x7FC0);  // signalling NaN: quiet, not Inf
    CHECK(float_to_bf16_bits(from_bits(0xFFC00000)) == 0xFFC0);
    CHECK(float_to_bf16_bits(from_bits(0x00000001)) == 0x0000);  // smallest denormal -> 0
    CHECK(float_to_bf16_bits(from_bits(0x00018000)) == 0x0002);  // denormal tie, to even
    CHECK(float_to_bf16_bits(from_bits(0x007FFFFF)) == 0x0080);  // up to the smallest normal
    CHECK(float_to_bf16_bits(-0.0f) == 0x8000);
  }
  SECTION("near-tie patterns in every binade, both signs") {
    const uint32_t lows[] = {0x0000, 0x0001, 0x7FFF, 0x8000, 0x8001, 0xFFFF};
    for (uint32_t sign_exp = 0; sign_exp < 512; ++sign_exp)
      for (uint32_t mid : {0x00u, 0x01u, 0x2Au, 0x7Eu, 0x7Fu})
        for (uint32_t low : lows) check_rounding((sign_exp << 23) | (mid << 16) | low);
  }
  SECTION("a random sample of float32 patterns") {
    std::mt19937 gen(321);
    int failures = 0;
    std::string first;
    for (int i = 0; i < (1 << 18); ++i) {
      std::string e = rounding_error(uint32_t(gen()));
      if (!e.empty() && failures++ == 0) first = e;
    }
    INFO("first failure: " << first);
    CHECK(failures == 0);
  }
}

TEST_CASE("Tensor::to converts between float32 and bfloat16 on the CPU", "[bf16][tensor]") {
  std::vector<float> values;
  for (uint32_t u : kSpecials) values.push_back(from_bits(u));
  Tensor x = Tensor::from_vector(values, {int64_t(values.size())});
  Tensor b = x.to(DType::BFloat16);
  CHECK(b.dtype() == DType::BFloat16);
  CHECK(b.nbytes() == 2 * values.size());
  CHECK(b.shape() == x.shape());
  const std::vector<uint16_t> bits = bits_of(b);
  for (size_t i = 0; i < values.size(); ++i) CHECK(bits[i] == float_to_bf16_bits(values[i]));
  CHECK(bits[10] == 0x3F80);  // 1 + 2^-8 ties down to 1
  CHECK(bits[11] == 0x3F82);

  // Back to float32: exact, NaN kept.
  std::vector<float> back = b.to(DType::Float32).to_vector();
  for (size_t i = 0; i < values.size(); ++i) {
    if (std::isnan(values[i]))
      CHECK(std::isnan(back[i]));
    else
      CHECK(double(back[i]) == reference_round(values[i]));
  }
  const std::vector<float> direct = b.to_vector();  // converts too
  for (size_t i = 0; i < values.size(); ++i) CHECK(to_bits(direct[i]) == to_bits(back[i]));
  CHECK(b.to(DType::BFloat16).same(b));

  SECTION("integer dtypes, rounded once") {
    Tensor i = Tensor::from_vector(std::vector<int64_t>{257, 259, -3, (int64_t(1) << 40) + 1, 0},
                                   {5});
    CHECK(i.to(DType::BFloat16).to_vector() ==
          std::vector<float>{256.f, 260.f, -3.f, 1099511627776.f, 0.f});
    Tensor h = Tensor::from_vector(std::vector<float>{2.75f, -2.75f, 200.f}, {3}).to(DType::BFloat16);
    CHECK(h.to(DType::Int64).to_int_vector() == std::vector<int64_t>{2, -2, 200});
    Tensor u = Tensor::from_vector(std::vector<float>{2.75f, 255.f}, {2}).to(DType::BFloat16).to(DType::UInt8);
    CHECK(u.to_int_vector() == std::vector<int64_t>{2, 255});
  }
  SECTION("creation, views and copies keep two bytes an element") {
    CHECK(bits_of(Tensor::full({3}, 1.00390625, DType::BFloat16)) ==
          std::vector<uint16_t>{0x3F80, 0x3F80, 0x3F80});
    CHECK(bits_of(Tensor::ones({2}, DType::BFloat16)) == std::vector<uint16_t>{0x3F80, 0x3F80});
    CHECK(bits_of(Tensor::zeros({1}, DType::BFloat16)) == std::vector<uint16_t>{0});
    CHECK(Tensor::arange(4, DType::BFloat16).to_vector() == std::vector<float>{0, 1, 2, 3});
    CHECK(Tensor::arange(300, DType::BFloat16).to_vector()[257] == 256.f);
    Tensor m = bf16_from_bits({1, 2, 3, 4, 5, 6}, {3, 2});
    CHECK(bits_of(m.narrow(1, 2)) == std::vector<uint16_t>{3, 4, 5, 6});
    CHECK(bits_of(m.clone().reshape({6})) == std::vector<uint16_t>{1, 2, 3, 4, 5, 6});
    CHECK(Tensor::full({}, -1.5, DType::BFloat16).item() == -1.5);
  }
}

TEST_CASE("Tensor::to converts between float32 and bfloat16 on a CUDA device",
          "[bf16][tensor][cuda]") {
  if (!cuda_test::have_device("bfloat16 conversion")) return;
  const Device dev = Device::cuda(0);
  std::vector<float> values;
  for (uint32_t u : kSpecials) values.push_back(from_bits(u));
  std::mt19937 gen(7);
  for (int i = 0; i < 4000; ++i) values.push_back(from_bits(uint32_t(gen())));
  const int64_t n = int64_t(values.size());
  Tensor x = Tensor::from_vector(values, {n});
  Tensor on_device = x.to(dev).to(DType::BFloat16);
  CHECK(on_device.device() == dev);
  CHECK(bits_of(on_device) == bits_of(x.to(DType::BFloat16)));
  std::vector<float> back = on_device.to(DType::Float32).to(Device::cpu()).to_vector();
  std::vector<float> want = x.to(DType::BFloat16).to(DType::Float32).to_vector();
  for (int64_t i = 0; i < n; ++i)
    CHECK(to_bits(back[size_t(i)]) == to_bits(want[size_t(i)]));
  CHECK(bits_of(Tensor::full({5}, -2.0, DType::BFloat16, dev)) ==
        std::vector<uint16_t>(5, 0xC000));
  // Integer dtypes convert on the host and come back to the device.
  Tensor i = Tensor::from_vector(std::vector<int64_t>{257, -259}, {2}, dev).to(DType::BFloat16);
  CHECK(i.device() == dev);
  CHECK(i.to_vector() == std::vector<float>{256.f, -260.f});
}

TEST_CASE("bfloat16 tensors print as PyTorch prints them", "[bf16][print]") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  CHECK(Tensor::from_vector(std::vector<float>{1.0f, 2.5f, -0.333f, nan}, {4}).to(DType::BFloat16).repr() ==
        "tensor([ 1.0000,  2.5000, -0.3320,     nan], dtype=torch.bfloat16)");
  CHECK(Tensor::from_vector(std::vector<float>{1.f, 2.f, 3.f, 4.f}, {2, 2}).to(DType::BFloat16).repr() ==
        "tensor([[1., 2.],\n        [3., 4.]], dtype=torch.bfloat16)");
  CHECK(Tensor::from_vector(std::vector<float>{1e10f, 1e-10f, 3.f}, {3}).to(DType::BFloat16).repr() ==
        "tensor([9.9992e+09, 1.0004e-10, 3.0000e+00], dtype=torch.bfloat16)");
  CHECK(Tensor::empty({0}, DType::BFloat16).repr() == "tensor([], dtype=torch.bfloat16)");
}

TEST_CASE("ops take bfloat16 where autocast keeps it, and refuse it for parameters and "
          "integers, naming the op",
          "[bf16][errors]") {
  Tensor b = Tensor::ones({2, 2}, DType::BFloat16);
  Tensor f = Tensor::ones({2, 2});
  CHECK(relu(b).dtype() == DType::BFloat16);
  CHECK(add(f, b).dtype() == DType::Float32);  // promoted, as in PyTorch
  CHECK(sum(b).dtype() == DType::Float32);     // reductions compute in float32
  require_invalid([&] { linear(f, f, Tensor::ones({2}, DType::BFloat16)); },
                  {"linear: bias must be float32, got bfloat16"});
  Tensor img = Tensor::ones({1, 1, 4, 4}, DType::BFloat16);
  require_invalid([&] { batch_norm(img, Tensor::ones({1}, DType::BFloat16), Tensor::zeros({1}),
                                   Tensor(), Tensor(), true); },
                  {"batch_norm: weight must be float32, got bfloat16"});
  require_invalid([&] { relu(Tensor::ones({2}, DType::Int64)); },
                  {"relu: x must be float32 or bfloat16, got int64"});
  require_invalid([&] { Tensor::ones({2}, DType::Int64).set_requires_grad(); },
                  {"set_requires_grad", "int64"});
}

TEST_CASE("random init fills bfloat16 tensors with rounded draws", "[bf16][init]") {
  Generator g1(5), g2(5);
  Tensor b = Tensor::empty({1000}, DType::BFloat16);
  Tensor f = Tensor::empty({1000});
  nn::init::normal_(b, 0.0, 1.0, &g1);
  nn::init::normal_(f, 0.0, 1.0, &g2);
  CHECK(bits_of(b) == bits_of(f.to(DType::BFloat16)));
  nn::init::uniform_(b, 2.0, 3.0, &g1);
  for (float v : b.to_vector()) CHECK((v >= 2.0f && v <= 3.0f));
  Tensor i = Tensor::empty({3}, DType::Int64);
  require_invalid([&] { nn::init::normal_(i, 0.0, 1.0); }, {"normal_", "int64"});
}

// ---------------------------------------------------------------- safetensors

// With ANVIL_BF16_EXPORT set, the file is written there and kept:
// tests/test_bf16_interop.py reads it with PyTorch and the safetensors package.
TEST_CASE("safetensors writes BF16 tensors that read back bit for bit", "[bf16][safetensors]") {
  testing::TempDir dir("bf16");
  const char* exported = std::getenv("ANVIL_BF16_EXPORT");
  const std::string path = exported && *exported ? exported : dir.file("bf16.safetensors");

  std::vector<uint16_t> all(0x10000);
  for (uint32_t b = 0; b < 0x10000; ++b) all[b] = uint16_t(b);
  std::vector<float> source;
  for (uint32_t u : kSpecials) source.push_back(from_bits(u));
  std::mt19937 gen(99);
  for (int i = 0; i < 2000; ++i) source.push_back(from_bits(uint32_t(gen())));
  Tensor src = Tensor::from_vector(source, {int64_t(source.size())});
  nn::NamedTensors tensors = {{"patterns", bf16_from_bits(all, {256, 256})},
                              {"source", src},
                              {"rounded", src.to(DType::BFloat16)},
                              {"arange", Tensor::arange(300, DType::BFloat16)},
                              {"scalar", Tensor::full({}, -0.333, DType::BFloat16)}};
  nn::save_safetensors(path, tensors);

  const std::string bytes = testing::read_file(path);
  CHECK_THAT(bytes, Contains(R"("patterns":{"dtype":"BF16","shape":[256,256])"));
  const nn::NamedTensors loaded = nn::load_safetensors(path);
  REQUIRE(loaded.size() == tensors.size());
  for (size_t i = 0; i < loaded.size(); ++i) {
    INFO(loaded[i].first);
    CHECK(loaded[i].first == tensors[i].first);
    CHECK(loaded[i].second.dtype() == tensors[i].second.dtype());
    CHECK(loaded[i].second.shape() == tensors[i].second.shape());
  }
  CHECK(bits_of(loaded[0].second) == all);
  CHECK(bits_of(loaded[2].second) == bits_of(tensors[2].second));
  CHECK(bits_of(loaded[4].second) == std::vector<uint16_t>{0xBEAA});
}

TEST_CASE("safetensors reads BF16 written by PyTorch", "[bf16][safetensors][golden]") {
  // tests/golden/make_bf16_golden.py wrote it with safetensors.torch.save_file.
  const nn::NamedTensors t =
      nn::load_safetensors(ANVIL_TEST_DATA_DIR "/golden/bf16_torch.safetensors");
  REQUIRE(t.size() == 3);
  std::map<std::string, Tensor> by_name(t.begin(), t.end());
  const Tensor& patterns = by_name.at("patterns");
  REQUIRE(patterns.dtype() == DType::BFloat16);
  REQUIRE(patterns.shape() == Shape{16, 16});
  const std::vector<uint16_t> bits = bits_of(patterns);
  for (uint32_t i = 0; i < 256; ++i) CHECK(bits[i] == uint16_t(i * 257));

  // PyTorch's rounding of each float32 equals anvil's (NaNs: both NaN).
  const Tensor& source = by_name.at("source");
  const Tensor& rounded = by_name.at("rounded");
  REQUIRE(source.dtype() == DType::Float32);
  REQUIRE(rounded.dtype() == DType::BFloat16);
  REQUIRE(rounded.shape() == source.shape());
  const std::vector<uint16_t> torch_bits = bits_of(rounded);
  const std::vector<uint16_t> ours = bits_of(source.to(DType::BFloat16));
  const std::vector<float> src = source.to_vector();
  for (size_t i = 0; i < src.size(); ++i) {
    INFO("element " << i << ": float32 0x" << std::hex << to_bits(src[i]));
    if (std::isnan(src[i]))
      CHECK((is_nan_bits(torch_bits[i]) && is_nan_bits(ours[i])));
    else
      CHECK(ours[i] == torch_bits[i]);
  }
}
