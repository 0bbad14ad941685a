#include "core/ops.h"

#include <stdexcept>

#include <fmt/format.h>

#include "core/autograd.h"
#include "core/backend.h"
#include "core/ops_util.h"

namespace anvil {

using namespace ops_detail;

// ---------------------------------------------------------------- elementwise

Tensor add(const Tensor& a, const Tensor& b) {
  check_float("add", "a", a);
  check_float("add", "b", b);
  check_same_device("add", {&a, &b});
  Tensor y = like(a);
  if (a.shape() == b.shape()) {
    backend(a).add(a, b, y);
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
  backend(a).add_channel_bias(outer, C, inner, a, b, y);
  if (any_requires_grad({&a, &b})) {
    Shape b_shape = b.shape();
    record(y, "AddBackward", {&a, &b}, [=](const Tensor& g) {
      Tensor db = Tensor::empty({C}, DType::Float32, g.device());
      backend(g).channel_sum(outer, C, inner, g, db);
      return Grads{g, db.reshape(b_shape)};
    });
  }
  return y;
}

Tensor mul(const Tensor& a, const Tensor& b) {
  check_float("mul", "a", a);
  check_float("mul", "b", b);
  check_same_device("mul", {&a, &b});
  if (a.shape() != b.shape())
    throw std::invalid_argument(fmt::format("mul: shapes {} and {} differ", shape_str(a.shape()),
                                            shape_str(b.shape())));
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

Tensor relu(const Tensor& x) {
  check_float("relu", "x", x);
  Tensor y = like(x);
  backend(x).relu_forward(x, y);
  if (any_requires_grad({&x})) {
    Tensor saved = y.detach();  // the output, not the graph node holding it
    record(y, "ReluBackward", {&x}, [saved](const Tensor& g) {
      Tensor dx = like(g);
      backend(g).relu_backward(saved, g, dx);
      return Grads{dx};
    });
  }
  return y;
}

namespace {

// An op of kernels/pointwise.h: y = op(x), and a backward that reads op's
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

Tensor silu(const Tensor& x) { return pointwise(PointwiseOp::kSilu, x); }

// ---------------------------------------------------------------- matmul

Tensor matmul(const Tensor& a, const Tensor& b) {
  check_float("matmul", "a", a);
  check_float("matmul", "b", b);
  check_rank("matmul", "a", a, 2);
  check_rank("matmul", "b", b, 2);
  check_same_device("matmul", {&a, &b});
  if (a.size(1) != b.size(0))
    throw std::invalid_argument(fmt::format("matmul: shapes {} and {} cannot be multiplied",
                                            shape_str(a.shape()), shape_str(b.shape())));
  Tensor y = Tensor::empty({a.size(0), b.size(1)}, DType::Float32, a.device());
  backend(a).gemm(false, false, 1.f, a, b, 0.f, y);
  if (any_requires_grad({&a, &b})) {
    Tensor sa = a.detach(), sb = b.detach();
    bool need_a = a.requires_grad(), need_b = b.requires_grad();
    record(y, "MatmulBackward", {&a, &b}, [=](const Tensor& g) {
      Grads out(2);
      if (need_a) backend(g).gemm(false, true, 1.f, g, sb, 0.f, out[0] = like(sa));  // g b^T
      if (need_b) backend(g).gemm(true, false, 1.f, sa, g, 0.f, out[1] = like(sb));  // a^T g
      return out;
    });
  }
  return y;
}

Tensor linear(const Tensor& x, const Tensor& w, const Tensor& bias) {
  check_float("linear", "input", x);
  check_float("linear", "weight", w);
  check_rank("linear", "input", x, 2);
  check_rank("linear", "weight", w, 2);
  check_same_device("linear", {&x, &w, &bias});
  if (x.size(1) != w.size(1))
    throw std::invalid_argument(
        fmt::format("linear: input {} does not match weight {} (expected input [N, {}])",
                    shape_str(x.shape()), shape_str(w.shape()), w.size(1)));
  int64_t N = x.size(0), out_features = w.size(0);
  if (bias.defined()) {
    check_float("linear", "bias", bias);
    if (bias.shape() != Shape{out_features})
      throw std::invalid_argument(fmt::format("linear: bias {} does not match weight {}",
                                              shape_str(bias.shape()), shape_str(w.shape())));
  }
  Tensor y = Tensor::empty({N, out_features}, DType::Float32, x.device());
  Backend& be = backend(x);
  be.gemm(false, true, 1.f, x, w, 0.f, y);
  if (bias.defined()) be.add_channel_bias(N, out_features, 1, y, bias, y);  // in place
  if (any_requires_grad({&x, &w, &bias})) {
    Tensor sx = x.detach(), sw = w.detach();
    bool need_x = x.requires_grad(), need_w = w.requires_grad();
    bool need_b = bias.defined() && bias.requires_grad();
    record(y, "LinearBackward", {&x, &w, &bias}, [=](const Tensor& g) {
      Grads out(3);
      if (need_x) backend(g).gemm(false, false, 1.f, g, sw, 0.f, out[0] = like(sx));  // g w
      if (need_w) backend(g).gemm(true, false, 1.f, g, sx, 0.f, out[1] = like(sw));   // g^T x
      if (need_b) {
        out[2] = Tensor::empty({out_features}, DType::Float32, g.device());
        backend(g).channel_sum(N, out_features, 1, g, out[2]);
      }
      return out;
    });
  }
  return y;
}

}  // namespace anvil
