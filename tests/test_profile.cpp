// The profiler (core/profile.h, apps/train_profile.h): a tiny model's
// training steps by op family, on the CPU and on cuda:0 (simulated or
// real), and anvil-train --profile-trace's file read back as JSON.
#include <catch2/catch.hpp>

#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "apps/train_profile.h"
#include "core/profile.h"
#include "data/dataloader.h"
#include "nn/layers.h"
#include "nn/optim.h"
#include "nn/train.h"
#include "tests/cli_test_util.h"
#include "tests/cuda_test_util.h"

using namespace anvil;
using profile::Family;

namespace {

// 12 images of 8x8 in batches of 4: three steps, two of them steady.
std::shared_ptr<const data::ImageSet> tiny_images() {
  auto set = std::make_shared<data::ImageSet>();
  set->count = 12;
  set->rows = 8;
  set->cols = 8;
  for (int64_t i = 0; i < 12 * 64; ++i) set->pixels.push_back(uint8_t((i * 37) % 256));
  for (int64_t i = 0; i < 12; ++i) set->labels.push_back(uint8_t(i % 10));
  return set;
}

// Two convolutions (the first's input needs no gradient: one backward-data
// per step), BatchNorm, two ReLUs, a pooling and a linear layer.
std::shared_ptr<nn::Sequential> tiny_model() {
  auto m = std::make_shared<nn::Sequential>();
  m->add(std::make_shared<nn::Conv2d>(1, 2, 3, 1, 1))
      .add(std::make_shared<nn::ReLU>())
      .add(std::make_shared<nn::Conv2d>(2, 2, 3, 1, 1))
      .add(std::make_shared<nn::BatchNorm2d>(2))
      .add(std::make_shared<nn::ReLU>())
      .add(std::make_shared<nn::MaxPool2d>(2))
      .add(std::make_shared<nn::Flatten>())
      .add(std::make_shared<nn::Linear>(2 * 4 * 4, 10));
  return m;
}

profile::Thread profile_tiny_run(Device device) {
  auto model = tiny_model();
  model->to(device);
  optim::SGD sgd(model->parameters(), {.lr = 0.05});
  data::DataLoader loader(tiny_images(), 4, /*shuffle=*/false, /*drop_last=*/false, /*seed=*/1);
  profile::clear();
  profile::set_thread_rank(0);
  profile::set_enabled(true);
  train::train_epoch(*model, sgd, loader, device);
  profile::set_enabled(false);
  auto threads = profile::collected();
  REQUIRE(threads.size() == 1);
  return threads.front();
}

std::map<Family, app::ProfileRow> rows_by_family(const app::ProfileTable& t) {
  std::map<Family, app::ProfileRow> rows;
  for (const auto& r : t.rows) rows[r.family] = r;
  return rows;
}

void check_adds_up(const app::ProfileTable& t) {
  REQUIRE(t.rows.size() == size_t(profile::kFamilies));
  double ms = 0, percent = 0;
  for (const auto& r : t.rows) {
    ms += r.ms_per_step;
    percent += r.percent;
    if (r.family != Family::Other) CHECK(r.ms_per_step >= 0);
  }
  CHECK(ms == Approx(t.step_ms).epsilon(1e-9));
  CHECK(percent == Approx(100.0).epsilon(1e-9));
  CHECK(t.step_ms > 0);
}

}  // namespace

TEST_CASE("profile: a tiny model's steady steps by op family, adding up to the step",
          "[profile]") {
  SECTION("on the CPU: one record per Backend method") {
    const profile::Thread t = profile_tiny_run(Device::cpu());
    const app::ProfileTable table = app::profile_table(t);
    CHECK(table.steps == 2);
    CHECK(table.skipped == 1);
    check_adds_up(table);
    auto rows = rows_by_family(table);
    CHECK(rows[Family::ConvForward].calls_per_step == 2);
    CHECK(rows[Family::ConvBackwardData].calls_per_step == 1);
    CHECK(rows[Family::ConvBackwardWeight].calls_per_step == 2);
    CHECK(rows[Family::BatchNorm].calls_per_step == 2);  // forward, backward
    // The first ReLU forward and backward; the one after BatchNorm runs in its passes.
    CHECK(rows[Family::Relu].calls_per_step == 2);
    CHECK(rows[Family::Pooling].calls_per_step == 2);
    CHECK(rows[Family::Gemm].calls_per_step == 3);  // forward, dx, dw
    CHECK(rows[Family::Sgd].calls_per_step == 1);   // every parameter at once
    CHECK(rows[Family::CrossEntropy].calls_per_step >= 2);
    CHECK(rows[Family::DataWait].calls_per_step == 1);
    CHECK(rows[Family::AllReduce].calls_per_step == 0);
    CHECK(rows[Family::Conversion].calls_per_step == 0);
    CHECK(rows[Family::Other].ms_per_step >= 0);  // the ops timed lie inside the step
  }
  SECTION("on cuda:0: one record per kernel, timed by CUDA events on its stream") {
    if (!cuda_test::have_device("cuda:0 part")) return;
    const profile::Thread t = profile_tiny_run(Device::cuda(0));
    const app::ProfileTable table = app::profile_table(t);
    CHECK(table.steps == 2);
    check_adds_up(table);
    auto rows = rows_by_family(table);
    for (Family f : {Family::ConvForward, Family::ConvBackwardData, Family::ConvBackwardWeight,
                     Family::BatchNorm, Family::Relu, Family::Pooling, Family::Gemm,
                     Family::CrossEntropy, Family::Sgd})
      CHECK(rows[f].calls_per_step >= 1);
    CHECK(rows[Family::ConvForward].calls_per_step >= 2);
    CHECK(rows[Family::Sgd].calls_per_step == 1);  // one launch for every parameter
    CHECK(rows[Family::DataWait].calls_per_step == 1);
    // Kernels are on a stream's track (1, ...), named by their kernel.
    bool conv_kernel = false;
    for (const profile::Record& r : t.records)
      if (r.family == Family::ConvForward) {
        CHECK(r.stream >= 1);
        conv_kernel = conv_kernel || profile::name_of(r.name).find("conv") != std::string::npos;
      }
    CHECK(conv_kernel);
    // In the trace, each stream is a thread of the rank's process.
    const nlohmann::json doc = app::chrome_trace({t});
    bool stream_slice = false;
    for (const auto& e : doc["traceEvents"])
      stream_slice = stream_slice || (e["ph"] == "X" && e["tid"].get<int>() >= 1 &&
                                      e["dur"].get<double>() >= 0);
    CHECK(stream_slice);
  }
}

TEST_CASE("anvil-train --profile prints the table and --profile-trace writes a Chrome trace",
          "[cli]") {
  if (!testing::have_fashion_mnist()) {
    WARN("Fashion-MNIST not installed; skipped");
    return;
  }
  testing::TempDir dir;
  const std::string trace = dir.file("trace.json");
  auto r = testing::cli::run_cli("--model lenet --device cpu --epochs 1 --batch-size 16 "
                                 "--limit-train 64 --limit-test 16 --profile --profile-trace " +
                                 testing::cli::quote(trace));
  INFO(r.output);
  REQUIRE(r.code == 0);
  CHECK_THAT(r.output, Catch::Contains("3 steady step(s) after 1 warm-up step(s)"));
  CHECK_THAT(r.output, Catch::Contains("conv backward-weight"));
  CHECK_THAT(r.output, Catch::Contains("step (measured)"));

  const nlohmann::json doc = nlohmann::json::parse(testing::read_file(trace));
  REQUIRE(doc.contains("traceEvents"));
  REQUIRE(doc["traceEvents"].is_array());
  std::set<std::string> cats, names;
  int steps = 0;
  bool process_named = false;
  for (const auto& e : doc["traceEvents"]) {
    REQUIRE(e.contains("ph"));
    CHECK(e["pid"] == 0);  // one rank
    if (e["ph"] == "M") {
      process_named = process_named || e["name"] == "process_name";
      continue;
    }
    REQUIRE(e["ph"] == "X");
    CHECK(e["tid"] == 0);  // the CPU: the host's track
    CHECK(e["ts"].get<double>() >= 0);
    CHECK(e["dur"].get<double>() >= 0);
    CHECK_FALSE(e["name"].get<std::string>().empty());
    cats.insert(e["cat"].get<std::string>());
    names.insert(e["name"].get<std::string>());
    steps += e["cat"] == "step";
  }
  CHECK(process_named);
  CHECK(steps == 3);
  CHECK(cats.count("conv forward") == 1);
  CHECK(cats.count("data wait") == 1);
  CHECK(names.count("conv2d_backward_data") == 1);
}
