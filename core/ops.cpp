#include "core/ops.h"

#include <stdexcept>
#include <utility>

#include <fmt/format.h>

#include "core/autograd.h"
#include "core/backend.h"
#include "core/ops_util.h"
#include "core/precision.h"

namespace anvil {

using namespace ops_detail;

// ---------------------------------------------------------------- elementwise

namespace {

// Two inputs of different float dtypes meet in float32, as PyTorch promotes
// bfloat16 with float32 (the cast is differentiable).
std::pair<Tensor, Tensor> promote(const Tensor& a, const Tensor& b) {
  if (a.dtype() == b.dtype()) return {a, b};
  return {a.to(DType::Float32), b.to(DType::Float32)};
}

}  // namespace

Tensor add(const Tensor& a_in, const Tensor& b_in) {
  check_float("add", "a", a_in);
  check_float("add", "b", b_in);
  check_same_device("add", {&a_in, &b_in});
  auto [a, b] = promote(a_in, b_in);
  Tensor y = like(a);
  if (a.shape() == b.shape()) {
    backend(a).add(a, b, y);  // float32 or bfloat16, as the backends' kernels take both
    if (any_requires_grad({&a, &b}))
      record(y, "AddBackward", {&a, &b}, [](const Tensor& g) { return Grads{g, g}; });
    return y;
  }
  // Channel bias [C] over a's dim 1, or a scalar: both as [outer, C, inner].
  int64_t outer, C, inner;
  if (b.numel() == 1) {
    outer = 1, C = 1, inner = a.numel();
  } else if (b.dim() == 1 && a.dim() >= 2 && b.size(0) == a.size(1)) {
    outer = a.size(0), C = a.size(1), inner = a.numel() / std::max<int64_t>(1, outer * C);
  } else {
    throw std::invalid_argument(
        fmt::format("add: shapes {} and {} cannot be broadcast (b must match a, have one element, "
                    "or be a bias of a's dim 1)",
                    shape_str(a.shape()), shape_str(b.shape())));
  }
  Float32Io io;
  backend(a).add_channel_bias(outer, C, inner, io.in(a), io.in(b), io.out(y));
  io.finish();
  if (any_requires_grad({&a, &b})) {
    Shape b_shape = b.shape();
    const DType b_dtype = b.dtype();
    record(y, "AddBackward", {&a, &b}, [=](const Tensor& g) {
      Tensor db = Tensor::empty({C}, b_dtype, g.device());
      Float32Io io;
      backend(g).channel_sum(outer, C, inner, io.in(g), io.out(db));
      io.finish();
      return Grads{g, db.reshape(b_shape)};
    });
  }
  return y;
}

Tensor mul(const Tensor& a_in, const Tensor& b_in) {
  check_float("mul", "a", a_in);
  check_float("mul", "b", b_in);
  check_same_device("mul", {&a_in, &b_in});
  if (a_in.shape() != b_in.shape())
    throw std::invalid_argument(fmt::format("mul: shapes {} and {} differ",
                                            shape_str(a_in.shape()), shape_str(b_in.shape())));
  auto [a, b] = promote(a_in, b_in);
  Tensor y = like(a);
  backend(a).mul(a, b, y);
  if (any_requires_grad({&a, &b})) {
    Tensor sa = a.detach(), sb = b.detach();
    bool need_a = a.requires_grad(), need_b = b.requires_grad();
    record(y, "MulBackward", {&a, &b}, [=](const Tensor& g) {
      Grads out(2);
      if (need_a) backend(g).mul(g, sb, out[0] = like(g));
      if (need_b) backend(g).mul(g, sa, out[1] = like(g));
      return out;
    });
  }
  return y;
}

Tensor scale(const Tensor& x, double alpha) {
  check_float("scale", "x", x);
  Tensor y = like(x);
  backend(x).scale(float(alpha), x, y);
  if (any_requires_grad({&x}))
    record(y, "ScaleBackward", {&x}, [alpha](const Tensor& g) {
      Tensor dx = like(g);
      backend(g).scale(float(alpha), g, dx);
      return Grads{dx};
    });
  return y;
}

namespace {

// An op of core/pointwise.h: y = op(x), and a backward that reads op's
// input or output, as the op's kSaved says.
Tensor pointwise(PointwiseOp op, const Tensor& x) {
  struct Info {
    const char* name;
    const char* backward_name;
    Saved saved;
  };
  const Info info = visit_pointwise(op, [](auto o) {
    using Op = decltype(o);
    return Info{Op::kName, Op::kBackwardName, Op::kSaved};
  });
  check_float(info.name, "x", x);
  Tensor y = like(x);
  backend(x).pointwise_forward(op, x, y);
  if (any_requires_grad({&x})) {
    // The tensor itself, not the graph node holding it.
    Tensor saved = info.saved == Saved::kInput ? x.detach() : y.detach();
    record(y, info.backward_name, {&x}, [op, saved](const Tensor& g) {
      Tensor dx = like(g);
      backend(g).pointwise_backward(op, saved, g, dx);
      return Grads{dx};
    });
  }
  return y;
}

}  // namespace

Tensor relu(const Tensor& x) { return pointwise(PointwiseOp::kRelu, x); }
Tensor silu(const Tensor& x) { return pointwise(PointwiseOp::kSilu, x); }

// ---------------------------------------------------------------- matmul

// Under autocast (core/autocast.h) both run in bfloat16: bfloat16 operands,
// float32 sums (ScopedBf16Math picks the kernels), a bfloat16 output; each
// gradient in its input's dtype (amp_operand). The backends read bfloat16
// operands as they are and write outputs of either dtype (core/backend.h).
Tensor matmul(const Tensor& a_in, const Tensor& b_in) {
  check_float("matmul", "a", a_in);
  check_float("matmul", "b", b_in);
  check_rank("matmul", "a", a_in, 2);
  check_rank("matmul", "b", b_in, 2);
  check_same_device("matmul", {&a_in, &b_in});
  if (a_in.size(1) != b_in.size(0))
    throw std::invalid_argument(fmt::format("matmul: shapes {} and {} cannot be multiplied",
                                            shape_str(a_in.shape()), shape_str(b_in.shape())));
  const auto [a, b, ga, gb, amp] = amp_operands(a_in, b_in);
  const ScopedBf16Math bf16(amp);
  const DType out_dtype = amp ? DType::BFloat16 : a.dtype();
  Tensor y = Tensor::empty({a.size(0), b.size(1)}, out_dtype, a.device());
  backend(a).gemm(false, false, 1.f, a, b, 0.f, y, Tensor());
  if (any_requires_grad({&ga, &gb})) {
    Tensor sa = a.detach(), sb = b.detach();
    bool need_a = ga.requires_grad(), need_b = gb.requires_grad();
    Shape a_shape = ga.shape(), b_shape = gb.shape();
    DType a_dtype = ga.dtype(), b_dtype = gb.dtype();
    record(y, "MatmulBackward", {&ga, &gb}, [=](const Tensor& g) {
      const ScopedBf16Math bf16(amp);
      Grads out(2);
      if (need_a) {  // g b^T
        out[0] = Tensor::empty(a_shape, a_dtype, g.device());
        backend(g).gemm(false, true, 1.f, g, sb, 0.f, out[0], Tensor());
      }
      if (need_b) {  // a^T g
        out[1] = Tensor::empty(b_shape, b_dtype, g.device());
        backend(g).gemm(true, false, 1.f, sa, g, 0.f, out[1], Tensor());
      }
      return out;
    });
  }
  return y;
}

Tensor linear(const Tensor& x_in, const Tensor& w_in, const Tensor& bias) {
  check_float("linear", "input", x_in);
  check_float("linear", "weight", w_in);
  check_rank("linear", "input", x_in, 2);
  check_rank("linear", "weight", w_in, 2);
  check_same_device("linear", {&x_in, &w_in, &bias});
  if (x_in.size(1) != w_in.size(1))
    throw std::invalid_argument(
        fmt::format("linear: input {} does not match weight {} (expected input [N, {}])",
                    shape_str(x_in.shape()), shape_str(w_in.shape()), w_in.size(1)));
  int64_t N = x_in.size(0), out_features = w_in.size(0);
  if (bias.defined()) {
    check_float32("linear", "bias", bias);
    if (bias.shape() != Shape{out_features})
      throw std::invalid_argument(fmt::format("linear: bias {} does not match weight {}",
                                              shape_str(bias.shape()), shape_str(w_in.shape())));
  }
  const auto [x, w, x_graph, w_graph, amp] = amp_operands(x_in, w_in);
  const ScopedBf16Math bf16(amp);
  Tensor y = Tensor::empty({N, out_features}, amp ? DType::BFloat16 : x.dtype(), x.device());
  // The bias in float32, before the output's rounding.
  backend(x).gemm(false, true, 1.f, x, w, 0.f, y, bias);
  if (any_requires_grad({&x_graph, &w_graph, &bias})) {
    Tensor sx = x.detach(), sw = w.detach();
    bool need_x = x_graph.requires_grad(), need_w = w_graph.requires_grad();
    bool need_b = bias.defined() && bias.requires_grad();
    Shape x_shape = x_graph.shape(), w_shape = w_graph.shape();
    DType x_dtype = x_graph.dtype(), w_dtype = w_graph.dtype();
    record(y, "LinearBackward", {&x_graph, &w_graph, &bias}, [=](const Tensor& g) {
      const ScopedBf16Math bf16(amp);
      Grads out(3);
      if (need_x) {  // g w
        out[0] = Tensor::empty(x_shape, x_dtype, g.device());
        backend(g).gemm(false, false, 1.f, g, sw, 0.f, out[0], Tensor());
      }
      if (need_w) {  // g^T x
        out[1] = Tensor::empty(w_shape, w_dtype, g.device());
        backend(g).gemm(true, false, 1.f, g, sx, 0.f, out[1], Tensor());
      }
      if (need_b) {  // float32, from g of either dtype
        out[2] = Tensor::empty({out_features}, DType::Float32, g.device());
        backend(g).channel_sum(N, out_features, 1, g, out[2]);
      }
      return out;
    });
  }
  return y;
}

// ---------------------------------------------------------------- memory

void copy_rows_(const Tensor& src, int64_t src_offset, int64_t src_stride, const Tensor& dst,
                int64_t dst_offset, int64_t dst_stride, int64_t rows, int64_t width) {
  check_same_device("copy_rows_", {&src, &dst});
  if (src.dtype() != dst.dtype())
    throw std::invalid_argument(fmt::format("copy_rows_: src is {}, dst {}",
                                            dtype_name(src.dtype()), dtype_name(dst.dtype())));
  if (rows < 0 || width < 0)
    throw std::invalid_argument(
        fmt::format("copy_rows_: {} rows of {} elements", rows, width));
  if (rows == 0 || width == 0) return;
  // The last run's end, and the first's start, inside each tensor.
  auto check = [&](const char* what, const Tensor& t, int64_t offset, int64_t stride) {
    const int64_t end = offset + (rows - 1) * stride + width;
    if (offset < 0 || stride < 0 || end > t.numel())
      throw std::invalid_argument(fmt::format(
          "copy_rows_: {} rows of {} elements from {}'s element {}, {} apart, pass the end of "
          "its {} elements",
          rows, width, what, offset, stride, t.numel()));
  };
  check("src", src, src_offset, src_stride);
  check("dst", dst, dst_offset, dst_stride);
  const Tensor from = src.detach().reshape({src.numel()}).narrow(src_offset, src.numel() - src_offset);
  const Tensor to = dst.detach().reshape({dst.numel()}).narrow(dst_offset, dst.numel() - dst_offset);
  backend(src).copy_rows(from, src_stride, to, dst_stride, rows, width);
}

}  // namespace anvil
