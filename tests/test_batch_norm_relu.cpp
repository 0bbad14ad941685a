// BatchNorm and ReLU fused (batch_norm_relu, core/ops.h): one pass forward
// that gives relu(batch_norm(x)) bit for bit, the same gradients and running
// statistics, in training and eval, float32 and bfloat16, on the CPU and on
// cuda:0 (the simulator, or a GPU where there is one); nn's Sequential and
// Residual fuse a BatchNorm2d followed by a ReLU.
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
};

// One BatchNorm (fused with ReLU or followed by it) forward and backward
// from the same inputs; dy random.
Result run(const Shape& shape, DType dtype, Device device, bool training, bool fused) {
  Generator gen(7);
  const int64_t C = shape[1];
  Tensor x = scale(Tensor::randn(shape, &gen), 2.0).to(dtype);
  Tensor gamma = Tensor::rand({C}, &gen), beta = scale(Tensor::randn({C}, &gen), 0.1);
  Tensor rm = Tensor::randn({C}, &gen), rv = add(Tensor::rand({C}, &gen), Tensor::full({C}, 0.5));
  Tensor dy = Tensor::randn(shape, &gen).to(dtype);
  x = x.to(device).detach().set_requires_grad(true);
  gamma = gamma.to(device).set_requires_grad(true);
  beta = beta.to(device).set_requires_grad(true);
  rm = rm.to(device);
  rv = rv.to(device);
  Tensor y = fused ? batch_norm_relu(x, gamma, beta, rm, rv, training)
                   : relu(batch_norm(x, gamma, beta, rm, rv, training));
  y.backward(dy.to(device));
  return {y, x.grad(), gamma.grad(), beta.grad(), rm, rv};
}

void check_fused_is_composition(Device device) {
  for (const Shape& shape : {Shape{3, 5, 7, 9}, Shape{2, 4, 8, 8}, Shape{6, 3}})
    for (DType dtype : {DType::Float32, DType::BFloat16})
      for (bool training : {true, false}) {
        INFO(device.str() << " " << shape_str(shape) << " " << dtype_name(dtype)
                          << (training ? " training" : " eval"));
        const Result fused = run(shape, dtype, device, training, true);
        const Result apart = run(shape, dtype, device, training, false);
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

}  // namespace

TEST_CASE("batch_norm_relu gives relu(batch_norm(x))'s bits and gradients on the CPU",
          "[nn][batchnorm]") {
  check_fused_is_composition(Device::cpu());
}

#if defined(ANVIL_CUDA_BACKEND)
TEST_CASE("batch_norm_relu gives relu(batch_norm(x))'s bits and gradients on cuda:0",
          "[cuda][batchnorm]") {
  if (!cuda_test::have_device()) return;
  check_fused_is_composition(Device::cuda(0));
  // And the CPU's values, within float rounding (different summation orders).
  const Result gpu = run({2, 4, 8, 8}, DType::Float32, Device::cuda(0), true, true);
  const Result cpu = run({2, 4, 8, 8}, DType::Float32, Device::cpu(), true, true);
  cuda_test::require_close(gpu.y.to_vector(), cpu.y.to_vector(), 1e-5f, 1e-5f);
  cuda_test::require_close(gpu.dx.to_vector(), cpu.dx.to_vector(), 1e-4f, 1e-5f);
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
  // relu(add(...)) at the end; the fused BatchNorm+ReLU inside: reached
  // from the add's inputs.
  REQUIRE(r.grad_fn());
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
