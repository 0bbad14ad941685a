// anvil-train --pipeline-parallel and --tensor-parallel, end to end: a
// pipeline of 2 stages on 2 MPI ranks saves bit for bit the weights (and
// metrics) of one device with --accumulate M, with either schedule, and
// prints its cut and what each rank measured; its checkpoint is one
// whole-model file that resumes on one device, and one device's resumes as a
// pipeline; 2 replicas of a 2-stage pipeline on 4 ranks end where 2
// data-parallel ranks with --accumulate do, with --sync-bn too (and then
// within 1e-4 of one device on the same micro-batches); a pipeline of simulated GPUs
// (--gpus 2) ends where one GPU does. LeNet's linear layers and ResNet-18's
// residual blocks split over 2 ranks (--tensor-parallel 2) end where one
// device does, within the data-parallel runs' tolerance (under --amp bf16,
// within bfloat16's rounding); 2 stages split over 2 ranks each on 4 ranks
// too; a pipeline's checkpoint resumes split, a split run's on one device.
// Flags that cannot make a pipeline or a split get one clear error. Needs
// the build's MPI.
#if defined(ANVIL_MPIEXEC)
#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <tuple>
#include <vector>

#include <fmt/format.h>

#include "core/device.h"
#include "tests/cli_mpi_util.h"
#include "tests/cuda_test_util.h"
#include "tests/skip.h"
#include "tests/test_util.h"

using anvil::testing::read_file;
using anvil::testing::TempDir;
using Catch::Contains;
using namespace anvil::testing::mpi_cli;

namespace {

// The same bits: the files' bytes, and every figure of every epoch.
void require_same_run(const TempDir& dir, const std::string& a, const std::string& b) {
  const std::string wa = read_file(dir.file(a + ".safetensors"));
  REQUIRE(!wa.empty());
  REQUIRE(wa == read_file(dir.file(b + ".safetensors")));
  require_same_metrics(dir.file(a + ".jsonl"), dir.file(b + ".jsonl"), 0);
}

std::string outputs(const TempDir& dir, const std::string& tag) {
  return " --save " + dir.file(tag + ".safetensors") + " --metrics " + dir.file(tag + ".jsonl");
}

// The first order.size() training images and labels of a write_data
// directory put in `order`: image i of the result is image order[i].
void reorder_training_set(const std::filesystem::path& dir, const std::vector<size_t>& order) {
  for (const auto& [name, header, bytes] : {std::tuple{"train-images-idx3-ubyte", 16, 784},
                                            std::tuple{"train-labels-idx1-ubyte", 8, 1}}) {
    const std::string path = (dir / name).string();
    const std::string in = read_file(path);
    std::string out = in;
    for (size_t i = 0; i < order.size(); ++i)
      out.replace(size_t(header) + i * size_t(bytes), size_t(bytes),
                  in.substr(size_t(header) + order[i] * size_t(bytes), size_t(bytes)));
    std::ofstream(path, std::ios::binary) << out;
  }
}

// One process on the CPU with the MPI ranks' thread count: the same sums.
std::string one_process() { return kMpiEnv + train_bin(); }

// One process with `common + one_flags`, then `ranks` MPI ranks with
// `common + flags`: the second prints `words`, and its every metric and saved
// weight lie within `tol` of the first's (relative).
void require_near_one_device(const TempDir& dir, const std::string& common,
                             const std::string& one_flags, int ranks, const std::string& flags,
                             const std::string& words, double tol = 1e-4) {
  const Run one = shell(one_process() + common + one_flags + outputs(dir, "one"), dir);
  INFO(one.output);
  REQUIRE(one.code == 0);
  const Run split =
      shell(mpirun(ranks) + train_bin() + " --distributed" + flags + common + outputs(dir, "split"), dir);
  INFO(split.output);
  REQUIRE(split.code == 0);
  REQUIRE_THAT(split.output, Contains(words));
  require_same_metrics(dir.file("split.jsonl"), dir.file("one.jsonl"), tol);
  require_same_weights(dir.file("split.safetensors"), dir.file("one.safetensors"), tol);
}

}  // namespace

TEST_CASE("anvil-train --pipeline-parallel 2 on 2 MPI ranks saves what one device with "
          "--accumulate saves, bit for bit",
          "[cli][distributed][pipeline]") {
  TempDir dir("pipe");
  write_data(dir.path / "data");
  const std::string common = kRecipe + " --device cpu --data-dir " + (dir.path / "data").string();
  const Run one = shell(one_process() + common + " --accumulate 3" + outputs(dir, "one"), dir);
  INFO(one.output);
  REQUIRE(one.code == 0);
  for (const std::string schedule : {"gpipe", "1f1b"}) {
    const Run pipe = shell(mpirun(2) + train_bin() + " --distributed" + common +
                               " --pipeline-parallel 2 --micro-batches 3 --pipeline-schedule " +
                               schedule + outputs(dir, schedule),
                           dir);
    INFO(pipe.output);
    REQUIRE(pipe.code == 0);
    REQUIRE_THAT(pipe.output,
                 Contains("pipeline parallel: 2 stages, " + schedule +
                          " schedule, 3 micro-batches per step (mesh dp 1 × pp 2 × tp 1); "
                          "GPipe's bubble (N-1)/(M+N-1) = 25.0%"));
    REQUIRE_THAT(pipe.output, Contains("    stage 0: layers 0..2 (Conv2d 0 .. AvgPool2d 2)"));
    REQUIRE_THAT(pipe.output, Contains("sends float32 [20, 13, 13] per image"));
    REQUIRE_THAT(pipe.output, Contains("  rank 1 (stage 1, replica 0): idle "));
    REQUIRE_THAT(pipe.output, Contains(fmt::format(
                                  "at most {} micro-batches' activations held",
                                  schedule == "gpipe" ? 3 : 2)));
    require_same_run(dir, schedule, "one");
  }
}

TEST_CASE("a pipeline's checkpoint resumes on one device, and one device's as a pipeline",
          "[cli][distributed][pipeline]") {
  TempDir dir("pipe_resume");
  write_data(dir.path / "data");
  const std::string common = kRecipe + " --device cpu --accumulate 3 --data-dir " +
                             (dir.path / "data").string();
  const std::string pipe = mpirun(2) + train_bin() + " --distributed" + kRecipe +
                           " --device cpu --pipeline-parallel 2 --micro-batches 3 --data-dir " +
                           (dir.path / "data").string();
  const Run straight = shell(one_process() + common + outputs(dir, "straight"), dir);
  REQUIRE(straight.code == 0);
  const std::string ckpt = dir.file("run.ckpt");
  SECTION("a pipeline of 2, then one device") {
    const Run first = shell(pipe + " --stop-after-epoch 1 --checkpoint " + ckpt, dir);
    INFO(first.output);
    REQUIRE(first.code == 0);
    const Run second = shell(one_process() + common + " --resume " + ckpt + outputs(dir, "resumed"),
                             dir);
    INFO(second.output);
    REQUIRE(second.code == 0);
    require_same_run(dir, "resumed", "straight");
  }
  SECTION("one device, then a pipeline of 2") {
    const Run first = shell(one_process() + common + " --stop-after-epoch 1 --checkpoint " + ckpt,
                            dir);
    REQUIRE(first.code == 0);
    const Run second = shell(pipe + " --resume " + ckpt + outputs(dir, "resumed"), dir);
    INFO(second.output);
    REQUIRE(second.code == 0);
    REQUIRE_THAT(second.output, Contains("resumed from"));
    require_same_run(dir, "resumed", "straight");
  }
}

TEST_CASE("2 replicas of a 2-stage pipeline on 4 MPI ranks save what 2 data-parallel ranks with "
          "--accumulate save, bit for bit",
          "[cli][distributed][pipeline]") {
  TempDir dir("pipe_dp");
  write_data(dir.path / "data");
  const std::string common = kRecipe + " --epochs 1 --device cpu --distributed --data-dir " +
                             (dir.path / "data").string();
  const Run dp = shell(mpirun(2) + train_bin() + common + " --accumulate 2" + outputs(dir, "dp"), dir);
  INFO(dp.output);
  REQUIRE(dp.code == 0);
  const Run mesh = shell(mpirun(4) + train_bin() + common +
                             " --pipeline-parallel 2 --micro-batches 2" + outputs(dir, "mesh"),
                         dir);
  INFO(mesh.output);
  REQUIRE(mesh.code == 0);
  REQUIRE_THAT(mesh.output, Contains("2 micro-batches per step (each replica's share) (mesh dp 2 "
                                     "× pp 2 × tp 1)"));
  REQUIRE_THAT(mesh.output, Contains("  rank 3 (stage 1, replica 1): idle "));
  require_same_run(dir, "mesh", "dp");
}

// --sync-bn normalises each micro-batch over the data-parallel group: the
// k-th micro-batches of both replicas together. dp 2 × pp 2 on 4 ranks saves
// bit for bit what 2 data-parallel ranks with --accumulate save, and both
// end where one device with --accumulate does on those same batches: ResNet-18,
// one step of 8 images, each replica's 4 in 2 micro-batches of 2, so the
// step's micro-batches are images {0, 1, 4, 5} and {2, 3, 6, 7}, which the
// one-device run reads in that order (no augmentation: its random crops
// follow an image's place). What differs is rounding: each statistic and
// each gradient sum over a rank's half, then the halves added, and SyncBN's
// formula for the backward where one device runs BatchNorm's own kernel.
// BatchNorm's backward over 4 images cancels most of its terms and the
// one-step evaluation runs on nearly initial running statistics, which
// amplify it: measured 1.5e-4 on the weights and 3.5e-4 on the test loss
// (dp 2 with --sync-bn against one device on the whole batch of 8, without
// micro-batches: 4.3e-5), so the bound is 1e-3; dividing each micro-batch's
// statistics by the whole batch's count instead misses by 0.65.
TEST_CASE("anvil-train --sync-bn with a pipeline: dp 2 × pp 2 saves what dp 2 with --accumulate "
          "saves, and both end where one device does on the same micro-batches",
          "[cli][distributed][pipeline]") {
  TempDir dir("pipe_sync_bn");
  write_data(dir.path / "data");
  write_data(dir.path / "reordered");
  reorder_training_set(dir.path / "reordered", {0, 1, 4, 5, 2, 3, 6, 7});
  const std::string common =
      " --model resnet18 --recipe best --no-augment --epochs 1 --limit-train 8 --limit-test 8 "
      "--batch-size 8 --no-shuffle --seed 3 --device cpu";
  const std::string data = " --data-dir " + (dir.path / "data").string();
  const Run one = shell(one_process() + common + " --accumulate 2 --data-dir " +
                            (dir.path / "reordered").string() + outputs(dir, "one"),
                        dir);
  INFO(one.output);
  REQUIRE(one.code == 0);
  const Run dp = shell(mpirun(2) + train_bin() + " --distributed --sync-bn --accumulate 2" +
                           common + data + outputs(dir, "dp"),
                       dir);
  INFO(dp.output);
  REQUIRE(dp.code == 0);
  const Run mesh = shell(mpirun(4) + train_bin() +
                             " --distributed --sync-bn --pipeline-parallel 2 --micro-batches 2" +
                             common + data + outputs(dir, "mesh"),
                         dir);
  INFO(mesh.output);
  REQUIRE(mesh.code == 0);
  require_same_run(dir, "mesh", "dp");
  require_same_weights(dir.file("mesh.safetensors"), dir.file("one.safetensors"), 1e-3);
  require_same_metrics(dir.file("mesh.jsonl"), dir.file("one.jsonl"), 1e-3);
}

TEST_CASE("anvil-train --gpus 2 --pipeline-parallel 2 saves what one GPU with --accumulate saves",
          "[cli][distributed][pipeline][cuda]") {
  if (!have_two_gpus("anvil-train on 2 GPU stages")) return;
  TempDir dir("pipe_gpus");
  write_data(dir.path / "data");
  const std::string common =
      " --model lenet --epochs 1 --batch-size 8 --limit-train 8 --limit-test 8 --init kaiming "
      "--lr 0.05 --no-shuffle --data-dir " + (dir.path / "data").string();
  const Run one = shell(train_bin() + common + " --device cuda:0 --accumulate 2" +
                            outputs(dir, "one"),
                        dir);
  INFO(one.output);
  REQUIRE(one.code == 0);
  const Run two = shell(train_bin() + common + " --gpus 2 --pipeline-parallel 2 --micro-batches 2" +
                            outputs(dir, "two"),
                        dir);
  INFO(two.output);
  REQUIRE(two.code == 0);
  REQUIRE_THAT(two.output, Contains("[2 x GPU]"));
  require_same_run(dir, "two", "one");
}

// The split layers sum their products in another order than one device's
// GEMM (tests/parallel/test_tensor_parallel.cpp bounds the first forward):
// within 1e-4 after the run's 10 steps, as the data-parallel runs are.
TEST_CASE("anvil-train --tensor-parallel 2 on 2 MPI ranks ends where one device does",
          "[cli][distributed][pipeline]") {
  TempDir dir("tensor");
  write_data(dir.path / "data");
  require_near_one_device(dir, kRecipe + " --device cpu --data-dir " + (dir.path / "data").string(),
                          "", 2, " --tensor-parallel 2",
                          "tensor parallel over 2 ranks (mesh dp 1 × pp 1 × tp 2): Linear 7 split "
                          "by its output units, Linear 9 by its inputs");
}

// ResNet-18 with its residual blocks split (the convolutions' sums in
// another order, bounded in tests/parallel/test_tensor_parallel.cpp): one
// step of 4 images, the saved weights and BatchNorm statistics within 1e-4
// (4e-6 measured). One step, because the full model amplifies rounding:
// ReLUs near 0 change side, and a change of the input by one rounding moves
// one device's own gradients by 2e-3 of their size; the second step's
// weights differ by that much.
TEST_CASE("anvil-train --tensor-parallel 2 --model resnet18 on 2 MPI ranks ends where one device does",
          "[cli][distributed][pipeline]") {
  TempDir dir("tensor_resnet");
  write_data(dir.path / "data");
  require_near_one_device(
      dir,
      " --model resnet18 --recipe best --epochs 1 --limit-train 4 --limit-test 8 --batch-size 4 "
      "--no-shuffle --seed 3 --device cpu --data-dir " + (dir.path / "data").string(),
      "", 2, " --tensor-parallel 2",
      "tensor parallel over 2 ranks (mesh dp 1 × pp 1 × tp 2): in each of 8 residual blocks conv1 "
      "split by its output channels, conv2 by its inputs");
}

// Under bfloat16 autocast the split layers' outputs differ from one device's
// by a few roundings of 2^-8 (bounded in tests/parallel/test_tensor_parallel.cpp):
// one step of LeNet, every figure and weight within 2^-8 (measured 1.2e-4
// on the loss, 8e-6 on the weights).
TEST_CASE("anvil-train --tensor-parallel 2 --amp bf16 on 2 MPI ranks ends within a bfloat16 "
          "rounding of one device",
          "[cli][distributed][pipeline]") {
  TempDir dir("tensor_amp");
  write_data(dir.path / "data");
  require_near_one_device(
      dir,
      " --model lenet --recipe best --epochs 1 --limit-train 64 --batch-size 64 --no-shuffle "
      "--seed 3 --amp bf16 --device cpu --data-dir " + (dir.path / "data").string(),
      "", 2, " --tensor-parallel 2", "amp bf16: conv and linear in BF16", std::ldexp(1.0, -8));
}

// 2 stages split over 2 ranks each: the step of one device with --accumulate
// M, within the tensor-parallel runs' tolerance; its checkpoint (the whole
// model, gathered over both) resumes on one device.
TEST_CASE("anvil-train --pipeline-parallel 2 --tensor-parallel 2 on 4 MPI ranks ends where one "
          "device with --accumulate does, and its checkpoint resumes on one device",
          "[cli][distributed][pipeline]") {
  TempDir dir("pipe_tensor");
  write_data(dir.path / "data");
  const std::string common = kRecipe + " --device cpu --data-dir " + (dir.path / "data").string();
  const Run straight = shell(one_process() + common + " --accumulate 2" + outputs(dir, "straight"), dir);
  REQUIRE(straight.code == 0);
  const std::string ckpt = dir.file("run.ckpt");
  const Run both = shell(mpirun(4) + train_bin() + " --distributed --pipeline-parallel 2 "
                             "--tensor-parallel 2 --micro-batches 2 --stop-after-epoch 1 "
                             "--checkpoint " + ckpt + common,
                         dir);
  INFO(both.output);
  REQUIRE(both.code == 0);
  REQUIRE_THAT(both.output, Contains("pipeline parallel: 2 stages, 1f1b schedule, 2 micro-batches "
                                     "per step (mesh dp 1 × pp 2 × tp 2)"));
  REQUIRE_THAT(both.output, Contains("tensor parallel over 2 ranks (mesh dp 1 × pp 2 × tp 2): "
                                     "Linear 7 split by its output units"));
  const Run resumed = shell(one_process() + common + " --accumulate 2 --resume " + ckpt +
                                outputs(dir, "resumed"),
                            dir);
  INFO(resumed.output);
  REQUIRE(resumed.code == 0);
  // Epoch 1 is the 4 ranks' (the checkpoint's history), epoch 2 one device's from their weights.
  require_same_metrics(dir.file("resumed.jsonl"), dir.file("straight.jsonl"), 1e-4);
  require_same_weights(dir.file("resumed.safetensors"), dir.file("straight.safetensors"), 1e-4);
}

// One whole-model file whatever the layout: a pipeline's checkpoint resumes
// split over 2 ranks, and a split run's on one device, each ending within
// the tensor-parallel runs' tolerance of 2 straight epochs on one device.
TEST_CASE("a pipeline's checkpoint resumes as tensor parallel, and a tensor-parallel one on one "
          "device",
          "[cli][distributed][pipeline]") {
  TempDir dir("tensor_resume");
  write_data(dir.path / "data");
  const std::string common = kRecipe + " --device cpu --data-dir " + (dir.path / "data").string();
  const std::string split = mpirun(2) + train_bin() + " --distributed --tensor-parallel 2 --accumulate 2" + common;
  const Run straight = shell(one_process() + common + " --accumulate 2" + outputs(dir, "straight"), dir);
  REQUIRE(straight.code == 0);
  const std::string a = dir.file("a.ckpt"), b = dir.file("b.ckpt");
  const Run pipe = shell(mpirun(2) + train_bin() + " --distributed --pipeline-parallel 2 "
                             "--micro-batches 2 --stop-after-epoch 1 --checkpoint " + a + common,
                         dir);
  INFO(pipe.output);
  REQUIRE(pipe.code == 0);
  const Run from_pipe = shell(split + " --resume " + a + outputs(dir, "from_pipe"), dir);
  INFO(from_pipe.output);
  REQUIRE(from_pipe.code == 0);
  REQUIRE_THAT(from_pipe.output, Contains("resumed from"));
  require_same_metrics(dir.file("from_pipe.jsonl"), dir.file("straight.jsonl"), 1e-4);
  require_same_weights(dir.file("from_pipe.safetensors"), dir.file("straight.safetensors"), 1e-4);
  const Run first = shell(split + " --stop-after-epoch 1 --checkpoint " + b, dir);
  INFO(first.output);
  REQUIRE(first.code == 0);
  const Run from_split = shell(one_process() + common + " --accumulate 2 --resume " + b +
                                   outputs(dir, "from_split"),
                               dir);
  INFO(from_split.output);
  REQUIRE(from_split.code == 0);
  require_same_metrics(dir.file("from_split.jsonl"), dir.file("straight.jsonl"), 1e-4);
  require_same_weights(dir.file("from_split.safetensors"), dir.file("straight.safetensors"), 1e-4);
}

TEST_CASE("flags that cannot make a pipeline or a split get one clear error",
          "[cli][distributed][pipeline]") {
  TempDir dir("pipe_flags");
  write_data(dir.path / "data");
  const std::string data = " --device cpu --data-dir " + (dir.path / "data").string();
  const std::string one = train_bin() + data;
  struct Case {
    std::string command, words;
  };
  const Case cases[] = {
      {mpirun(2) + train_bin() + " --distributed" + data + " --pipeline-parallel 3",
       "--pipeline-parallel 3: the run's 2 rank(s) do not make whole pipelines of 3 stages"},
      {one + " --pipeline-parallel 2 --accumulate 2",
       "--accumulate 2 with --pipeline-parallel 2: a pipeline cuts each step into "
       "--micro-batches; give --micro-batches 2"},
      {mpirun(2) + train_bin() + " --distributed" + data +
           " --model resnet18 --sync-bn --batch-size 6 --accumulate 4",
       "--sync-bn: each batch has 6 image(s) for 2 ranks, cut into 4 micro-batches "
       "(--accumulate), so a rank would have a micro-batch without any"},
      {one + " --pipeline-parallel 2 --model resnet18 --bn-recalibrate 1",
       "--bn-recalibrate 1 with --pipeline-parallel 2: not supported"},
      {one + " --pipeline-parallel 2",
       "--pipeline-parallel 2: the run's 1 rank(s) do not make whole pipelines of 2 stages"},
      {one + " --micro-batches 4",
       "--micro-batches 4: cuts a pipeline's step, and this run has none"},
      {one + " --tensor-parallel 2",
       "--tensor-parallel 2: the run's 1 rank(s) do not make whole groups of 2"},
      {mpirun(2) + train_bin() + " --distributed" + data + " --tensor-parallel 2 --pipeline-parallel 2",
       "--pipeline-parallel 2 with --tensor-parallel 2: the run's 2 rank(s) do not make whole "
       "pipelines of 2 stages of 2 ranks each; start a multiple of 4 ranks"},
  };
  for (const Case& c : cases) {
    const Run r = shell(c.command, dir);
    INFO(c.command << "\n" << r.output);
    CHECK(r.code == 2);
    CHECK_THAT(r.output, Contains(c.words));
    CHECK_THAT(r.output, !Contains("epoch "));
  }
  const Run zero = shell(train_bin() + data + " --pipeline-parallel 0", dir);
  CHECK(zero.code != 0);
  CHECK_THAT(zero.output, Contains("--pipeline-parallel: expected a finite number >= 1, got '0'"));
}
#endif
