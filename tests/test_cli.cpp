// Tests of the anvil-train command line: every bad flag, device, data
// directory, data file and checkpoint ends in a one-line error and a non-zero
// exit (never an abort or a crash), bad output paths fail before any
// training, a short real run writes its metrics and a checkpoint that
// loads back and restarts training, recipes fill the settings that flags do
// not give, and a run stopped after an epoch resumes to the same weights and
// metrics as one that was never interrupted.
#include <catch2/catch.hpp>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/device.h"
#include "core/tensor.h"
#include "kernels/cpu/cpu_kernels.h"
#include "nn/models.h"
#include "nn/safetensors.h"
#include "tests/cli_test_util.h"
#include "tests/cuda_test_util.h"
#include "tests/test_util.h"

using anvil::testing::TempDir;
using anvil::testing::have_fashion_mnist;
using anvil::testing::kFashionDir;
using anvil::testing::read_file;
using namespace anvil::testing::cli;

namespace fs = std::filesystem;
using namespace anvil;
using Catch::Contains;

namespace {

const std::vector<std::string> kLeNetKeys = {"0.weight", "0.bias", "3.weight", "3.bias",
                                             "7.weight", "7.bias", "9.weight", "9.bias"};

}  // namespace

TEST_CASE("anvil-train rejects unknown flags and bad values", "[cli]") {
  expect_failure("--bogus-flag 3", {"--bogus-flag"});
  expect_failure("--epochs", {"--epochs"});
  expect_failure("--batch-size 0", {"--batch-size", "> 0"});
  expect_failure("--epochs -1", {"--epochs"});
  expect_failure("--lr nan", {"--lr", "nan"});
  expect_failure("--momentum -0.5", {"--momentum"});
  expect_failure("--init xavier --device cpu", {"--init", "xavier"});
  expect_failure("--fp32-precision high", {"--fp32-precision", "high"});
  CliResult r = run_cli("--batch-size 0");
  CHECK_THAT(r.output, !Contains("179769"));  // no raw double limits in messages
}

TEST_CASE("anvil-train --help lists the options and exits 0", "[cli]") {
  CliResult r = run_cli("--help");
  INFO(r.output);
  CHECK(r.code == 0);
  for (const char* flag :
       {"--model", "--device", "--epochs", "--batch-size", "--lr", "--data-dir", "--init-from",
        "--save", "--metrics", "--recipe", "--lr-schedule", "--lr-step-epochs", "--lr-gamma",
        "--lr-min", "--warmup-epochs", "--resize", "--augment", "--no-augment", "--normalize",
        "--crop-padding", "--label-smoothing", "--checkpoint", "--resume", "--stop-after-epoch",
        "--bn-recalibrate", "--accumulate"})
    CHECK_THAT(r.output, Contains(flag));
  for (const char* model : {"lenet", "resnet18", "resnet18-96"})
    CHECK_THAT(r.output, Contains(model));
  CHECK_THAT(r.output, Contains("Recipes"));
}

TEST_CASE("anvil-train --model nosuch: one error line naming the model", "[cli]") {
  // Default device (auto): the model is checked before the GPU probe, so the
  // error is the only output.
  CliResult r = expect_failure("--model nosuch", {"nosuch", "lenet", "resnet18", "resnet18-96"});
  CHECK(lines_of(r.output).size() == 1);
  CHECK(count_lines_containing(r.output, "error") == 1);
  CHECK(count_lines_containing(r.output, "nosuch") == 1);
  CliResult cpu = expect_failure("--model nosuch --device cpu", {"nosuch"});
  CHECK(lines_of(cpu.output).size() == 1);
}

TEST_CASE("anvil-train refuses unknown or absent devices, naming them", "[cli]") {
  CliResult bad = expect_failure("--device gpu0", {"gpu0"});
  CHECK(count_lines_containing(bad.output, "error") == 1);
  if (device_count() <= 7) {
    CliResult absent = expect_failure("--device cuda:7", {"cuda:7"});
    CHECK(count_lines_containing(absent.output, "error") == 1);
  }
  expect_failure("--device cuda:x", {"cuda:x"});
  expect_failure("--device ''", {"--device"});
}

TEST_CASE("anvil-train reports a missing data directory", "[cli]") {
  TempDir dir;
  std::string missing = dir.file("no-such-dir");
  CliResult r = expect_failure("--device cpu --data-dir " + quote(missing), {missing});
  CHECK(count_lines_containing(r.output, "error") == 1);
  expect_failure("--device cpu --data-dir /nonexistent", {"/nonexistent"});
  // A directory without the files names the file it looked for.
  TempDir empty;
  expect_failure("--device cpu --data-dir " + quote(empty.path.string()),
                 {empty.path.string(), "train-images-idx3-ubyte"});
}

TEST_CASE("anvil-train reports a truncated IDX images file", "[cli]") {
  TempDir dir;
  write_synthetic_split(dir.path, 100, 20);
  // Header says 100 images, but only 1000 bytes of pixels follow.
  write_file(dir.file("train-images-idx3-ubyte"), idx_images(100, 1000, 1));
  std::string images = dir.file("train-images-idx3-ubyte");
  CliResult r = expect_failure("--device cpu --data-dir " + quote(dir.path.string()),
                               {images, "truncated"});
  CHECK(count_lines_containing(r.output, "error") == 1);
  // The same with the real label files next to it, when present.
  if (have_fashion_mnist()) {
    TempDir real;
    for (const char* f : {"train-labels-idx1-ubyte.gz", "t10k-labels-idx1-ubyte.gz",
                          "t10k-images-idx3-ubyte.gz"})
      fs::copy_file(fs::path(kFashionDir) / f, real.path / f);
    write_file(real.file("train-images-idx3-ubyte"), idx_images(60000, 5000, 1));
    expect_failure("--device cpu --data-dir " + quote(real.path.string()),
                   {real.file("train-images-idx3-ubyte"), "truncated"});
  }
}

TEST_CASE("anvil-train --init-from reports bad checkpoints, naming file and tensor", "[cli]") {
  TempDir dir;
  SECTION("missing file") {
    std::string path = dir.file("absent.safetensors");
    expect_failure("--device cpu --init-from " + quote(path), {path});
  }
  SECTION("garbage") {
    std::string path = dir.file("garbage.safetensors");
    std::string text = "this is not a checkpoint, just some text that goes on for a while\n";
    write_file(path, std::vector<uint8_t>(text.begin(), text.end()));
    CliResult r = expect_failure("--device cpu --init-from " + quote(path), {path});
    CHECK(count_lines_containing(r.output, "error") == 1);
  }
  SECTION("a directory") {
    expect_failure("--device cpu --init-from " + quote(dir.path.string()),
                   {dir.path.string(), "directory"});
  }
  SECTION("a tensor of the wrong shape") {
    std::string path = dir.file("wrong.safetensors");
    auto net = models::lenet(models::Init::Default);
    auto state = net->state_dict();
    for (auto& [name, t] : state)
      if (name == "7.weight") t = Tensor::zeros({128, 801});
    nn::save_safetensors(path, state);
    expect_failure("--device cpu --init-from " + quote(path), {path, "7.weight", "[128, 801]"});
  }
  SECTION("a checkpoint of another model") {
    std::string path = dir.file("other.safetensors");
    nn::save_safetensors(path, {{"fc.weight", Tensor::zeros({10, 784})}});
    expect_failure("--device cpu --init-from " + quote(path), {path, "fc.weight", "0.weight"});
  }
}

TEST_CASE("anvil-train checks --save and --metrics paths before training", "[cli]") {
  TempDir dir;
  std::string save = dir.file("no/such/dir/model.safetensors");
  // The data directory is missing too: the output path must be checked first,
  // before any data is read or any epoch runs.
  CliResult r = expect_failure(
      "--device cpu --epochs 50 --save " + quote(save) + " --data-dir " + quote(dir.file("nodata")),
      {"--save", save});
  CHECK(r.code == 2);
  CHECK_THAT(r.output, !Contains("nodata"));
  CHECK(r.seconds < 30);
  CHECK_FALSE(fs::exists(dir.file("no")));

  std::string metrics = dir.file("missing/metrics.jsonl");
  expect_failure("--device cpu --metrics " + quote(metrics) + " --data-dir " +
                     quote(dir.file("nodata")),
                 {"--metrics", metrics});
  // A directory is not a file to write.
  expect_failure("--device cpu --save " + quote(dir.path.string()), {"--save", "directory"});

  if (have_fashion_mnist()) {
    // With real data present, still no training before the error.
    CliResult real = expect_failure("--device cpu --epochs 50 --save " + quote(save),
                                    {"--save", save});
    CHECK(real.seconds < 30);
  }
}

TEST_CASE("anvil-train trains, writes metrics and a checkpoint, and restarts from it", "[cli]") {
  TempDir dir;
  std::string data_dir = kFashionDir;
  if (!have_fashion_mnist()) {
    WARN("Fashion-MNIST not found in " << kFashionDir << "; using synthetic data");
    write_synthetic_split(dir.path / "data", 256, 128);
    data_dir = (dir.path / "data").string();
  }
  std::string metrics = dir.file("metrics.jsonl");
  std::string ckpt = dir.file("lenet.safetensors");
  std::string args = "--epochs 1 --limit-train 256 --limit-test 128 --batch-size 64 --data-dir " +
                     quote(data_dir) + " --metrics " + quote(metrics) + " --save " + quote(ckpt);
  CliResult r = run_cli(args);
  INFO("anvil-train " << args << "\nexit " << r.code << ", output:\n" << r.output);
  REQUIRE(r.code == 0);
  check_no_crash(r);
  CHECK_THAT(r.output, Contains("256 train / 128 test images"));
  CHECK_THAT(r.output, Contains("epoch   1/1: train loss "));
  CHECK_THAT(r.output, !Contains("\r"));  // no progress bar when not on a terminal
  CHECK(count_lines_containing(r.output, "test acc: ") == 1);
  std::string device = device_count() > 0 && !devices_are_simulated() ? "cuda:0" : "cpu";
  CHECK_THAT(r.output, Contains("sec/epoch on [" + device + "]"));

  auto metric_lines = lines_of(read_file(metrics));
  REQUIRE(metric_lines.size() == 1);
  auto m = nlohmann::json::parse(metric_lines[0]);
  REQUIRE(m.is_object());
  for (const char* key : {"epoch", "train_loss", "train_acc", "test_acc", "epoch_seconds",
                          "images_per_second", "device"})
    CHECK(m.contains(key));
  CHECK(m["epoch"] == 1);
  double loss = m["train_loss"].get<double>();
  CHECK(std::isfinite(loss));
  CHECK(loss > 0);
  CHECK(loss < 10);
  for (const char* key : {"train_acc", "test_acc"}) {
    double acc = m[key].get<double>();
    CHECK(acc >= 0);
    CHECK(acc <= 1);
  }
  CHECK(m["epoch_seconds"].get<double>() > 0);
  CHECK(m["images_per_second"].get<double>() > 0);
  CHECK(m["device"] == device);

  auto state = nn::load_safetensors(ckpt);
  REQUIRE(state.size() == kLeNetKeys.size());
  for (size_t i = 0; i < state.size(); ++i) CHECK(state[i].first == kLeNetKeys[i]);
  CHECK(state[4].second.shape() == Shape{128, 800});
  // Trained: not the seed init's zero biases any more.
  auto b = state[7].second.to_vector();
  bool moved = false;
  for (float v : b) moved |= v != 0.0f;
  CHECK(moved);
  CHECK(dir.temporaries() == 0);
  CHECK(fs::exists(metrics));

  // Restart from the checkpoint; with no epochs the saved weights are the loaded ones.
  std::string again = dir.file("again.safetensors");
  CliResult r2 = run_cli("--epochs 0 --limit-train 64 --limit-test 64 --data-dir " +
                         quote(data_dir) + " --init-from " + quote(ckpt) + " --save " +
                         quote(again));
  INFO("restart output:\n" << r2.output);
  REQUIRE(r2.code == 0);
  check_no_crash(r2);
  auto state2 = nn::load_safetensors(again);
  REQUIRE(state2.size() == state.size());
  for (size_t i = 0; i < state.size(); ++i) {
    INFO(state[i].first);
    CHECK(state2[i].first == state[i].first);
    CHECK(state2[i].second.to_vector() == state[i].second.to_vector());
  }
}

TEST_CASE("anvil-train --list-devices prints each device or says there is none", "[cli][cuda]") {
  CliResult r = run_cli("--list-devices");
  INFO(r.output);
  REQUIRE(r.code == 0);
  check_no_crash(r);
  const int n = device_count();
  if (!cuda_test::have_device("CUDA part")) {
    CHECK(count_lines_containing(r.output, "no CUDA devices") == 1);
  } else {
    CHECK(count_lines_containing(r.output, "compute capability") == n);
    CHECK_THAT(r.output, Contains("cuda:0"));
    if (devices_are_simulated()) CHECK(count_lines_containing(r.output, "(simulated)") == n);
  }
}

TEST_CASE("anvil-train trains on the last CUDA device", "[cli][cuda]") {
  if (!cuda_test::have_device("CUDA test")) return;
  const int n = device_count();
  TempDir dir;
  std::string data_dir = kFashionDir;
  if (!have_fashion_mnist()) {
    write_synthetic_split(dir.path / "data", 32, 16);
    data_dir = (dir.path / "data").string();
  }
  std::string device = Device::cuda(n - 1).str();
  // Small: on the simulator every CUDA thread is a fiber on one CPU core.
  std::string args = "--device " + device +
                     " --epochs 1 --limit-train 32 --limit-test 16 --batch-size 16 --data-dir " +
                     quote(data_dir);
  CliResult r = run_cli(args);
  INFO("anvil-train " << args << "\nexit " << r.code << ", output:\n" << r.output);
  REQUIRE(r.code == 0);
  check_no_crash(r);
  CHECK_THAT(r.output, Contains("sec/epoch on [" + device + "]"));
  CHECK_THAT(r.output, !Contains("no GPU available"));
}

TEST_CASE("anvil-train rejects bad recipes, schedules and transforms, naming the flag", "[cli]") {
  // Each is refused before any data is read (the data directory is missing).
  const std::string nodata = " --device cpu --data-dir /nonexistent";
  auto one_error = [&](const std::string& args, std::initializer_list<std::string> parts) {
    CliResult r = expect_failure(args + nodata, parts);
    CHECK(r.code == 2);
    CHECK(count_lines_containing(r.output, "error") == 1);
    CHECK_THAT(r.output, !Contains("/nonexistent"));
  };
  one_error("--recipe fast", {"--recipe", "'fast'", "seed, best"});
  one_error("--lr-schedule linear", {"--lr-schedule", "'linear'", "constant, step, cosine"});
  one_error("--lr-schedule step --lr-step-epochs 0", {"--lr-step-epochs", "got 0"});
  one_error("--lr-schedule step --lr-gamma 2", {"--lr-gamma", "2"});
  one_error("--lr-schedule cosine --lr 0.1 --lr-min 0.5", {"--lr-min", "0.5"});
  one_error("--warmup-epochs 12 --epochs 10", {"--warmup-epochs", "--epochs 10"});
  one_error("--warmup-epochs 1 --warmup-start-factor 0", {"--warmup-start-factor"});
  one_error("--model lenet --resize 96", {"--resize 96", "lenet", "28x28"});
  one_error("--model resnet18-96 --resize 64", {"--resize 64", "resnet18-96"});
  one_error("--recipe best --momentum 0", {"--nesterov", "--momentum"});
  expect_failure("--resize -1", {"--resize"});
  expect_failure("--crop-padding -2", {"--crop-padding"});
  expect_failure("--stop-after-epoch -1", {"--stop-after-epoch"});
  TempDir dir;
  std::string missing = dir.file("absent.ckpt");
  one_error("--resume " + quote(missing), {"--resume", missing, "no such file"});
  std::string ckpt = dir.file("run.ckpt");
  write_file(ckpt, {1, 2, 3});
  one_error("--resume " + quote(ckpt) + " --init-from " + quote(ckpt), {"--resume", "--init-from"});
  one_error("--checkpoint " + quote(dir.file("no/such/dir/run.ckpt")),
            {"--checkpoint", "no/such/dir"});
  // Outputs that would overwrite one another, or another run's checkpoint.
  one_error("--checkpoint " + quote(ckpt), {"--checkpoint", ckpt, "exists", "--resume"});
  std::string out = dir.file("out.safetensors");
  one_error("--save " + quote(out) + " --checkpoint " + quote(out),
            {"--save", "--checkpoint", "same file"});
  one_error("--metrics " + quote(out) + " --save " + quote(dir.path.string() + "/./out.safetensors"),
            {"--save", "--metrics", "same file"});
  // Transforms that cannot be what was meant.
  one_error("--crop-padding 2", {"--crop-padding", "--augment"});
  one_error("--augment --crop-padding 28", {"--crop-padding 28", "image size (28)"});
  one_error("--model resnet18 --augment --resize 32 --crop-padding 40",
            {"--crop-padding 40", "(32)"});
  one_error("--model resnet18 --resize 5000", {"--resize 5000", "1024"});
  one_error("--model lenet --bn-recalibrate 5", {"--bn-recalibrate 5", "lenet", "no BatchNorm"});
  expect_failure("--bn-recalibrate -1", {"--bn-recalibrate"});
  expect_failure("--accumulate 0", {"--accumulate"});
  one_error("--label-smoothing 1.5", {"--label-smoothing 1.5", "[0, 1]"});
  expect_failure("--label-smoothing -0.1", {"--label-smoothing"});
  one_error("--lr-min nan", {"--lr-min", "finite", "nan"});
  one_error("--warmup-start-factor inf", {"--warmup-start-factor", "finite"});
}

TEST_CASE("anvil-train --recipe fills what the flags leave, flags override it", "[cli]") {
  TempDir dir;
  write_synthetic_split(dir.path / "data", 64, 32);
  const std::string data_dir = " --device cpu --data-dir " + quote((dir.path / "data").string());
  // No training: the header says what the run would do. (The best recipe's
  // warmup epoch is no error in a run of 0 epochs.)
  const std::string data = " --epochs 0" + data_dir;
  SECTION("seed (the default) is the seeds' plain SGD") {
    CliResult r = run_cli("--model lenet" + data);
    INFO(r.output);
    REQUIRE(r.code == 0);
    CHECK_THAT(r.output, Contains("batch 256, lr 0.2, 0 epochs"));
    CHECK_THAT(r.output, Contains("recipe seed: init seed, SGD momentum 0, weight decay 0, "
                                  "schedule constant, transforms none"));
    CHECK_THAT(r.output, Contains("float32 math (--fp32-precision default): conv FP32 (Winograd "
                                  "for 3x3), matmul FP32"));
  }
  SECTION("--fp32-precision tf32 on the cpu emulates the tensor cores") {
    CliResult r = run_cli("--model lenet --fp32-precision tf32" + data);
    INFO(r.output);
    REQUIRE(r.code == 0);
    CHECK_THAT(r.output, Contains("float32 math (--fp32-precision tf32): conv TF32 (emulated), "
                                  "matmul TF32 (emulated)"));
  }
  SECTION("best") {
    CliResult r = run_cli("--model lenet --recipe best" + data);
    INFO(r.output);
    REQUIRE(r.code == 0);
    CHECK_THAT(r.output, Contains("batch 128, lr 0.05"));
    CHECK_THAT(r.output,
               Contains("init kaiming, SGD momentum 0.9 (nesterov), weight decay 0.0005"));
    CHECK_THAT(r.output, Contains("schedule cosine (to 0), 1 warmup epoch(s) from 0.1x"));
    CHECK_THAT(r.output, Contains("transforms normalise (mean 0."));
  }
  SECTION("best for ResNet-18: 15 epochs, crop + flip, label smoothing 0.1") {
    // The preset's epoch count shows only when --epochs is not given, so this
    // trains one epoch on 16 images and stops.
    CliResult r = run_cli("--model resnet18 --recipe best --limit-train 16 "
                          "--limit-test 16 --stop-after-epoch 1" + data_dir);
    INFO(r.output);
    REQUIRE(r.code == 0);
    CHECK_THAT(r.output, Contains("batch 128, lr 0.1, 15 epochs"));
    CHECK_THAT(r.output, Contains("transforms normalise (mean 0."));
    CHECK_THAT(r.output, Contains("random crop (padding 2) + flip, label smoothing 0.1"));
  }
  SECTION("best with overrides: each explicit flag wins, the rest stays") {
    CliResult r = run_cli("--model lenet --recipe best --lr 0.01 --batch-size 32 --no-nesterov "
                          "--no-normalize --augment --crop-padding 3 --lr-schedule step "
                          "--lr-step-epochs 4 --lr-gamma 0.5" + data);
    INFO(r.output);
    REQUIRE(r.code == 0);
    CHECK_THAT(r.output, Contains("batch 32, lr 0.01"));
    CHECK_THAT(r.output, Contains("init kaiming, SGD momentum 0.9, weight decay 0.0005"));
    CHECK_THAT(r.output, Contains("schedule step (x0.5 every 4 epochs), 1 warmup epoch(s)"));
    CHECK_THAT(r.output, Contains("transforms random crop (padding 3) + flip"));
    CHECK_THAT(r.output, !Contains("normalise"));
  }
  SECTION("seed with overrides") {
    CliResult r = run_cli("--recipe seed --momentum 0.5 --init kaiming --warmup-epochs 1 "
                          "--epochs 3 --resize 28" + data_dir);
    INFO(r.output);
    REQUIRE(r.code == 0);
    CHECK_THAT(r.output, Contains("batch 256, lr 0.2, 3 epochs"));
    CHECK_THAT(r.output, Contains("init kaiming, SGD momentum 0.5, weight decay 0, schedule "
                                  "constant, 1 warmup epoch(s) from 0.1x, transforms resize 28"));
  }
}

namespace {

// One JSON object per line of a metrics file.
std::vector<nlohmann::json> read_metrics(const std::string& path) {
  std::vector<nlohmann::json> out;
  for (auto& line : lines_of(read_file(path))) out.push_back(nlohmann::json::parse(line));
  return out;
}

}  // namespace

TEST_CASE("anvil-train --checkpoint / --resume: 1 + 1 epochs equal 2 straight", "[cli]") {
  TempDir dir;
  std::string data_dir = kFashionDir;
  if (!have_fashion_mnist()) {
    WARN("Fashion-MNIST not found in " << kFashionDir << "; using synthetic data");
    write_synthetic_split(dir.path / "data", 512, 128);
    data_dir = (dir.path / "data").string();
  }
  // The best recipe exercises what a resume must restore: momentum buffers,
  // the cosine schedule's position after a warmup epoch, and the epoch's
  // shuffling and augmentation.
  const std::string common = "--device cpu --model lenet --recipe best --augment --epochs 2 "
                             "--limit-train 512 --limit-test 128 --batch-size 64 --data-dir " +
                             quote(data_dir);
  auto run_ok = [&](const std::string& args) {
    CliResult r = run_cli(common + " " + args);
    INFO("anvil-train " << common << " " << args << "\nexit " << r.code << ", output:\n"
                        << r.output);
    REQUIRE(r.code == 0);
    check_no_crash(r);
    return r;
  };
  std::string straight = dir.file("straight.safetensors");
  std::string resumed = dir.file("resumed.safetensors");
  std::string ckpt = dir.file("run.ckpt");
  run_ok("--save " + quote(straight) + " --metrics " + quote(dir.file("straight.jsonl")));

  CliResult first = run_ok("--checkpoint " + quote(ckpt) + " --stop-after-epoch 1 --metrics " +
                           quote(dir.file("resumed.jsonl")));
  CHECK_THAT(first.output, Contains("epoch   1/2"));
  CHECK_THAT(first.output, !Contains("epoch   2/2"));
  CHECK_THAT(first.output, Contains("stopped after epoch 1 of 2"));
  REQUIRE(fs::exists(ckpt));
  CHECK(dir.temporaries() == 0);
  {
    // Weights, one momentum buffer per parameter and the counters.
    auto tensors = nn::load_safetensors(ckpt);
    int model = 0, momentum = 0, state = 0;
    for (auto& [name, t] : tensors) {
      model += name.starts_with("model.");
      momentum += name.starts_with("optimizer.momentum.");
      state += name == "trainer.state";
    }
    CHECK(model == int(kLeNetKeys.size()));
    CHECK(momentum == int(kLeNetKeys.size()));
    CHECK(state == 1);
  }
  CliResult second = run_ok("--resume " + quote(ckpt) + " --save " + quote(resumed) +
                            " --metrics " + quote(dir.file("resumed.jsonl")));
  CHECK_THAT(second.output, Contains("resumed from " + ckpt + " after epoch 1/2"));
  CHECK_THAT(second.output, !Contains("epoch   1/2"));
  CHECK_THAT(second.output, Contains("epoch   2/2"));

  auto a = nn::load_safetensors(straight), b = nn::load_safetensors(resumed);
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    INFO(a[i].first);
    CHECK(a[i].first == b[i].first);
    CHECK(a[i].second.to_vector() == b[i].second.to_vector());  // bit for bit
  }
  auto ma = read_metrics(dir.file("straight.jsonl")), mb = read_metrics(dir.file("resumed.jsonl"));
  REQUIRE(ma.size() == 2);
  REQUIRE(mb.size() == 2);  // the resumed file has the first invocation's epoch too
  for (size_t i = 0; i < 2; ++i)
    for (const char* key :
         {"epoch", "train_loss", "train_acc", "test_loss", "test_acc", "last_lr"}) {
      INFO("epoch " << i + 1 << ": " << key);
      CHECK(ma[i][key] == mb[i][key]);
    }
  // 8 batches an epoch: the first is the warmup, the second the cosine.
  CHECK(ma[0]["last_lr"].get<double>() == Approx(0.05 * (0.1 + 0.9 * 7 / 8)));
  CHECK(ma[1]["last_lr"].get<double>() == Approx(0.05 * (1 + std::cos(M_PI * 7 / 8)) / 2));

  // The checkpoint now holds both epochs: resuming again trains nothing.
  CliResult done = run_ok("--resume " + quote(ckpt));
  CHECK_THAT(done.output, Contains("after epoch 2/2"));
  CHECK_THAT(done.output, !Contains("epoch   2/2:"));

  // A resume with other training flags is refused, naming the file and the flag.
  CliResult other = expect_failure(common + " --resume " + quote(ckpt) + " --lr 0.01",
                                   {ckpt, "--lr 0.05", "--lr 0.01"});
  CHECK(count_lines_containing(other.output, "error") == 1);
  expect_failure(common + " --resume " + quote(ckpt) + " --epochs 3", {ckpt, "--epochs"});
  expect_failure(common + " --resume " + quote(ckpt) + " --seed 7", {ckpt, "--seed"});
  // Another model is named as such, not as a list of mismatched tensors.
  std::string resnet = common;
  resnet.replace(resnet.find("--model lenet"), 13, "--model resnet18");
  CliResult model = expect_failure(resnet + " --resume " + quote(ckpt),
                                   {ckpt, "--model \"lenet\"", "--model \"resnet18\""});
  CHECK_THAT(model.output, !Contains("weight"));
  // Resuming onto --save would replace the checkpoint with weights only.
  expect_failure(common + " --resume " + quote(ckpt) + " --save " + quote(ckpt),
                 {"--save", "--checkpoint", "same file"});
  CHECK(nn::load_safetensors(ckpt).size() > kLeNetKeys.size());  // still the whole checkpoint
  // A weights-only file, or garbage, is not a training checkpoint.
  expect_failure(common + " --resume " + quote(straight), {straight, "trainer.state"});
  std::string garbage = dir.file("garbage.ckpt");
  write_file(garbage, std::vector<uint8_t>(64, 'x'));
  expect_failure(common + " --resume " + quote(garbage), {garbage});
}

TEST_CASE("anvil-train --label-smoothing trains against smoothed targets", "[cli]") {
  TempDir dir;
  write_synthetic_split(dir.path / "data", 64, 32);
  const std::string common = "--device cpu --model lenet --epochs 1 --batch-size 16 --data-dir " +
                             quote((dir.path / "data").string());
  auto metrics_of = [&](const std::string& args, const std::string& file) {
    CliResult r = run_cli(common + " --metrics " + quote(file) + " " + args);
    INFO("exit " << r.code << ", output:\n" << r.output);
    REQUIRE(r.code == 0);
    const bool shown = r.output.find(", label smoothing ") != std::string::npos;
    CHECK(shown == (args.find("--label-smoothing 0.") != std::string::npos));
    return nlohmann::json::parse(lines_of(read_file(file)).at(0));
  };
  auto plain = metrics_of("", dir.file("plain.jsonl"));
  auto smoothed = metrics_of("--label-smoothing 0.2", dir.file("smoothed.jsonl"));
  // From the same weights, the smoothed loss of the first batches is another
  // number, and the steps it takes lead elsewhere.
  CHECK(smoothed["train_loss"].get<double>() != plain["train_loss"].get<double>());
  CHECK(smoothed["test_loss"].get<double>() != plain["test_loss"].get<double>());
  auto zero = metrics_of("--label-smoothing 0", dir.file("zero.jsonl"));
  CHECK(zero["train_loss"].get<double>() == plain["train_loss"].get<double>());
  // A run is resumed only with the smoothing it was trained with.
  std::string ckpt = dir.file("run.ckpt");
  REQUIRE(run_cli(common + " --label-smoothing 0.2 --epochs 2 --stop-after-epoch 1 --checkpoint " +
                  quote(ckpt)).code == 0);
  expect_failure(common + " --epochs 2 --resume " + quote(ckpt),
                 {ckpt, "--label-smoothing 0.2", "--label-smoothing 0.0"});
}

TEST_CASE("anvil-train --accumulate: micro-batches, one step per batch, said in the header",
          "[cli]") {
  TempDir dir;
  write_synthetic_split(dir.path / "data", 32, 16);
  // Kaiming weights and a large rate, so that two steps move the loss.
  const std::string common =
      "--device cpu --model lenet --epochs 1 --batch-size 16 --init kaiming --lr 0.1 "
      "--momentum 0.9 --data-dir " + quote((dir.path / "data").string());
  std::string metrics = dir.file("metrics.jsonl"), plain_metrics = dir.file("plain.jsonl");
  CliResult r = run_cli(common + " --accumulate 3 --metrics " + quote(metrics));
  INFO("exit " << r.code << ", output:\n" << r.output);
  REQUIRE(r.code == 0);
  check_no_crash(r);
  CHECK_THAT(r.output, Contains("gradient accumulation: each step's batch as 3 micro-batches"));
  CliResult plain = run_cli(common + " --metrics " + quote(plain_metrics));
  REQUIRE(plain.code == 0);
  CHECK_THAT(plain.output, !Contains("accumulation"));
  auto m = nlohmann::json::parse(lines_of(read_file(metrics)).at(0));
  auto p = nlohmann::json::parse(lines_of(read_file(plain_metrics)).at(0));
  CHECK(m["accumulate"] == 3);
  CHECK(p["accumulate"] == 1);
  // LeNet has no BatchNorm: two steps on micro-batches of 5, 5 and 6 end
  // where two steps on the whole batches do, up to float rounding.
  CHECK(m["test_loss"].get<double>() == Approx(p["test_loss"].get<double>()).epsilon(1e-4));
  CHECK(m["train_loss"].get<double>() == Approx(p["train_loss"].get<double>()).epsilon(1e-4));
}

TEST_CASE("anvil-train --amp bf16: said in the header and metrics, float32 weights saved",
          "[cli][autocast]") {
  TempDir dir;
  write_synthetic_split(dir.path / "data", 32, 16);
  const std::string common =
      "--device cpu --model lenet --epochs 1 --batch-size 16 --init kaiming --lr 0.1 "
      "--momentum 0.9 --data-dir " + quote((dir.path / "data").string());
  const std::string metrics = dir.file("amp.jsonl"), plain_metrics = dir.file("plain.jsonl");
  const std::string weights = dir.file("amp.safetensors");
  CliResult r = run_cli(common + " --amp bf16 --metrics " + quote(metrics) + " --save " +
                        quote(weights));
  INFO("exit " << r.code << ", output:\n" << r.output);
  REQUIRE(r.code == 0);
  check_no_crash(r);
  CHECK_THAT(r.output, Contains(std::string("amp bf16: conv and linear in BF16 (") +
                                cpu::bf16_math_word() + ")"));
  CliResult plain = run_cli(common + " --metrics " + quote(plain_metrics));
  REQUIRE(plain.code == 0);
  CHECK_THAT(plain.output, !Contains("amp bf16"));
  auto m = nlohmann::json::parse(lines_of(read_file(metrics)).at(0));
  auto p = nlohmann::json::parse(lines_of(read_file(plain_metrics)).at(0));
  CHECK(m["amp"] == "bf16");
  CHECK(p["amp"] == "off");
  // Two steps in bfloat16 stay near the float32 run (bfloat16 keeps 8 bits),
  // but are not it.
  CHECK(m["train_loss"].get<double>() == Approx(p["train_loss"].get<double>()).epsilon(0.05));
  CHECK(m["train_loss"].get<double>() != p["train_loss"].get<double>());
  // The master weights are what is saved: float32, as PyTorch loads them.
  for (const auto& [name, t] : nn::load_safetensors(weights)) {
    INFO(name);
    CHECK(t.dtype() == DType::Float32);
  }
  CHECK_FALSE(run_cli(common + " --amp fp16").code == 0);
}

TEST_CASE("anvil-train --bn-recalibrate re-estimates BatchNorm statistics before evaluating",
          "[cli]") {
  TempDir dir;
  write_synthetic_split(dir.path / "data", 32, 16);
  const std::string common = "--device cpu --model resnet18 --epochs 1 --batch-size 16 --data-dir " +
                             quote((dir.path / "data").string());
  // Two training batches an epoch: three is more than there are.
  CliResult too_many = expect_failure(common + " --bn-recalibrate 3",
                                      {"--bn-recalibrate 3", "2 training batches of 16"});
  CHECK(too_many.code == 2);

  std::string weights = dir.file("resnet.safetensors");
  std::string metrics = dir.file("metrics.jsonl");
  CliResult r = run_cli(common + " --bn-recalibrate 1 --save " + quote(weights) + " --metrics " +
                        quote(metrics));
  INFO("exit " << r.code << ", output:\n" << r.output);
  REQUIRE(r.code == 0);
  check_no_crash(r);
  CHECK_THAT(r.output, Contains("re-estimated over 1 training batches before each evaluation"));
  auto m = nlohmann::json::parse(lines_of(read_file(metrics)).at(0));
  CHECK(m["bn_recalibrate"] == 1);
  // Evaluated twice: with the running statistics training left, exactly as
  // a run without the flag evaluates, then with the re-estimated ones.
  CHECK_THAT(r.output, Contains("(running statistics: "));
  std::string plain_metrics = dir.file("plain.jsonl");
  CliResult plain = run_cli(common + " --metrics " + quote(plain_metrics));
  REQUIRE(plain.code == 0);
  CHECK_THAT(plain.output, !Contains("running statistics"));
  auto p = nlohmann::json::parse(lines_of(read_file(plain_metrics)).at(0));
  CHECK_FALSE(p.contains("test_acc_running_stats"));
  CHECK(m["test_loss_running_stats"].get<double>() == p["test_loss"].get<double>());
  CHECK(m["test_acc_running_stats"].get<double>() == p["test_acc"].get<double>());
  CHECK(m["train_loss"].get<double>() == p["train_loss"].get<double>());
  // After two steps from N(0, 0.01) weights the running averages are still
  // near their start (mean 0, variance 1): far from the batches' statistics.
  CHECK(m["test_loss"].get<double>() != m["test_loss_running_stats"].get<double>());
  // Training took two steps; the statistics were then rebuilt from one batch.
  int batch_norms = 0;
  for (auto& [name, t] : nn::load_safetensors(weights))
    if (name.ends_with("num_batches_tracked")) {
      ++batch_norms;
      CHECK(t.to_int_vector() == std::vector<int64_t>{1});
    }
  CHECK(batch_norms == 17);
}
