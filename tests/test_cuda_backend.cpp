// The CUDA backend through the op layer: every op, forward and backward
// (through autograd), on cuda:0 against the CPU backend on ragged shapes;
// BatchNorm's batch counter on the device; LeNet training steps on cuda:0
// against the CPU; copies between cpu, cuda:0 and cuda:1; cross-device errors; the caching allocator's figures and its
// out-of-memory message. Runs on the simulator (ANVIL_CUDA=SIM) or a real GPU.
#if defined(ANVIL_CUDA_BACKEND)
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "core/precision.h"
#include "tests/tensor_util.h"
#include "core/autograd.h"
#include "core/ops.h"
#include "core/random.h"
#include "core/storage.h"
#include "core/tensor.h"
#include "nn/layers.h"
#include "nn/models.h"
#include "nn/optim.h"
#include "tests/cuda_test_util.h"

using namespace anvil;
using anvil::test::uniform;
using Catch::Matchers::Contains;

namespace {

const Device kGpu = Device::cuda(0);

// A copy of t on `device` that is a fresh autograd leaf.
Tensor leaf_on(const Tensor& t, Device device, bool requires_grad) {
  Tensor out = t.detach().to(device).clone();
  out.set_requires_grad(requires_grad);
  return out;
}

void require_close(const Tensor& got, const Tensor& want, double rtol, double atol,
                   const std::string& what) {
  INFO(what);
  REQUIRE(got.device() == kGpu);
  REQUIRE(got.shape() == want.shape());
  REQUIRE(got.dtype() == want.dtype());
  if (want.dtype() != DType::Float32) {
    REQUIRE(got.to_int_vector() == want.to_int_vector());
    return;
  }
  cuda_test::require_close(got.to_vector(), want.to_vector(), float(rtol), float(atol));
}

using OpFn = std::function<Tensor(const std::vector<Tensor>&)>;

// Runs f on CPU copies and on cuda:0 copies of the inputs, then backward from
// sum(y * r) for a fixed random r, and compares y and every input gradient.
void compare_op(const std::string& name, const OpFn& f, const std::vector<Tensor>& inputs,
                const std::vector<bool>& differentiable, double rtol = 1e-4,
                double atol = 1e-5) {
  std::vector<Tensor> cpu_in, gpu_in;
  for (size_t i = 0; i < inputs.size(); ++i) {
    bool grad = i < differentiable.size() && differentiable[i];
    cpu_in.push_back(leaf_on(inputs[i], Device::cpu(), grad));
    gpu_in.push_back(leaf_on(inputs[i], kGpu, grad));
  }
  Tensor y_cpu = f(cpu_in), y_gpu = f(gpu_in);
  require_close(y_gpu, y_cpu, rtol, atol, name + ": forward");
  if (!y_cpu.requires_grad()) return;
  Tensor r = uniform(y_cpu.shape(), 99);
  sum(mul(y_cpu, r)).backward();
  sum(mul(y_gpu, r.to(kGpu))).backward();
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!cpu_in[i].requires_grad()) continue;
    REQUIRE(gpu_in[i].grad().defined());
    require_close(gpu_in[i].grad(), cpu_in[i].grad(), rtol, atol,
                  name + ": gradient of input " + std::to_string(i));
  }
}

}  // namespace

TEST_CASE("cuda ops: elementwise, matrix products and reductions match the CPU",
          "[cuda][ops][tsan]") {
  if (!cuda_test::have_device()) return;
  SECTION("add, mul, scale, relu, silu") {
    Tensor a = uniform({3, 5, 7}, 1), b = uniform({3, 5, 7}, 2);
    compare_op("add", [](auto& in) { return add(in[0], in[1]); }, {a, b}, {true, true});
    compare_op("add scalar", [](auto& in) { return add(in[0], in[1]); },
               {a, Tensor::full({}, 0.25)}, {true, true});
    compare_op("add channel bias", [](auto& in) { return add(in[0], in[1]); },
               {a, uniform({5}, 3)}, {true, true});
    compare_op("mul", [](auto& in) { return mul(in[0], in[1]); }, {a, b}, {true, true});
    compare_op("scale", [](auto& in) { return scale(in[0], -1.5); }, {a}, {true});
    compare_op("relu", [](auto& in) { return relu(in[0]); }, {a}, {true});
    compare_op("silu", [](auto& in) { return silu(in[0]); }, {scale(a, 6.0)}, {true});
  }
  SECTION("matmul and linear") {
    compare_op("matmul", [](auto& in) { return matmul(in[0], in[1]); },
               {uniform({5, 7}, 4), uniform({7, 3}, 5)}, {true, true});
    compare_op("linear", [](auto& in) { return linear(in[0], in[1], in[2]); },
               {uniform({4, 9}, 6), uniform({6, 9}, 7), uniform({6}, 8)}, {true, true, true});
    compare_op("linear without bias", [](auto& in) { return linear(in[0], in[1]); },
               {uniform({1, 33}, 9), uniform({10, 33}, 10)}, {true, true});
  }
  SECTION("sum, mean, argmax_rows") {
    compare_op("sum", [](auto& in) { return sum(in[0]); }, {uniform({4097}, 11)}, {true}, 1e-4,
               1e-3);
    compare_op("mean", [](auto& in) { return mean(in[0]); }, {uniform({3, 11}, 12)}, {true});
    Tensor x = uniform({6, 10}, 13);
    CHECK(argmax_rows(x.to(kGpu)).to_int_vector() == argmax_rows(x).to_int_vector());
  }
}

TEST_CASE("cuda ops: convolution and pooling match the CPU", "[cuda][ops][tsan]") {
  if (!cuda_test::have_device()) return;
  // FP32 on both devices (cuda:0 would take TF32 convolutions by default):
  // the tolerances here are FP32's.
  const ScopedFp32Precision fp32(Fp32Precision::kIeee);
  SECTION("conv2d, stride 1, padding 1, bias") {
    compare_op("conv2d", [](auto& in) { return conv2d(in[0], in[1], in[2], 1, 1); },
               {uniform({2, 3, 7, 6}, 20), uniform({5, 3, 3, 3}, 21), uniform({5}, 22)},
               {true, true, true});
  }
  SECTION("conv2d, stride 2, no padding, no bias") {
    compare_op("conv2d s2", [](auto& in) { return conv2d(in[0], in[1], Tensor(), 2, 0); },
               {uniform({3, 2, 9, 8}, 23), uniform({4, 2, 3, 3}, 24)}, {true, true});
  }
  SECTION("pooling") {
    Tensor x = uniform({2, 3, 7, 7}, 25);
    compare_op("max_pool2d 2/2", [](auto& in) { return max_pool2d(in[0], 2); }, {x}, {true});
    compare_op("max_pool2d 3/2 pad 1", [](auto& in) { return max_pool2d(in[0], 3, 2, 1); }, {x},
               {true});
    compare_op("avg_pool2d 2/2", [](auto& in) { return avg_pool2d(in[0], 2); }, {x}, {true});
    compare_op("avg_pool2d 3/1 pad 1", [](auto& in) { return avg_pool2d(in[0], 3, 1, 1); }, {x},
               {true});
    compare_op("global_avg_pool2d", [](auto& in) { return global_avg_pool2d(in[0]); }, {x},
               {true});
  }
}

TEST_CASE("cuda ops: batch norm and cross-entropy match the CPU", "[cuda][ops][tsan]") {
  if (!cuda_test::have_device()) return;
  SECTION("batch_norm, training, with running statistics") {
    Tensor rm = uniform({3}, 30), rv = uniform({3}, 31, 0.5, 2.0);
    Tensor rm_gpu = rm.to(kGpu).clone(), rv_gpu = rv.to(kGpu).clone();
    Tensor rm_cpu = rm.clone(), rv_cpu = rv.clone();
    compare_op("batch_norm train",
               [&](auto& in) {
                 bool gpu = in[0].device().is_cuda();
                 return batch_norm(in[0], in[1], in[2], gpu ? rm_gpu : rm_cpu,
                                   gpu ? rv_gpu : rv_cpu, true, 0.1, 1e-5);
               },
               {uniform({4, 3, 5, 3}, 32), uniform({3}, 33), uniform({3}, 34)},
               {true, true, true}, 1e-4, 1e-4);
    require_close(rm_gpu, rm_cpu, 1e-5, 1e-6, "running_mean");
    require_close(rv_gpu, rv_cpu, 1e-5, 1e-6, "running_var");
  }
  SECTION("batch_norm, eval, and over [N, C]") {
    Tensor rm = uniform({4}, 35), rv = uniform({4}, 36, 0.5, 2.0);
    compare_op("batch_norm eval",
               [&](auto& in) {
                 Device d = in[0].device();
                 return batch_norm(in[0], in[1], in[2], rm.to(d), rv.to(d), false);
               },
               {uniform({2, 4, 3, 3}, 37), uniform({4}, 38), uniform({4}, 39)},
               {true, true, true});
    compare_op("batch_norm [N, C]",
               [](auto& in) { return batch_norm(in[0], in[1], in[2], Tensor(), Tensor(), true); },
               {uniform({5, 4}, 40), uniform({4}, 41), uniform({4}, 42)}, {true, true, true},
               1e-4, 1e-4);
  }
  SECTION("cross_entropy, each reduction") {
    Tensor logits = uniform({7, 10}, 43, -4, 4);
    Tensor labels = Tensor::from_vector(std::vector<int64_t>{0, 9, 3, 3, 5, 1, 8}, {7});
    for (Reduction red : {Reduction::Mean, Reduction::Sum, Reduction::None})
      for (double smoothing : {0.0, 0.1}) {
        compare_op("cross_entropy",
                   [&](auto& in) { return cross_entropy(in[0], in[1], red, smoothing); },
                   {logits, labels}, {true, false});
      }
    Tensor bad = Tensor::from_vector(std::vector<int64_t>{0, 10, 3, 3, 5, 1, 8}, {7});
    // Checked on the device without a wait; reported at the next one, once.
    Tensor loss = cross_entropy(logits.to(kGpu), bad.to(kGpu));
    CHECK_THROWS_WITH(loss.item(), Contains("label 10 out of range [0, 10) for 10 classes") &&
                                       Contains("at position 1 of a batch of 7"));
    CHECK(std::isnan(loss.item()));  // the bad row's loss
    CHECK(cross_entropy(logits.to(kGpu), labels.to(kGpu)).item() ==
          Approx(cross_entropy(logits, labels).item()).epsilon(1e-5));
  }
}

TEST_CASE("cuda: BatchNorm2d counts its batches on the buffer's device", "[cuda][nn]") {
  if (!cuda_test::have_device()) return;
  nn::BatchNorm2d bn(3);
  bn.to(kGpu);
  REQUIRE(bn.num_batches_tracked.device() == kGpu);
  // A value that needs more than 32 bits, as a loaded checkpoint might hold.
  const int64_t start = (int64_t(1) << 36) + 5;
  bn.num_batches_tracked.copy_(Tensor::from_vector(std::vector<int64_t>{start}, {}));
  Tensor x = uniform({2, 3, 4, 4}, 60).to(kGpu);
  bn(x);
  bn(x);
  bn.eval();
  bn(x);  // eval does not count
  bn.train();
  bn(x);
  CHECK(bn.num_batches_tracked.device() == kGpu);
  CHECK(bn.num_batches_tracked.to_int_vector() == std::vector<int64_t>{start + 3});
  CHECK_THROWS_WITH(add_int64_(bn.running_mean, 1),
                    Contains("add_int64_: counter must be int64, got float32"));
}

// The running totals of train::train_epoch: a loss sum and a correct count
// that stay on the device from batch to batch.
TEST_CASE("cuda ops: add_scaled_ and count_correct_ keep totals on the device as on the CPU",
          "[cuda][ops][tsan]") {
  if (!cuda_test::have_device()) return;
  Tensor logits = uniform({37, 10}, 61);
  std::vector<int64_t> label_values(37);
  for (size_t i = 0; i < label_values.size(); ++i) label_values[i] = int64_t(i * 3 % 10);
  Tensor labels = Tensor::from_vector(label_values, {37});
  Tensor pred = argmax_rows(logits);
  int64_t want = 0;
  for (size_t i = 0; i < label_values.size(); ++i)
    want += pred.to_int_vector()[i] == label_values[i];
  REQUIRE(want > 0);  // uniform logits: about one row in ten
  for (Device d : {Device::cpu(), kGpu}) {
    DYNAMIC_SECTION(d.str()) {
      Tensor counter = Tensor::from_vector(std::vector<int64_t>{(int64_t(1) << 36) + 1}, {}).to(d);
      Tensor total = Tensor::full({}, 0.5).to(d);
      for (int batch = 0; batch < 3; ++batch) {
        count_correct_(counter, logits.to(d), labels.to(d));
        add_scaled_(total, sum(logits.to(d)), 37.0);
      }
      CHECK(counter.device() == d);
      CHECK(counter.to_int_vector() == std::vector<int64_t>{(int64_t(1) << 36) + 1 + 3 * want});
      CHECK(total.item() == Approx(0.5 + 3 * 37 * sum(logits).item()).epsilon(1e-5));
      CHECK_THROWS_WITH(count_correct_(total, logits.to(d), labels.to(d)),
                        Contains("count_correct_: counter must be one int64, got float32"));
      CHECK_THROWS_WITH(count_correct_(counter, logits.to(d), labels.to(d).reshape({37, 1})),
                        Contains("labels must be int64 [37]"));
      CHECK_THROWS_WITH(add_scaled_(total, logits.to(d), 1.0),
                        Contains("add_scaled_: total is [] but x is [37, 10]"));
    }
  }
  CHECK_THROWS_WITH(count_correct_(Tensor::zeros({}, DType::Int64), logits.to(kGpu), labels),
                    Contains("count_correct_: expected all tensors on the same device"));
}

TEST_CASE("cuda: LeNet SGD steps on cuda:0 give the CPU's losses and weights", "[cuda][nn]") {
  if (!cuda_test::have_device()) return;
  // FP32 on both devices (cuda:0 would take TF32 convolutions by default):
  // the tolerances here are FP32's.
  const ScopedFp32Precision fp32(Fp32Precision::kIeee);
  Generator gen_cpu(7), gen_gpu(7);
  auto cpu_model = models::lenet(models::Init::Kaiming, &gen_cpu);
  auto gpu_model = models::lenet(models::Init::Kaiming, &gen_gpu);
  gpu_model->to(kGpu);
  optim::SGDOptions opt{0.05, 0.9, 1e-4, false};
  optim::SGD cpu_sgd(cpu_model->parameters(), opt), gpu_sgd(gpu_model->parameters(), opt);
  Tensor x = uniform({8, 1, 28, 28}, 50, 0, 1);
  Tensor y = Tensor::from_vector(std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7}, {8});
  Tensor x_gpu = x.to(kGpu), y_gpu = y.to(kGpu);
  for (int step = 0; step < 3; ++step) {
    Tensor loss_cpu = cross_entropy((*cpu_model)(x), y);
    Tensor loss_gpu = cross_entropy((*gpu_model)(x_gpu), y_gpu);
    INFO("step " << step);
    CHECK(loss_gpu.item() == Approx(loss_cpu.item()).epsilon(1e-4));
    loss_cpu.backward();
    loss_gpu.backward();
    cpu_sgd.step();
    gpu_sgd.step();
    cpu_sgd.zero_grad();
    gpu_sgd.zero_grad();
  }
  auto cpu_state = cpu_model->state_dict(), gpu_state = gpu_model->state_dict();
  REQUIRE(cpu_state.size() == gpu_state.size());
  for (size_t i = 0; i < cpu_state.size(); ++i)
    require_close(gpu_state[i].second, cpu_state[i].second, 1e-3, 1e-4, cpu_state[i].first);
}

TEST_CASE("cuda: copies between cpu, cuda:0 and cuda:1 round-trip exactly", "[cuda][tensor]") {
  if (!cuda_test::have_device()) return;
  const Device last = Device::cuda(device_count() - 1);
  SECTION("float32, int64 and uint8") {
    Tensor f = uniform({3, 5, 7}, 60);
    Tensor i = Tensor::from_vector(std::vector<int64_t>{-3, 0, 1LL << 40, 7}, {2, 2});
    const uint8_t bytes[] = {0, 1, 128, 255, 9};
    Tensor u = Tensor::from_host(bytes, {5}, DType::UInt8);
    for (const Tensor& t : {f, i, u}) {
      Tensor on_gpu = t.to(kGpu);
      CHECK(on_gpu.device() == kGpu);
      Tensor there = on_gpu.to(last);
      CHECK(there.device() == last);
      Tensor back = there.to(Device::cpu());
      REQUIRE(back.nbytes() == t.nbytes());
      CHECK(std::memcmp(back.raw_data(), t.raw_data(), t.nbytes()) == 0);
      CHECK(on_gpu.clone().to(Device::cpu()).to_vector() == t.to_vector());
      CHECK(on_gpu.to(kGpu).same(on_gpu));  // already there
    }
  }
  SECTION("copy_ and fill on the device, and views of device tensors") {
    Tensor g = Tensor::zeros({4, 3}, DType::Float32, kGpu);
    CHECK(g.to_vector() == std::vector<float>(12, 0.0f));
    Tensor src = uniform({4, 3}, 61);
    g.copy_(src);
    CHECK(g.to_vector() == src.to_vector());
    std::vector<float> all = src.to_vector();
    CHECK(g.narrow(1, 2).to_vector() == std::vector<float>(all.begin() + 3, all.begin() + 9));
    Tensor ones = Tensor::ones({5}, DType::Int64, last);
    CHECK(ones.to_int_vector() == std::vector<int64_t>(5, 1));
    CHECK(Tensor::full({2}, 3.5, DType::Float32, kGpu).to_vector() == std::vector<float>{3.5f, 3.5f});
  }
}

TEST_CASE("cuda: ops refuse tensors on different devices, naming both", "[cuda][errors]") {
  if (!cuda_test::have_device()) return;
  Tensor c = Tensor::ones({2}), g = Tensor::ones({2}, DType::Float32, kGpu);
  CHECK_THROWS_WITH(add(c, g), Contains("add") && Contains("cpu") && Contains("cuda:0"));
  CHECK_THROWS_WITH(matmul(g.reshape({1, 2}), c.reshape({2, 1})),
                    Contains("matmul") && Contains("same device"));
  if (device_count() > 1) {
    Tensor g1 = Tensor::ones({2}, DType::Float32, Device::cuda(1));
    CHECK_THROWS_WITH(mul(g, g1), Contains("mul") && Contains("cuda:0") && Contains("cuda:1"));
  }
  CHECK_THROWS_WITH(Tensor::ones({2}, DType::Float32, Device::cuda(device_count())),
                    Contains("not available"));
}

TEST_CASE("cuda: the caching allocator reuses blocks and reports its figures", "[cuda][memory]") {
  if (!cuda_test::have_device()) return;
  synchronize(kGpu);
  empty_cache(kGpu);
  MemoryStats before = memory_stats(kGpu);
  {
    Tensor t = Tensor::empty({1000}, DType::Float32, kGpu);  // 4000 bytes -> one 4096 block
    MemoryStats s = memory_stats(kGpu);
    CHECK(s.allocated == before.allocated + 4096);
    CHECK(s.reserved == before.reserved + 4096);
    CHECK(s.peak_allocated >= s.allocated);
    CHECK(s.device_allocations == before.device_allocations + 1);
  }
  MemoryStats freed = memory_stats(kGpu);
  CHECK(freed.allocated == before.allocated);
  CHECK(freed.reserved == before.reserved + 4096);  // cached, not returned
  {
    Tensor again = Tensor::empty({1010}, DType::Float32, kGpu);  // same rounded size
    MemoryStats s = memory_stats(kGpu);
    CHECK(s.device_allocations == freed.device_allocations);  // served from the cache
    CHECK(s.cache_hits == freed.cache_hits + 1);
  }
  empty_cache(kGpu);
  CHECK(memory_stats(kGpu).reserved == before.reserved);
}

TEST_CASE("cuda: out of memory names the device, the request and the usage", "[cuda][memory]") {
  if (!cuda_test::have_device()) return;
  const size_t total = device_properties(kGpu).total_memory;
  const int64_t too_many = int64_t(total / sizeof(float)) + (int64_t(1) << 20);
  CHECK_THROWS_WITH(Tensor::empty({too_many}, DType::Float32, kGpu),
                    Contains("out of memory on cuda:0") && Contains("tried to allocate") &&
                        Contains("reserved") && Contains("smaller --batch-size"));
  // The device still works afterwards.
  CHECK(Tensor::ones({3}, DType::Float32, kGpu).to_vector() == std::vector<float>(3, 1.0f));
}

#endif  // ANVIL_CUDA_BACKEND
