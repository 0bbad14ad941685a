// anvil's ops against PyTorch: tests/golden/ops_golden.json holds small
// inputs with PyTorch's forward outputs and the gradients of
// L = sum(out * R) (written by tests/golden/make_golden.py). Each case is
// rebuilt from its inputs, run through anvil, and compared elementwise with
// |got - want| <= 1e-5 + 1e-5 * |want|.
#include <catch2/catch.hpp>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "core/autograd.h"
#include "core/ops.h"
#include "core/tensor.h"
#include "tests/golden_util.h"

#ifndef ANVIL_TEST_DATA_DIR
#error "ANVIL_TEST_DATA_DIR must name the tests/ directory"
#endif

using namespace anvil;
using json = nlohmann::json;

namespace {

constexpr double kAbsTol = 1e-5;
constexpr double kRelTol = 1e-5;

const json& golden() { return anvil::testing::golden_file("ops_golden.json"); }

std::vector<const json*> cases_of(const std::string& op) {
  std::vector<const json*> out;
  for (const json& c : golden().at("cases"))
    if (c.at("op") == op) out.push_back(&c);
  return out;
}

Shape shape_of(const json& t) { return t.at("shape").get<Shape>(); }

Tensor float_tensor(const json& t, bool requires_grad = false) {
  Tensor x = Tensor::from_vector(t.at("data").get<std::vector<float>>(), shape_of(t));
  if (requires_grad) x.set_requires_grad(true);
  return x;
}

Tensor int_tensor(const json& t) {
  return Tensor::from_vector(t.at("data").get<std::vector<int64_t>>(), shape_of(t));
}

// Elementwise comparison; on failure names the first bad element and the
// largest error.
void expect_matches(const Tensor& got, const json& want, const std::string& what) {
  INFO(what);
  REQUIRE(got.defined());
  REQUIRE(shape_str(got.shape()) == shape_str(shape_of(want)));
  std::vector<float> g = got.to_vector();
  std::vector<double> w = want.at("data").get<std::vector<double>>();
  REQUIRE(g.size() == w.size());
  int64_t first_bad = -1;
  double worst = 0;
  int64_t worst_at = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    double err = std::fabs(double(g[i]) - w[i]);
    if (!(err <= kAbsTol + kRelTol * std::fabs(w[i])) && first_bad < 0) first_bad = int64_t(i);
    if (!(err <= worst)) worst = err, worst_at = int64_t(i);
  }
  std::ostringstream os;
  os.precision(9);
  if (first_bad >= 0)
    os << "first mismatch at flat index " << first_bad << ": got " << g[size_t(first_bad)]
       << ", want " << w[size_t(first_bad)] << "; ";
  os << "largest error " << worst << " at " << worst_at;
  INFO(os.str());
  CHECK(first_bad == -1);
}

// Backpropagates R from y and compares each named leaf's gradient.
void expect_grads(const Tensor& y, const json& c,
                  const std::vector<std::pair<std::string, Tensor>>& leaves) {
  REQUIRE(c.contains("grads"));
  y.backward(float_tensor(c.at("inputs").at("R")));
  for (const auto& [name, t] : leaves) {
    REQUIRE(c.at("grads").contains(name));
    expect_matches(t.grad(), c.at("grads").at(name), "gradient of " + name);
  }
}

std::string case_name(const json& c) { return c.at("name").get<std::string>(); }

}  // namespace

TEST_CASE("golden: the data file is there and complete", "[golden]") {
  const json& doc = golden();
  REQUIRE(doc.contains("cases"));
  for (const char* op : {"conv2d", "max_pool2d", "avg_pool2d", "global_avg_pool2d",
                         "cross_entropy", "batch_norm", "linear"}) {
    INFO(op);
    CHECK(cases_of(op).size() >= 2);
  }
}

TEST_CASE("golden: conv2d forward and gradients vs PyTorch", "[golden]") {
  for (const json* cp : cases_of("conv2d")) {
    const json& c = *cp;
    DYNAMIC_SECTION(case_name(c)) {
      const json& in = c.at("inputs");
      Tensor x = float_tensor(in.at("x"), true), w = float_tensor(in.at("weight"), true);
      Tensor b = in.contains("bias") ? float_tensor(in.at("bias"), true) : Tensor();
      Tensor y = conv2d(x, w, b, c.at("params").at("stride"), c.at("params").at("padding"));
      expect_matches(y, c.at("outputs").at("y"), "output");
      std::vector<std::pair<std::string, Tensor>> leaves{{"x", x}, {"weight", w}};
      if (b.defined()) leaves.emplace_back("bias", b);
      expect_grads(y, c, leaves);
    }
  }
}

TEST_CASE("golden: max_pool2d and avg_pool2d vs PyTorch", "[golden]") {
  for (const char* op : {"max_pool2d", "avg_pool2d"}) {
    for (const json* cp : cases_of(op)) {
      const json& c = *cp;
      DYNAMIC_SECTION(case_name(c)) {
        const json& p = c.at("params");
        Tensor x = float_tensor(c.at("inputs").at("x"), true);
        Tensor y = std::string(op) == "max_pool2d"
                       ? max_pool2d(x, p.at("kernel"), p.at("stride"), p.at("padding"))
                       : avg_pool2d(x, p.at("kernel"), p.at("stride"), p.at("padding"));
        expect_matches(y, c.at("outputs").at("y"), "output");
        expect_grads(y, c, {{"x", x}});
      }
    }
  }
}

TEST_CASE("golden: global_avg_pool2d vs adaptive_avg_pool2d(1)", "[golden]") {
  for (const json* cp : cases_of("global_avg_pool2d")) {
    const json& c = *cp;
    DYNAMIC_SECTION(case_name(c)) {
      Tensor x = float_tensor(c.at("inputs").at("x"), true);
      Tensor y = global_avg_pool2d(x);
      expect_matches(y, c.at("outputs").at("y"), "output");
      expect_grads(y, c, {{"x", x}});
    }
  }
}

TEST_CASE("golden: cross_entropy vs PyTorch", "[golden]") {
  for (const json* cp : cases_of("cross_entropy")) {
    const json& c = *cp;
    DYNAMIC_SECTION(case_name(c)) {
      const std::string red = c.at("params").at("reduction");
      Reduction r = red == "mean" ? Reduction::Mean : red == "sum" ? Reduction::Sum : Reduction::None;
      Tensor logits = float_tensor(c.at("inputs").at("logits"), true);
      Tensor labels = int_tensor(c.at("inputs").at("labels"));
      const double smoothing = c.at("params").value("label_smoothing", 0.0);
      Tensor y = cross_entropy(logits, labels, r, smoothing);
      expect_matches(y, c.at("outputs").at("y"), "output");
      expect_grads(y, c, {{"logits", logits}});
    }
  }
}

TEST_CASE("golden: batch_norm (train and eval) vs PyTorch", "[golden]") {
  for (const json* cp : cases_of("batch_norm")) {
    const json& c = *cp;
    DYNAMIC_SECTION(case_name(c)) {
      const json& in = c.at("inputs");
      const json& p = c.at("params");
      Tensor x = float_tensor(in.at("x"), true);
      Tensor w = float_tensor(in.at("weight"), true), b = float_tensor(in.at("bias"), true);
      Tensor rm = float_tensor(in.at("running_mean")), rv = float_tensor(in.at("running_var"));
      Tensor y = batch_norm(x, w, b, rm, rv, p.at("training").get<bool>(),
                            p.at("momentum").get<double>(), p.at("eps").get<double>());
      expect_matches(y, c.at("outputs").at("y"), "output");
      expect_matches(rm, c.at("outputs").at("running_mean"), "running_mean after the call");
      expect_matches(rv, c.at("outputs").at("running_var"), "running_var after the call");
      expect_grads(y, c, {{"x", x}, {"weight", w}, {"bias", b}});
    }
  }
}

TEST_CASE("golden: linear vs PyTorch", "[golden]") {
  for (const json* cp : cases_of("linear")) {
    const json& c = *cp;
    DYNAMIC_SECTION(case_name(c)) {
      const json& in = c.at("inputs");
      Tensor x = float_tensor(in.at("x"), true), w = float_tensor(in.at("weight"), true);
      Tensor b = in.contains("bias") ? float_tensor(in.at("bias"), true) : Tensor();
      Tensor y = linear(x, w, b);
      expect_matches(y, c.at("outputs").at("y"), "output");
      std::vector<std::pair<std::string, Tensor>> leaves{{"x", x}, {"weight", w}};
      if (b.defined()) leaves.emplace_back("bias", b);
      expect_grads(y, c, leaves);
    }
  }
}
