// Tests for nn/: modules and state dicts (names, shapes and init of LeNet,
// BatchNorm2d buffers), Module's tree operations and SGD against
// hand-computed updates.
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

// ---------------------------------------------------------------- models

TEST_CASE("LeNet state_dict names and shapes match PyTorch's nn.Sequential", "[nn]") {
  Generator gen(1);
  auto net = models::lenet(models::Init::Seed, &gen);
  auto sd = net->state_dict();
  REQUIRE(sd.size() == kLeNetKeys.size());
  for (size_t i = 0; i < sd.size(); ++i) {
    INFO("entry " << i);
    CHECK(sd[i].first == kLeNetKeys[i]);
    CHECK(sd[i].second.shape() == kLeNetShapes[i]);
    CHECK(sd[i].second.dtype() == DType::Float32);
    CHECK(sd[i].second.requires_grad());
    CHECK(sd[i].second.is_leaf());
  }
  CHECK(net->named_buffers().empty());
  CHECK(net->named_parameters().size() == 8);
  CHECK(net->parameters().size() == 8);
  // 180+20 + 25000+50 + 102400+128 + 1280+10
  CHECK(net->num_parameters() == 129068);
  CHECK(net->size() == 10);
}

TEST_CASE("LeNet forward maps [N,1,28,28] to [N,10] logits", "[nn]") {
  Generator gen(2);
  auto net = models::lenet(models::Init::Default, &gen);
  Tensor x = Tensor::randn({2, 1, 28, 28}, &gen);
  Tensor y = (*net)(x);
  CHECK(y.shape() == Shape{2, 10});
  CHECK(y.dtype() == DType::Float32);
  for (float v : y.to_vector()) CHECK(std::isfinite(v));
  // The two examples differ, so their logits do.
  auto v = y.to_vector();
  CHECK(std::vector<float>(v.begin(), v.begin() + 10) !=
        std::vector<float>(v.begin() + 10, v.end()));
  // Batch independence: example 1 alone gives the same logits as in the batch.
  Tensor y1 = (*net)(x.narrow(1, 1));
  auto v1 = y1.to_vector();
  for (int i = 0; i < 10; ++i) CHECK(v1[size_t(i)] == Approx(v[size_t(10 + i)]).margin(1e-5));
}

TEST_CASE("LeNet seed init: N(0, 0.01) weights, zero biases, reproducible", "[nn]") {
  Generator gen(3);
  auto net = models::lenet(models::Init::Seed, &gen);
  std::vector<float> all;
  for (auto& [name, t] : net->state_dict()) {
    INFO(name);
    auto v = t.to_vector();
    if (name.ends_with("bias")) {
      for (float b : v) REQUIRE(b == 0.0f);
      continue;
    }
    // Relative standard error of a sample std is ~1/sqrt(2n); 10% is > 3 of those
    // for every tensor but the 180-element first conv, which gets 25%.
    double tol = v.size() >= 1000 ? 0.10 : 0.25;
    CHECK(sample_std(v) == Approx(0.01).epsilon(tol));
    CHECK(std::abs(sample_mean(v)) < 0.003);
    all.insert(all.end(), v.begin(), v.end());
  }
  CHECK(sample_std(all) == Approx(0.01).epsilon(0.02));
  CHECK(std::abs(sample_mean(all)) < 0.0005);

  Generator again(3);
  auto net2 = models::lenet(models::Init::Seed, &again);
  require_same_state(net->state_dict(), net2->state_dict());
  Generator other(4);
  auto net3 = models::lenet(models::Init::Seed, &other);
  CHECK(tensor_bytes(net->state_dict()[0].second) != tensor_bytes(net3->state_dict()[0].second));
}

TEST_CASE("LeNet kaiming and default init follow their fan-in", "[nn]") {
  Generator gen(5);
  auto kaiming = models::lenet(models::Init::Kaiming, &gen);
  for (auto& [name, t] : kaiming->state_dict()) {
    INFO(name);
    auto v = t.to_vector();
    if (name.ends_with("bias")) {
      for (float b : v) REQUIRE(b == 0.0f);
      continue;
    }
    int64_t fan = t.numel() / t.size(0);
    double tol = v.size() >= 1000 ? 0.10 : 0.25;
    CHECK(sample_std(v) == Approx(std::sqrt(2.0 / double(fan))).epsilon(tol));
  }
  auto def = models::lenet(models::Init::Default, &gen);
  auto sd = def->state_dict();
  for (size_t i = 0; i < sd.size(); i += 2) {
    const Tensor& w = sd[i].second;
    const Tensor& b = sd[i + 1].second;
    INFO(sd[i].first);
    double bound = 1.0 / std::sqrt(double(w.numel() / w.size(0)));
    auto wv = w.to_vector(), bv = b.to_vector();
    double wmax = 0, bmax = 0;
    for (float x : wv) wmax = std::max(wmax, double(std::abs(x)));
    for (float x : bv) bmax = std::max(bmax, double(std::abs(x)));
    CHECK(wmax <= bound);
    CHECK(wmax > 0.9 * bound);  // uniform over the whole interval
    CHECK(bmax <= bound);
    CHECK(bmax > 0.0);          // biases are not zeroed by the default init
    // Uniform(-a, a) has std a/sqrt(3).
    double tol = wv.size() >= 1000 ? 0.10 : 0.25;
    CHECK(sample_std(wv) == Approx(bound / std::sqrt(3.0)).epsilon(tol));
  }
}

TEST_CASE("models::create knows lenet and names the unknown model", "[nn]") {
  auto m = models::create("lenet", models::Init::Default);
  CHECK(m->state_dict().size() == 8);
  REQUIRE_THROWS_AS(models::create("nosuch"), std::invalid_argument);
  REQUIRE_THROWS_WITH(models::create("nosuch"), Contains("nosuch") && Contains("lenet"));
}

TEST_CASE("Module::repr prints the tree as PyTorch's print(model)", "[nn]") {
  auto net = models::lenet(models::Init::Default);
  const std::string expected =
      "Sequential(\n"
      "  (0): Conv2d(1, 20, kernel_size=(3, 3), stride=(1, 1))\n"
      "  (1): ReLU()\n"
      "  (2): AvgPool2d(kernel_size=2, stride=2, padding=0)\n"
      "  (3): Conv2d(20, 50, kernel_size=(5, 5), stride=(1, 1))\n"
      "  (4): ReLU()\n"
      "  (5): AvgPool2d(kernel_size=2, stride=2, padding=0)\n"
      "  (6): Flatten(start_dim=1, end_dim=-1)\n"
      "  (7): Linear(in_features=800, out_features=128, bias=True)\n"
      "  (8): ReLU()\n"
      "  (9): Linear(in_features=128, out_features=10, bias=True)\n"
      ")";
  CHECK(net->repr() == expected);
  CHECK_THAT(net->repr(), Contains("Conv2d(1, 20, kernel_size=(3, 3), stride=(1, 1))"));

  CHECK(nn::BatchNorm2d(3).repr() ==
        "BatchNorm2d(3, eps=1e-05, momentum=0.1, affine=True, track_running_stats=True)");
  CHECK(nn::Conv2d(3, 64, 7, 2, 3, false).repr() ==
        "Conv2d(3, 64, kernel_size=(7, 7), stride=(2, 2), padding=(3, 3), bias=False)");
  CHECK(nn::MaxPool2d(3, 2, 1).repr() ==
        "MaxPool2d(kernel_size=3, stride=2, padding=1, dilation=1, ceil_mode=False)");
  CHECK(nn::AdaptiveAvgPool2d(1).repr() == "AdaptiveAvgPool2d(output_size=(1, 1))");
  CHECK(nn::Linear(4, 2, false).repr() == "Linear(in_features=4, out_features=2, bias=False)");

  // Nested containers indent their children.
  nn::Sequential outer;
  outer.add(std::make_shared<nn::Sequential>(
      std::vector<std::shared_ptr<nn::Module>>{std::make_shared<nn::ReLU>()}));
  CHECK(outer.repr() ==
        "Sequential(\n"
        "  (0): Sequential(\n"
        "    (0): ReLU()\n"
        "  )\n"
        ")");
}

TEST_CASE("Layers without bias register no bias tensor", "[nn]") {
  nn::Conv2d conv(3, 4, 3, 1, 1, false);
  auto sd = conv.state_dict();
  REQUIRE(sd.size() == 1);
  CHECK(sd[0].first == "weight");
  CHECK(sd[0].second.shape() == Shape{4, 3, 3, 3});
  nn::Linear lin(5, 2, false);
  REQUIRE(lin.state_dict().size() == 1);
  Tensor y = lin(Tensor::ones({3, 5}));
  CHECK(y.shape() == Shape{3, 2});
}

TEST_CASE("Nested modules name their tensors with dotted paths", "[nn]") {
  nn::Sequential outer;
  auto inner = std::make_shared<nn::Sequential>();
  inner->add(std::make_shared<nn::ReLU>()).add(std::make_shared<nn::BatchNorm2d>(2));
  outer.add(std::make_shared<nn::Conv2d>(1, 2, 1)).add(inner);
  std::vector<std::string> names;
  for (auto& [n, t] : outer.state_dict()) names.push_back(n);
  CHECK(names == std::vector<std::string>{"0.weight", "0.bias", "1.1.weight", "1.1.bias",
                                          "1.1.running_mean", "1.1.running_var",
                                          "1.1.num_batches_tracked"});
  std::vector<std::string> params;
  for (auto& [n, t] : outer.named_parameters()) params.push_back(n);
  CHECK(params == std::vector<std::string>{"0.weight", "0.bias", "1.1.weight", "1.1.bias"});
  std::vector<std::string> buffers;
  for (auto& [n, t] : outer.named_buffers()) buffers.push_back(n);
  CHECK(buffers == std::vector<std::string>{"1.1.running_mean", "1.1.running_var",
                                            "1.1.num_batches_tracked"});
}

// ---------------------------------------------------------------- BatchNorm2d

TEST_CASE("BatchNorm2d state_dict: weight, bias, running stats, num_batches_tracked", "[nn]") {
  nn::BatchNorm2d bn(3);
  auto sd = bn.state_dict();
  REQUIRE(sd.size() == 5);
  CHECK(sd[0].first == "weight");
  CHECK(sd[1].first == "bias");
  CHECK(sd[2].first == "running_mean");
  CHECK(sd[3].first == "running_var");
  CHECK(sd[4].first == "num_batches_tracked");
  for (int i = 0; i < 4; ++i) {
    CHECK(sd[size_t(i)].second.shape() == Shape{3});
    CHECK(sd[size_t(i)].second.dtype() == DType::Float32);
  }
  CHECK(sd[0].second.to_vector() == std::vector<float>{1, 1, 1});
  CHECK(sd[1].second.to_vector() == std::vector<float>{0, 0, 0});
  CHECK(sd[2].second.to_vector() == std::vector<float>{0, 0, 0});
  CHECK(sd[3].second.to_vector() == std::vector<float>{1, 1, 1});
  CHECK(sd[4].second.shape() == Shape{});
  CHECK(sd[4].second.dtype() == DType::Int64);
  CHECK(sd[4].second.numel() == 1);
  CHECK(sd[4].second.to_int_vector() == std::vector<int64_t>{0});
  // Only weight and bias are trained.
  CHECK(bn.named_parameters().size() == 2);
  CHECK(bn.parameters()[0].requires_grad());
  for (auto& [n, t] : bn.named_buffers()) CHECK_FALSE(t.requires_grad());
}

TEST_CASE("BatchNorm2d: batch statistics and buffer updates in train mode, running stats in eval",
          "[nn]") {
  const int64_t N = 4, C = 2, H = 3, W = 2;
  Generator gen(11);
  Tensor x = Tensor::randn({N, C, H, W}, &gen);
  // Shift and scale channel 1 so that the two channels differ.
  {
    auto v = x.to_vector();
    for (int64_t n = 0; n < N; ++n)
      for (int64_t i = 0; i < H * W; ++i) {
        float& e = v[size_t((n * C + 1) * H * W + i)];
        e = 3.0f * e + 2.0f;
      }
    x = Tensor::from_vector(v, {N, C, H, W});
  }
  const auto xv = x.to_vector();
  nn::BatchNorm2d bn(C, 1e-5, 0.1);
  assign(bn.weight, {1.5f, -0.5f});
  assign(bn.bias, {0.25f, 1.0f});

  std::vector<double> mean(C, 0), var(C, 0);  // biased variance
  const double m = double(N * H * W);
  for (int64_t c = 0; c < C; ++c) {
    for (int64_t n = 0; n < N; ++n)
      for (int64_t i = 0; i < H * W; ++i) mean[size_t(c)] += xv[size_t((n * C + c) * H * W + i)];
    mean[size_t(c)] /= m;
    for (int64_t n = 0; n < N; ++n)
      for (int64_t i = 0; i < H * W; ++i) {
        double d = xv[size_t((n * C + c) * H * W + i)] - mean[size_t(c)];
        var[size_t(c)] += d * d;
      }
    var[size_t(c)] /= m;
  }
  const double w[2] = {1.5, -0.5}, b[2] = {0.25, 1.0};

  REQUIRE(bn.is_training());
  Tensor y = bn(x);
  auto yv = y.to_vector();
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c)
      for (int64_t i = 0; i < H * W; ++i) {
        size_t k = size_t((n * C + c) * H * W + i);
        double expect = (xv[k] - mean[size_t(c)]) / std::sqrt(var[size_t(c)] + 1e-5) * w[c] + b[c];
        CHECK(yv[k] == Approx(expect).margin(1e-4));
      }
  CHECK(bn.num_batches_tracked.to_int_vector() == std::vector<int64_t>{1});
  // PyTorch: running = (1 - momentum) * running + momentum * batch, with the
  // unbiased variance.
  auto rm = bn.running_mean.to_vector(), rv = bn.running_var.to_vector();
  for (int64_t c = 0; c < C; ++c) {
    CHECK(rm[size_t(c)] == Approx(0.1 * mean[size_t(c)]).margin(1e-5));
    CHECK(rv[size_t(c)] == Approx(0.9 + 0.1 * var[size_t(c)] * m / (m - 1)).margin(1e-5));
  }
  bn(x);
  CHECK(bn.num_batches_tracked.to_int_vector() == std::vector<int64_t>{2});

  bn.eval();
  assign(bn.running_mean, {0.5f, -1.0f});
  assign(bn.running_var, {4.0f, 0.25f});
  Tensor ye = bn(x);
  CHECK(bn.num_batches_tracked.to_int_vector() == std::vector<int64_t>{2});
  // Eval leaves the running statistics alone.
  CHECK(bn.running_mean.to_vector() == std::vector<float>{0.5f, -1.0f});
  CHECK(bn.running_var.to_vector() == std::vector<float>{4.0f, 0.25f});
  const double erm[2] = {0.5, -1.0}, erv[2] = {4.0, 0.25};
  auto yev = ye.to_vector();
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c)
      for (int64_t i = 0; i < H * W; ++i) {
        size_t k = size_t((n * C + c) * H * W + i);
        double expect = (xv[k] - erm[c]) / std::sqrt(erv[c] + 1e-5) * w[c] + b[c];
        CHECK(yev[k] == Approx(expect).margin(1e-4));
      }
  // Eval output of one example does not depend on the rest of the batch.
  Tensor y0 = bn(x.narrow(0, 1));
  auto y0v = y0.to_vector();
  for (size_t k = 0; k < y0v.size(); ++k) CHECK(y0v[k] == Approx(yev[k]).margin(1e-5));

  bn.train();
  bn(x);
  CHECK(bn.num_batches_tracked.to_int_vector() == std::vector<int64_t>{3});
}

// ---------------------------------------------------------------- Module

TEST_CASE("Module::to(cpu) on a CPU model keeps the very same tensors", "[nn]") {
  auto net = models::lenet(models::Init::Default);
  nn::BatchNorm2d bn(4);
  auto before = net->state_dict();
  auto bn_before = bn.state_dict();
  net->to(Device::cpu());
  bn.to(Device::cpu());
  auto after = net->state_dict();
  auto bn_after = bn.state_dict();
  REQUIRE(before.size() == after.size());
  for (size_t i = 0; i < before.size(); ++i) {
    CHECK(before[i].second.same(after[i].second));
    CHECK(after[i].second.requires_grad());
    CHECK(after[i].second.is_leaf());
  }
  for (size_t i = 0; i < bn_before.size(); ++i) CHECK(bn_before[i].second.same(bn_after[i].second));
}

TEST_CASE("train() and eval() reach every descendant", "[nn]") {
  nn::Sequential outer;
  auto inner = std::make_shared<nn::Sequential>();
  auto bn = std::make_shared<nn::BatchNorm2d>(2);
  inner->add(bn);
  outer.add(std::make_shared<nn::Conv2d>(1, 2, 1)).add(inner);
  CHECK(outer.is_training());
  CHECK(bn->is_training());
  outer.eval();
  CHECK_FALSE(outer.is_training());
  CHECK_FALSE(outer[0].is_training());
  CHECK_FALSE(inner->is_training());
  CHECK_FALSE(bn->is_training());
  outer.train();
  CHECK(outer[0].is_training());
  CHECK(bn->is_training());
  outer.train(false);
  CHECK_FALSE(bn->is_training());
}

TEST_CASE("Module::zero_grad drops every parameter's gradient", "[nn]") {
  Generator gen(21);
  auto net = models::lenet(models::Init::Default, &gen);
  Tensor x = Tensor::randn({2, 1, 28, 28}, &gen);
  Tensor loss = cross_entropy((*net)(x), Tensor::from_vector(std::vector<int64_t>{3, 7}, {2}));
  loss.backward();
  for (auto& [name, p] : net->named_parameters()) {
    INFO(name);
    REQUIRE(p.grad().defined());
    CHECK(p.grad().shape() == p.shape());
  }
  net->zero_grad();
  for (auto& [name, p] : net->named_parameters()) {
    INFO(name);
    CHECK_FALSE(p.grad().defined());
  }
}

// ---------------------------------------------------------------- SGD

namespace {

// One parameter [3] with the given values, as a leaf that requires grad.
Tensor make_param(const std::vector<float>& v) {
  Tensor p = Tensor::from_vector(v, {int64_t(v.size())});
  p.set_requires_grad(true);
  return p;
}

// Runs `steps` SGD steps on p0 with gradient g_t = grads[t] and returns the
// trajectory (parameter after each step).
std::vector<std::vector<float>> sgd_run(const std::vector<float>& p0,
                                        const std::vector<std::vector<float>>& grads,
                                        optim::SGDOptions opt) {
  Tensor p = make_param(p0);
  optim::SGD sgd({p}, opt);
  std::vector<std::vector<float>> out;
  for (auto& g : grads) {
    p.set_grad(Tensor::from_vector(g, p.shape()));
    sgd.step();
    out.push_back(p.to_vector());
  }
  return out;
}

// PyTorch's torch.optim.SGD (dampening 0), written out in double precision.
std::vector<std::vector<double>> sgd_reference(const std::vector<float>& p0,
                                               const std::vector<std::vector<float>>& grads,
                                               optim::SGDOptions o) {
  std::vector<double> p(p0.begin(), p0.end()), buf(p0.size(), 0.0);
  std::vector<std::vector<double>> out;
  for (size_t t = 0; t < grads.size(); ++t) {
    for (size_t i = 0; i < p.size(); ++i) {
      double g = grads[t][i] + o.weight_decay * p[i];
      if (o.momentum != 0) {
        buf[i] = t == 0 ? g : o.momentum * buf[i] + g;
        g = o.nesterov ? g + o.momentum * buf[i] : buf[i];
      }
      p[i] -= o.lr * g;
    }
    out.push_back(p);
  }
  return out;
}

}  // namespace

TEST_CASE("SGD single steps match hand-computed values", "[nn][optim]") {
  // p = 1, g = 0.5, lr = 0.1 in every case.
  SECTION("plain") {
    auto r = sgd_run({1.0f}, {{0.5f}, {0.5f}}, {.lr = 0.1});
    CHECK(r[0][0] == Approx(0.95));
    CHECK(r[1][0] == Approx(0.90));
  }
  SECTION("momentum 0.9: buf = g first, then 0.9 buf + g") {
    auto r = sgd_run({1.0f}, {{0.5f}, {0.5f}, {0.5f}}, {.lr = 0.1, .momentum = 0.9});
    CHECK(r[0][0] == Approx(0.95));    // buf 0.5
    CHECK(r[1][0] == Approx(0.855));   // buf 0.95
    CHECK(r[2][0] == Approx(0.7195));  // buf 1.355
  }
  SECTION("nesterov: step with g + m buf") {
    auto r = sgd_run({1.0f}, {{0.5f}, {0.5f}},
                     {.lr = 0.1, .momentum = 0.9, .nesterov = true});
    CHECK(r[0][0] == Approx(0.905));   // 1 - 0.1 (0.5 + 0.45)
    CHECK(r[1][0] == Approx(0.7695));  // buf 0.95, step 0.1 (0.5 + 0.855)
  }
  SECTION("weight decay is added to the gradient first") {
    auto r = sgd_run({1.0f}, {{0.5f}, {0.5f}}, {.lr = 0.1, .weight_decay = 0.1});
    CHECK(r[0][0] == Approx(0.94));    // g 0.6
    CHECK(r[1][0] == Approx(0.8806));  // g 0.5 + 0.094
  }
  SECTION("weight decay with momentum feeds the decayed gradient into the buffer") {
    auto r = sgd_run({1.0f}, {{0.5f}, {0.5f}},
                     {.lr = 0.1, .momentum = 0.9, .weight_decay = 0.1});
    CHECK(r[0][0] == Approx(0.94));  // buf 0.6
    // g = 0.5 + 0.094 = 0.594, buf = 0.54 + 0.594 = 1.134
    CHECK(r[1][0] == Approx(0.94 - 0.1134));
  }
  SECTION("weight decay, momentum and nesterov together") {
    auto r = sgd_run({2.0f}, {{-1.0f}, {0.25f}},
                     {.lr = 0.5, .momentum = 0.5, .weight_decay = 0.25, .nesterov = true});
    // step 1: g = -1 + 0.5 = -0.5, buf = -0.5, d = -0.5 - 0.25 = -0.75, p = 2.375
    CHECK(r[0][0] == Approx(2.375));
    // step 2: g = 0.25 + 0.59375 = 0.84375, buf = -0.25 + 0.84375 = 0.59375,
    //         d = 0.84375 + 0.296875 = 1.140625, p = 2.375 - 0.5703125
    CHECK(r[1][0] == Approx(1.8046875));
  }
}

TEST_CASE("SGD trajectories over several steps match PyTorch's update rule", "[nn][optim]") {
  const std::vector<float> p0 = {1.0f, -2.0f, 0.5f, 3.0f};
  const std::vector<std::vector<float>> grads = {{0.3f, -0.1f, 0.0f, 1.0f},
                                                 {-0.2f, 0.4f, 0.7f, 0.5f},
                                                 {0.1f, 0.1f, -0.3f, -1.5f},
                                                 {0.0f, -0.6f, 0.2f, 0.25f},
                                                 {0.5f, 0.5f, 0.5f, 0.5f}};
  for (optim::SGDOptions o : {optim::SGDOptions{.lr = 0.05},
                              optim::SGDOptions{.lr = 0.05, .momentum = 0.9},
                              optim::SGDOptions{.lr = 0.2, .weight_decay = 0.01},
                              optim::SGDOptions{.lr = 0.1, .momentum = 0.8, .weight_decay = 0.05},
                              optim::SGDOptions{.lr = 0.1, .momentum = 0.9, .nesterov = true},
                              optim::SGDOptions{.lr = 0.3, .momentum = 0.5, .weight_decay = 0.1,
                                                .nesterov = true}}) {
    INFO("lr " << o.lr << " momentum " << o.momentum << " wd " << o.weight_decay
               << " nesterov " << o.nesterov);
    auto got = sgd_run(p0, grads, o);
    auto want = sgd_reference(p0, grads, o);
    for (size_t t = 0; t < grads.size(); ++t)
      for (size_t i = 0; i < p0.size(); ++i) {
        INFO("step " << t << " element " << i);
        CHECK(got[t][i] == Approx(want[t][i]).margin(1e-6).epsilon(1e-5));
      }
  }
}

TEST_CASE("SGD on a large parameter (the parallel path) matches the reference", "[nn][optim]") {
  const int64_t n = 1 << 17;
  Generator gen(31);
  auto p0 = Tensor::randn({n}, &gen).to_vector();
  std::vector<std::vector<float>> grads = {Tensor::randn({n}, &gen).to_vector(),
                                           Tensor::randn({n}, &gen).to_vector(),
                                           Tensor::randn({n}, &gen).to_vector()};
  optim::SGDOptions o{.lr = 0.1, .momentum = 0.9, .weight_decay = 1e-3, .nesterov = true};
  auto got = sgd_run(p0, grads, o);
  auto want = sgd_reference(p0, grads, o);
  double worst = 0;
  for (size_t t = 0; t < grads.size(); ++t)
    for (size_t i = 0; i < size_t(n); ++i) worst = std::max(worst, std::abs(got[t][i] - want[t][i]));
  CHECK(worst < 1e-5);
}

TEST_CASE("SGD skips parameters without a gradient and honours set_lr", "[nn][optim]") {
  Tensor a = make_param({1.0f, 2.0f});
  Tensor b = make_param({3.0f});
  optim::SGD sgd({a, b}, {.lr = 0.5, .momentum = 0.9});
  a.set_grad(Tensor::from_vector(std::vector<float>{1.0f, -1.0f}, {2}));
  sgd.step();
  CHECK(a.to_vector() == std::vector<float>{0.5f, 2.5f});
  CHECK(b.to_vector() == std::vector<float>{3.0f});
  // b's first gradient arrives at step 2: its buffer starts from that gradient.
  b.set_grad(Tensor::from_vector(std::vector<float>{2.0f}, {1}));
  sgd.set_lr(0.25);
  CHECK(sgd.lr() == 0.25);
  sgd.step();
  CHECK(b.to_vector()[0] == Approx(2.5));
  // a: buf = 0.9 * 1 + 1 = 1.9 -> 0.5 - 0.475
  CHECK(a.to_vector()[0] == Approx(0.025));
  sgd.zero_grad();
  CHECK_FALSE(a.grad().defined());
  CHECK_FALSE(b.grad().defined());
  sgd.step();  // nothing to do
  CHECK(a.to_vector()[0] == Approx(0.025));
}

TEST_CASE("SGD zero_grad(false) zeroes every gradient in place, and sgd_step_ checks its tensors",
          "[nn][optim]") {
  Tensor a = make_param({1.0f, 2.0f});
  Tensor b = make_param({3.0f});
  Tensor c = make_param({4.0f});
  optim::SGD sgd({a, b, c}, {.lr = 0.5});
  const Tensor ga = Tensor::from_vector(std::vector<float>{1.0f, -1.0f}, {2});
  a.set_grad(ga);
  b.set_grad(Tensor::from_vector(std::vector<float>{2.0f}, {1}));
  sgd.zero_grad(false);
  CHECK(ga.to_vector() == std::vector<float>{0.0f, 0.0f});  // the same tensor, zeroed
  CHECK(b.grad().to_vector() == std::vector<float>{0.0f});
  CHECK_FALSE(c.grad().defined());  // no gradient: none made
  sgd.step();                        // zero gradients: nothing moves
  CHECK(a.to_vector() == std::vector<float>{1.0f, 2.0f});

  SgdTensors t;
  t.param = Tensor::zeros({3});
  t.grad = Tensor::zeros({2});
  SgdHyper h;
  h.lr = 0.1f;
  CHECK_THROWS_WITH(sgd_step_(std::vector<SgdTensors>{t}, h),
                    Catch::Contains("the gradient of tensor 0 is [2], its parameter [3]"));
  t.grad = Tensor::zeros({3});
  h.momentum = 0.9f;
  CHECK_THROWS_WITH(sgd_step_(std::vector<SgdTensors>{t}, h),
                    Catch::Contains("tensor 0's momentum buffer is undefined"));
  CHECK_THROWS_WITH(zero_(std::vector<Tensor>{t.param, Tensor::zeros({2}, DType::Int64)}),
                    Catch::Contains("zero_: tensor 1 must be float32, got int64"));
}

TEST_CASE("SGD trains LeNet parameters in place", "[nn][optim]") {
  Generator gen(41);
  auto net = models::lenet(models::Init::Default, &gen);
  auto params = net->parameters();
  optim::SGD sgd(params, {.lr = 0.1});
  Tensor x = Tensor::randn({4, 1, 28, 28}, &gen);
  Tensor y = Tensor::from_vector(std::vector<int64_t>{0, 1, 2, 3}, {4});
  double first = 0, last = 0;
  for (int i = 0; i < 8; ++i) {
    Tensor loss = cross_entropy((*net)(x), y);
    if (i == 0) first = loss.item();
    last = loss.item();
    sgd.zero_grad();
    loss.backward();
    sgd.step();
  }
  CHECK(last < first);
  // The parameters are still the module's own tensors.
  auto now = net->parameters();
  for (size_t i = 0; i < params.size(); ++i) CHECK(now[i].same(params[i]));
}

TEST_CASE("SGD rejects invalid options and parameters", "[nn][optim]") {
  Tensor p = make_param({1.0f});
  CHECK_THROWS_AS(optim::SGD({p}, {.lr = -0.1}), std::invalid_argument);
  CHECK_THROWS_WITH(optim::SGD({p}, {.lr = -0.1}), Contains("lr"));
  CHECK_THROWS_WITH(optim::SGD({p}, {.lr = 0.1, .momentum = -0.5}), Contains("momentum"));
  CHECK_THROWS_WITH(optim::SGD({p}, {.lr = 0.1, .weight_decay = -1}), Contains("weight_decay"));
  CHECK_THROWS_WITH(optim::SGD({p}, {.lr = 0.1, .nesterov = true}), Contains("nesterov"));
  CHECK_THROWS_AS(optim::SGD({p}, {.lr = 0.1, .momentum = 0, .nesterov = true}),
                  std::invalid_argument);
  Tensor frozen = Tensor::ones({2});
  CHECK_THROWS_AS(optim::SGD({frozen}, {}), std::invalid_argument);
  Tensor non_leaf = scale(p, 2.0);
  CHECK_THROWS_AS(optim::SGD({p, non_leaf}, {}), std::invalid_argument);
  CHECK_NOTHROW(optim::SGD({p}, {.lr = 0.0}));
  CHECK_NOTHROW(optim::SGD({p}, {.lr = 0.1, .momentum = 0.9, .nesterov = true}));
}
