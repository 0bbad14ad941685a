// Convolution, pooling, batch norm, losses and reductions (see core/ops.h).
#include <stdexcept>

#include <fmt/format.h>

#include "core/autograd.h"
#include "core/backend.h"
#include "core/ops.h"
#include "core/ops_util.h"
#include "core/precision.h"

namespace anvil {

using namespace ops_detail;

namespace {

void check_nchw(const char* op, const Tensor& x) {
  check_float(op, "input", x);
  if (x.dim() != 4)
    throw std::invalid_argument(
        fmt::format("{}: input must be 4-D [N, C, H, W], got shape {}", op, shape_str(x.shape())));
}

Pool2dShape pool_shape(const char* op, const Tensor& x, int64_t kernel, int64_t stride,
                       int64_t padding) {
  check_nchw(op, x);
  if (stride <= 0) stride = kernel;
  if (kernel <= 0 || padding < 0 || 2 * padding > kernel)
    throw std::invalid_argument(fmt::format(
        "{}: invalid window kernel={} stride={} padding={} (padding must be at most half the "
        "kernel)",
        op, kernel, stride, padding));
  Pool2dShape s{x.size(0), x.size(1), x.size(2), x.size(3), kernel, kernel, stride, stride,
                padding,   padding,   0,         0};
  s.P = Conv2dShape::out_size(s.H, kernel, stride, padding);
  s.Q = Conv2dShape::out_size(s.W, kernel, stride, padding);
  if (s.P <= 0 || s.Q <= 0)
    throw std::invalid_argument(fmt::format("{}: kernel {} is larger than the padded input {}",
                                            op, kernel, shape_str(x.shape())));
  return s;
}

}  // namespace

// ---------------------------------------------------------------- conv

// Under autocast (core/autocast.h) it runs in bfloat16: bfloat16 operands,
// float32 sums (ScopedBf16Math picks the kernels), the bias added in float32,
// a bfloat16 output; each gradient in its input's dtype (amp_operand). The
// backends read bfloat16 operands as they are (BF16 math, whatever the
// setting) and write y and dx in either dtype (core/backend.h).
Tensor conv2d(const Tensor& x_in, const Tensor& w_in, const Tensor& bias, int64_t stride,
              int64_t padding) {
  check_nchw("conv2d", x_in);
  check_float("conv2d", "weight", w_in);
  check_same_device("conv2d", {&x_in, &w_in, &bias});
  if (w_in.dim() != 4 || w_in.size(1) != x_in.size(1))
    throw std::invalid_argument(
        fmt::format("conv2d: weight {} does not match input {} (expected weight [K, {}, R, S])",
                    shape_str(w_in.shape()), shape_str(x_in.shape()), x_in.size(1)));
  if (stride <= 0 || padding < 0)
    throw std::invalid_argument(
        fmt::format("conv2d: invalid stride {} or padding {}", stride, padding));
  if (bias.defined()) {
    check_float32("conv2d", "bias", bias);
    if (bias.shape() != Shape{w_in.size(0)})
      throw std::invalid_argument(fmt::format("conv2d: bias {} does not match weight {}",
                                              shape_str(bias.shape()), shape_str(w_in.shape())));
  }
  Conv2dShape s{x_in.size(0), x_in.size(1), x_in.size(2), x_in.size(3), w_in.size(0),
                w_in.size(2), w_in.size(3), stride,       stride,       padding,
                padding,      0,            0};
  s.P = Conv2dShape::out_size(s.H, s.R, stride, padding);
  s.Q = Conv2dShape::out_size(s.W, s.S, stride, padding);
  if (s.P <= 0 || s.Q <= 0)
    throw std::invalid_argument(fmt::format("conv2d: kernel {} is larger than the padded input {}",
                                            shape_str(w_in.shape()), shape_str(x_in.shape())));
  const auto [x, w, x_graph, w_graph, amp] = amp_operands(x_in, w_in);
  const ScopedBf16Math bf16(amp);
  Tensor y =
      Tensor::empty({s.N, s.K, s.P, s.Q}, amp ? DType::BFloat16 : x.dtype(), x.device());
  backend(x).conv2d_forward(s, x, w, bias, y);
  if (any_requires_grad({&x_graph, &w_graph, &bias})) {
    Tensor sx = x.detach(), sw = w.detach();
    bool need_x = x_graph.requires_grad(), need_w = w_graph.requires_grad();
    bool need_b = bias.defined() && bias.requires_grad();
    DType x_dtype = x_graph.dtype(), w_dtype = w_graph.dtype();
    record(y, "Conv2dBackward", {&x_graph, &w_graph, &bias}, [=](const Tensor& g) {
      const ScopedBf16Math bf16(amp);
      Grads out(3);
      if (need_x) {
        out[0] = Tensor::empty(sx.shape(), x_dtype, g.device());
        backend(g).conv2d_backward_data(s, g, sw, out[0]);
      }
      if (need_w || need_b) {
        // dw is float32 in the backends: a bfloat16 weight (not a parameter
        // read through the cast cache, whose dw is float32) gets it rounded.
        Float32Io io;
        Tensor dw = Tensor::empty(sw.shape(), w_dtype, g.device());
        Tensor db = need_b ? Tensor::empty({s.K}, DType::Float32, g.device()) : Tensor();
        backend(g).conv2d_backward_weight(s, sx, g, io.out(dw), db);
        io.finish();
        if (need_w) out[1] = dw;
        out[2] = db;
      }
      return out;
    });
  }
  return y;
}

// ---------------------------------------------------------------- pooling

Tensor max_pool2d(const Tensor& x, int64_t kernel, int64_t stride, int64_t padding) {
  Pool2dShape s = pool_shape("max_pool2d", x, kernel, stride, padding);
  Tensor y = Tensor::empty({s.N, s.C, s.P, s.Q}, x.dtype(), x.device());
  Tensor argmax = Tensor::empty(y.shape(), DType::Int64, x.device());
  backend(x).max_pool2d_forward(s, x, y, argmax);  // float32 or bfloat16
  if (any_requires_grad({&x})) {
    Shape x_shape = x.shape();
    const DType dtype = x.dtype();
    record(y, "MaxPool2dBackward", {&x}, [=](const Tensor& g) {
      Tensor dx = Tensor::empty(x_shape, dtype, g.device());
      backend(g).max_pool2d_backward(s, g, argmax, dx);
      return Grads{dx};
    });
  }
  return y;
}

// y: of dtype y_dtype; dx: of x's.
static Tensor avg_pool(const char* op, const Tensor& x, const Pool2dShape& s, DType y_dtype) {
  Tensor y = Tensor::empty({s.N, s.C, s.P, s.Q}, y_dtype, x.device());
  backend(x).avg_pool2d_forward(s, x, y);  // float32 or bfloat16
  if (any_requires_grad({&x})) {
    Shape x_shape = x.shape();
    const DType dtype = x.dtype();
    record(y, op, {&x}, [=](const Tensor& g) {
      Tensor dx = Tensor::empty(x_shape, dtype, g.device());
      backend(g).avg_pool2d_backward(s, g, dx);
      return Grads{dx};
    });
  }
  return y;
}

Tensor avg_pool2d(const Tensor& x, int64_t kernel, int64_t stride, int64_t padding) {
  return avg_pool("AvgPool2dBackward", x, pool_shape("avg_pool2d", x, kernel, stride, padding),
                  x.dtype());
}

// A reduction: float32 out, as autocast's policy. The kernels read a
// bfloat16 input as stored and write its gradient as bfloat16 (the float32
// result rounded once), so neither needs a conversion pass.
Tensor global_avg_pool2d(const Tensor& x) {
  check_nchw("global_avg_pool2d", x);
  Pool2dShape s{x.size(0), x.size(1), x.size(2), x.size(3), x.size(2), x.size(3),
                x.size(2), x.size(3), 0,         0,         1,         1};
  return avg_pool("GlobalAvgPool2dBackward", x, s, DType::Float32);
}

// ---------------------------------------------------------------- batch norm

// A bfloat16 input (autocast) gives a bfloat16 output, read and written as
// such by the kernels; the statistics, the parameters and the running
// buffers stay float32.
namespace {

// batch_norm, with ReLU fused into its forward pass where `relu`, and a
// residual added before it where `residual` is defined (relu with it). The
// training backward then reads the saved output with dy and takes ReLU's
// backward (dy where y > 0) as it loads them, in BatchNorm's own passes,
// writing it out as the residual's gradient where there is one; the eval
// backward takes ReLU's first, as a pass of its own.
Tensor batch_norm_op(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                     const Tensor& running_mean, const Tensor& running_var, bool training,
                     double momentum, double eps, bool relu, const Tensor& residual) {
  check_float("batch_norm", "input", x);
  if (x.dim() != 2 && x.dim() != 4)
    throw std::invalid_argument(fmt::format(
        "batch_norm: input must be [N, C] or [N, C, H, W], got {}", shape_str(x.shape())));
  check_same_device("batch_norm", {&x, &gamma, &beta, &running_mean, &running_var});
  int64_t C = x.size(1);
  for (auto [t, name] : {std::pair{&gamma, "weight"}, {&beta, "bias"},
                         {&running_mean, "running_mean"}, {&running_var, "running_var"}}) {
    if (!t->defined()) continue;
    check_float32("batch_norm", name, *t);
    if (t->shape() != Shape{C})
      throw std::invalid_argument(fmt::format("batch_norm: {} has shape {}, expected [{}]", name,
                                              shape_str(t->shape()), C));
  }
  if (!gamma.defined() || !beta.defined())
    throw std::invalid_argument("batch_norm: weight and bias are required");
  if (!training && (!running_mean.defined() || !running_var.defined()))
    throw std::invalid_argument("batch_norm: eval mode needs running_mean and running_var");
  int64_t N = x.size(0), HW = x.numel() / std::max<int64_t>(1, N * C);
  if (training && N * HW < 2)
    throw std::invalid_argument(fmt::format(
        "batch_norm: expected more than 1 value per channel when training, got input {}",
        shape_str(x.shape())));

  if (residual.defined()) {
    check_float("batch_norm_add_relu", "residual", residual);
    check_same_device("batch_norm_add_relu", {&x, &residual});
    if (residual.shape() != x.shape())
      throw std::invalid_argument(fmt::format(
          "batch_norm_add_relu: residual has shape {}, the input {}",
          shape_str(residual.shape()), shape_str(x.shape())));
    // The fused pass takes both in one dtype; otherwise the three ops, which
    // promote as add() does.
    if (!training || residual.dtype() != x.dtype())
      return anvil::relu(add(batch_norm_op(x, gamma, beta, running_mean, running_var, training,
                                           momentum, eps, false, Tensor()),
                             residual));
  }
  Tensor y = like(x);
  Backend& be = backend(x);
  const char* node = residual.defined() ? "BatchNormAddReluBackward"
                     : relu             ? "BatchNormReluBackward"
                                        : "BatchNormBackward";
  // The ReLU output the backward masks dy with (undefined without relu).
  const Tensor sy = relu ? y.detach() : Tensor();
  // The eval backward's gradient: dy, or with relu ReLU's backward of it.
  auto through_relu = [relu, sy](const Tensor& g) {
    if (!relu) return g;
    Tensor dz = like(g);
    backend(g).pointwise_backward(PointwiseOp::kRelu, sy, g, dz);
    return dz;
  };
  if (training) {
    Tensor save_mean = Tensor::empty({C}, DType::Float32, x.device());
    Tensor save_invstd = Tensor::empty({C}, DType::Float32, x.device());
    be.batch_norm_forward_train(x, gamma, beta, float(eps), float(momentum), running_mean,
                                running_var, save_mean, save_invstd, y, relu, residual);
    if (any_requires_grad({&x, &gamma, &beta, &residual})) {
      Tensor sx = x.detach(), sg = gamma.detach();
      const bool residual_grad = residual.defined() && residual.requires_grad();
      record(y, node, {&x, &gamma, &beta, &residual}, [=](const Tensor& dy) {
        Tensor dx = like(dy), dgamma = like(sg), dbeta = like(sg);
        Tensor dr = residual_grad ? like(dy) : Tensor();
        backend(dy).batch_norm_backward_train(sx, sg, save_mean, save_invstd, dy, sy, dx,
                                              dgamma, dbeta, dr);
        return Grads{dx, dgamma, dbeta, dr};
      });
    }
    return y;
  }
  be.batch_norm_forward_eval(x, gamma, beta, running_mean, running_var, float(eps), y, relu);
  if (any_requires_grad({&x, &gamma, &beta})) {
    // y = gamma * xhat + beta with fixed statistics: dx = dy * gamma / std,
    // dgamma = sum(dy * xhat), dbeta = sum(dy). Both products reuse the
    // eval kernel as a per-channel affine map.
    Tensor sx = x.detach(), sg = gamma.detach(), rm = running_mean.detach(),
           rv = running_var.detach();
    record(y, relu ? "BatchNormReluEvalBackward" : "BatchNormEvalBackward", {&x, &gamma, &beta},
           [=](const Tensor& dy) {
      const Tensor g_in = through_relu(dy);
      Backend& b = backend(g_in);
      Float32Io io;
      const Tensor g = io.in(g_in);
      Tensor zeros = Tensor::zeros({C}, DType::Float32, g.device());
      Tensor ones = Tensor::ones({C}, DType::Float32, g.device());
      Tensor dx = like(g_in), xhat = like(g), prod = like(g);
      b.batch_norm_forward_eval(g, sg, zeros, zeros, rv, float(eps), io.out(dx), false);
      b.batch_norm_forward_eval(io.in(sx), ones, zeros, rm, rv, float(eps), xhat, false);
      io.finish();
      b.mul(g, xhat, prod);
      Tensor dgamma = like(sg), dbeta = like(sg);
      b.channel_sum(N, C, HW, prod, dgamma);
      b.channel_sum(N, C, HW, g, dbeta);
      return Grads{dx, dgamma, dbeta};
    });
  }
  return y;
}

}  // namespace

Tensor batch_norm(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                  const Tensor& running_mean, const Tensor& running_var, bool training,
                  double momentum, double eps) {
  return batch_norm_op(x, gamma, beta, running_mean, running_var, training, momentum, eps, false,
                       Tensor());
}

Tensor batch_norm_relu(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                       const Tensor& running_mean, const Tensor& running_var, bool training,
                       double momentum, double eps) {
  return batch_norm_op(x, gamma, beta, running_mean, running_var, training, momentum, eps, true,
                       Tensor());
}

Tensor batch_norm_add_relu(const Tensor& x, const Tensor& residual, const Tensor& gamma,
                           const Tensor& beta, const Tensor& running_mean,
                           const Tensor& running_var, bool training, double momentum,
                           double eps) {
  if (!residual.defined())
    throw std::invalid_argument("batch_norm_add_relu: the residual is undefined");
  return batch_norm_op(x, gamma, beta, running_mean, running_var, training, momentum, eps, true,
                       residual);
}

// ---------------------------------------------------------------- losses

namespace {

// A classifier's outputs: float32 logits [N, C] and int64 labels [N].
void check_logits_and_labels(const char* op, const Tensor& logits, const Tensor& labels) {
  check_float(op, "logits", logits);
  if (logits.dim() != 2)
    throw std::invalid_argument(
        fmt::format("{}: logits must be [N, C], got {}", op, shape_str(logits.shape())));
  if (labels.dtype() != DType::Int64 || labels.shape() != Shape{logits.size(0)})
    throw std::invalid_argument(fmt::format("{}: labels must be int64 [{}], got {} {}", op,
                                            logits.size(0), dtype_name(labels.dtype()),
                                            shape_str(labels.shape())));
}

}  // namespace

// Float32, as autocast's policy: the loss, the softmax kept for the
// backward pass and their arithmetic, from float32 or bfloat16 logits, which
// the kernels read as stored; dlogits has the logits' dtype.
Tensor cross_entropy(const Tensor& logits, const Tensor& labels, Reduction reduction,
                     double label_smoothing) {
  check_same_device("cross_entropy", {&logits, &labels});
  check_logits_and_labels("cross_entropy", logits, labels);
  if (!(label_smoothing >= 0.0 && label_smoothing <= 1.0))  // also rejects nan
    throw std::invalid_argument(fmt::format(
        "cross_entropy: label_smoothing must be in [0, 1], got {}", label_smoothing));
  const float smoothing = static_cast<float>(label_smoothing);
  int64_t N = logits.size(0), C = logits.size(1);
  Backend& be = backend(logits);
  // At once on the CPU; on a GPU at the device's next wait for the host
  // (Backend::check_labels), so that a training step does not wait.
  if (N > 0) be.check_labels(labels, C);
  Tensor loss = Tensor::empty({N}, DType::Float32, logits.device());
  Tensor probs = Tensor::empty(logits.shape(), DType::Float32, logits.device());
  be.softmax_cross_entropy_forward(logits, labels, smoothing, loss, probs);
  Tensor out = loss;
  // The mean's 1/N (nan for an empty batch, as in PyTorch) and its gradient
  // stay on the device: nothing here waits for the GPU.
  const double scale = reduction == Reduction::Mean ? 1.0 / double(N) : 1.0;
  if (reduction != Reduction::None) {
    out = Tensor::empty({}, DType::Float32, logits.device());
    be.sum(loss, scale, out);
  }
  if (any_requires_grad({&logits})) {
    const DType dtype = logits.dtype();
    record(out, "CrossEntropyBackward", {&logits}, [=](const Tensor& g) {
      Tensor dloss = g;
      if (reduction != Reduction::None) {
        dloss = Tensor::empty({N}, DType::Float32, g.device());
        backend(g).broadcast_scalar(g, static_cast<float>(scale), dloss);
      }
      Tensor dlogits = Tensor::empty(probs.shape(), dtype, g.device());
      backend(g).softmax_cross_entropy_backward(probs, labels, smoothing, dloss, dlogits);
      return Grads{dlogits};
    });
  }
  return out;
}

// ---------------------------------------------------------------- reductions

// Float32, as autocast's policy: a bfloat16 input is cast first.
static Tensor reduce_all(const char* op, const Tensor& x_in, bool average) {
  check_float(op, "input", x_in);
  const Tensor x = x_in.to(DType::Float32);
  // Result and gradient stay on the device. The mean of nothing is nan, as in PyTorch.
  const double scale = average ? 1.0 / double(x.numel()) : 1.0;
  Tensor y = Tensor::empty({}, DType::Float32, x.device());
  backend(x).sum(x, scale, y);
  if (any_requires_grad({&x})) {
    Shape x_shape = x.shape();
    record(y, average ? "MeanBackward" : "SumBackward", {&x}, [=](const Tensor& g) {
      Tensor dx = Tensor::empty(x_shape, DType::Float32, g.device());
      backend(g).broadcast_scalar(g, static_cast<float>(scale), dx);
      return Grads{dx};
    });
  }
  return y;
}

Tensor sum(const Tensor& x) { return reduce_all("sum", x, false); }
Tensor mean(const Tensor& x) { return reduce_all("mean", x, true); }

Tensor argmax_rows(const Tensor& x) {
  check_float("argmax_rows", "input", x);
  if (x.dim() != 2)
    throw std::invalid_argument(
        fmt::format("argmax_rows: input must be 2-D, got {}", shape_str(x.shape())));
  Tensor host = x.to(DType::Float32).to(Device::cpu());
  int64_t N = x.size(0), C = x.size(1);
  Tensor out = Tensor::empty({N}, DType::Int64);
  const float* p = host.data<float>();
  int64_t* o = out.data<int64_t>();
  for (int64_t i = 0; i < N; ++i) {
    int64_t best = 0;
    for (int64_t c = 1; c < C; ++c)
      if (p[i * C + c] > p[i * C + best]) best = c;
    o[i] = best;
  }
  return out;
}

void add_int64_(const Tensor& counter, int64_t value) {
  if (counter.dtype() != DType::Int64)
    throw std::invalid_argument(
        fmt::format("add_int64_: counter must be int64, got {}", dtype_name(counter.dtype())));
  backend(counter).add_scalar_int64(counter, value);
}

void add_scaled_(const Tensor& total, const Tensor& x, double alpha) {
  check_float32("add_scaled_", "total", total);
  check_float32("add_scaled_", "x", x);
  check_same_device("add_scaled_", {&total, &x});
  if (total.shape() != x.shape())
    throw std::invalid_argument(fmt::format("add_scaled_: total is {} but x is {}",
                                            shape_str(total.shape()), shape_str(x.shape())));
  backend(total).axpy(static_cast<float>(alpha), x, total);
}

void count_correct_(const Tensor& counter, const Tensor& logits, const Tensor& labels) {
  check_same_device("count_correct_", {&counter, &logits, &labels});
  check_logits_and_labels("count_correct_", logits, labels);
  if (logits.size(1) < 1)
    throw std::invalid_argument(fmt::format("count_correct_: logits {} have no classes",
                                            shape_str(logits.shape())));
  if (!counter.defined()) throw std::invalid_argument("count_correct_: counter is undefined");
  if (counter.dtype() != DType::Int64 || counter.numel() != 1)
    throw std::invalid_argument(fmt::format("count_correct_: counter must be one int64, got {} {}",
                                            dtype_name(counter.dtype()),
                                            shape_str(counter.shape())));
  backend(logits).count_correct(logits, labels, counter);
}

}  // namespace anvil
