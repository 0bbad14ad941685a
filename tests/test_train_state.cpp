// The training loop's schedule hook and the run checkpoints behind
// anvil-train --checkpoint / --resume: the schedule sets the rate of every
// step, a checkpoint restores weights and momentum exactly (so 1 + 1 epochs
// equal 2), and a bad checkpoint is refused, naming the file, without
// touching the model or the optimizer. On a simulated GPU, an epoch's
// running totals stay on the device: a step waits for it once, not once per
// figure. Synthetic images: no dataset needed.
#include <catch2/catch.hpp>

#include <memory>
#include <string>
#include <vector>

#include "core/precision.h"
#include "core/random.h"
#include "data/dataloader.h"
#include "nn/models.h"
#include "nn/optim.h"
#include "nn/safetensors.h"
#include "nn/schedule.h"
#include "nn/train.h"
#include "tests/test_util.h"
#if defined(ANVIL_CUDA_SIM)
#include "tests/cuda_test_util.h"
#include "tests/sync_launches.h"
#endif

using namespace anvil;
using anvil::testing::TempDir;
using Catch::Contains;

namespace {

std::shared_ptr<const data::ImageSet> synthetic_set(int64_t count) {
  auto set = std::make_shared<data::ImageSet>();
  set->count = count;
  set->rows = set->cols = 28;
  set->pixels.resize(size_t(count * 28 * 28));
  for (size_t i = 0; i < set->pixels.size(); ++i)
    set->pixels[i] = uint8_t((i * 37 + i / 784) % 256);
  for (int64_t i = 0; i < count; ++i) set->labels.push_back(i % 10);
  return set;
}

optim::LRSchedule cosine_with_warmup(int64_t epochs) {
  optim::ScheduleOptions o;
  o.shape = optim::ScheduleShape::Cosine;
  o.lr = 0.05;
  o.epochs = epochs;
  o.warmup_epochs = 1;
  return optim::LRSchedule(o);
}

// A LeNet run's pieces, each seeded alike.
struct Run {
  std::shared_ptr<nn::Sequential> model;
  std::unique_ptr<optim::SGD> sgd;
  explicit Run(uint64_t seed = 5) {
    Generator gen(seed);
    model = models::lenet(models::Init::Kaiming, &gen);
    sgd = std::make_unique<optim::SGD>(
        model->parameters(),
        optim::SGDOptions{.lr = 0.05, .momentum = 0.9, .weight_decay = 5e-4, .nesterov = true});
  }
};

train::EpochStats run_epoch(Run& run, data::DataLoader& loader, const optim::LRSchedule& s,
                            uint64_t epoch) {
  train::EpochOptions options;
  options.schedule = &s;
  options.epoch = epoch;
  return train::train_epoch(*run.model, *run.sgd, loader, Device::cpu(), options);
}

std::vector<std::vector<float>> values(const nn::NamedTensors& tensors) {
  std::vector<std::vector<float>> out;
  for (auto& [name, t] : tensors) out.push_back(t.to(DType::Float32).to_vector());
  return out;
}

std::vector<std::vector<float>> momentum_values(const optim::SGD& sgd) {
  std::vector<std::vector<float>> out;
  for (auto& t : sgd.momentum_buffers())
    out.push_back(t.defined() ? t.to_vector() : std::vector<float>{});
  return out;
}

}  // namespace

TEST_CASE("train_epoch sets the optimizer's rate from the schedule at every step", "[train]") {
  auto set = synthetic_set(100);
  data::DataLoader loader(set, 16, true, false, 3);  // 7 batches, the last of 4
  optim::LRSchedule schedule = cosine_with_warmup(3);
  Run run;
  std::vector<double> seen;
  train::EpochOptions options;
  options.schedule = &schedule;
  options.progress = [&](const train::EpochProgress&) {
    seen.push_back(run.sgd->lr());
  };
  for (uint64_t e = 0; e < 3; ++e) {
    train::EpochStats s = train::train_epoch(*run.model, *run.sgd, loader, Device::cpu(), options);
    CHECK(s.examples == 100);
    CHECK(s.last_lr == schedule.lr(int64_t(e), 6, 7));
  }
  REQUIRE(seen.size() == 21);
  for (int64_t i = 0; i < 21; ++i) {
    INFO("step " << i);
    CHECK(seen[size_t(i)] == schedule.lr(i / 7, i % 7, 7));
  }
  CHECK(seen.front() == Approx(0.005));
  CHECK(seen[7] == 0.05);  // the cosine's peak after one warmup epoch
}

TEST_CASE("A run checkpoint restores weights and momentum: 1 + 1 epochs equal 2", "[train]") {
  TempDir dir("ckpt");
  auto set = synthetic_set(96);
  optim::LRSchedule schedule = cosine_with_warmup(2);

  Run straight;
  data::DataLoader loader(set, 32, true, false, 9);
  run_epoch(straight, loader, schedule, 0);
  train::EpochStats want = run_epoch(straight, loader, schedule, 1);

  std::string path = dir.file("run.ckpt");
  {
    Run first;
    data::DataLoader first_loader(set, 32, true, false, 9);
    run_epoch(first, first_loader, schedule, 0);
    nlohmann::ordered_json info = {{"note", "kept as given"}};
    train::save_checkpoint(path, *first.model, *first.sgd,
                           {.epochs_done = 1, .steps_done = 3, .info = info});
  }
  // A fresh process's view: other initial weights, no momentum yet.
  Run resumed(77);
  train::RunState state = train::load_checkpoint(path, *resumed.model, *resumed.sgd);
  CHECK(state.epochs_done == 1);
  CHECK(state.steps_done == 3);
  CHECK(state.info["note"] == "kept as given");
  data::DataLoader resumed_loader(set, 32, true, false, 9);
  train::EpochStats got = run_epoch(resumed, resumed_loader, schedule, 1);

  CHECK(got.loss == want.loss);  // bit for bit
  CHECK(got.accuracy == want.accuracy);
  CHECK(values(resumed.model->state_dict()) == values(straight.model->state_dict()));
  CHECK(momentum_values(*resumed.sgd) == momentum_values(*straight.sgd));
}

TEST_CASE("A bad run checkpoint is refused, naming the file, and changes nothing", "[train]") {
  TempDir dir("ckpt");
  auto set = synthetic_set(32);
  optim::LRSchedule schedule = cosine_with_warmup(1);
  Run trained;
  data::DataLoader loader(set, 16, false, false, 1);
  run_epoch(trained, loader, schedule, 0);
  std::string good = dir.file("good.ckpt");
  train::save_checkpoint(good, *trained.model, *trained.sgd,
                         {.epochs_done = 1, .steps_done = 2, .info = {}});

  Run target(3);
  const auto before = values(target.model->state_dict());
  auto expect_refused = [&](const std::string& path, std::initializer_list<std::string> parts) {
    INFO(path);
    try {
      train::load_checkpoint(path, *target.model, *target.sgd);
      FAIL("loaded");
    } catch (const nn::CheckpointError& e) {
      CHECK_THAT(e.what(), Contains(path));
      for (auto& p : parts) CHECK_THAT(e.what(), Contains(p));
    }
    CHECK(values(target.model->state_dict()) == before);
    for (auto& m : target.sgd->momentum_buffers()) CHECK_FALSE(m.defined());
  };

  SECTION("weights only (a --save file)") {
    std::string path = dir.file("weights.safetensors");
    nn::save_safetensors(path, trained.model->state_dict());
    expect_refused(path, {"trainer.state"});
  }
  SECTION("another model") {
    std::string path = dir.file("other.ckpt");
    auto other = std::make_shared<nn::Sequential>();
    other->add(std::make_shared<nn::Linear>(784, 10));
    optim::SGD sgd(other->parameters(), {.lr = 0.1, .momentum = 0.9});
    train::save_checkpoint(path, *other, sgd, {.epochs_done = 1, .steps_done = 1, .info = {}});
    expect_refused(path, {"does not match the model", "3.weight"});
  }
  SECTION("a momentum buffer of the wrong shape") {
    auto tensors = nn::load_safetensors(good);
    for (auto& [name, t] : tensors)
      if (name == "optimizer.momentum.7.weight") t = Tensor::zeros({128, 801});
    std::string path = dir.file("momentum.ckpt");
    nn::save_safetensors(path, tensors);
    expect_refused(path, {"optimizer.momentum.7.weight", "[128, 801]", "[128, 800]"});
  }
  SECTION("a momentum buffer of no parameter") {
    auto tensors = nn::load_safetensors(good);
    tensors.emplace_back("optimizer.momentum.11.weight", Tensor::zeros({3}));
    std::string path = dir.file("extra.ckpt");
    nn::save_safetensors(path, tensors);
    expect_refused(path, {"optimizer.momentum.11.weight"});
  }
  SECTION("state that is not the JSON we wrote") {
    auto tensors = nn::load_safetensors(good);
    std::string text = "{\"format\": \"something else\"}";
    for (auto& [name, t] : tensors)
      if (name == "trainer.state")
        t = Tensor::from_host(text.data(), {int64_t(text.size())}, DType::UInt8);
    std::string path = dir.file("state.ckpt");
    nn::save_safetensors(path, tensors);
    expect_refused(path, {"anvil-train-checkpoint"});
  }
  SECTION("a missing momentum buffer after steps with momentum") {
    nn::NamedTensors tensors;
    for (auto& [name, t] : nn::load_safetensors(good))
      if (name != "optimizer.momentum.3.bias") tensors.emplace_back(name, t);
    std::string path = dir.file("stripped.ckpt");
    nn::save_safetensors(path, tensors);
    expect_refused(path, {"optimizer.momentum.3.bias", "momentum 0.9"});
  }
  SECTION("momentum buffers for an optimizer without momentum") {
    Run plain(3);
    plain.sgd = std::make_unique<optim::SGD>(plain.model->parameters(),
                                             optim::SGDOptions{.lr = 0.05});
    try {
      train::load_checkpoint(good, *plain.model, *plain.sgd);
      FAIL("loaded");
    } catch (const nn::CheckpointError& e) {
      CHECK_THAT(e.what(), Contains(good));
      CHECK_THAT(e.what(), Contains("momentum 0"));
    }
  }
  SECTION("state fields of the wrong JSON type") {
    for (const std::string text :
         {R"({"format": 5, "version": 1, "epochs_done": 1, "steps_done": 2})",
          R"({"format": "anvil-train-checkpoint", "version": "1", "epochs_done": 1, "steps_done": 2})",
          R"({"format": "anvil-train-checkpoint", "version": 1, "epochs_done": 1, "steps_done": 2, "info": []})"}) {
      INFO(text);
      auto tensors = nn::load_safetensors(good);
      for (auto& [name, t] : tensors)
        if (name == "trainer.state")
          t = Tensor::from_host(text.data(), {int64_t(text.size())}, DType::UInt8);
      std::string path = dir.file("typed.ckpt");
      nn::save_safetensors(path, tensors);
      expect_refused(path, {"trainer.state"});
      CHECK_THROWS_AS(train::read_run_state(path), nn::CheckpointError);
    }
  }
  SECTION("a missing file") { expect_refused(dir.file("absent.ckpt"), {}); }
}

#if defined(ANVIL_CUDA_SIM)
// train_epoch adds each batch's loss and correct predictions to totals kept
// on the device and reads them once, at the end. The waits left in a step are
// cross_entropy's label check (see test_resnet.cpp), one per step; the
// simulator counts them (anvil::sim::host_waits). A progress callback that
// reads the figures after every batch adds at least one wait a batch (each
// copy to the host is one), which this test shows, so it can tell the two
// apart: before the totals moved to the device, a step waited 3 times.
TEST_CASE("cuda: train_epoch waits for the device once a step and gives the CPU's figures",
          "[train][cuda]") {
  if (!cuda_test::have_device()) return;
  // FP32 on both devices (cuda:0 would take TF32 convolutions by default):
  // the tolerances here are FP32's.
  const ScopedFp32Precision fp32(Fp32Precision::kIeee);
  const cuda_test::SyncLaunches no_sync(false);  // ANVIL_CUDA_SYNC=1 would wait at every launch
  struct Outcome {
    train::EpochStats stats;
    uint64_t waits = 0;
  };
  auto epoch_on = [](Device device, int64_t batches, bool read_every_batch) {
    auto set = synthetic_set(batches * 4);
    data::DataLoader loader(set, 4, true, false, 3);
    Generator gen(5);
    auto model = models::lenet(models::Init::Kaiming, &gen);
    model->to(device);
    optim::SGD sgd(model->parameters(), {.lr = 0.05, .momentum = 0.9, .weight_decay = 5e-4});
    train::EpochOptions options;
    int64_t read = 0;
    if (read_every_batch)
      options.progress = [&](const train::EpochProgress& p) { read += p.stats().examples > 0; };
    Outcome out;
    const uint64_t before = anvil::sim::host_waits();
    out.stats = train::train_epoch(*model, sgd, loader, device, options);
    out.waits = anvil::sim::host_waits() - before;
    if (read_every_batch) CHECK(read == batches);
    return out;
  };
  const Device gpu = Device::cuda(0);
  const Outcome four = epoch_on(gpu, 4, false), eight = epoch_on(gpu, 8, false);
  CHECK(eight.waits - four.waits == 4);
  const Outcome eight_read = epoch_on(gpu, 8, true);
  CHECK(eight_read.waits - eight.waits >= 8);

  const Outcome cpu = epoch_on(Device::cpu(), 8, false);
  CHECK(eight.stats.examples == 32);
  CHECK(eight.stats.loss == Approx(cpu.stats.loss).epsilon(1e-4));
  CHECK(eight.stats.accuracy == cpu.stats.accuracy);
  CHECK(eight_read.stats.loss == eight.stats.loss);
}
#endif
