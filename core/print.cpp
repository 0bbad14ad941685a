// Tensor printing in the style of PyTorch's repr:
//   tensor([[ 1.0000, -2.5000],
//           [ 0.1250,  3.0000]], device='cuda:0', requires_grad=True)
// One number format for the whole tensor (integer-valued floats print as
// "1.", wide ranges switch to scientific notation), large tensors are
// summarised with "..." keeping three items at each end of every dimension.
#include <algorithm>
#include <cmath>
#include <ostream>
#include <sstream>

#include <fmt/format.h>

#include "core/autograd.h"
#include "core/tensor.h"

namespace anvil {
namespace {

constexpr int64_t kSummariseAbove = 1000;
constexpr int64_t kEdgeItems = 3;

struct Formatter {
  enum class Mode { Int, IntFloat, Fixed, Sci } mode = Mode::Fixed;
  size_t width = 1;

  std::string raw(double v) const {
    if (std::isnan(v)) return "nan";
    if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
    switch (mode) {
      case Mode::Int: return fmt::format("{}", int64_t(v));
      case Mode::IntFloat: return fmt::format("{}.", int64_t(v));
      case Mode::Fixed: return fmt::format("{:.4f}", v);
      case Mode::Sci: return fmt::format("{:.4e}", v);
    }
    return "";
  }
  std::string operator()(double v) const {
    std::string s = raw(v);
    return std::string(width > s.size() ? width - s.size() : 0, ' ') + s;
  }
};

Formatter make_formatter(const std::vector<double>& values, bool integral_dtype) {
  Formatter f;
  if (integral_dtype) {
    f.mode = Formatter::Mode::Int;
  } else {
    bool all_int = true;
    double max_abs = 0, min_abs = INFINITY;
    for (double v : values) {
      if (!std::isfinite(v)) continue;
      if (v != std::floor(v)) all_int = false;
      max_abs = std::max(max_abs, std::abs(v));
      if (v != 0) min_abs = std::min(min_abs, std::abs(v));
    }
    if (all_int && max_abs < 1e8)
      f.mode = Formatter::Mode::IntFloat;
    else if (max_abs >= 1e8 || (min_abs < 1e-4) || (min_abs > 0 && max_abs / min_abs > 1000))
      f.mode = Formatter::Mode::Sci;
  }
  for (double v : values) f.width = std::max(f.width, f.raw(v).size());
  return f;
}

struct Printer {
  const Shape& shape;
  const std::vector<int64_t>& strides;
  const std::vector<double>& values;
  bool summarise;
  Formatter fmt_;

  // Indices printed along a dimension of the given size.
  std::vector<int64_t> shown(int64_t size) const {
    std::vector<int64_t> idx;
    if (!summarise || size <= 2 * kEdgeItems) {
      for (int64_t i = 0; i < size; ++i) idx.push_back(i);
    } else {
      for (int64_t i = 0; i < kEdgeItems; ++i) idx.push_back(i);
      idx.push_back(-1);  // the ellipsis
      for (int64_t i = size - kEdgeItems; i < size; ++i) idx.push_back(i);
    }
    return idx;
  }

  void print(std::ostream& os, size_t d, int64_t offset, size_t indent) const {
    if (d == shape.size()) {
      os << fmt_(values[size_t(offset)]);
      return;
    }
    os << '[';
    auto idx = shown(shape[d]);
    for (size_t k = 0; k < idx.size(); ++k) {
      if (k > 0) {
        if (d + 1 == shape.size()) {
          os << ", ";
        } else {
          os << ',' << std::string(shape.size() - d - 1, '\n') << std::string(indent + 1, ' ');
        }
      }
      if (idx[k] < 0) {
        os << "...";
        continue;
      }
      print(os, d + 1, offset + idx[k] * strides[d], indent + 1);
    }
    os << ']';
  }
};

}  // namespace

std::string Tensor::repr() const {
  if (!defined()) return "tensor(undefined)";
  std::vector<double> values;
  Tensor host = to(Device::cpu());
  values.reserve(size_t(numel()));
  for (int64_t i = 0; i < numel(); ++i) {
    switch (dtype()) {
      case DType::Float32: values.push_back(host.data<float>()[i]); break;
      case DType::Int64: values.push_back(double(host.data<int64_t>()[i])); break;
      case DType::UInt8: values.push_back(host.data<uint8_t>()[i]); break;
    }
  }
  std::ostringstream os;
  os << "tensor(";
  if (numel() == 0) {
    os << "[]";
  } else {
    bool summarise = numel() > kSummariseAbove;
    Shape st = strides();
    // The format is chosen from the values that are printed, as PyTorch does.
    Printer p{shape(), st, values, summarise, make_formatter(values, dtype() != DType::Float32)};
    p.print(os, 0, 0, 7);
  }
  if (numel() == 0 && dim() > 1) os << fmt::format(", size=({})", fmt::join(shape(), ", "));
  if (!device().is_cpu()) os << ", device='" << device().str() << "'";
  if (dtype() == DType::UInt8) os << ", dtype=torch.uint8";
  if (grad_fn())
    os << ", grad_fn=<" << grad_fn()->name << ">";
  else if (requires_grad())
    os << ", requires_grad=True";
  os << ')';
  return os.str();
}

std::ostream& operator<<(std::ostream& os, const Tensor& t) { return os << t.repr(); }

}  // namespace anvil
