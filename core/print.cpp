// Tensor printing that reproduces PyTorch's repr (torch/_tensor_str.py,
// default print options: precision 4, threshold 1000, edgeitems 3,
// linewidth 80):
//   tensor([[ 1.0000, -2.5000],
//           [ 0.1250,  3.0000]], device='cuda:0', requires_grad=True)
// One number format for the whole tensor, chosen from the values that are
// printed (all of them, or the summarised edges when numel > 1000):
// integer-valued floats print as "1.", wide ranges or tiny or huge values
// switch to scientific notation; the column width comes from the nonzero
// finite values only. Rows wrap at 80 columns, and suffixes (device, dtype,
// grad_fn / requires_grad) go on a new line when they would pass it.
#include <algorithm>
#include <cmath>
#include <ostream>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "core/autograd.h"
#include "core/tensor.h"

namespace anvil {
namespace {

constexpr int64_t kSummariseAbove = 1000;  // threshold
constexpr int64_t kEdgeItems = 3;
constexpr int64_t kLineWidth = 80;

// Element values for formatting: long double holds every float32 (so every
// bfloat16) and every int64 exactly (double would round int64 values above 2^53).
using Real = long double;

struct Formatter {
  enum class Mode { Int, IntFloat, Fixed, Sci } mode = Mode::IntFloat;
  size_t width = 1;

  std::string raw(Real v) const {
    switch (mode) {
      case Mode::Int: return fmt::format("{}", int64_t(v));
      case Mode::IntFloat:
        if (std::isnan(v)) return "nan";
        if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
        return fmt::format("{:.0f}.", v);
      case Mode::Fixed:
        if (std::isnan(v)) return "nan";
        if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
        return fmt::format("{:.4f}", v);
      case Mode::Sci:
        if (std::isnan(v)) return "nan";
        if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
        return fmt::format("{:.4e}", v);
    }
    return "";
  }
  std::string operator()(Real v) const {
    std::string s = raw(v);
    return std::string(width > s.size() ? width - s.size() : 0, ' ') + s;
  }
};

// PyTorch's _Formatter over the printed values.
Formatter make_formatter(const std::vector<Real>& values, bool integral_dtype) {
  Formatter f;
  if (integral_dtype) {
    f.mode = Formatter::Mode::Int;
    for (Real v : values) f.width = std::max(f.width, f.raw(v).size());
    return f;
  }
  std::vector<Real> nz;  // nonzero finite values
  for (Real v : values)
    if (std::isfinite(v) && v != 0) nz.push_back(v);
  if (nz.empty()) return f;  // integer mode, width 1
  bool all_int = true;
  Real max_abs = 0, min_abs = INFINITY;
  for (Real v : nz) {
    if (v != std::ceil(v)) all_int = false;
    max_abs = std::max(max_abs, std::abs(v));
    min_abs = std::min(min_abs, std::abs(v));
  }
  const bool wide = max_abs / min_abs > 1000. || max_abs > 1.e8;
  if (all_int)
    f.mode = wide ? Formatter::Mode::Sci : Formatter::Mode::IntFloat;
  else
    f.mode = (wide || min_abs < 1.e-4) ? Formatter::Mode::Sci : Formatter::Mode::Fixed;
  for (Real v : nz) f.width = std::max(f.width, f.raw(v).size());
  return f;
}

struct Printer {
  const Shape& shape;
  const std::vector<int64_t>& strides;
  const std::vector<Real>& values;
  bool summarise;
  Formatter fmt_;

  // Indices printed along a dimension of the given size; -1 is the ellipsis.
  std::vector<int64_t> shown(int64_t size) const {
    std::vector<int64_t> idx;
    if (!summarise || size <= 2 * kEdgeItems) {
      for (int64_t i = 0; i < size; ++i) idx.push_back(i);
    } else {
      for (int64_t i = 0; i < kEdgeItems; ++i) idx.push_back(i);
      idx.push_back(-1);
      for (int64_t i = size - kEdgeItems; i < size; ++i) idx.push_back(i);
    }
    return idx;
  }

  // The values that will be printed (PyTorch's get_summarized_data).
  void collect(size_t d, int64_t offset, std::vector<Real>& out) const {
    if (d == shape.size()) {
      out.push_back(values[size_t(offset)]);
      return;
    }
    for (int64_t i : shown(shape[d]))
      if (i >= 0) collect(d + 1, offset + i * strides[d], out);
  }

  void print(std::ostream& os, size_t d, int64_t offset, size_t indent) const {
    if (d == shape.size()) {  // 0-d tensor
      os << fmt_(values[size_t(offset)]);
      return;
    }
    auto idx = shown(shape[d]);
    if (d + 1 == shape.size()) {  // a row: wrapped at the line width
      std::vector<std::string> items;
      for (int64_t i : idx)
        items.push_back(i < 0 ? std::string(" ...") : fmt_(values[size_t(offset + i * strides[d])]));
      const int64_t element_length = int64_t(fmt_.width) + 2;
      const size_t per_line =
          size_t(std::max<int64_t>(1, (kLineWidth - int64_t(indent)) / element_length));
      os << '[';
      for (size_t k = 0; k < items.size(); ++k) {
        if (k > 0) {
          if (k % per_line == 0)
            os << ",\n" << std::string(indent + 1, ' ');
          else
            os << ", ";
        }
        os << items[k];
      }
      os << ']';
      return;
    }
    os << '[';
    for (size_t k = 0; k < idx.size(); ++k) {
      if (k > 0) os << ',' << std::string(shape.size() - d - 1, '\n') << std::string(indent + 1, ' ');
      if (idx[k] < 0) {
        os << "...";
        continue;
      }
      print(os, d + 1, offset + idx[k] * strides[d], indent + 1);
    }
    os << ']';
  }
};

// PyTorch's _add_suffixes: ", suffix" on the last line, or on a new line
// when the line would pass the line width.
std::string add_suffixes(const std::string& body, const std::vector<std::string>& suffixes,
                         size_t indent) {
  std::string out = body;
  size_t nl = body.rfind('\n');
  // len(s) - s.rfind('\n') + 1, with rfind giving -1 when there is none.
  int64_t last_line_len =
      int64_t(body.size()) - (nl == std::string::npos ? -1 : int64_t(nl)) + 1;
  for (const std::string& s : suffixes) {
    if (last_line_len + int64_t(s.size()) + 2 > kLineWidth) {
      out += ",\n" + std::string(indent, ' ') + s;
      last_line_len = int64_t(indent + s.size());
    } else {
      out += ", " + s;
      last_line_len += int64_t(s.size()) + 2;
    }
  }
  return out + ")";
}

}  // namespace

std::string Tensor::repr() const {
  if (!defined()) return "tensor(undefined)";
  const std::string prefix = "tensor(";
  const size_t indent = prefix.size();
  std::vector<Real> values;
  Tensor host = to(Device::cpu());
  values.reserve(size_t(numel()));
  for (int64_t i = 0; i < numel(); ++i) {
    switch (dtype()) {
      case DType::Float32: values.push_back(host.data<float>()[i]); break;
      case DType::Int64: values.push_back(Real(host.data<int64_t>()[i])); break;
      case DType::UInt8: values.push_back(host.data<uint8_t>()[i]); break;
      case DType::BFloat16: values.push_back(host.data<bfloat16>()[i].to_float()); break;
    }
  }
  std::vector<std::string> suffixes;
  if (!device().is_cpu()) suffixes.push_back("device='" + device().str() + "'");
  std::ostringstream os;
  if (numel() == 0) {
    if (dim() != 1) suffixes.push_back(fmt::format("size=({})", fmt::join(shape(), ", ")));
    if (dtype() != DType::Float32)
      suffixes.push_back(fmt::format("dtype=torch.{}", dtype_name(dtype())));
    os << "[]";
  } else {
    // PyTorch names every dtype but the default float and int64.
    if (dtype() == DType::UInt8 || dtype() == DType::BFloat16)
      suffixes.push_back(fmt::format("dtype=torch.{}", dtype_name(dtype())));
    bool summarise = numel() > kSummariseAbove;
    Shape st = strides();
    Printer p{shape(), st, values, summarise, Formatter{}};
    std::vector<Real> printed;
    if (summarise) p.collect(0, 0, printed);
    const bool integral = dtype() == DType::Int64 || dtype() == DType::UInt8;
    p.fmt_ = make_formatter(summarise ? printed : values, integral);
    p.print(os, 0, 0, indent);
  }
  if (grad_fn())
    suffixes.push_back("grad_fn=<" + grad_fn()->name + ">");
  else if (requires_grad())
    suffixes.push_back("requires_grad=True");
  return add_suffixes(prefix + os.str(), suffixes, indent);
}

std::ostream& operator<<(std::ostream& os, const Tensor& t) { return os << t.repr(); }

}  // namespace anvil
