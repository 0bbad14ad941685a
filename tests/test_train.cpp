// End-to-end training on real Fashion-MNIST: LeNet learns from the first 512
// training images (the loss falls and the accuracy rises well above chance),
// and the same seed gives the same losses bit for bit. Skipped, with a
// warning, where the dataset is not installed. Then BatchNorm recalibration
// on synthetic images, on the CPU and on a (simulated) GPU.
#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <memory>
#include <vector>

#include "core/device.h"
#include "core/precision.h"
#include "core/random.h"
#include "data/dataloader.h"
#include "data/idx.h"
#include "nn/layers.h"
#include "nn/models.h"
#include "nn/optim.h"
#include "nn/train.h"
#include "tests/cuda_test_util.h"
#include "tests/nn_test_util.h"
#include "tests/test_util.h"

using anvil::testing::have_fashion_mnist;
using anvil::testing::kFashionDir;

using namespace anvil;

namespace {

struct RunResult {
  std::vector<train::EpochStats> epochs;
  train::EpochStats eval;
};

// LeNet trained with SGD + momentum on `set`, `epochs` times. The seed
// documents' N(0, 0.01) init barely moves in the first epochs, so this uses
// He init; lr 0.05 with momentum 0.9 learns these 512 images reliably (over
// eight seeds the last of six epochs reached loss <= 0.41x the first's and
// accuracy >= 0.70).
RunResult train_lenet(const std::shared_ptr<const data::ImageSet>& set, int epochs,
                      uint64_t seed) {
  Generator gen(seed);
  auto model = models::lenet(models::Init::Kaiming, &gen);
  optim::SGD sgd(model->parameters(), {.lr = 0.05, .momentum = 0.9});
  data::DataLoader loader(set, 64, /*shuffle=*/true, /*drop_last=*/false, seed);
  RunResult r;
  for (int e = 0; e < epochs; ++e)
    r.epochs.push_back(train::train_epoch(*model, sgd, loader, Device::cpu()));
  data::DataLoader eval_loader(set, 128, false, false, seed);
  r.eval = train::evaluate(*model, eval_loader, Device::cpu());
  CHECK(model->is_training());  // evaluate restores the mode
  return r;
}

}  // namespace

TEST_CASE("LeNet learns the first 512 Fashion-MNIST training images", "[train]") {
  if (!have_fashion_mnist()) {
    WARN("skipped: Fashion-MNIST not found in " << kFashionDir);
    return;
  }
  auto set = std::make_shared<const data::ImageSet>(
      data::load_mnist_split(kFashionDir, /*train=*/true, /*limit=*/512));
  REQUIRE(set->count == 512);
  const int kEpochs = 6;
  RunResult r = train_lenet(set, kEpochs, 7);
  REQUIRE(r.epochs.size() == size_t(kEpochs));
  for (size_t e = 0; e < r.epochs.size(); ++e) {
    const auto& s = r.epochs[e];
    INFO("epoch " << e + 1 << ": loss " << s.loss << ", accuracy " << s.accuracy);
    CHECK(s.examples == 512);
    CHECK(std::isfinite(s.loss));
    CHECK(s.seconds > 0);
    CHECK(s.images_per_second() > 0);
  }
  const auto& first = r.epochs.front();
  const auto& last = r.epochs.back();
  INFO("first epoch loss " << first.loss << " acc " << first.accuracy << "; last epoch loss "
                           << last.loss << " acc " << last.accuracy << "; eval loss "
                           << r.eval.loss << " acc " << r.eval.accuracy);
  // Ten balanced classes: an untrained model starts near ln(10) = 2.30.
  CHECK(first.loss > 0.8);
  CHECK(first.loss < 3.5);
  CHECK(last.loss < 0.6 * first.loss);
  CHECK(last.accuracy > 0.6);
  CHECK(last.accuracy > first.accuracy);
  // Evaluation (eval mode, no gradients) over the same images agrees.
  CHECK(r.eval.examples == 512);
  CHECK(r.eval.accuracy > 0.6);
  CHECK(r.eval.loss < 0.6 * first.loss);
}

TEST_CASE("Training is deterministic for a given seed", "[train]") {
  if (!have_fashion_mnist()) {
    WARN("skipped: Fashion-MNIST not found in " << kFashionDir);
    return;
  }
  auto set = std::make_shared<const data::ImageSet>(
      data::load_mnist_split(kFashionDir, true, 128));
  RunResult a = train_lenet(set, 2, 3);
  RunResult b = train_lenet(set, 2, 3);
  REQUIRE(a.epochs.size() == 2);
  for (size_t e = 0; e < 2; ++e) {
    INFO("epoch " << e + 1);
    CHECK(a.epochs[e].loss == b.epochs[e].loss);  // bit for bit
    CHECK(a.epochs[e].accuracy == b.epochs[e].accuracy);
  }
  CHECK(a.eval.loss == b.eval.loss);
  // And a different seed takes a different path.
  RunResult c = train_lenet(set, 1, 4);
  CHECK(c.epochs[0].loss != a.epochs[0].loss);
}

namespace {

// Per-channel mean and unbiased variance of a batch's NCHW images, in double.
void batch_moments(const data::Batch& b, std::vector<double>& mean, std::vector<double>& var) {
  const int64_t C = b.channels, HW = b.rows * b.cols, m = b.size * HW;
  mean.assign(size_t(C), 0);
  var.assign(size_t(C), 0);
  for (int64_t c = 0; c < C; ++c) {
    for (int64_t n = 0; n < b.size; ++n)
      for (int64_t i = 0; i < HW; ++i) mean[size_t(c)] += b.images[size_t((n * C + c) * HW + i)];
    mean[size_t(c)] /= double(m);
    for (int64_t n = 0; n < b.size; ++n)
      for (int64_t i = 0; i < HW; ++i) {
        double d = b.images[size_t((n * C + c) * HW + i)] - mean[size_t(c)];
        var[size_t(c)] += d * d;
      }
    var[size_t(c)] /= double(m - 1);
  }
}

}  // namespace

TEST_CASE("recalibrate_batch_norm: running statistics become the plain mean over the batches",
          "[train]") {
  // 10 images of 3x2 in batches of 4, 4, 2; the pixels vary by image and position.
  auto set = std::make_shared<data::ImageSet>();
  set->count = 10;
  set->rows = 3;
  set->cols = 2;
  for (int64_t i = 0; i < 10 * 6; ++i) set->pixels.push_back(uint8_t((i * 37 + (i / 6) * 101) % 256));
  set->labels.assign(10, 0);
  std::shared_ptr<const data::ImageSet> images = set;
  // The expected statistics are FP32's; cuda:0 would take TF32 convolutions.
  const ScopedFp32Precision fp32(Fp32Precision::kIeee);

  std::vector<Device> devices{Device::cpu()};
  if (cuda_test::have_device("cuda:0 part")) devices.push_back(Device::cuda(0));  // simulated or real
  for (Device device : devices) {
    DYNAMIC_SECTION("on " << device.str()) {
      // bn1 sees the images; bn2, nested one level down, sees a 1x1 convolution
      // (weights w, biases c) of bn1's output, whose batch mean is 0 and
      // biased variance v / (v + eps) for the batch's variance v.
      auto bn1 = std::make_shared<nn::BatchNorm2d>(1, 1e-5, 0.3);
      auto conv = std::make_shared<nn::Conv2d>(1, 2, 1);
      auto bn2 = std::make_shared<nn::BatchNorm2d>(2);
      auto inner = std::make_shared<nn::Sequential>();
      inner->add(conv).add(bn2);
      nn::Sequential model;
      model.add(bn1).add(inner);
      testing::assign(conv->weight, {2.0f, -0.5f});
      testing::assign(conv->bias, {0.75f, -1.25f});
      // Stale statistics and counters, to be replaced.
      testing::assign(bn1->running_mean, {5.0f});
      testing::assign(bn1->running_var, {9.0f});
      testing::assign(bn2->running_mean, {-3.0f, 4.0f});
      model.to(device);
      model.eval();
      const auto weights_before = conv->weight.to(Device::cpu()).to_vector();

      data::DataLoader loader(images, 4, /*shuffle=*/true, false, /*seed=*/3);
      CHECK(train::recalibrate_batch_norm(model, loader, device, 2, /*epoch=*/1) == 2);

      // The expected values from the same two batches, read from a twin loader.
      data::DataLoader twin(images, 4, true, false, 3);
      twin.start_epoch(1);
      data::Batch b;
      double mean = 0, var = 0, bn2_var_factor = 0;
      const double m = 4 * 6;
      for (int k = 0; k < 2; ++k) {
        REQUIRE(twin.next(b));
        std::vector<double> bm, bv;
        batch_moments(b, bm, bv);
        mean += bm[0] / 2;
        var += bv[0] / 2;
        const double biased = bv[0] * (m - 1) / m;
        // bn2's batch sees w * bn1(x) + c: unbiased variance w^2 * v/(v+eps) * m/(m-1).
        bn2_var_factor += biased / (biased + 1e-5) * m / (m - 1) / 2;
      }
      auto rm1 = bn1->running_mean.to(Device::cpu()).to_vector();
      auto rv1 = bn1->running_var.to(Device::cpu()).to_vector();
      CHECK(rm1[0] == Approx(mean).margin(1e-6));
      CHECK(rv1[0] == Approx(var).epsilon(1e-5));
      auto rm2 = bn2->running_mean.to(Device::cpu()).to_vector();
      auto rv2 = bn2->running_var.to(Device::cpu()).to_vector();
      CHECK(rm2[0] == Approx(0.75).margin(1e-5));
      CHECK(rm2[1] == Approx(-1.25).margin(1e-5));
      CHECK(rv2[0] == Approx(4.0 * bn2_var_factor).epsilon(1e-4));
      CHECK(rv2[1] == Approx(0.25 * bn2_var_factor).epsilon(1e-4));
      CHECK(bn1->num_batches_tracked.to(Device::cpu()).to_int_vector() == std::vector<int64_t>{2});
      CHECK(bn2->num_batches_tracked.to(Device::cpu()).to_int_vector() == std::vector<int64_t>{2});
      // What it must leave alone: momenta, mode, parameters.
      CHECK(bn1->momentum == 0.3);
      CHECK(bn2->momentum == 0.1);
      CHECK_FALSE(model.is_training());
      CHECK_FALSE(bn2->is_training());
      CHECK(conv->weight.to(Device::cpu()).to_vector() == weights_before);

      // A different epoch draws other batches, so other statistics.
      train::recalibrate_batch_norm(model, loader, device, 2, /*epoch=*/0);
      CHECK(bn1->running_mean.to(Device::cpu()).to_vector()[0] != Approx(mean).margin(1e-6));
    }
  }
}

TEST_CASE("recalibrate_batch_norm refuses a model without BatchNorm and a bad batch count",
          "[train]") {
  auto set = std::make_shared<data::ImageSet>();
  set->count = 6;
  set->rows = set->cols = 2;
  set->pixels.assign(24, 7);
  set->labels.assign(6, 1);
  data::DataLoader loader(std::shared_ptr<const data::ImageSet>(set), 4, false, false, 0);
  nn::Sequential plain;
  plain.add(std::make_shared<nn::Conv2d>(1, 1, 1));
  CHECK_THROWS_WITH(train::recalibrate_batch_norm(plain, loader, Device::cpu(), 1),
                    Catch::Contains("no BatchNorm layers"));
  nn::Sequential with_bn;
  with_bn.add(std::make_shared<nn::BatchNorm2d>(1));
  CHECK_THROWS_WITH(train::recalibrate_batch_norm(with_bn, loader, Device::cpu(), 0),
                    Catch::Contains("must be in 1..2") && Catch::Contains("got 0"));
  CHECK_THROWS_WITH(train::recalibrate_batch_norm(with_bn, loader, Device::cpu(), 3),
                    Catch::Contains("got 3"));
}
