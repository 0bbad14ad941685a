// Autograd graph semantics (tensors used twice, accumulation, diamonds,
// NoGradGuard, detach, freed graphs) and the error messages of the op layer.
#include <catch2/catch.hpp>
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/autograd.h"
#include "core/backend.h"
#include "core/device.h"
#include "core/ops.h"
#include "core/tensor.h"
#include "tests/cuda_test_util.h"

using namespace anvil;
using Catch::Matchers::Contains;

namespace {

Tensor F(const std::vector<float>& v, const Shape& s) { return Tensor::from_vector(v, s); }
Tensor I(const std::vector<int64_t>& v, const Shape& s) { return Tensor::from_vector(v, s); }
Tensor RG(Tensor t) {
  t.set_requires_grad(true);
  return t;
}
Tensor leaf(const std::vector<float>& v, const Shape& s) { return RG(F(v, s)); }

void expect_values(const Tensor& t, const std::vector<float>& want, double tol = 1e-6) {
  REQUIRE(t.defined());
  std::vector<float> got = t.to_vector();
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    INFO("element " << i << ": got " << got[i] << ", want " << want[i]);
    CHECK(std::fabs(got[i] - want[i]) <= tol * (1 + std::fabs(want[i])));
  }
}

}  // namespace

// ============================================================ graph semantics

TEST_CASE("autograd: a tensor used twice gets both contributions", "[autograd]") {
  SECTION("mul(x, x) -> 2x") {
    Tensor x = leaf({1.5f, -2.f, 0.25f, 3.f}, {2, 2});
    sum(mul(x, x)).backward();
    expect_values(x.grad(), {3.f, -4.f, 0.5f, 6.f});
  }
  SECTION("add(x, x) -> 2") {
    Tensor x = leaf({1.5f, -2.f, 0.25f}, {3});
    sum(add(x, x)).backward();
    expect_values(x.grad(), {2.f, 2.f, 2.f});
  }
  SECTION("matmul(x, x) for a square x: d/dx sum(x x) = 1 x^T + x^T 1") {
    Tensor x = leaf({1.f, 2.f, 3.f, 4.f}, {2, 2});
    sum(matmul(x, x)).backward();
    // d/dx_ij = (row sum j) + (column sum i); rows sum to 3, 7, columns to 4, 6.
    expect_values(x.grad(), {3.f + 4.f, 7.f + 4.f, 3.f + 6.f, 7.f + 6.f});
  }
}

TEST_CASE("autograd: gradients accumulate across backward calls", "[autograd]") {
  Tensor x = leaf({1.f, -2.f, 3.f}, {3});
  sum(scale(x, 2.0)).backward();
  expect_values(x.grad(), {2.f, 2.f, 2.f});
  sum(mul(x, x)).backward();  // a second, fresh graph
  expect_values(x.grad(), {2.f + 2.f, 2.f - 4.f, 2.f + 6.f});

  SECTION("zero_grad resets to undefined, and the next backward starts afresh") {
    x.zero_grad();
    CHECK_FALSE(x.grad().defined());
    sum(scale(x, -1.0)).backward();
    expect_values(x.grad(), {-1.f, -1.f, -1.f});
  }
  SECTION("the accumulated gradient does not alias the earlier one") {
    Tensor before = x.grad();
    std::vector<float> before_values = before.to_vector();
    sum(x).backward();
    expect_values(before, before_values);  // the old tensor is unchanged
    expect_values(x.grad(), {5.f, -1.f, 9.f});
  }
}

TEST_CASE("autograd: post-accumulate hooks see each leaf's final gradient, once per pass",
          "[autograd]") {
  // w is used twice, late and early in the forward pass; b once, last. The
  // hooks must run when all of a leaf's gradient has arrived, in the order
  // backward finishes the leaves (b before w), and see the summed gradient.
  Tensor w = leaf({1.f, 2.f}, {2});
  Tensor b = leaf({0.5f, -1.f}, {2});
  Tensor x = F({3.f, 4.f}, {2});
  std::vector<std::string> order;
  std::vector<std::vector<float>> seen_w;
  w.register_post_accumulate_grad_hook([&](const Tensor& t) {
    order.push_back("w");
    seen_w.push_back(t.grad().to_vector());
  });
  b.register_post_accumulate_grad_hook([&](const Tensor&) { order.push_back("b"); });
  auto forward = [&] { return sum(add(mul(mul(w, x), w), b)); };  // sum(w^2 x + b)
  forward().backward();
  REQUIRE(order == std::vector<std::string>{"b", "w"});
  REQUIRE(seen_w.size() == 1);
  REQUIRE(seen_w[0] == std::vector<float>{2 * 1.f * 3.f, 2 * 2.f * 4.f});  // d/dw = 2 w x
  forward().backward();  // a second pass: once more, with the accumulated sum
  REQUIRE(order.size() == 4);
  REQUIRE(seen_w.back() == std::vector<float>{12.f, 32.f});

  SECTION("a leaf the pass gives no gradient to is not reported") {
    order.clear();
    Tensor unused = leaf({1.f}, {1});
    unused.register_post_accumulate_grad_hook([&](const Tensor&) { order.push_back("unused"); });
    sum(scale(b, 2.0)).backward();
    REQUIRE(order == std::vector<std::string>{"b"});
  }
  SECTION("hooks go when cleared, and only leaves take them") {
    order.clear();
    w.clear_post_accumulate_grad_hooks();
    b.clear_post_accumulate_grad_hooks();
    forward().backward();
    REQUIRE(order.empty());
    Tensor y = mul(w, x);
    REQUIRE_THROWS_WITH(y.register_post_accumulate_grad_hook([](const Tensor&) {}),
                        Contains("only leaf tensors accumulate gradients"));
  }
  SECTION("a leaf that is the root itself") {
    order.clear();
    sum(w).backward();  // graph root is not a leaf; now a leaf root:
    Tensor s = leaf({2.f}, {1});
    s.register_post_accumulate_grad_hook([&](const Tensor&) { order.push_back("s"); });
    s.backward(F({1.f}, {1}));
    REQUIRE(order == std::vector<std::string>{"w", "s"});
  }
}

TEST_CASE("autograd: diamond graphs", "[autograd]") {
  SECTION("x -> a, b -> add") {
    Tensor x = leaf({1.f, 2.f}, {2});
    Tensor a = scale(x, 2.0), b = scale(x, 3.0);
    sum(add(a, b)).backward();
    expect_values(x.grad(), {5.f, 5.f});
  }
  SECTION("an intermediate used at two depths") {
    // a = x^2, c = a + 3x, d = c * a = x^4 + 3x^3: d' = 4x^3 + 9x^2.
    Tensor x = leaf({1.f, -2.f, 0.5f}, {3});
    Tensor a = mul(x, x);
    Tensor c = add(a, scale(x, 3.0));
    sum(mul(c, a)).backward();
    std::vector<float> want;
    for (float v : {1.f, -2.f, 0.5f}) want.push_back(4 * v * v * v + 9 * v * v);
    expect_values(x.grad(), want);
  }
  SECTION("two leaves through shared nodes") {
    Tensor x = leaf({1.f, 2.f, 3.f}, {3}), w = leaf({0.5f, -1.f, 2.f}, {3});
    Tensor h = mul(x, w);           // x*w
    Tensor y = add(mul(h, h), h);   // (xw)^2 + xw
    sum(y).backward();
    // dy/dx = (2xw + 1) w, dy/dw = (2xw + 1) x
    expect_values(x.grad(), {(2 * 0.5f + 1) * 0.5f, (2 * -2.f + 1) * -1.f, (2 * 6.f + 1) * 2.f});
    expect_values(w.grad(), {(2 * 0.5f + 1) * 1.f, (2 * -2.f + 1) * 2.f, (2 * 6.f + 1) * 3.f});
  }
}

TEST_CASE("autograd: NoGradGuard records nothing", "[autograd]") {
  Tensor x = leaf({1.f, 2.f}, {2});
  CHECK(grad_mode_enabled());
  Tensor y;
  {
    NoGradGuard guard;
    CHECK_FALSE(grad_mode_enabled());
    y = sum(mul(x, x));
    {
      NoGradGuard nested;
      CHECK_FALSE(grad_mode_enabled());
    }
    CHECK_FALSE(grad_mode_enabled());  // the inner guard restores "off"
  }
  CHECK(grad_mode_enabled());
  CHECK(y.grad_fn() == nullptr);
  CHECK_FALSE(y.requires_grad());
  CHECK(y.item() == Approx(5.0));
  CHECK_THROWS_AS(y.backward(), std::logic_error);
  CHECK_THROWS_WITH(y.backward(), Contains("does not require grad") && Contains("NoGradGuard"));
  CHECK_FALSE(x.grad().defined());

  // Recording is back on after the guard.
  Tensor z = sum(mul(x, x));
  REQUIRE(z.grad_fn() != nullptr);
  CHECK(z.grad_fn()->name == "SumBackward");
}

TEST_CASE("autograd: detach stops the gradient", "[autograd]") {
  Tensor x = leaf({1.f, -2.f, 3.f}, {3});
  Tensor d = x.detach();
  CHECK_FALSE(d.requires_grad());
  CHECK(d.is_leaf());
  CHECK(d.raw_data() == x.raw_data());  // same storage
  // Only the attached factor contributes: d/dx sum(detach(x) * x) = x.
  sum(mul(d, x)).backward();
  expect_values(x.grad(), {1.f, -2.f, 3.f});

  SECTION("detaching an intermediate") {
    Tensor y = leaf({2.f, 3.f}, {2});
    Tensor h = mul(y, y);
    Tensor out = add(h.detach(), scale(y, 4.0));
    sum(out).backward();
    expect_values(y.grad(), {4.f, 4.f});
  }
}

TEST_CASE("autograd: requires_grad propagation and leaves", "[autograd]") {
  Tensor x = leaf({1.f, 2.f}, {2});
  Tensor c = F({3.f, 4.f}, {2});
  Tensor y = mul(x, c);
  CHECK(y.requires_grad());
  CHECK_FALSE(y.is_leaf());
  REQUIRE(y.grad_fn() != nullptr);
  CHECK(y.grad_fn()->name == "MulBackward");
  Tensor z = mul(c, c);
  CHECK_FALSE(z.requires_grad());
  CHECK(z.grad_fn() == nullptr);

  sum(y).backward();
  expect_values(x.grad(), {3.f, 4.f});
  CHECK_FALSE(c.grad().defined());  // constants get no gradient
  CHECK_FALSE(y.grad().defined());  // nor do intermediates

  CHECK_THROWS_WITH(y.set_requires_grad(false), Contains("only leaf tensors"));
  CHECK_THROWS_WITH(Tensor::zeros({2}, DType::Int64).set_requires_grad(true),
                    Contains("float32") && Contains("int64"));

  SECTION("backward on a scalar leaf") {
    Tensor s = leaf({2.5f}, {});
    s.backward();
    expect_values(s.grad(), {1.f});
  }
}

TEST_CASE("autograd: a freed graph cannot be run again", "[autograd]") {
  Tensor x = leaf({1.f, 2.f}, {2});
  Tensor y = sum(mul(x, x));
  y.backward();
  expect_values(x.grad(), {2.f, 4.f});
  CHECK_THROWS_AS(y.backward(), std::logic_error);
  CHECK_THROWS_WITH(y.backward(), Contains("a second time") && Contains("SumBackward"));
  expect_values(x.grad(), {2.f, 4.f});  // unchanged by the failed calls

  SECTION("a second root sharing freed nodes") {
    Tensor w = leaf({1.f, 2.f}, {2});
    Tensor h = mul(w, w);
    Tensor r1 = sum(h), r2 = mean(h);
    r1.backward();
    CHECK_THROWS_WITH(r2.backward(), Contains("a second time") && Contains("MulBackward"));
  }
}

TEST_CASE("autograd: non-scalar roots", "[autograd]") {
  Tensor x = leaf({1.f, 2.f, 3.f, 4.f}, {2, 2});
  Tensor y = mul(x, x);
  CHECK_THROWS_AS(y.backward(), std::invalid_argument);
  CHECK_THROWS_WITH(y.backward(), Contains("only for scalar outputs") && Contains("[2, 2]"));
  CHECK_THROWS_WITH(y.backward(Tensor::ones({4})), Contains("[4]") && Contains("[2, 2]"));
  // An explicit gradient of the root's shape works: dL/dx = g * 2x.
  y.backward(F({1.f, 0.f, -1.f, 0.5f}, {2, 2}));
  expect_values(x.grad(), {2.f, 0.f, -6.f, 4.f});
}

// ============================================================ error messages

TEST_CASE("errors: shape mismatches name the op and both shapes", "[autograd][errors]") {
  Tensor a23 = Tensor::zeros({2, 3}), b45 = Tensor::zeros({4, 5});
  CHECK_THROWS_AS(matmul(a23, b45), std::invalid_argument);
  CHECK_THROWS_WITH(matmul(a23, b45), Contains("matmul") && Contains("[2, 3]") && Contains("[4, 5]"));
  CHECK_THROWS_WITH(matmul(Tensor::zeros({2, 3, 1}), b45),
                    Contains("matmul") && Contains("[2, 3, 1]"));
  CHECK_THROWS_WITH(add(a23, Tensor::zeros({4})),
                    Contains("add") && Contains("[2, 3]") && Contains("[4]"));
  CHECK_THROWS_WITH(mul(a23, Tensor::zeros({3, 2})),
                    Contains("mul") && Contains("[2, 3]") && Contains("[3, 2]"));
  CHECK_THROWS_WITH(linear(a23, Tensor::zeros({5, 4})),
                    Contains("linear") && Contains("[2, 3]") && Contains("[5, 4]"));
  CHECK_THROWS_WITH(linear(a23, Tensor::zeros({5, 3}), Tensor::zeros({4})),
                    Contains("linear") && Contains("[4]") && Contains("[5, 3]"));
  Tensor img = Tensor::zeros({1, 3, 7, 5});
  CHECK_THROWS_WITH(conv2d(img, Tensor::zeros({2, 2, 3, 3})),
                    Contains("conv2d") && Contains("[2, 2, 3, 3]") && Contains("[1, 3, 7, 5]"));
  CHECK_THROWS_WITH(conv2d(img, Tensor::zeros({2, 3, 9, 3})),
                    Contains("conv2d") && Contains("larger"));
  CHECK_THROWS_WITH(conv2d(img, Tensor::zeros({2, 3, 3, 3}), Tensor::zeros({3})),
                    Contains("conv2d") && Contains("[3]"));
  CHECK_THROWS_WITH(conv2d(Tensor::zeros({3, 7, 5}), Tensor::zeros({2, 3, 3, 3})),
                    Contains("conv2d") && Contains("[3, 7, 5]"));
  CHECK_THROWS_WITH(max_pool2d(Tensor::zeros({3, 7, 5}), 2),
                    Contains("max_pool2d") && Contains("[3, 7, 5]"));
  CHECK_THROWS_WITH(avg_pool2d(img, 3, 1, 2), Contains("avg_pool2d") && Contains("padding"));
  CHECK_THROWS_WITH(max_pool2d(img, 9), Contains("max_pool2d") && Contains("[1, 3, 7, 5]"));
  CHECK_THROWS_WITH(batch_norm(img, Tensor::ones({2}), Tensor::zeros({3}), Tensor(), Tensor(), true),
                    Contains("batch_norm") && Contains("[2]") && Contains("[3]"));
  CHECK_THROWS_WITH(batch_norm(Tensor::zeros({1, 3}), Tensor::ones({3}), Tensor::zeros({3}),
                               Tensor(), Tensor(), true),
                    Contains("batch_norm") && Contains("more than 1 value"));
  CHECK_THROWS_WITH(batch_norm(img, Tensor::ones({3}), Tensor::zeros({3}), Tensor(), Tensor(), false),
                    Contains("batch_norm") && Contains("running"));
  CHECK_THROWS_WITH(cross_entropy(a23, I({0, 1, 2}, {3})),
                    Contains("cross_entropy") && Contains("[2]") && Contains("[3]"));
  CHECK_THROWS_WITH(cross_entropy(a23, F({0.f, 1.f}, {2})),
                    Contains("cross_entropy") && Contains("int64") && Contains("float32"));
  CHECK_THROWS_WITH(a23.reshape({4, 2}), Contains("reshape") && Contains("[2, 3]") && Contains("[4, 2]"));
  CHECK_THROWS_WITH(add(Tensor::zeros({2}, DType::Int64), Tensor::zeros({2})),
                    Contains("add") && Contains("float32") && Contains("int64"));
}

TEST_CASE("errors: cross_entropy labels out of range", "[autograd][errors]") {
  Tensor logits = Tensor::zeros({2, 3});
  CHECK_THROWS_AS(cross_entropy(logits, I({0, 5}, {2})), std::invalid_argument);
  CHECK_THROWS_WITH(cross_entropy(logits, I({0, 5}, {2})),
                    Contains("cross_entropy") && Contains("label 5 out of range [0, 3)"));
  CHECK_THROWS_WITH(cross_entropy(logits, I({-1, 2}, {2})), Contains("label -1 out of range"));
  CHECK_THROWS_WITH(cross_entropy(logits, I({3, 0}, {2})), Contains("label 3 out of range"));
  CHECK_NOTHROW(cross_entropy(logits, I({2, 0}, {2})));
}

TEST_CASE("errors: devices", "[autograd][errors]") {
  Tensor a = Tensor::zeros({2}), b = Tensor::ones({2});
  CHECK_NOTHROW(check_same_device("add", {&a, &b}));
  Tensor undefined;
  CHECK_NOTHROW(check_same_device("add", {&a, &undefined, &b}));
  // Without GPUs no CUDA tensor can be made (so the cross-device message
  // cannot be exercised); the error names the device and the reason.
  if (!cuda_test::have_device("CUDA part")) {
    CHECK_THROWS_WITH(Tensor::zeros({2}, DType::Float32, Device::cuda(0)),
                      Contains("cuda:0") && Contains("not available"));
    CHECK_THROWS_WITH(backend_for(Device::cuda(1)), Contains("cuda:1") && Contains("not available"));
    CHECK(try_gpu(0) == Device::cpu());
  } else {
    Tensor g = Tensor::ones({2}, DType::Float32, Device::cuda(0));
    CHECK_THROWS_WITH(add(a, g), Contains("add") && Contains("same device") && Contains("cpu") &&
                                     Contains("cuda:0"));
    CHECK_THROWS_WITH(matmul(g.reshape({1, 2}), b.reshape({2, 1})),
                      Contains("matmul") && Contains("same device"));
  }
  CHECK_THROWS_WITH(Device::parse("gpu0"), Contains("gpu0"));
  CHECK(Device::parse("cuda:2") == Device::cuda(2));
}
