// Finite-difference gradient checker for anvil ops, in the manner of Caffe's
// GradientChecker.
//
// Given f(inputs) -> Tensor (any shape), the checker forms the scalar
//   L(inputs) = sum(f(inputs) * R)
// with a fixed random tensor R (every output element gets its own weight),
// backpropagates R through f to get the analytic gradient of L for every
// input with requires_grad, and compares each element with the central
// difference (L(x+h) - L(x-h)) / (2h). L is evaluated in double from the
// float32 outputs read back to the host, and the step is measured as the
// float32 values actually stored (x+h and x-h rounded), so the numeric
// estimate carries no avoidable rounding error.
//
// An element passes when |analytic - numeric| <= threshold * max(|analytic|,
// |numeric|, scale_floor), as in Caffe (which fixes scale_floor at 1).
//
// Kinks (ReLU at 0, a max-pool window whose maximum changes): the tests
// generate inputs that keep every kink more than h away (away_from_zero,
// distinct_values), and for compositions where that cannot be controlled
// the checker can skip a failing element whose error is explained by a kink:
// a piecewise-linear kink inside (x-h, x+h) makes the two one-sided slopes
// (L(x+h)-L(x))/h and (L(x)-L(x-h))/h differ by twice the central-difference
// error, while a wrong analytic gradient on a smooth function leaves them
// equal. Skipped elements are counted, and the check fails when more than
// max_skip_fraction of them are skipped.
//
// Header-only: tests/CMakeLists.txt compiles tests/test_*.cpp and main.cpp.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <numeric>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/autograd.h"
#include "core/random.h"
#include "core/tensor.h"

namespace anvil::test {

using GradFn = std::function<Tensor(const std::vector<Tensor>&)>;

struct GradCheckOptions {
  double step = 1e-2;          // h
  double threshold = 1e-2;     // relative tolerance
  // Tolerance is threshold * max(|a|, |n|, scale_floor). Caffe uses 1; 0.1
  // keeps small gradients (a mean over many elements) meaningful while staying
  // well above the float32 noise of the numeric estimate (~1e-4 at most here).
  double scale_floor = 0.1;
  bool skip_kinks = false;     // skip failing elements explained by a kink
  double max_skip_fraction = 0.0;
  uint64_t seed = 20240611;    // for R
};

struct GradCheckFailure {
  size_t input = 0;
  int64_t index = 0;  // flat index into the input
  Shape input_shape;
  double analytic = 0, numeric = 0, tolerance = 0;
};

struct GradCheckResult {
  bool ok = true;
  int64_t checked = 0;   // elements compared
  int64_t skipped = 0;   // elements skipped as kinks
  int64_t failed = 0;
  double worst_ratio = 0;  // max |a-n| / tolerance over checked elements
  GradCheckFailure worst;  // the element with worst_ratio
  std::vector<GradCheckFailure> failures;  // the first few
  std::string message;     // human-readable summary (details on failure)
};

namespace detail {

inline std::string index_str(const Shape& shape, int64_t flat) {
  std::vector<int64_t> idx(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    int64_t s = shape[d] > 0 ? shape[d] : 1;
    idx[d] = flat % s;
    flat /= s;
  }
  std::ostringstream os;
  os << '[';
  for (size_t d = 0; d < idx.size(); ++d) os << (d ? ", " : "") << idx[d];
  os << ']';
  return os.str();
}

inline std::string describe(const GradCheckFailure& f) {
  std::ostringstream os;
  os.precision(9);
  os << "input " << f.input << " (shape " << shape_str(f.input_shape) << ") element " << f.index
     << ' ' << index_str(f.input_shape, f.index) << ": analytic " << f.analytic << ", numeric "
     << f.numeric << ", |diff| " << std::fabs(f.analytic - f.numeric) << ", tolerance "
     << f.tolerance;
  return os.str();
}

inline std::vector<double> host_values(const Tensor& t) {
  std::vector<float> v = t.to_vector();
  return std::vector<double>(v.begin(), v.end());
}

inline double weighted_sum(const Tensor& y, const std::vector<double>& r) {
  std::vector<double> v = host_values(y);
  if (v.size() != r.size())
    throw std::logic_error("gradcheck: output size changed between evaluations");
  double s = 0;
  for (size_t i = 0; i < v.size(); ++i) s += v[i] * r[i];
  return s;
}

}  // namespace detail

// Checks the gradients of every input of f that requires grad. The inputs
// must be float32 CPU leaves for those that require grad (the checker
// perturbs their elements in place and restores them).
inline GradCheckResult check_gradients(const GradFn& f, std::vector<Tensor> inputs,
                                       const GradCheckOptions& opt = {}) {
  GradCheckResult res;
  std::vector<size_t> checked_inputs;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& t = inputs[i];
    if (!t.defined() || !t.requires_grad()) continue;
    if (!t.is_leaf() || t.dtype() != DType::Float32 || !t.device().is_cpu())
      throw std::invalid_argument("gradcheck: inputs requiring grad must be float32 CPU leaves");
    checked_inputs.push_back(i);
  }
  if (checked_inputs.empty())
    throw std::invalid_argument("gradcheck: no input requires grad");

  // Reference evaluation (no graph) fixes the output shape and R.
  Tensor y0;
  {
    NoGradGuard ng;
    y0 = f(inputs);
  }
  Generator gen(opt.seed);
  std::vector<double> r(size_t(y0.numel()));
  std::vector<float> rf(r.size());
  for (size_t i = 0; i < r.size(); ++i) {
    rf[i] = 2.f * gen.uniform() - 1.f;  // weights in [-1, 1)
    r[i] = rf[i];
  }
  const double L0 = detail::weighted_sum(y0, r);

  // Analytic gradients: backward with d(output) = R.
  for (size_t i : checked_inputs) inputs[i].zero_grad();
  Tensor y = f(inputs);
  if (y.shape() != y0.shape())
    throw std::logic_error("gradcheck: f returned different shapes with and without grad mode");
  if (!y.requires_grad())
    throw std::logic_error("gradcheck: the output of f does not require grad");
  {
    // f must be deterministic (e.g. no batch-norm running statistics that
    // change between calls and feed back into the output).
    std::vector<double> a = detail::host_values(y), b = detail::host_values(y0);
    for (size_t i = 0; i < a.size(); ++i)
      if (!(std::fabs(a[i] - b[i]) <= 1e-6 * (1 + std::fabs(b[i]))))
        throw std::logic_error("gradcheck: f is not deterministic (output element " +
                               std::to_string(i) + " changed between calls)");
  }
  y.backward(Tensor::from_vector(rf, y.shape()));
  std::vector<std::vector<double>> analytic;
  for (size_t i : checked_inputs) {
    Tensor g = inputs[i].grad();
    if (g.defined() && g.shape() != inputs[i].shape())
      throw std::logic_error("gradcheck: gradient of input " + std::to_string(i) + " has shape " +
                             shape_str(g.shape()) + ", expected " +
                             shape_str(inputs[i].shape()));
    // No gradient at all reads as zeros: correct only if L does not depend on it.
    analytic.push_back(g.defined() ? detail::host_values(g)
                                   : std::vector<double>(size_t(inputs[i].numel()), 0.0));
    inputs[i].zero_grad();
  }

  // Numeric gradients.
  NoGradGuard ng;
  for (size_t k = 0; k < checked_inputs.size(); ++k) {
    size_t i = checked_inputs[k];
    float* p = inputs[i].data<float>();
    for (int64_t j = 0; j < inputs[i].numel(); ++j) {
      const float orig = p[j];
      const float xp = float(double(orig) + opt.step), xm = float(double(orig) - opt.step);
      p[j] = xp;
      const double Lp = detail::weighted_sum(f(inputs), r);
      p[j] = xm;
      const double Lm = detail::weighted_sum(f(inputs), r);
      p[j] = orig;
      const double numeric = (Lp - Lm) / (double(xp) - double(xm));
      const double a = analytic[k][size_t(j)];
      const double tol =
          opt.threshold * std::max({std::fabs(a), std::fabs(numeric), opt.scale_floor});
      const double err = std::fabs(a - numeric);
      GradCheckFailure info{i, j, inputs[i].shape(), a, numeric, tol};
      bool pass = err <= tol;  // false for NaN
      if (!pass && opt.skip_kinks && std::isfinite(err)) {
        const double sp = (Lp - L0) / (double(xp) - double(orig));
        const double sm = (L0 - Lm) / (double(orig) - double(xm));
        if (err <= std::fabs(sp - sm)) {
          ++res.skipped;
          continue;
        }
      }
      ++res.checked;
      const double ratio = std::isfinite(err) ? err / tol : INFINITY;
      if (res.checked == 1 || ratio > res.worst_ratio) {
        res.worst_ratio = ratio;
        res.worst = info;
      }
      if (!pass) {
        ++res.failed;
        if (res.failures.size() < 8) res.failures.push_back(info);
      }
    }
  }

  const int64_t total = res.checked + res.skipped;
  const bool too_many_skips = double(res.skipped) > opt.max_skip_fraction * double(total);
  res.ok = res.failed == 0 && !too_many_skips;
  std::ostringstream os;
  os << "gradcheck: " << res.checked << " elements checked, " << res.skipped
     << " skipped as kinks, " << res.failed << " failed (h=" << opt.step
     << ", threshold=" << opt.threshold << ")";
  if (too_many_skips)
    os << "\n  too many kink skips: " << res.skipped << " of " << total << " (allowed fraction "
       << opt.max_skip_fraction << ")";
  if (res.checked > 0)
    os << "\n  worst (|diff|/tolerance = " << res.worst_ratio
       << "): " << detail::describe(res.worst);
  for (const auto& fl : res.failures) os << "\n  FAIL " << detail::describe(fl);
  res.message = os.str();
  return res;
}

// ---- input generators (deterministic, from a seed) ----

// Uniform in [lo, hi).
inline Tensor uniform_tensor(const Shape& shape, uint64_t seed, double lo = -1, double hi = 1,
                             bool requires_grad = true) {
  Generator g(seed);
  std::vector<float> v(size_t(shape_numel(shape)));
  for (auto& x : v) x = float(lo + (hi - lo) * g.uniform());
  Tensor t = Tensor::from_vector(v, shape);
  if (requires_grad) t.set_requires_grad(true);
  return t;
}

// Random signs, magnitudes in [margin, margin + 1): no element within
// margin of zero (ReLU kinks).
inline Tensor away_from_zero(const Shape& shape, uint64_t seed, double margin,
                             bool requires_grad = true) {
  Generator g(seed);
  std::vector<float> v(size_t(shape_numel(shape)));
  for (auto& x : v) {
    float mag = float(margin + g.uniform());
    x = g.uniform() < 0.5f ? -mag : mag;
  }
  Tensor t = Tensor::from_vector(v, shape);
  if (requires_grad) t.set_requires_grad(true);
  return t;
}

// A random permutation of distinct values spaced `gap` apart (centred on
// zero): every pooling window has a unique maximum that stays unique under
// a perturbation smaller than gap / 2.
inline Tensor distinct_values(const Shape& shape, uint64_t seed, double gap,
                              bool requires_grad = true) {
  const size_t n = size_t(shape_numel(shape));
  std::vector<int64_t> perm(n);
  std::iota(perm.begin(), perm.end(), 0);
  Generator g(seed);
  for (size_t i = n; i > 1; --i) std::swap(perm[i - 1], perm[g.next_u64() % i]);
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = float((double(perm[i]) - double(n) / 2) * gap);
  Tensor t = Tensor::from_vector(v, shape);
  if (requires_grad) t.set_requires_grad(true);
  return t;
}

}  // namespace anvil::test
