// BatchNorm and ReLU fused (batch_norm_relu, core/ops.h): one pass forward
// that gives relu(batch_norm(x)) bit for bit, and a training backward whose
// passes take ReLU's backward of dy as they read it, that gives the same
// gradients and running statistics, in training and eval, float32 and
// bfloat16, on the CPU and on cuda:0 (the simulator, or a GPU where there is
// one), also where outputs are exactly 0; nn's Sequential and Residual fuse
// a BatchNorm2d followed by a ReLU. The same for a residual block's end,
// batch_norm_add_relu: relu(batch_norm(x) + r)'s bits and gradients, r's
// gradient among them.
#include <catch2/catch.hpp>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/autograd.h"
#include "core/ops.h"
#include "core/random.h"
#include "nn/layers.h"
#include "tests/cuda_test_util.h"

using namespace anvil;

namespace {

bool same_bits(const Tensor& a, const Tensor& b) {
  const Tensor ha = a.to(Device::cpu()), hb = b.to(Device::cpu());
  return ha.dtype() == hb.dtype() && ha.shape() == hb.shape() &&
         std::memcmp(ha.raw_data(), hb.raw_data(), ha.nbytes()) == 0;
}

struct Result {
  Tensor y, dx, dgamma, dbeta, running_mean, running_var;
  Tensor dresidual;  // with a residual
};

// x[:, 0] = 0.75 everywhere: channel 0's batch mean is 0.75 and its
// variance 0 on every device (the CUDA kernels' shifted moments included),
// so with beta[0] = 0 its normalised values are exactly 0, ReLU's kink.
Tensor with_constant_channel0(const Tensor& x) {
  std::vector<float> v = x.to_vector();
  const int64_t C = x.size(1), inner = x.numel() / (x.size(0) * C);
  for (int64_t n = 0; n < x.size(0); ++n)
    for (int64_t i = 0; i < inner; ++i) v[(n * C) * inner + i] = 0.75f;
  return Tensor::from_vector(v, x.shape());
}

// One BatchNorm (fused with ReLU or followed by it) forward and backward
// from the same inputs; dy random. exact_zeros: channel 0's outputs are
// all exactly 0 in training (with_constant_channel0, beta[0] = 0).
// residual: a residual r is added before ReLU (batch_norm_add_relu, or
// relu(add(batch_norm(x), r)) apart).
Result run(const Shape& shape, DType dtype, Device device, bool training, bool fused,
           bool exact_zeros = false, bool residual = false) {
  Generator gen(7);
  const int64_t C = shape[1];
  Tensor x = scale(Tensor::randn(shape, &gen), 2.0);
  if (exact_zeros) x = with_constant_channel0(x);
  x = x.to(dtype);
  Tensor gamma = Tensor::rand({C}, &gen), beta = scale(Tensor::randn({C}, &gen), 0.1);
  if (exact_zeros) {
    std::vector<float> b = beta.to_vector();
    b[0] = 0.0f;
    beta = Tensor::from_vector(b, Shape{C});
  }
  Tensor rm = Tensor::randn({C}, &gen), rv = add(Tensor::rand({C}, &gen), Tensor::full({C}, 0.5));
  Tensor dy = Tensor::randn(shape, &gen).to(dtype);
  Tensor r = Tensor::randn(shape, &gen).to(dtype).to(device).set_requires_grad(true);
  x = x.to(device).detach().set_requires_grad(true);
  gamma = gamma.to(device).set_requires_grad(true);
  beta = beta.to(device).set_requires_grad(true);
  rm = rm.to(device);
  rv = rv.to(device);
  Tensor y;
  if (residual)
    y = fused ? batch_norm_add_relu(x, r, gamma, beta, rm, rv, training)
              : relu(add(batch_norm(x, gamma, beta, rm, rv, training), r));
  else
    y = fused ? batch_norm_relu(x, gamma, beta, rm, rv, training)
              : relu(batch_norm(x, gamma, beta, rm, rv, training));
  y.backward(dy.to(device));
  return {y, x.grad(), gamma.grad(), beta.grad(), rm, rv, residual ? r.grad() : Tensor()};
}

void check_fused_is_composition(Device device, bool residual = false) {
  for (const Shape& shape : {Shape{3, 5, 7, 9}, Shape{2, 4, 8, 8}, Shape{2, 3, 23, 21}, Shape{6, 3}})
    for (DType dtype : {DType::Float32, DType::BFloat16})
      for (bool training : {true, false}) {
        INFO(device.str() << " " << shape_str(shape) << " " << dtype_name(dtype)
                          << (training ? " training" : " eval")
                          << (residual ? ", with a residual" : ""));
        const Result fused = run(shape, dtype, device, training, true, false, residual);
        const Result apart = run(shape, dtype, device, training, false, false, residual);
        if (residual) CHECK(same_bits(fused.dresidual, apart.dresidual));
        CHECK(same_bits(fused.y, apart.y));
        CHECK(same_bits(fused.dx, apart.dx));
        CHECK(same_bits(fused.dgamma, apart.dgamma));
        CHECK(same_bits(fused.dbeta, apart.dbeta));
        CHECK(same_bits(fused.running_mean, apart.running_mean));
        CHECK(same_bits(fused.running_var, apart.running_var));
        // ReLU did happen: no negative output, and some zeros.
        const std::vector<float> y = fused.y.to(DType::Float32).to_vector();
        bool zero = false;
        for (float v : y) {
          REQUIRE(v >= 0.0f);
          zero |= v == 0.0f;
        }
        CHECK(zero);
      }
}

// Training with a channel whose outputs are all exactly 0 (ReLU's kink,
// where torch.relu's gradient is 0): the fused backward passes none of dy
// there, so that channel's dbeta, dgamma and dx are exactly 0 (and not
// sum(dy), as a mask of y >= 0 would give), and the rest equals the
// composition's bits. Ragged shapes: C = 5 and N*H*W = 189 (odd), [N, C].
void check_exact_zeros(Device device) {
  for (const Shape& shape : {Shape{3, 5, 7, 9}, Shape{7, 3}})
    for (DType dtype : {DType::Float32, DType::BFloat16}) {
      INFO(device.str() << " " << shape_str(shape) << " " << dtype_name(dtype));
      const Result fused = run(shape, dtype, device, true, true, true);
      const Result apart = run(shape, dtype, device, true, false, true);
      const std::vector<float> y = fused.y.to(DType::Float32).to_vector();
      const std::vector<float> dx = fused.dx.to(DType::Float32).to_vector();
      const int64_t C = shape[1], inner = fused.y.numel() / (shape[0] * C);
      for (int64_t n = 0; n < shape[0]; ++n)
        for (int64_t i = 0; i < inner; ++i) {
          REQUIRE(y[size_t(n * C * inner + i)] == 0.0f);
          REQUIRE(dx[size_t(n * C * inner + i)] == 0.0f);
        }
      CHECK(fused.dbeta.to_vector()[0] == 0.0f);
      CHECK(fused.dgamma.to_vector()[0] == 0.0f);
      bool passed = false;  // and gradient does pass in the other channels
      for (size_t i = 1; i < dx.size(); ++i) passed |= dx[i] != 0.0f;
      CHECK(passed);
      CHECK(same_bits(fused.dx, apart.dx));
      CHECK(same_bits(fused.dgamma, apart.dgamma));
      CHECK(same_bits(fused.dbeta, apart.dbeta));
    }
}

}  // namespace

TEST_CASE("batch_norm_relu gives relu(batch_norm(x))'s bits and gradients on the CPU",
          "[nn][batchnorm]") {
  check_fused_is_composition(Device::cpu());
}

TEST_CASE("batch_norm_relu's backward passes no gradient at exact zeros on the CPU",
          "[nn][batchnorm]") {
  check_exact_zeros(Device::cpu());
}

TEST_CASE("batch_norm_add_relu gives relu(batch_norm(x) + r)'s bits and gradients on the CPU",
          "[nn][batchnorm]") {
  check_fused_is_composition(Device::cpu(), true);
}

#if defined(ANVIL_CUDA_BACKEND)
TEST_CASE("batch_norm_add_relu gives relu(batch_norm(x) + r)'s bits and gradients on cuda:0, "
          "and the CPU's values",
          "[cuda][batchnorm]") {
  if (!cuda_test::have_device()) return;
  check_fused_is_composition(Device::cuda(0), true);
  for (const Shape& shape : {Shape{3, 5, 7, 9}, Shape{2, 4, 8, 8}})
    for (DType dtype : {DType::Float32, DType::BFloat16}) {
      INFO(shape_str(shape) << " " << dtype_name(dtype));
      const float tol = dtype == DType::Float32 ? 1e-4f : 1e-2f;
      const Result gpu = run(shape, dtype, Device::cuda(0), true, true, false, true);
      const Result cpu = run(shape, dtype, Device::cpu(), true, true, false, true);
      auto floats = [](const Tensor& t) { return t.to(DType::Float32).to_vector(); };
      cuda_test::require_close(floats(gpu.y), floats(cpu.y), tol, tol);
      cuda_test::require_close(floats(gpu.dx), floats(cpu.dx), tol, tol);
      cuda_test::require_close(floats(gpu.dresidual), floats(cpu.dresidual), tol, tol);
      cuda_test::require_close(gpu.dgamma.to_vector(), cpu.dgamma.to_vector(), tol, tol);
    }
}

TEST_CASE("batch_norm_relu gives relu(batch_norm(x))'s bits and gradients on cuda:0",
          "[cuda][batchnorm]") {
  if (!cuda_test::have_device()) return;
  check_fused_is_composition(Device::cuda(0));
  check_exact_zeros(Device::cuda(0));
  // And the CPU's values, within float rounding (different summation
  // orders; bfloat16: a stored y or dx may round to the neighbouring
  // bfloat16, 2^-8 relative), on a ragged shape (C = 5, N*H*W = 189) and an
  // aligned one (the kernels' 4-wide loads).
  for (const Shape& shape : {Shape{3, 5, 7, 9}, Shape{2, 4, 8, 8}})
    for (DType dtype : {DType::Float32, DType::BFloat16}) {
      INFO(shape_str(shape) << " " << dtype_name(dtype));
      const float tol = dtype == DType::Float32 ? 1e-4f : 1e-2f;
      const Result gpu = run(shape, dtype, Device::cuda(0), true, true);
      const Result cpu = run(shape, dtype, Device::cpu(), true, true);
      auto floats = [](const Tensor& t) { return t.to(DType::Float32).to_vector(); };
      cuda_test::require_close(floats(gpu.y), floats(cpu.y), tol, tol);
      cuda_test::require_close(floats(gpu.dx), floats(cpu.dx), tol, tol);
      cuda_test::require_close(gpu.dgamma.to_vector(), cpu.dgamma.to_vector(), tol, tol);
      cuda_test::require_close(gpu.dbeta.to_vector(), cpu.dbeta.to_vector(), tol, tol);
    }
}
#endif

TEST_CASE("Sequential and Residual run BatchNorm2d then ReLU as one fused op", "[nn][batchnorm]") {
  Generator gen(3);
  auto bn = std::make_shared<nn::BatchNorm2d>(4);
  nn::Sequential seq({bn, std::make_shared<nn::ReLU>()});
  Tensor x = Tensor::randn({2, 4, 5, 5}, &gen);
  Tensor y = seq(x.detach().set_requires_grad(true));
  REQUIRE(y.grad_fn());
  CHECK(y.grad_fn()->name == "BatchNormReluBackward");
  // The same as the two layers apart (the running statistics move twice:
  // compare against a second copy).
  auto bn2 = std::make_shared<nn::BatchNorm2d>(4);
  Tensor apart = relu((*bn2)(x));
  CHECK(same_bits(y, apart));
  CHECK(same_bits(bn->running_mean, bn2->running_mean));
  CHECK(bn->num_batches_tracked.to_int_vector() == std::vector<int64_t>{1});

  nn::Residual block(4, 4, false, 1, &gen);
  Tensor r = block(x.detach().set_requires_grad(true));
  // relu(bn2(conv2) + x) at the end as one op; the fused BatchNorm+ReLU
  // inside: reached from its inputs.
  REQUIRE(r.grad_fn());
  CHECK(r.grad_fn()->name == "BatchNormAddReluBackward");
  bool fused = false;
  std::vector<std::shared_ptr<Node>> todo{r.grad_fn()};
  while (!todo.empty()) {
    auto n = todo.back();
    todo.pop_back();
    fused |= n->name == "BatchNormReluBackward";
    for (const Edge& e : n->next)
      if (e.node) todo.push_back(e.node);
  }
  CHECK(fused);
}
