// ResNet-18 (models::resnet18, models::resnet18_96) and its block
// (nn::Residual) against PyTorch. tests/golden/resnet_golden.json, written by
// tests/golden/make_resnet_golden.py from the seed documents' PyTorch code,
// holds the state-dict listings PyTorch's load_state_dict(strict=True)
// demands, Residual outputs and gradients, and two SGD steps of a narrow
// ResNet-18. Weights and inputs are not stored: both sides fill them from the
// same integer hash (fill_deterministic below), so only results are in the file.
// Also: finite-difference checks of BatchNorm2d and Residual in train mode,
// the init schemes, models::create, and (CUDA builds) cuda:0 against the CPU.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/precision.h"
#include "core/autograd.h"
#include "core/ops.h"
#include "core/random.h"
#include "core/tensor.h"
#include "nn/layers.h"
#include "nn/models.h"
#include "nn/module.h"
#include "nn/optim.h"
#include "nn/safetensors.h"
#include "tests/golden_util.h"
#include "tests/gradcheck.h"
#include "tests/nn_test_util.h"
#if defined(ANVIL_CUDA_BACKEND)
#include "tests/cuda_test_util.h"
#include "tests/sync_launches.h"
#endif

#ifndef ANVIL_TEST_DATA_DIR
#error "ANVIL_TEST_DATA_DIR must name the tests/ directory"
#endif

using namespace anvil;
using json = nlohmann::json;
using Catch::Contains;

namespace {

const json& golden() { return anvil::testing::golden_file("resnet_golden.json"); }

// ---- deterministic values, identical to make_resnet_golden.py's

uint32_t hash32(uint32_t i, uint32_t salt) {
  uint32_t x = i + salt * 0x9E3779B9u;  // wraps mod 2^32, as Python's & 0xFFFFFFFF
  x ^= x >> 16;
  x *= 0x7FEB352Du;
  x ^= x >> 15;
  x *= 0x846CA68Bu;
  x ^= x >> 16;
  return x;
}

// The same double operations in the same order as Python, then rounding to
// float32, so both sides hold bit-identical tensors.
std::vector<float> det_values(int64_t n, uint32_t salt, double lo, double hi) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    v[size_t(i)] = float(lo + (hi - lo) * (double(hash32(uint32_t(i), salt)) / 4294967296.0));
  return v;
}

Tensor det_tensor(const Shape& shape, uint32_t salt, double lo, double hi) {
  return Tensor::from_vector(det_values(shape_numel(shape), salt, lo, hi), shape);
}

std::optional<std::pair<double, double>> value_range(const std::string& name, const Tensor& t) {
  if (name.ends_with("num_batches_tracked")) return std::nullopt;
  if (name.ends_with("running_mean")) return std::pair{-0.5, 0.5};
  if (name.ends_with("running_var")) return std::pair{0.5, 2.0};
  if (name.ends_with("weight") && t.dim() == 1) return std::pair{0.5, 1.5};  // BatchNorm scale
  if (name.ends_with("bias")) return std::pair{-0.5, 0.5};
  const double bound = std::sqrt(3.0 / double(t.numel() / t.size(0)));
  return std::pair{-bound, bound};
}

// Overwrites every float tensor of the state dict, entry k with salt base + k.
void fill_deterministic(const nn::Module& model, uint32_t salt_base) {
  auto sd = model.state_dict();
  for (size_t k = 0; k < sd.size(); ++k) {
    auto& [name, t] = sd[k];
    if (auto r = value_range(name, t))
      testing::assign(t, det_values(t.numel(), salt_base + uint32_t(k), r->first, r->second));
  }
}

// ---- golden comparisons

Shape shape_of(const json& t) { return t.at("shape").get<Shape>(); }

// Elementwise |got - want| <= atol + rtol |want|; reports the first offender
// and the largest error.
void expect_close(const Tensor& got, const json& want, double atol, double rtol,
                  const std::string& what) {
  INFO(what);
  REQUIRE(got.defined());
  REQUIRE(shape_str(got.shape()) == shape_str(shape_of(want)));
  if (got.dtype() == DType::Int64) {
    CHECK(got.to_int_vector() == want.at("data").get<std::vector<int64_t>>());
    return;
  }
  std::vector<float> g = got.to_vector();
  std::vector<double> w = want.at("data").get<std::vector<double>>();
  REQUIRE(g.size() == w.size());
  int64_t first_bad = -1;
  double worst = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    double err = std::fabs(double(g[i]) - w[i]);
    if (!(err <= atol + rtol * std::fabs(w[i])) && first_bad < 0) first_bad = int64_t(i);
    if (!(err <= worst)) worst = err;
  }
  std::ostringstream os;
  os.precision(9);
  if (first_bad >= 0)
    os << "first mismatch at flat index " << first_bad << ": got " << g[size_t(first_bad)]
       << ", want " << w[size_t(first_bad)] << "; ";
  os << "largest error " << worst;
  INFO(os.str());
  CHECK(first_bad == -1);
}

// The state dict as [name, shape, dtype] rows, the golden file's listing format.
json listing(const nn::Module& m) {
  json rows = json::array();
  for (auto& [name, t] : m.state_dict())
    rows.push_back({name, t.shape(), t.dtype() == DType::Int64 ? "I64" : "F32"});
  return rows;
}

void expect_listing(const nn::Module& m, const json& want) {
  json got = listing(m);
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    INFO("state_dict entry " << i);
    CHECK(got[i].dump() == want[i].dump());
  }
}

}  // namespace

// ---------------------------------------------------------------- structure

TEST_CASE("resnet18 and resnet18_96 state dicts equal PyTorch's, names, shapes and order",
          "[nn][resnet]") {
  const json& g = golden();
  for (const char* model : {"resnet18", "resnet18-96"}) {
    DYNAMIC_SECTION(model) {
      Generator gen(1);
      auto net = models::create(model, models::Init::Seed, &gen);
      const json& want = g.at("state_dicts").at(model);
      expect_listing(*net, want);
      CHECK(net->num_parameters() == g.at("num_parameters").at(model).get<int64_t>());
      CHECK(net->repr() == g.at("reprs").at(model).get<std::string>());
      auto sd = net->state_dict();
      // The checkpoint's first and last tensors, as docs/checkpoints.md lists them.
      CHECK(sd.front().first == "0.weight");
      CHECK(sd[7].first == "resnet_block1.0.conv1.weight");
      CHECK(sd.back().first == "fc.1.bias");
      for (auto& [name, t] : net->named_parameters()) {
        INFO(name);
        CHECK(t.requires_grad());
        CHECK(t.is_leaf());
      }
      for (auto& [name, t] : net->named_buffers()) CHECK_FALSE(t.requires_grad());
      // 20 convs (stem, 2 per Residual, 3 shortcuts) and the linear: weight and
      // bias each; 17 BatchNorms (stem, 2 per Residual): weight and bias, and
      // 3 buffers each.
      CHECK(net->named_parameters().size() == 2 * 21 + 2 * 17);
      CHECK(net->named_buffers().size() == 3 * 17);
      CHECK(sd.size() == 127);
    }
  }
  SECTION("the variants differ only in the stem conv's kernel") {
    auto a = g.at("state_dicts").at("resnet18"), b = g.at("state_dicts").at("resnet18-96");
    REQUIRE(a.size() == b.size());
    for (size_t i = 0; i < a.size(); ++i) {
      CHECK(a[i][0] == b[i][0]);
      if (i != 0) CHECK(a[i][1] == b[i][1]);
    }
    CHECK(a[0][1] == json({64, 1, 3, 3}));
    CHECK(b[0][1] == json({64, 1, 7, 7}));
    // So the counts differ by the stem's 64 x (49 - 9) extra weights.
    CHECK(g.at("num_parameters").at("resnet18") == 11'175'818);
    CHECK(g.at("num_parameters").at("resnet18-96") == 11'175'818 + 64 * 40);
  }
}

// Stage widths times w (bench_model_parallel --width-multiplier, and
// tools/predict/memory_model.py's widths): the parameter count is PyTorch's
// for the same modules, layer by layer (convs with bias, BatchNorm's weight
// and bias, blocks 2-4's 1x1 shortcuts, fc), the formula of
// tools/predict/step_model.py's resnet18_params.
TEST_CASE("ResNet-18's parameter count at stage widths times w is PyTorch's per-layer count",
          "[nn][resnet]") {
  auto count = [](const std::array<int64_t, 4>& c) {
    int64_t n = 9 * c[0] + c[0] + 2 * c[0];  // the stem: conv 1 -> c0, BatchNorm
    int64_t in = c[0];
    for (size_t b = 0; b < 4; ++b)
      for (int i = 0; i < 2; ++i) {
        const int64_t from = i == 0 ? in : c[b], to = c[b];
        n += 9 * from * to + to + 9 * to * to + to + 4 * to;  // conv1, conv2, bn1, bn2
        if (b > 0 && i == 0) n += from * to + to;              // conv3, the 1x1 shortcut
        in = to;
      }
    return n + c[3] * 10 + 10;  // fc
  };
  REQUIRE(count({64, 128, 256, 512}) == 11'175'818);  // PyTorch's (tests/golden)
  for (int64_t w : {1, 2, 3}) {
    const std::array<int64_t, 4> c = {4 * w, 8 * w, 8 * w, 16 * w};
    CHECK(models::resnet18({.widths = c}, models::Init::Default)->num_parameters() == count(c));
  }
}

TEST_CASE("ResNetConfig sets widths, input channels and classes", "[nn][resnet]") {
  models::ResNetConfig cfg{.widths = {4, 8, 8, 16}, .in_channels = 3, .num_classes = 5};
  auto net = models::resnet18(cfg, models::Init::Default);
  auto sd = net->state_dict();
  CHECK(sd.front().second.shape() == Shape{4, 3, 3, 3});
  auto find = [&](const std::string& key) {
    for (auto& [name, t] : sd)
      if (name == key) return t.shape();
    FAIL("no tensor " << key);
    return Shape{};
  };
  CHECK(find("resnet_block1.0.conv1.weight") == Shape{4, 4, 3, 3});
  CHECK(find("resnet_block2.0.conv3.weight") == Shape{8, 4, 1, 1});
  CHECK(find("resnet_block3.0.conv1.weight") == Shape{8, 8, 3, 3});
  CHECK(find("resnet_block4.1.conv2.weight") == Shape{16, 16, 3, 3});
  CHECK(find("fc.1.weight") == Shape{5, 16});
  Tensor y = (*net)(det_tensor({2, 3, 9, 9}, 7, -1, 1));
  CHECK(y.shape() == Shape{2, 5});

  auto n96 = models::resnet18_96(cfg, models::Init::Default);
  CHECK(n96->state_dict().front().second.shape() == Shape{4, 3, 7, 7});

  CHECK_THROWS_WITH(models::resnet18({.widths = {4, 0, 8, 8}}),
                    Contains("resnet18") && Contains("widths [4, 0, 8, 8]"));
  CHECK_THROWS_AS(models::resnet18_96({.num_classes = 0}), std::invalid_argument);
  CHECK_THROWS_WITH(nn::Residual(3, 4), Contains("1x1 conv"));
  CHECK_THROWS_WITH(nn::Residual(4, 4, false, 2), Contains("stride 2"));
}

TEST_CASE("models::create builds every model and names the unknown one", "[nn][resnet]") {
  CHECK(models::create("lenet", models::Init::Default)->state_dict().size() == 8);
  CHECK(models::create("resnet18", models::Init::Default)->state_dict().size() == 127);
  auto m96 = models::create("resnet18-96", models::Init::Default);
  CHECK(m96->state_dict().front().second.shape() == Shape{64, 1, 7, 7});
  CHECK_THROWS_AS(models::create("resnet50"), std::invalid_argument);
  CHECK_THROWS_WITH(models::create("resnet50"), Contains("resnet50") && Contains("lenet") &&
                                                    Contains("resnet18") &&
                                                    Contains("resnet18-96"));
}

TEST_CASE("ResNet-18 maps 28x28 and 96x96 images to [1, 10] logits", "[nn][resnet]") {
  // The real widths, one image each, without a graph: about 0.6 GFLOP in all.
  NoGradGuard no_grad;
  SECTION("resnet18 on 1x1x28x28") {
    Generator gen(2);
    auto net = models::resnet18({}, models::Init::Seed, &gen);
    net->eval();
    Tensor y = (*net)(det_tensor({1, 1, 28, 28}, 11, 0, 1));
    CHECK(y.shape() == Shape{1, 10});
    for (float v : y.to_vector()) CHECK(std::isfinite(v));
  }
  SECTION("resnet18_96 on 1x1x96x96") {
    Generator gen(3);
    auto net = models::resnet18_96({}, models::Init::Seed, &gen);
    net->eval();
    Tensor y = (*net)(det_tensor({1, 1, 96, 96}, 12, 0, 1));
    CHECK(y.shape() == Shape{1, 10});
    for (float v : y.to_vector()) CHECK(std::isfinite(v));
  }
}

// ---------------------------------------------------------------- init

TEST_CASE("ResNet-18 init: seed N(0, 0.01) weights, PyTorch's default biases and BatchNorm",
          "[nn][resnet]") {
  Generator gen(4);
  SECTION("seed: N(0, 0.01) weights; biases and BatchNorm left at PyTorch's defaults") {
    auto net = models::resnet18({}, models::Init::Seed, &gen);
    std::vector<float> weights;
    for (auto& [name, t] : net->state_dict()) {
      INFO(name);
      if (name.ends_with("num_batches_tracked")) {
        CHECK(t.to_int_vector() == std::vector<int64_t>{0});
        continue;
      }
      auto v = t.to_vector();
      // "1." is the stem's BatchNorm; the others are each Residual's bn1 and bn2.
      const bool bn = name.starts_with("1.") || name.find(".bn") != std::string::npos;
      if (bn) {
        // weight 1, bias 0, running_mean 0, running_var 1: PyTorch's defaults.
        const float want = name.ends_with("weight") || name.ends_with("running_var") ? 1.f : 0.f;
        for (float x : v) REQUIRE(x == want);
      } else if (t.dim() == 1) {
        // Conv and linear biases: the seeds' init_weights leaves PyTorch's
        // uniform(+-1/sqrt(fan_in)), so they are neither zero nor N(0, 0.01).
        double amax = 0;
        for (float x : v) amax = std::max(amax, double(std::fabs(x)));
        CHECK(amax > 0.0);
        CHECK(amax <= 1.0 / 3.0 + 1e-7);  // the smallest fan-in is the stem's 9
      } else {
        weights.insert(weights.end(), v.begin(), v.end());
      }
    }
    REQUIRE(weights.size() > 11'000'000);
    CHECK(testing::sample_std(weights) == Approx(0.01).epsilon(0.002));
    CHECK(std::fabs(testing::sample_mean(weights)) < 2e-5);  // ~7 standard errors
    // The stem conv's 576 weights alone.
    CHECK(testing::sample_std(net->state_dict()[0].second.to_vector()) ==
          Approx(0.01).epsilon(0.2));
  }
  SECTION("kaiming: He-normal weights from the fan-in, zero biases") {
    auto k = models::resnet18({}, models::Init::Kaiming, &gen);
    for (auto& [name, t] : k->named_parameters()) {
      INFO(name);
      auto v = t.to_vector();
      if (t.dim() >= 2) {
        if (v.size() < 10000) continue;  // too few for a tight estimate
        const double fan = double(t.numel() / t.size(0));
        CHECK(testing::sample_std(v) == Approx(std::sqrt(2.0 / fan)).epsilon(0.05));
      } else if (name.ends_with("bias")) {
        for (float x : v) REQUIRE(x == 0.f);
      } else {
        for (float x : v) REQUIRE(x == 1.f);  // BatchNorm scale
      }
    }
  }
  SECTION("the same generator seed gives the same model, another seed another") {
    const models::ResNetConfig narrow{.widths = {4, 8, 8, 16}};
    Generator a(9), b(9), c(10);
    auto na = models::resnet18(narrow, models::Init::Seed, &a);
    testing::require_same_state(na->state_dict(),
                                models::resnet18(narrow, models::Init::Seed, &b)->state_dict());
    auto nc = models::resnet18(narrow, models::Init::Seed, &c);
    CHECK(testing::tensor_bytes(na->state_dict()[0].second) !=
          testing::tensor_bytes(nc->state_dict()[0].second));
  }
}

// ---------------------------------------------------------------- Residual vs PyTorch

TEST_CASE("Residual forward, running statistics and gradients match PyTorch", "[nn][resnet]") {
  const json& r = golden().at("residual");
  for (const json& c : r.at("cases")) {
    DYNAMIC_SECTION(c.at("name").get<std::string>()) {
      nn::Residual blk(c.at("in_channels"), c.at("out_channels"), c.at("use_1x1conv"),
                       c.at("stride"));
      expect_listing(blk, c.at("state_dict"));
      CHECK(blk.repr() == c.at("repr").get<std::string>());
      fill_deterministic(blk, r.at("param_salt_base"));
      blk.train(c.at("training").get<bool>());
      Tensor x = det_tensor(c.at("x_shape").get<Shape>(), r.at("x_salt"), r.at("x_range")[0],
                            r.at("x_range")[1]);
      x.set_requires_grad(true);
      Tensor y = blk(x);
      expect_close(y, c.at("y"), 1e-5, 1e-5, "output");
      for (auto& [name, t] : blk.named_buffers())
        expect_close(t, c.at("buffers_after").at(name), 1e-6, 1e-6, "buffer " + name);
      Tensor R = det_tensor(y.shape(), r.at("R_salt"), r.at("R_range")[0], r.at("R_range")[1]);
      sum(mul(y, R)).backward();
      const json& grads = c.at("grads");
      expect_close(x.grad(), grads.at("x"), 1e-5, 1e-4, "gradient of x");
      for (auto& [name, p] : blk.named_parameters())
        expect_close(p.grad(), grads.at(name), 1e-5, 1e-4, "gradient of " + name);
    }
  }
}

// ---------------------------------------------------------------- finite differences

TEST_CASE("BatchNorm2d and Residual in train mode pass finite-difference gradient checks",
          "[nn][resnet][gradcheck]") {
  // The output depends on the batch statistics, which every evaluation
  // recomputes; the running statistics the modules update do not feed back in
  // train mode, so f is deterministic. The checker perturbs the module's own
  // parameter tensors in place.
  test::GradCheckOptions opt;
  opt.step = 3e-3;
  SECTION("BatchNorm2d: input, weight, bias") {
    nn::BatchNorm2d bn(3);
    fill_deterministic(bn, 40);
    Tensor x = test::uniform_tensor({2, 3, 4, 3}, 41, -2, 2);
    auto f = [&bn](const std::vector<Tensor>& in) { return bn(in[0]); };
    auto res = test::check_gradients(f, {x, bn.weight, bn.bias}, opt);
    INFO(res.message);
    CHECK(res.ok);
    CHECK(res.checked == 2 * 3 * 4 * 3 + 3 + 3);
  }
  SECTION("Residual with the 1x1 conv shortcut, stride 2: input and every parameter") {
    nn::Residual blk(2, 3, true, 2);
    fill_deterministic(blk, 50);
    Tensor x = test::uniform_tensor({2, 2, 5, 4}, 51, -2, 2);
    std::vector<Tensor> inputs{x};
    for (auto& p : blk.parameters()) inputs.push_back(p);
    auto f = [&blk](const std::vector<Tensor>& in) { return blk(in[0]); };
    // ReLU kinks cannot be kept away from every perturbed input here:
    // elements whose error a kink explains are skipped (a few at most).
    opt.skip_kinks = true;
    opt.max_skip_fraction = 0.05;
    int64_t total = 0;
    for (auto& t : inputs) total += t.numel();
    auto res = test::check_gradients(f, inputs, opt);
    INFO(res.message);
    CHECK(res.ok);
    CHECK(res.checked + res.skipped == total);
  }
}

// ---------------------------------------------------------------- training vs PyTorch

TEST_CASE("Narrow ResNet-18: two SGD steps give PyTorch's losses, weights and running stats",
          "[nn][resnet][optim]") {
  const json& g = golden().at("training");
  models::ResNetConfig cfg{.widths = g.at("widths").get<std::array<int64_t, 4>>(),
                           .in_channels = g.at("in_channels"),
                           .num_classes = g.at("num_classes")};
  auto net = models::resnet18(cfg, models::Init::Default);
  fill_deterministic(*net, g.at("param_salt_base"));
  Tensor x = det_tensor(g.at("x_shape").get<Shape>(), g.at("x_salt"), g.at("x_range")[0],
                        g.at("x_range")[1]);
  Tensor labels = Tensor::from_vector(g.at("labels").get<std::vector<int64_t>>(),
                                      {int64_t(g.at("labels").size())});
  optim::SGD sgd(net->parameters(), {.lr = g.at("lr"),
                                     .momentum = g.at("momentum"),
                                     .weight_decay = g.at("weight_decay")});
  const auto want_losses = g.at("losses").get<std::vector<double>>();
  net->train();
  for (size_t step = 0; step < want_losses.size(); ++step) {
    sgd.zero_grad();
    Tensor loss = cross_entropy((*net)(x), labels);
    INFO("step " << step);
    CHECK(loss.item() == Approx(want_losses[step]).epsilon(1e-5));
    loss.backward();
    sgd.step();
  }
  // Rounding differences grow through two large steps (lr 0.1, momentum): the
  // worst measured is 1.2e-6 (a quarter of the tolerance at 5e-6 + 5e-5 |w|).
  // Dropping the weight decay (1.45e-4 |w| over the two steps) fails 84 of the
  // 127 tensors.
  const json& final_state = g.at("final_state");
  auto sd = net->state_dict();
  REQUIRE(sd.size() == final_state.size());
  for (size_t i = 0; i < sd.size(); ++i) {
    REQUIRE(sd[i].first == final_state[i][0].get<std::string>());
    expect_close(sd[i].second, final_state[i][1], 5e-6, 5e-5, sd[i].first);
  }
  net->eval();
  NoGradGuard no_grad;
  expect_close((*net)(x), g.at("eval_logits"), 1e-4, 1e-4, "eval-mode logits after training");
}

// ---------------------------------------------------------------- checkpoints

TEST_CASE("A ResNet-18 checkpoint round-trips and is refused by the other variant",
          "[nn][resnet][checkpoint]") {
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("anvil_test_resnet_" + std::to_string(getpid()) + ".safetensors"))
                               .string();
  models::ResNetConfig narrow{.widths = {4, 8, 8, 16}};
  auto a = models::resnet18(narrow, models::Init::Default);
  fill_deterministic(*a, 60);
  nn::save_safetensors(path, a->state_dict());
  auto b = models::resnet18(narrow, models::Init::Default);
  nn::load_state_dict(*b, nn::load_safetensors(path), path);
  testing::require_same_state(a->state_dict(), b->state_dict());
  // Same names, but the 7x7 stem: the shape check names the tensor.
  auto c = models::resnet18_96(narrow, models::Init::Default);
  CHECK_THROWS_WITH(nn::load_state_dict(*c, nn::load_safetensors(path), path),
                    Contains("'0.weight'") && Contains("[4, 1, 3, 3]") &&
                        Contains("[4, 1, 7, 7]"));
  std::remove(path.c_str());
}

// ---------------------------------------------------------------- cuda:0 vs CPU

#if defined(ANVIL_CUDA_BACKEND)
TEST_CASE("cuda: a tiny ResNet-18 forward, backward and SGD step on cuda:0 match the CPU",
          "[cuda][nn][resnet]") {
  if (!cuda_test::have_device()) return;
  // FP32 on both devices (cuda:0 would take TF32 convolutions by default):
  // the tolerances here are FP32's.
  const ScopedFp32Precision fp32(Fp32Precision::kIeee);
  // Tiny, for the simulator: widths 2, 4, 4, 4 on 2x1x8x8 (a few MFLOP).
  const Device gpu = Device::cuda(0);
  models::ResNetConfig cfg{.widths = {2, 4, 4, 4}, .num_classes = 3};
  auto cpu_net = models::resnet18(cfg, models::Init::Default);
  auto gpu_net = models::resnet18(cfg, models::Init::Default);
  fill_deterministic(*cpu_net, 70);
  fill_deterministic(*gpu_net, 70);
  gpu_net->to(gpu);
  Tensor x = det_tensor({2, 1, 8, 8}, 71, 0, 1);
  Tensor labels = Tensor::from_vector(std::vector<int64_t>{2, 0}, {2});
  optim::SGDOptions o{.lr = 0.1, .momentum = 0.9, .weight_decay = 5e-4};
  optim::SGD cpu_sgd(cpu_net->parameters(), o), gpu_sgd(gpu_net->parameters(), o);

  Tensor logits_cpu = (*cpu_net)(x), logits_gpu = (*gpu_net)(x.to(gpu));
  REQUIRE(logits_gpu.device() == gpu);
  cuda_test::require_close(logits_gpu.to_vector(), logits_cpu.to_vector(), 1e-4f, 1e-5f);
  Tensor loss_cpu = cross_entropy(logits_cpu, labels);
  Tensor loss_gpu = cross_entropy(logits_gpu, labels.to(gpu));
  CHECK(loss_gpu.item() == Approx(loss_cpu.item()).epsilon(1e-5));
  loss_cpu.backward();
  loss_gpu.backward();
  auto pc = cpu_net->named_parameters(), pg = gpu_net->named_parameters();
  REQUIRE(pc.size() == pg.size());
  for (size_t i = 0; i < pc.size(); ++i) {
    INFO("gradient of " << pc[i].first);
    REQUIRE(pg[i].second.grad().defined());
    CHECK(pg[i].second.grad().device() == gpu);
    cuda_test::require_close(pg[i].second.grad().to_vector(), pc[i].second.grad().to_vector(),
                             1e-3f, 1e-5f);
  }
  cpu_sgd.step();
  gpu_sgd.step();
  auto sc = cpu_net->state_dict(), sg = gpu_net->state_dict();
  REQUIRE(sc.size() == sg.size());
  for (size_t i = 0; i < sc.size(); ++i) {
    INFO("after one step: " << sc[i].first);
    REQUIRE(sg[i].first == sc[i].first);
    if (sc[i].second.dtype() == DType::Int64) {
      CHECK(sg[i].second.to_int_vector() == sc[i].second.to_int_vector());
      continue;
    }
    cuda_test::require_close(sg[i].second.to_vector(), sc[i].second.to_vector(), 1e-4f, 1e-5f);
  }
}

#if defined(ANVIL_CUDA_SIM)
// Each time the host waits for the GPU, the GPU's queue runs dry and the next
// kernels start only after the host has issued them. A training step should
// not wait at all, however deep the model: a wait per layer (as when
// BatchNorm read its batch counter back to the host) would show here as a
// count that grows with the depth. The simulator counts the waits.
TEST_CASE("cuda: a training step waits for the device as often for ResNet-18 as for LeNet",
          "[cuda][nn][resnet]") {
  if (!cuda_test::have_device()) return;
  const cuda_test::SyncLaunches no_sync(false);  // ANVIL_CUDA_SYNC=1 would wait at every launch
  const Device gpu = Device::cuda(0);
  // Host waits of one step (forward, cross-entropy, backward, SGD with
  // momentum) after a first step that has created the momentum buffers.
  auto step_waits = [&](nn::Module& net, const Tensor& x, const Tensor& labels) {
    net.to(gpu);
    optim::SGD sgd(net.parameters(), {.lr = 0.1, .momentum = 0.9, .weight_decay = 5e-4});
    uint64_t waits = 0;
    for (int step = 0; step < 2; ++step) {
      const uint64_t before = anvil::sim::host_waits();
      Tensor loss = cross_entropy(net(x.to(gpu)), labels.to(gpu));
      sgd.zero_grad();
      loss.backward();
      sgd.step();
      waits = anvil::sim::host_waits() - before;
    }
    return waits;
  };
  Tensor labels = Tensor::from_vector(std::vector<int64_t>{2, 0}, {2});
  auto resnet = models::resnet18({.widths = {2, 4, 4, 4}, .num_classes = 3}, models::Init::Default);
  fill_deterministic(*resnet, 72);
  const uint64_t resnet_waits = step_waits(*resnet, det_tensor({2, 1, 8, 8}, 73, 0, 1), labels);
  auto lenet = models::lenet(models::Init::Default);
  fill_deterministic(*lenet, 74);
  const uint64_t lenet_waits = step_waits(*lenet, det_tensor({2, 1, 28, 28}, 75, 0, 1), labels);
  CHECK(resnet_waits == lenet_waits);
  // None: cross_entropy's label check, the last one, records a bad label on
  // the device and reports it at the next wait (Backend::check_labels).
  CHECK(resnet_waits == 0);
}
#endif
#endif
