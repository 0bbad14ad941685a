// Autograd graph semantics (tensors used twice, accumulation, diamonds,
// NoGradGuard, detach, freed graphs), the error messages of the op layer,
// and Tensor::repr against PyTorch's repr.
#include <catch2/catch.hpp>
#include <cmath>
#include <limits>
#include <sstream>
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

const float kNaN = std::numeric_limits<float>::quiet_NaN();
const float kInf = std::numeric_limits<float>::infinity();

Tensor F(const std::vector<float>& v, const Shape& s) { return Tensor::from_vector(v, s); }
Tensor I(const std::vector<int64_t>& v, const Shape& s) { return Tensor::from_vector(v, s); }
Tensor U8(const std::vector<uint8_t>& v) {
  return Tensor::from_host(v.data(), {int64_t(v.size())}, DType::UInt8);
}
Tensor RG(Tensor t) {
  t.set_requires_grad(true);
  return t;
}
// 0, 1, ..., n-1 divided by div, as float32 (like torch.arange(n.) / div).
Tensor ar(int64_t n, const Shape& s, float div = 1.f) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = float(i) / div;
  return F(v, s);
}
Tensor middle_spike() {
  std::vector<float> v(2001, 0.f);
  v[1000] = 12345.678f;
  return F(v, {2001});
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

// ============================================================ printing

TEST_CASE("printing: Tensor::repr matches PyTorch", "[autograd][print]") {
  // Expected strings are repr(t) from PyTorch 1.13 for the same values.
  struct Case {
    const char* name;
    Tensor t;
    std::string want;
  };
  const std::vector<Case> cases = {
  {"2x2 integer-valued", F({1, 2, 3, 4}, {2, 2}),
   R"(tensor([[1., 2.],
        [3., 4.]]))"},
  {"fixed point, signs", F({1.5f, -2.25f, 0.125f}, {3}),
   R"(tensor([ 1.5000, -2.2500,  0.1250]))"},
  {"fixed point 2-D", F({-0.5f, 0.25f, 1.f, -2.f}, {2, 2}),
   R"(tensor([[-0.5000,  0.2500],
        [ 1.0000, -2.0000]]))"},
  {"rounding to 4 places", F({0.33333334f, 0.66666669f, 1.f}, {3}),
   R"(tensor([0.3333, 0.6667, 1.0000]))"},
  {"0-d", F({3.5f}, {}),
   R"(tensor(3.5000))"},
  {"0-d integer-valued", F({2.f}, {}),
   R"(tensor(2.))"},
  {"0-d nan", F({kNaN}, {}),
   R"(tensor(nan))"},
  {"int64", Tensor::arange(5, DType::Int64),
   R"(tensor([0, 1, 2, 3, 4]))"},
  {"int64 2-D", I({-3, 10, 7, 0}, {2, 2}),
   R"(tensor([[-3, 10],
        [ 7,  0]]))"},
  {"int64 wide", I({123456789012, -5}, {2}),
   R"(tensor([123456789012,           -5]))"},
  {"int64 beyond 2^53", I({9007199254740993, -9223372036854775807}, {2}),
   R"(tensor([    9007199254740993, -9223372036854775807]))"},
  {"uint8", U8({1, 2, 250}),
   R"(tensor([  1,   2, 250], dtype=torch.uint8))"},
  {"3-D", ar(8, {2, 2, 2}),
   R"(tensor([[[0., 1.],
         [2., 3.]],

        [[4., 5.],
         [6., 7.]]]))"},
  {"4-D", ar(16, {2, 2, 2, 2}),
   R"(tensor([[[[ 0.,  1.],
          [ 2.,  3.]],

         [[ 4.,  5.],
          [ 6.,  7.]]],


        [[[ 8.,  9.],
          [10., 11.]],

         [[12., 13.],
          [14., 15.]]]]))"},
  {"negative integers", F({-1.f, 2.f}, {2}),
   R"(tensor([-1.,  2.]))"},
  {"negative zero", F({-0.f, 1.f}, {2}),
   R"(tensor([-0., 1.]))"},
  {"negative zero, fixed", F({-0.f, 1.5f}, {2}),
   R"(tensor([-0.0000, 1.5000]))"},
  {"zeros", Tensor::zeros({2, 3}),
   R"(tensor([[0., 0., 0.],
        [0., 0., 0.]]))"},
  {"scientific: tiny", F({1e-5f, 1.f}, {2}),
   R"(tensor([1.0000e-05, 1.0000e+00]))"},
  {"scientific: tiny and zero", F({0.f, 1e-5f}, {2}),
   R"(tensor([0.0000e+00, 1.0000e-05]))"},
  {"scientific: ratio", F({0.5f, 1000.5f}, {2}),
   R"(tensor([5.0000e-01, 1.0005e+03]))"},
  {"scientific: integer ratio", F({1.f, 10000.f}, {2}),
   R"(tensor([1.0000e+00, 1.0000e+04]))"},
  {"scientific: huge", F({1.5e9f, -2.f}, {2}),
   R"(tensor([ 1.5000e+09, -2.0000e+00]))"},
  {"scientific: signs", F({-1.5e-7f, 2.0e3f}, {2}),
   R"(tensor([-1.5000e-07,  2.0000e+03]))"},
  {"1e8 stays integer", F({1e8f}, {1}),
   R"(tensor([100000000.]))"},
  {"nan and inf", F({1.5f, kNaN, kInf}, {3}),
   R"(tensor([1.5000,    nan,    inf]))"},
  {"nan and inf, integer mode", F({1.f, kNaN, -kInf}, {3}),
   R"(tensor([1., nan, -inf]))"},
  {"only nan and zero", F({kNaN, 0.f}, {2}),
   R"(tensor([nan, 0.]))"},
  {"empty", Tensor::zeros({0}),
   R"(tensor([]))"},
  {"empty 2-D", Tensor::zeros({0, 3}),
   R"(tensor([], size=(0, 3)))"},
  {"empty 3-D", Tensor::zeros({2, 0, 3}),
   R"(tensor([], size=(2, 0, 3)))"},
  {"empty int64", Tensor::zeros({0}, DType::Int64),
   R"(tensor([], dtype=torch.int64))"},
  {"empty uint8", Tensor::zeros({0}, DType::UInt8),
   R"(tensor([], dtype=torch.uint8))"},
  {"requires_grad", RG(F({1.f, 2.f}, {2})),
   R"(tensor([1., 2.], requires_grad=True))"},
  {"line wrap", ar(30, {30}),
   R"(tensor([ 0.,  1.,  2.,  3.,  4.,  5.,  6.,  7.,  8.,  9., 10., 11., 12., 13.,
        14., 15., 16., 17., 18., 19., 20., 21., 22., 23., 24., 25., 26., 27.,
        28., 29.]))"},
  {"line wrap, fixed", ar(20, {20}, 3),
   R"(tensor([0.0000, 0.3333, 0.6667, 1.0000, 1.3333, 1.6667, 2.0000, 2.3333, 2.6667,
        3.0000, 3.3333, 3.6667, 4.0000, 4.3333, 4.6667, 5.0000, 5.3333, 5.6667,
        6.0000, 6.3333]))"},
  {"line wrap, int64", Tensor::arange(40, DType::Int64),
   R"(tensor([ 0,  1,  2,  3,  4,  5,  6,  7,  8,  9, 10, 11, 12, 13, 14, 15, 16, 17,
        18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35,
        36, 37, 38, 39]))"},
  {"line wrap, rows", ar(40, {2, 20}, 7),
   R"(tensor([[0.0000, 0.1429, 0.2857, 0.4286, 0.5714, 0.7143, 0.8571, 1.0000, 1.1429,
         1.2857, 1.4286, 1.5714, 1.7143, 1.8571, 2.0000, 2.1429, 2.2857, 2.4286,
         2.5714, 2.7143],
        [2.8571, 3.0000, 3.1429, 3.2857, 3.4286, 3.5714, 3.7143, 3.8571, 4.0000,
         4.1429, 4.2857, 4.4286, 4.5714, 4.7143, 4.8571, 5.0000, 5.1429, 5.2857,
         5.4286, 5.5714]]))"},
  {"suffix after wrapped rows", RG(ar(30, {30})),
   R"(tensor([ 0.,  1.,  2.,  3.,  4.,  5.,  6.,  7.,  8.,  9., 10., 11., 12., 13.,
        14., 15., 16., 17., 18., 19., 20., 21., 22., 23., 24., 25., 26., 27.,
        28., 29.], requires_grad=True))"},
  {"suffix on a new line", RG(ar(14, {14})),
   R"(tensor([ 0.,  1.,  2.,  3.,  4.,  5.,  6.,  7.,  8.,  9., 10., 11., 12., 13.],
       requires_grad=True))"},
  {"1000 elements: not summarised", Tensor::ones({1000}),
   R"(tensor([1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1.,
        1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1.,
        1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1.,
        1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1.,
        1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1.,
        1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1.,
        1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1.,
        1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1.,
        1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1.,
        1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1.,
        1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1.,
        1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1.,
        1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1.,
        1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1.,
        1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1.,
        1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1.,
        1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1.,
        1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1.,
        1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1.,
        1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1.,
        1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1.,
        1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1.,
        1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1.,
        1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1.,
        1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1.,
        1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1.,
        1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1.,
        1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1.,
        1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1.,
        1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1.,
        1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1.,
        1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1.,
        1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1.,
        1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1.,
        1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1.,
        1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1.,
        1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1.,
        1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1.,
        1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1.,
        1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1.,
        1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1.,
        1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1.,
        1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1.,
        1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1.,
        1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1.,
        1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1.,
        1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1.,
        1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1.,
        1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1.,
        1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1.,
        1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1.,
        1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1.,
        1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1.,
        1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1.,
        1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1., 1.,
        1., 1., 1., 1., 1., 1., 1., 1., 1., 1.]))"},
  {"1001 elements: summarised", Tensor::ones({1001}),
   R"(tensor([1., 1., 1.,  ..., 1., 1., 1.]))"},
  {"summarised: format from the edges only", middle_spike(),
   R"(tensor([0., 0., 0.,  ..., 0., 0., 0.]))"},
  {"summarised arange", ar(2000, {2000}),
   R"(tensor([0.0000e+00, 1.0000e+00, 2.0000e+00,  ..., 1.9970e+03, 1.9980e+03,
        1.9990e+03]))"},
  {"summarised int64", Tensor::arange(1001, DType::Int64),
   R"(tensor([   0,    1,    2,  ...,  998,  999, 1000]))"},
  {"summarised 2-D", ar(3000, {30, 100}),
   R"(tensor([[0.0000e+00, 1.0000e+00, 2.0000e+00,  ..., 9.7000e+01, 9.8000e+01,
         9.9000e+01],
        [1.0000e+02, 1.0100e+02, 1.0200e+02,  ..., 1.9700e+02, 1.9800e+02,
         1.9900e+02],
        [2.0000e+02, 2.0100e+02, 2.0200e+02,  ..., 2.9700e+02, 2.9800e+02,
         2.9900e+02],
        ...,
        [2.7000e+03, 2.7010e+03, 2.7020e+03,  ..., 2.7970e+03, 2.7980e+03,
         2.7990e+03],
        [2.8000e+03, 2.8010e+03, 2.8020e+03,  ..., 2.8970e+03, 2.8980e+03,
         2.8990e+03],
        [2.9000e+03, 2.9010e+03, 2.9020e+03,  ..., 2.9970e+03, 2.9980e+03,
         2.9990e+03]]))"},
  {"summarised 3-D", ar(1200, {12, 10, 10}, 7),
   R"(tensor([[[0.0000e+00, 1.4286e-01, 2.8571e-01,  ..., 1.0000e+00,
          1.1429e+00, 1.2857e+00],
         [1.4286e+00, 1.5714e+00, 1.7143e+00,  ..., 2.4286e+00,
          2.5714e+00, 2.7143e+00],
         [2.8571e+00, 3.0000e+00, 3.1429e+00,  ..., 3.8571e+00,
          4.0000e+00, 4.1429e+00],
         ...,
         [1.0000e+01, 1.0143e+01, 1.0286e+01,  ..., 1.1000e+01,
          1.1143e+01, 1.1286e+01],
         [1.1429e+01, 1.1571e+01, 1.1714e+01,  ..., 1.2429e+01,
          1.2571e+01, 1.2714e+01],
         [1.2857e+01, 1.3000e+01, 1.3143e+01,  ..., 1.3857e+01,
          1.4000e+01, 1.4143e+01]],

        [[1.4286e+01, 1.4429e+01, 1.4571e+01,  ..., 1.5286e+01,
          1.5429e+01, 1.5571e+01],
         [1.5714e+01, 1.5857e+01, 1.6000e+01,  ..., 1.6714e+01,
          1.6857e+01, 1.7000e+01],
         [1.7143e+01, 1.7286e+01, 1.7429e+01,  ..., 1.8143e+01,
          1.8286e+01, 1.8429e+01],
         ...,
         [2.4286e+01, 2.4429e+01, 2.4571e+01,  ..., 2.5286e+01,
          2.5429e+01, 2.5571e+01],
         [2.5714e+01, 2.5857e+01, 2.6000e+01,  ..., 2.6714e+01,
          2.6857e+01, 2.7000e+01],
         [2.7143e+01, 2.7286e+01, 2.7429e+01,  ..., 2.8143e+01,
          2.8286e+01, 2.8429e+01]],

        [[2.8571e+01, 2.8714e+01, 2.8857e+01,  ..., 2.9571e+01,
          2.9714e+01, 2.9857e+01],
         [3.0000e+01, 3.0143e+01, 3.0286e+01,  ..., 3.1000e+01,
          3.1143e+01, 3.1286e+01],
         [3.1429e+01, 3.1571e+01, 3.1714e+01,  ..., 3.2429e+01,
          3.2571e+01, 3.2714e+01],
         ...,
         [3.8571e+01, 3.8714e+01, 3.8857e+01,  ..., 3.9571e+01,
          3.9714e+01, 3.9857e+01],
         [4.0000e+01, 4.0143e+01, 4.0286e+01,  ..., 4.1000e+01,
          4.1143e+01, 4.1286e+01],
         [4.1429e+01, 4.1571e+01, 4.1714e+01,  ..., 4.2429e+01,
          4.2571e+01, 4.2714e+01]],

        ...,

        [[1.2857e+02, 1.2871e+02, 1.2886e+02,  ..., 1.2957e+02,
          1.2971e+02, 1.2986e+02],
         [1.3000e+02, 1.3014e+02, 1.3029e+02,  ..., 1.3100e+02,
          1.3114e+02, 1.3129e+02],
         [1.3143e+02, 1.3157e+02, 1.3171e+02,  ..., 1.3243e+02,
          1.3257e+02, 1.3271e+02],
         ...,
         [1.3857e+02, 1.3871e+02, 1.3886e+02,  ..., 1.3957e+02,
          1.3971e+02, 1.3986e+02],
         [1.4000e+02, 1.4014e+02, 1.4029e+02,  ..., 1.4100e+02,
          1.4114e+02, 1.4129e+02],
         [1.4143e+02, 1.4157e+02, 1.4171e+02,  ..., 1.4243e+02,
          1.4257e+02, 1.4271e+02]],

        [[1.4286e+02, 1.4300e+02, 1.4314e+02,  ..., 1.4386e+02,
          1.4400e+02, 1.4414e+02],
         [1.4429e+02, 1.4443e+02, 1.4457e+02,  ..., 1.4529e+02,
          1.4543e+02, 1.4557e+02],
         [1.4571e+02, 1.4586e+02, 1.4600e+02,  ..., 1.4671e+02,
          1.4686e+02, 1.4700e+02],
         ...,
         [1.5286e+02, 1.5300e+02, 1.5314e+02,  ..., 1.5386e+02,
          1.5400e+02, 1.5414e+02],
         [1.5429e+02, 1.5443e+02, 1.5457e+02,  ..., 1.5529e+02,
          1.5543e+02, 1.5557e+02],
         [1.5571e+02, 1.5586e+02, 1.5600e+02,  ..., 1.5671e+02,
          1.5686e+02, 1.5700e+02]],

        [[1.5714e+02, 1.5729e+02, 1.5743e+02,  ..., 1.5814e+02,
          1.5829e+02, 1.5843e+02],
         [1.5857e+02, 1.5871e+02, 1.5886e+02,  ..., 1.5957e+02,
          1.5971e+02, 1.5986e+02],
         [1.6000e+02, 1.6014e+02, 1.6029e+02,  ..., 1.6100e+02,
          1.6114e+02, 1.6129e+02],
         ...,
         [1.6714e+02, 1.6729e+02, 1.6743e+02,  ..., 1.6814e+02,
          1.6829e+02, 1.6843e+02],
         [1.6857e+02, 1.6871e+02, 1.6886e+02,  ..., 1.6957e+02,
          1.6971e+02, 1.6986e+02],
         [1.7000e+02, 1.7014e+02, 1.7029e+02,  ..., 1.7100e+02,
          1.7114e+02, 1.7129e+02]]]))"},
  };
  for (const Case& c : cases) {
    INFO(c.name);
    CHECK(c.t.repr() == c.want);
  }
}

TEST_CASE("printing: autograd suffixes and operator<<", "[autograd][print]") {
  Tensor x = leaf({1.f, 2.f}, {2});
  // PyTorch prints grad_fn=<MulBackward0>; anvil's node is named MulBackward.
  CHECK(mul(x, x).repr() == "tensor([1., 4.], grad_fn=<MulBackward>)");
  CHECK(x.detach().repr() == "tensor([1., 2.])");
  std::ostringstream os;
  os << F({0.5f}, {1});
  CHECK(os.str() == "tensor([0.5000])");
  CHECK(Tensor().repr() == "tensor(undefined)");
}
