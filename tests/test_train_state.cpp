// The training loop's schedule hook and the run checkpoints behind
// anvil-train --checkpoint / --resume: the schedule sets the rate of every
// step, a checkpoint restores weights and momentum exactly (so 1 + 1 epochs
// equal 2), and a bad checkpoint is refused, naming the file, without
// touching the model or the optimizer. On a simulated GPU, an epoch's
// running totals stay on the device and a steady step never waits for it; a
// bad label is reported at the next point that does. Synthetic images: no
// dataset needed.
#include <catch2/catch.hpp>

#include <memory>
#include <string>
#include <utility>
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
// on the device, and cross_entropy checks the labels there too
// (Backend::check_labels): a steady step queues its work and returns without
// the host ever waiting for the device, so that it could be captured as one
// CUDA graph. The simulator counts every blocking call (anvil::sim::host_syncs)
// and those that found work queued (host_waits). The host waits only where the
// figures are read: a progress callback's stats() (anvil-train's log line)
// and the epoch's end. Before the label check moved to the device, every step
// waited once; before the totals did, 3 times.
TEST_CASE("cuda: a steady train_epoch step never waits for the device and gives the CPU's figures",
          "[train][cuda]") {
  if (!cuda_test::have_device()) return;
  // FP32 on both devices (cuda:0 would take TF32 convolutions by default):
  // the tolerances here are FP32's.
  const ScopedFp32Precision fp32(Fp32Precision::kIeee);
  const cuda_test::SyncLaunches no_sync(false);  // ANVIL_CUDA_SYNC=1 would wait at every launch
  struct Outcome {
    train::EpochStats stats;
    uint64_t waits = 0;
    std::vector<uint64_t> syncs, step_waits;  // per step, its stats() read included
  };
  // log_every > 0: the callback reads the figures after every log_every-th step.
  auto epoch_on = [](Device device, int64_t batches, int64_t log_every) {
    auto set = synthetic_set(batches * 4);
    data::DataLoader loader(set, 4, true, false, 3);
    Generator gen(5);
    auto model = models::lenet(models::Init::Kaiming, &gen);
    model->to(device);
    optim::SGD sgd(model->parameters(), {.lr = 0.05, .momentum = 0.9, .weight_decay = 5e-4});
    train::EpochOptions options;
    Outcome out;
    uint64_t syncs = anvil::sim::host_syncs(), waits = anvil::sim::host_waits();
    options.progress = [&](const train::EpochProgress& p) {
      if (log_every > 0 && p.done % log_every == 0) CHECK(p.stats().examples == p.done * 4);
      out.syncs.push_back(anvil::sim::host_syncs() - std::exchange(syncs, anvil::sim::host_syncs()));
      out.step_waits.push_back(anvil::sim::host_waits() -
                               std::exchange(waits, anvil::sim::host_waits()));
    };
    const uint64_t before = anvil::sim::host_waits();
    out.stats = train::train_epoch(*model, sgd, loader, device, options);
    out.waits = anvil::sim::host_waits() - before;
    CHECK(int64_t(out.syncs.size()) == batches);
    return out;
  };
  const Device gpu = Device::cuda(0);
  const Outcome four = epoch_on(gpu, 4, 0), eight = epoch_on(gpu, 8, 0);
  // Every step after the first (which may make the label record) is steady.
  for (size_t k = 1; k < eight.syncs.size(); ++k) {
    INFO("step " << k + 1);
    CHECK(eight.syncs[k] == 0);
    CHECK(eight.step_waits[k] == 0);
  }
  CHECK(eight.waits == four.waits);  // the epoch's end, whatever its length
  // Read every 4 steps (a log interval): those steps wait, once a figure
  // (each copy to the host is one); the others never.
  const Outcome logged = epoch_on(gpu, 8, 4);
  for (size_t k = 1; k < logged.syncs.size(); ++k) {
    INFO("step " << k + 1);
    if ((k + 1) % 4 == 0) {
      CHECK(logged.step_waits[k] == 2);
    } else {
      CHECK(logged.syncs[k] == 0);
      CHECK(logged.step_waits[k] == 0);
    }
  }

  const Outcome cpu = epoch_on(Device::cpu(), 8, 0);
  CHECK(eight.stats.examples == 32);
  CHECK(eight.stats.loss == Approx(cpu.stats.loss).epsilon(1e-4));
  CHECK(eight.stats.accuracy == cpu.stats.accuracy);
  CHECK(logged.stats.loss == eight.stats.loss);
}

// A label out of range on a GPU is found by a kernel without a wait and
// reported where the loop next waits (the log line's figures, the epoch's
// end), naming the label, its position and the class count; on the CPU at
// once, in the step that has it.
TEST_CASE("cuda: train_epoch reports a bad label at its next wait for the device",
          "[train][cuda]") {
  if (!cuda_test::have_device()) return;
  const cuda_test::SyncLaunches no_sync(false);
  auto reached_on = [](Device device, int64_t log_every) {
    auto set = std::const_pointer_cast<data::ImageSet>(synthetic_set(16));
    set->labels[size_t(4 + 1)] = 10;  // batch 2, position 1: LeNet has 10 classes
    data::DataLoader loader(set, 4, false, false, 3);
    Generator gen(5);
    auto model = models::lenet(models::Init::Kaiming, &gen);
    model->to(device);
    optim::SGD sgd(model->parameters(), {.lr = 0.05});
    train::EpochOptions options;
    int64_t reached = 0;
    options.progress = [&](const train::EpochProgress& p) {
      reached = p.done;
      if (log_every > 0 && p.done % log_every == 0) (void)p.stats();
    };
    CHECK_THROWS_WITH(train::train_epoch(*model, sgd, loader, device, options),
                      Contains("label 10 out of range [0, 10) for 10 classes") &&
                          Contains("at position 1 of a batch of 4"));
    return reached;
  };
  CHECK(reached_on(Device::cpu(), 3) == 1);    // in step 2, before its callback
  CHECK(reached_on(Device::cuda(0), 3) == 3);  // at the log point after step 3
  CHECK(reached_on(Device::cuda(0), 0) == 4);  // at the epoch's end
  // Reported once: the device's next epoch runs clean.
  auto set = synthetic_set(8);
  data::DataLoader loader(set, 4, false, false, 3);
  Generator gen(5);
  auto model = models::lenet(models::Init::Kaiming, &gen);
  model->to(Device::cuda(0));
  optim::SGD sgd(model->parameters(), {.lr = 0.05});
  CHECK(train::train_epoch(*model, sgd, loader, Device::cuda(0)).examples == 8);
}
#endif
