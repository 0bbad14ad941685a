// Finite-difference gradient checks (tests/gradcheck.h) of every op in
// core/ops.h on ragged shapes: odd sizes, N = 1 and N = 3, C = 1 and C = 3,
// stride 1 and 2, padding 0 and 1, 7x5 images. First, the checker itself is
// shown to fail on wrong gradients, so a passing check means something.
#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "core/autograd.h"
#include "core/ops.h"
#include "core/tensor.h"
#include "tests/gradcheck.h"

using namespace anvil;
using anvil::test::check_gradients;
using anvil::test::GradCheckOptions;
using anvil::test::GradCheckResult;
using anvil::test::away_from_zero;
using anvil::test::distinct_values;
using anvil::test::uniform_tensor;
using Inputs = std::vector<Tensor>;

namespace {

void expect_ok(const GradCheckResult& r) {
  INFO(r.message);
  CHECK(r.ok);
  CHECK(r.checked > 0);
}

GradCheckResult run(const anvil::test::GradFn& f, const Inputs& in,
                    const GradCheckOptions& opt = {}) {
  return check_gradients(f, in, opt);
}

Tensor fixed(const Shape& shape, uint64_t seed, double lo = -1, double hi = 1) {
  return uniform_tensor(shape, seed, lo, hi, /*requires_grad=*/false);
}

Tensor int_labels(const std::vector<int64_t>& v) {
  return Tensor::from_vector(v, Shape{int64_t(v.size())});
}

// ---- deliberately wrong ops, to show the checker fails ----

// y = x * x, with the backward returning g * x (should be 2 g x).
Tensor bad_square(const Tensor& x) {
  Tensor y;
  {
    NoGradGuard ng;
    y = mul(x, x);
  }
  if (any_requires_grad({&x})) {
    Tensor sx = x.detach();
    record(y, "BadSquareBackward", {&x},
           [sx](const Tensor& g) { return std::vector<Tensor>{mul(g, sx)}; });
  }
  return y;
}

// y = relu(x), with the backward passing the gradient through everywhere.
Tensor bad_relu(const Tensor& x) {
  Tensor y;
  {
    NoGradGuard ng;
    y = relu(x);
  }
  if (any_requires_grad({&x}))
    record(y, "BadReluBackward", {&x}, [](const Tensor& g) { return std::vector<Tensor>{g}; });
  return y;
}

// y = scale(x, 2) whose gradient lands one element off (as an argmax bug would).
Tensor shifted_grad(const Tensor& x) {
  Tensor y;
  {
    NoGradGuard ng;
    y = scale(x, 2.0);
  }
  if (any_requires_grad({&x}))
    record(y, "ShiftedBackward", {&x}, [](const Tensor& g) {
      std::vector<float> v = g.to_vector(), out(v.size());
      for (size_t i = 0; i < v.size(); ++i) out[(i + 1) % v.size()] = 2 * v[i];
      return std::vector<Tensor>{Tensor::from_vector(out, g.shape())};
    });
  return y;
}

}  // namespace

// ============================================================ the checker

TEST_CASE("gradcheck: detects wrong gradients", "[gradcheck]") {
  GradCheckOptions kinky;
  kinky.skip_kinks = true;
  kinky.max_skip_fraction = 0.5;

  SECTION("factor 2 missing") {
    Tensor x = uniform_tensor({3, 5}, 1);
    auto r = run([](const Inputs& in) { return bad_square(in[0]); }, {x});
    INFO(r.message);
    CHECK_FALSE(r.ok);
    CHECK(r.failed > 0);
    CHECK(r.message.find("FAIL input 0") != std::string::npos);
    // Kink skipping must not explain away an error on a smooth function.
    auto r2 = run([](const Inputs& in) { return bad_square(in[0]); }, {x}, kinky);
    CHECK_FALSE(r2.ok);
    CHECK(r2.skipped == 0);
  }
  SECTION("relu backward without the mask, even with kink skipping on") {
    Tensor x = away_from_zero({4, 5}, 2, 0.05);
    auto r = run([](const Inputs& in) { return bad_relu(in[0]); }, {x}, kinky);
    INFO(r.message);
    CHECK_FALSE(r.ok);
    CHECK(r.failed > 0);
    CHECK(r.skipped == 0);
  }
  SECTION("gradient delivered to the wrong element") {
    Tensor x = uniform_tensor({2, 7}, 3);
    auto r = run([](const Inputs& in) { return shifted_grad(in[0]); }, {x});
    INFO(r.message);
    CHECK_FALSE(r.ok);
    CHECK(r.failed > 0);
  }
  SECTION("a correct op passes, and the worst element is reported") {
    Tensor x = uniform_tensor({3, 5}, 4);
    auto r = run([](const Inputs& in) { return mul(in[0], in[0]); }, {x});
    expect_ok(r);
    CHECK(r.checked == 15);
    CHECK(r.message.find("worst (|diff|/tolerance = ") != std::string::npos);
    CHECK(r.message.find("): input 0 (shape [3, 5]) element ") != std::string::npos);
  }
}

TEST_CASE("gradcheck: kinks inside the step are skipped, not failed", "[gradcheck]") {
  // 16 of 32 elements lie within h/2 of the ReLU kink.
  std::vector<float> v;
  for (int i = 0; i < 16; ++i) {
    float near = 0.001f * float(i % 5 + 1) * (i % 2 ? -1.f : 1.f);
    v.push_back(near);
    v.push_back((i % 2 ? 0.3f : -0.4f) + 0.01f * float(i));
  }
  Tensor x = Tensor::from_vector(v, {4, 8});
  x.set_requires_grad(true);
  auto f = [](const Inputs& in) { return relu(in[0]); };

  auto strict = run(f, {x});
  INFO(strict.message);
  CHECK_FALSE(strict.ok);  // the kinks make plain central differences wrong
  CHECK(strict.failed > 0);

  GradCheckOptions opt;
  opt.skip_kinks = true;
  opt.max_skip_fraction = 0.6;
  auto lenient = run(f, {x}, opt);
  INFO(lenient.message);
  CHECK(lenient.ok);
  CHECK(lenient.skipped > 0);
  CHECK(lenient.skipped <= 16);
  CHECK(lenient.checked >= 16);

  opt.max_skip_fraction = 0.05;  // too many skips fail the check
  CHECK_FALSE(run(f, {x}, opt).ok);
}

// ============================================================ elementwise

TEST_CASE("gradcheck: add", "[gradcheck][ops]") {
  auto f = [](const Inputs& in) { return add(in[0], in[1]); };
  for (const Shape& s : {Shape{7}, Shape{3, 5}, Shape{1, 3, 7, 5}, Shape{3, 1, 5, 7}}) {
    DYNAMIC_SECTION("same shape " << shape_str(s)) {
      expect_ok(run(f, {uniform_tensor(s, 10), uniform_tensor(s, 11)}));
    }
  }
  struct Bias { Shape a; Shape b; };
  for (const Bias& c : {Bias{{3, 3}, {3}}, Bias{{1, 3}, {3}}, Bias{{5, 1}, {1}},
                        Bias{{3, 3, 7, 5}, {3}}, Bias{{1, 3, 7, 5}, {3}}, Bias{{3, 1, 7, 5}, {1}},
                        Bias{{2, 3, 4}, {3}}}) {
    DYNAMIC_SECTION("channel bias " << shape_str(c.a) << " + " << shape_str(c.b)) {
      expect_ok(run(f, {uniform_tensor(c.a, 12), uniform_tensor(c.b, 13)}));
    }
  }
  for (const Shape& s : {Shape{}, Shape{1}}) {
    DYNAMIC_SECTION("scalar " << shape_str(s) << " over [3, 3, 7, 5]") {
      expect_ok(run(f, {uniform_tensor({3, 3, 7, 5}, 14), uniform_tensor(s, 15)}));
    }
  }
  SECTION("only one side requires grad") {
    expect_ok(run(f, {uniform_tensor({3, 3, 5, 4}, 16), fixed({3}, 17)}));
    expect_ok(run(f, {fixed({3, 3, 5, 4}, 18), uniform_tensor({3}, 19)}));
  }
  SECTION("same tensor on both sides") {
    expect_ok(run([](const Inputs& in) { return add(in[0], in[0]); }, {uniform_tensor({3, 5}, 20)}));
  }
}

TEST_CASE("gradcheck: mul", "[gradcheck][ops]") {
  auto f = [](const Inputs& in) { return mul(in[0], in[1]); };
  for (const Shape& s : {Shape{7}, Shape{3, 5}, Shape{1, 3, 7, 5}, Shape{}}) {
    DYNAMIC_SECTION("shape " << shape_str(s)) {
      expect_ok(run(f, {uniform_tensor(s, 21), uniform_tensor(s, 22)}));
    }
  }
  SECTION("one side constant") {
    expect_ok(run(f, {fixed({3, 5}, 23), uniform_tensor({3, 5}, 24)}));
  }
  SECTION("squared (same tensor twice)") {
    expect_ok(run([](const Inputs& in) { return mul(in[0], in[0]); }, {uniform_tensor({2, 3, 5}, 25)}));
  }
}

TEST_CASE("gradcheck: scale", "[gradcheck][ops]") {
  for (double alpha : {-1.7, 0.5, 0.0, 3.0}) {
    DYNAMIC_SECTION("alpha " << alpha) {
      expect_ok(run([alpha](const Inputs& in) { return scale(in[0], alpha); },
                    {uniform_tensor({3, 7, 5}, 26)}));
    }
  }
}

TEST_CASE("gradcheck: relu", "[gradcheck][ops]") {
  // No input within 5h of the kink, so no skipping is needed (or allowed).
  for (const Shape& s : {Shape{7}, Shape{3, 5}, Shape{2, 3, 7, 5}}) {
    DYNAMIC_SECTION("shape " << shape_str(s)) {
      expect_ok(run([](const Inputs& in) { return relu(in[0]); }, {away_from_zero(s, 27, 0.05)}));
    }
  }
  SECTION("relu of a computed tensor") {
    auto f = [](const Inputs& in) { return relu(add(in[0], in[1])); };
    expect_ok(run(f, {away_from_zero({3, 5}, 28, 0.1), uniform_tensor({5}, 29, -0.02, 0.02)}));
  }
}

TEST_CASE("gradcheck: silu", "[gradcheck][ops]") {
  // Smooth everywhere: no kinks to keep away from. [-6, 6] reaches both
  // tails, where the derivative leaves [0, 1] (its minimum, about -0.1, is
  // near x = -2.4; its maximum, about 1.1, near x = 2.4).
  for (const Shape& s : {Shape{7}, Shape{2, 3, 7, 5}}) {
    DYNAMIC_SECTION("shape " << shape_str(s)) {
      expect_ok(run([](const Inputs& in) { return silu(in[0]); }, {uniform_tensor(s, 30, -6, 6)}));
    }
  }
  SECTION("silu of a computed tensor") {
    auto f = [](const Inputs& in) { return silu(mul(in[0], in[1])); };
    expect_ok(run(f, {uniform_tensor({3, 5}, 31, -3, 3), uniform_tensor({3, 5}, 32, -2, 2)}));
  }
}

// ============================================================ matmul, linear

TEST_CASE("gradcheck: matmul", "[gradcheck][ops]") {
  auto f = [](const Inputs& in) { return matmul(in[0], in[1]); };
  struct MM { int64_t m, k, n; };
  for (const MM& c : {MM{3, 5, 7}, MM{1, 4, 1}, MM{1, 1, 3}, MM{7, 1, 2}, MM{5, 3, 1}}) {
    DYNAMIC_SECTION("[" << c.m << ", " << c.k << "] x [" << c.k << ", " << c.n << "]") {
      expect_ok(run(f, {uniform_tensor({c.m, c.k}, 30), uniform_tensor({c.k, c.n}, 31)}));
    }
  }
  SECTION("only b requires grad") {
    expect_ok(run(f, {fixed({3, 5}, 32), uniform_tensor({5, 2}, 33)}));
  }
}

TEST_CASE("gradcheck: linear", "[gradcheck][ops]") {
  struct Lin { int64_t n, in, out; };
  for (const Lin& c : {Lin{3, 5, 7}, Lin{1, 4, 1}, Lin{3, 1, 3}, Lin{5, 9, 2}}) {
    DYNAMIC_SECTION("x [" << c.n << ", " << c.in << "] out " << c.out << " with bias") {
      auto f = [](const Inputs& in) { return linear(in[0], in[1], in[2]); };
      expect_ok(run(f, {uniform_tensor({c.n, c.in}, 34), uniform_tensor({c.out, c.in}, 35),
                        uniform_tensor({c.out}, 36)}));
    }
    DYNAMIC_SECTION("x [" << c.n << ", " << c.in << "] out " << c.out << " without bias") {
      auto f = [](const Inputs& in) { return linear(in[0], in[1]); };
      expect_ok(run(f, {uniform_tensor({c.n, c.in}, 37), uniform_tensor({c.out, c.in}, 38)}));
    }
  }
  SECTION("frozen weight, trainable bias") {
    auto f = [](const Inputs& in) { return linear(in[0], in[1], in[2]); };
    expect_ok(run(f, {uniform_tensor({3, 5}, 39), fixed({4, 5}, 40), uniform_tensor({4}, 41)}));
  }
}

// ============================================================ conv2d

TEST_CASE("gradcheck: conv2d", "[gradcheck][ops]") {
  struct Conv { int64_t n, c, h, w, k, r, s, stride, pad; bool bias; };
  const Conv cases[] = {
      {1, 1, 7, 5, 1, 3, 3, 1, 0, false}, {1, 1, 7, 5, 2, 3, 3, 1, 1, true},
      {3, 1, 7, 5, 2, 3, 3, 2, 0, true},  {3, 1, 7, 5, 1, 3, 3, 2, 1, false},
      {1, 3, 7, 5, 2, 3, 3, 1, 0, true},  {1, 3, 7, 5, 3, 3, 3, 2, 1, true},
      {3, 3, 7, 5, 2, 3, 3, 1, 1, false}, {3, 3, 7, 5, 2, 3, 3, 2, 1, true},
      {3, 3, 7, 5, 2, 1, 1, 1, 0, true},  {3, 3, 7, 5, 3, 1, 1, 2, 1, false},
      {1, 3, 7, 5, 2, 2, 3, 1, 0, true},  {3, 1, 7, 5, 2, 2, 3, 2, 1, true},
      {3, 3, 6, 6, 2, 5, 5, 1, 1, true},  {2, 3, 5, 7, 3, 3, 2, 2, 0, false},
      {1, 2, 3, 3, 1, 3, 3, 1, 0, true},  {3, 2, 4, 4, 2, 4, 4, 2, 1, true},
  };
  for (const Conv& c : cases) {
    DYNAMIC_SECTION("x [" << c.n << ", " << c.c << ", " << c.h << ", " << c.w << "] w [" << c.k
                          << ", " << c.c << ", " << c.r << ", " << c.s << "] stride " << c.stride
                          << " pad " << c.pad << (c.bias ? " bias" : " no bias")) {
      Inputs in{uniform_tensor({c.n, c.c, c.h, c.w}, 42),
                uniform_tensor({c.k, c.c, c.r, c.s}, 43)};
      if (c.bias) in.push_back(uniform_tensor({c.k}, 44));
      int64_t stride = c.stride, pad = c.pad;
      auto f = [stride, pad](const Inputs& in) {
        return conv2d(in[0], in[1], in.size() > 2 ? in[2] : Tensor(), stride, pad);
      };
      expect_ok(run(f, in));
    }
  }
  SECTION("frozen input (first layer): weight and bias only") {
    auto f = [](const Inputs& in) { return conv2d(in[0], in[1], in[2], 2, 1); };
    expect_ok(run(f, {fixed({3, 3, 7, 5}, 45), uniform_tensor({2, 3, 3, 3}, 46),
                      uniform_tensor({2}, 47)}));
  }
  SECTION("frozen weight: input only") {
    auto f = [](const Inputs& in) { return conv2d(in[0], in[1], Tensor(), 1, 1); };
    expect_ok(run(f, {uniform_tensor({3, 3, 7, 5}, 48), fixed({2, 3, 3, 3}, 49)}));
  }
}

// ============================================================ pooling

struct PoolCase { int64_t n, c, h, w, k, stride, pad; };
const PoolCase kPoolCases[] = {
    {1, 1, 7, 5, 2, 2, 0}, {3, 3, 7, 5, 2, 2, 0}, {1, 3, 7, 5, 3, 2, 1}, {3, 1, 7, 5, 3, 2, 1},
    {3, 3, 7, 5, 2, 1, 0}, {1, 1, 7, 5, 3, 1, 1}, {3, 3, 7, 5, 3, 3, 0}, {2, 3, 6, 6, 2, 2, 1},
    {1, 2, 5, 5, 5, 1, 2}, {3, 1, 4, 6, 4, 2, 2},
};

TEST_CASE("gradcheck: max_pool2d", "[gradcheck][ops]") {
  // Distinct values 0.05 apart (h = 0.01): every window has a unique maximum.
  for (const PoolCase& c : kPoolCases) {
    DYNAMIC_SECTION("x [" << c.n << ", " << c.c << ", " << c.h << ", " << c.w << "] kernel " << c.k
                          << " stride " << c.stride << " pad " << c.pad) {
      auto f = [c](const Inputs& in) { return max_pool2d(in[0], c.k, c.stride, c.pad); };
      expect_ok(run(f, {distinct_values({c.n, c.c, c.h, c.w}, 50, 0.05)}));
    }
  }
  SECTION("default stride = kernel") {
    auto f = [](const Inputs& in) { return max_pool2d(in[0], 2); };
    expect_ok(run(f, {distinct_values({3, 3, 7, 5}, 51, 0.05)}));
  }
  SECTION("all-negative input with padding (padding must never win)") {
    auto f = [](const Inputs& in) { return max_pool2d(scale(in[0], 1.0), 3, 2, 1); };
    Tensor x = distinct_values({1, 2, 7, 5}, 52, 0.05, false);
    std::vector<float> v = x.to_vector();
    for (float& e : v) e -= 10.f;
    Tensor neg = Tensor::from_vector(v, x.shape());
    neg.set_requires_grad(true);
    expect_ok(run(f, {neg}));
  }
}

TEST_CASE("gradcheck: avg_pool2d", "[gradcheck][ops]") {
  for (const PoolCase& c : kPoolCases) {
    DYNAMIC_SECTION("x [" << c.n << ", " << c.c << ", " << c.h << ", " << c.w << "] kernel " << c.k
                          << " stride " << c.stride << " pad " << c.pad) {
      auto f = [c](const Inputs& in) { return avg_pool2d(in[0], c.k, c.stride, c.pad); };
      expect_ok(run(f, {uniform_tensor({c.n, c.c, c.h, c.w}, 53)}));
    }
  }
}

TEST_CASE("gradcheck: global_avg_pool2d", "[gradcheck][ops]") {
  for (const Shape& s : {Shape{1, 1, 7, 5}, Shape{3, 3, 7, 5}, Shape{2, 3, 1, 1}, Shape{3, 1, 1, 6}}) {
    DYNAMIC_SECTION("x " << shape_str(s)) {
      expect_ok(run([](const Inputs& in) { return global_avg_pool2d(in[0]); },
                    {uniform_tensor(s, 54)}));
    }
  }
}

// ============================================================ batch norm

TEST_CASE("gradcheck: batch_norm (training)", "[gradcheck][ops]") {
  // The output depends on the batch statistics, which every finite-difference
  // evaluation recomputes. Running statistics are either undefined or fresh
  // copies per call, so their in-place update cannot feed back.
  GradCheckOptions opt;
  opt.step = 3e-3;
  for (const Shape& s : {Shape{3, 3}, Shape{5, 1}, Shape{2, 3}, Shape{3, 3, 5, 4},
                         Shape{1, 3, 7, 5}, Shape{2, 1, 3, 3}, Shape{3, 2, 1, 1}}) {
    const int64_t C = s[1];
    DYNAMIC_SECTION("x " << shape_str(s) << " without running stats") {
      auto f = [](const Inputs& in) {
        return batch_norm(in[0], in[1], in[2], Tensor(), Tensor(), /*training=*/true);
      };
      expect_ok(run(f, {uniform_tensor(s, 55, -2, 2), uniform_tensor({C}, 56, 0.5, 1.5),
                        uniform_tensor({C}, 57)},
                    opt));
    }
    DYNAMIC_SECTION("x " << shape_str(s) << " with fresh running stats") {
      Tensor rm = fixed({C}, 58), rv = fixed({C}, 59, 0.5, 2.0);
      auto f = [rm, rv](const Inputs& in) {
        Tensor m = rm.clone(), v = rv.clone();
        return batch_norm(in[0], in[1], in[2], m, v, /*training=*/true, 0.1, 1e-5);
      };
      expect_ok(run(f, {uniform_tensor(s, 60, -2, 2), uniform_tensor({C}, 61, 0.5, 1.5),
                        uniform_tensor({C}, 62)},
                    opt));
    }
  }
  SECTION("input only (frozen affine parameters)") {
    auto f = [](const Inputs& in) {
      return batch_norm(in[0], in[1], in[2], Tensor(), Tensor(), true);
    };
    expect_ok(run(f, {uniform_tensor({3, 3, 5, 4}, 63, -2, 2), fixed({3}, 64, 0.5, 1.5),
                      fixed({3}, 65)},
                  opt));
  }
}

TEST_CASE("gradcheck: batch_norm_relu (training)", "[gradcheck][ops]") {
  // BatchNorm and ReLU fused, its backward one pass family: the kinks are
  // where a normalised value is within the step of 0, which a perturbation
  // of any x of the channel moves (skipped, at most 5%).
  GradCheckOptions opt;
  opt.step = 3e-3;
  opt.skip_kinks = true;
  opt.max_skip_fraction = 0.05;
  for (const Shape& s : {Shape{5, 3}, Shape{3, 5, 3, 3}, Shape{1, 3, 7, 5}}) {
    const int64_t C = s[1];
    DYNAMIC_SECTION("x " << shape_str(s)) {
      auto f = [](const Inputs& in) {
        return batch_norm_relu(in[0], in[1], in[2], Tensor(), Tensor(), /*training=*/true);
      };
      expect_ok(run(f, {uniform_tensor(s, 93, -2, 2), uniform_tensor({C}, 94, 0.5, 1.5),
                        uniform_tensor({C}, 95, -0.5, 0.5)},
                    opt));
    }
  }
}

TEST_CASE("gradcheck: batch_norm_add_relu (training)", "[gradcheck][ops]") {
  // A residual block's end: the gradients of x, gamma, beta and the
  // residual, kinks skipped as batch_norm_relu's.
  GradCheckOptions opt;
  opt.step = 3e-3;
  opt.skip_kinks = true;
  opt.max_skip_fraction = 0.05;
  for (const Shape& s : {Shape{5, 3}, Shape{3, 5, 3, 3}}) {
    const int64_t C = s[1];
    DYNAMIC_SECTION("x " << shape_str(s)) {
      auto f = [](const Inputs& in) {
        return batch_norm_add_relu(in[0], in[3], in[1], in[2], Tensor(), Tensor(),
                                   /*training=*/true);
      };
      expect_ok(run(f, {uniform_tensor(s, 96, -2, 2), uniform_tensor({C}, 97, 0.5, 1.5),
                        uniform_tensor({C}, 98, -0.5, 0.5), uniform_tensor(s, 99, -1, 1)},
                    opt));
    }
  }
}

TEST_CASE("gradcheck: batch_norm (eval)", "[gradcheck][ops]") {
  for (const Shape& s : {Shape{3, 3}, Shape{1, 1}, Shape{3, 3, 7, 5}, Shape{1, 3, 7, 5},
                         Shape{2, 1, 3, 3}}) {
    const int64_t C = s[1];
    DYNAMIC_SECTION("x " << shape_str(s)) {
      Tensor rm = fixed({C}, 66), rv = fixed({C}, 67, 0.3, 2.0);
      auto f = [rm, rv](const Inputs& in) {
        return batch_norm(in[0], in[1], in[2], rm, rv, /*training=*/false, 0.1, 1e-5);
      };
      expect_ok(run(f, {uniform_tensor(s, 68, -2, 2), uniform_tensor({C}, 69, 0.5, 1.5),
                        uniform_tensor({C}, 70)}));
    }
  }
}

// ============================================================ losses, reductions

TEST_CASE("gradcheck: cross_entropy", "[gradcheck][ops]") {
  struct CE { int64_t n, c; std::vector<int64_t> labels; };
  const CE cases[] = {{3, 5, {0, 4, 2}},
                      {1, 7, {3}},
                      {4, 1, {0, 0, 0, 0}},
                      {6, 3, {2, 2, 0, 1, 2, 0}},
                      {5, 10, {9, 0, 5, 5, 1}}};
  for (Reduction red : {Reduction::Mean, Reduction::Sum, Reduction::None}) {
    const char* name = red == Reduction::Mean ? "mean" : red == Reduction::Sum ? "sum" : "none";
    for (const CE& c : cases)
    for (const double smoothing : {0.0, 0.25, 1.0}) {
      DYNAMIC_SECTION(name << " logits [" << c.n << ", " << c.c << "], label smoothing "
                           << smoothing) {
        Tensor labels = int_labels(c.labels);
        auto f = [labels, red, smoothing](const Inputs& in) {
          return cross_entropy(in[0], labels, red, smoothing);
        };
        expect_ok(run(f, {uniform_tensor({c.n, c.c}, 71, -3, 3)}));
      }
    }
  }
}

TEST_CASE("gradcheck: sum and mean", "[gradcheck][ops]") {
  for (const Shape& s : {Shape{}, Shape{7}, Shape{3, 5}, Shape{1, 3, 7, 5}}) {
    DYNAMIC_SECTION("sum " << shape_str(s)) {
      expect_ok(run([](const Inputs& in) { return sum(in[0]); }, {uniform_tensor(s, 72)}));
    }
    DYNAMIC_SECTION("mean " << shape_str(s)) {
      expect_ok(run([](const Inputs& in) { return mean(in[0]); }, {uniform_tensor(s, 73)}));
    }
  }
  SECTION("sum of a product") {
    auto f = [](const Inputs& in) { return sum(mul(in[0], in[1])); };
    expect_ok(run(f, {uniform_tensor({3, 5}, 74), uniform_tensor({3, 5}, 75)}));
  }
}

TEST_CASE("gradcheck: reshape and flatten", "[gradcheck][ops]") {
  SECTION("reshape with -1") {
    auto f = [](const Inputs& in) { return in[0].reshape({5, -1}); };
    expect_ok(run(f, {uniform_tensor({3, 4, 5}, 76)}));
  }
  SECTION("view to 1-D") {
    auto f = [](const Inputs& in) { return in[0].view({-1}); };
    expect_ok(run(f, {uniform_tensor({3, 1, 7, 5}, 77)}));
  }
  SECTION("flatten(1) of a pooled computed tensor") {
    auto f = [](const Inputs& in) { return avg_pool2d(in[0], 2, 2).flatten(1); };
    expect_ok(run(f, {uniform_tensor({3, 3, 7, 5}, 78)}));
  }
  SECTION("flatten(0)") {
    auto f = [](const Inputs& in) { return scale(in[0], 2.0).flatten(); };
    expect_ok(run(f, {uniform_tensor({2, 3, 5}, 79)}));
  }
  SECTION("reshape feeding mul (gradient goes back through the view)") {
    auto f = [](const Inputs& in) { return mul(in[0].reshape({6, 5}), in[1]); };
    expect_ok(run(f, {uniform_tensor({2, 3, 5}, 80), uniform_tensor({6, 5}, 81)}));
  }
}

// ============================================================ compositions

TEST_CASE("gradcheck: conv -> relu -> max_pool -> flatten -> linear -> cross_entropy",
          "[gradcheck][composition]") {
  // ReLU and max-pool kinks cannot be kept away from the step here, so kink
  // skipping is on, bounded to a few percent of the elements.
  GradCheckOptions opt;
  opt.step = 3e-3;
  opt.skip_kinks = true;
  opt.max_skip_fraction = 0.05;
  Tensor labels = int_labels({0, 3, 1});
  for (Reduction red : {Reduction::Sum, Reduction::Mean}) {
    DYNAMIC_SECTION((red == Reduction::Sum ? "sum" : "mean")) {
      auto f = [labels, red](const Inputs& in) {
        Tensor h = conv2d(in[0], in[1], in[2], 1, 1);  // [3,3,7,5]
        h = relu(h);
        h = max_pool2d(h, 2, 2);                     // [3,3,3,2]
        h = h.flatten(1);                            // [3,18]
        h = linear(h, in[3], in[4]);                 // [3,4]
        return cross_entropy(h, labels, red);
      };
      expect_ok(run(f,
                    {uniform_tensor({3, 2, 7, 5}, 82), uniform_tensor({3, 2, 3, 3}, 83, -0.5, 0.5),
                     uniform_tensor({3}, 84, -0.2, 0.2), uniform_tensor({4, 18}, 85),
                     uniform_tensor({4}, 86)},
                    opt));
    }
  }
}

TEST_CASE("gradcheck: conv -> batch_norm -> relu -> avg_pool -> global pool -> linear",
          "[gradcheck][composition]") {
  GradCheckOptions opt;
  opt.step = 3e-3;
  opt.skip_kinks = true;
  opt.max_skip_fraction = 0.05;
  Tensor labels = int_labels({1, 0, 2});
  auto f = [labels](const Inputs& in) {
    Tensor h = conv2d(in[0], in[1], Tensor(), 2, 1);  // [3,4,4,3]
    h = batch_norm(h, in[2], in[3], Tensor(), Tensor(), true);
    h = relu(h);
    h = avg_pool2d(h, 3, 1, 1);  // [3,4,4,3]
    h = add(h, in[4]);           // channel bias
    h = global_avg_pool2d(h).flatten(1);  // [3,4]
    return cross_entropy(linear(h, in[5]), labels, Reduction::Sum);
  };
  expect_ok(run(f,
                {uniform_tensor({3, 3, 7, 5}, 87), uniform_tensor({4, 3, 3, 3}, 88, -0.5, 0.5),
                 uniform_tensor({4}, 89, 0.5, 1.5), uniform_tensor({4}, 90, -0.3, 0.3),
                 uniform_tensor({4}, 91), uniform_tensor({3, 4}, 92, -2, 2)},
                opt));
}
