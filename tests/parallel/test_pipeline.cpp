// Pipeline-parallel training (parallel/pipeline.h, parallel/stages.h): the
// cut of a model into stages balanced by FLOPs, and training on a pipeline
// of 2 to 4 stages (and 2 replicas of 2 stages) ending bit for bit where one
// device does with the same micro-batches as gradient accumulation, with
// both schedules; 2 stages split over 2 ranks each (pp 2 × tp 2) ending bit
// for bit where the same split does on those 2 ranks. Over NCCL with one
// thread per (simulated) GPU, and over MPI on the processes mpiexec starts
// (tests/parallel/CMakeLists.txt: 2 and 4; the tag [mpi_model_parallel]
// keeps them out of the 1-to-5-rank [mpi] suite).
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <climits>
#include <functional>
#include <numeric>

#include "core/random.h"
#include "parallel/pipeline.h"
#include "parallel/stages.h"
#include "parallel/tensor_parallel.h"
#include "tests/parallel/pipeline_scenarios.h"
#include "tests/parallel/ranks.h"

using namespace parallel_test;
namespace par = anvil::parallel;
using Catch::Matchers::Contains;

namespace {

// Every setup for `n` ranks on n simulated GPUs, one thread each.
void pipelines_on_gpus(int n, const std::vector<PipelineSetup>& setups) {
  for (const PipelineSetup& s : setups) {
    const par::NcclId id = par::nccl_unique_id();
    const auto per_rank = each_rank(n, [&](int r) {
      auto world = par::nccl_communicator(id, r, n, anvil::Device::cuda(r), options(120));
      return pipeline_scenario(*world, s);
    });
    for (int r = 0; r < n; ++r) require_outcomes(per_rank[size_t(r)], r);
  }
}

// The largest stage total of a cut.
int64_t largest(const std::vector<int64_t>& costs, const std::vector<size_t>& bounds) {
  int64_t worst = 0;
  for (size_t s = 0; s + 1 < bounds.size(); ++s)
    worst = std::max(worst, std::accumulate(costs.begin() + int64_t(bounds[s]),
                                            costs.begin() + int64_t(bounds[s + 1]), int64_t{0}));
  return worst;
}

}  // namespace

TEST_CASE("pipeline stages: LeNet's layers, their FLOPs and outputs, and the balanced cut",
          "[comm][pipeline]") {
  auto lenet = models::lenet();
  const auto layers = par::pipeline_layers(*lenet, {1, 28, 28}, false);
  REQUIRE(layers.size() == 10);
  // Conv2d(1, 20, 3) on 28x28: 2 * 1 * 9 * (20 * 26 * 26) multiply-adds' FLOPs plus the bias;
  // Conv2d(20, 50, 5) on 13x13 -> 9x9; Linear(800, 128); pooling reads its input once.
  CHECK(layers[0].flops == 2 * 9 * 13520 + 13520);
  CHECK(layers[2].flops == 13520);
  CHECK(layers[3].flops == 2 * 20 * 25 * 4050 + 4050);
  CHECK(layers[6].flops == 0);
  CHECK(layers[7].flops == 2 * 800 * 128 + 128);
  CHECK(layers[2].output == anvil::Shape{20, 13, 13});
  CHECK(layers[9].name == "9");
  CHECK(layers[3].kind == "Conv2d");
  // Under bfloat16 autocast a convolution's output, and what follows it, is bfloat16.
  CHECK(par::pipeline_layers(*lenet, {1, 28, 28}, true)[2].dtype == DType::BFloat16);
  std::vector<int64_t> costs;
  for (const auto& l : layers) costs.push_back(l.flops);
  // The second convolution is 94% of the FLOPs: two stages cut before it.
  CHECK(par::balance_stages(costs, 2) == std::vector<size_t>{0, 3, 10});
  // ResNet-18's layers: the stem's three, the 8 blocks, pooling, Flatten, Linear.
  models::ResNetConfig narrow;
  narrow.widths = {4, 8, 8, 8};
  auto resnet = models::resnet18(narrow);
  const auto rl = par::pipeline_layers(*resnet, {1, 28, 28}, false);
  REQUIRE(rl.size() == 14);
  CHECK(rl[3].name == "resnet_block1.0");
  CHECK(rl[13].name == "fc.1");
  par::Stage stage(rl, 3, 5);
  CHECK(stage.state_dict().front().first == "resnet_block1.0.conv1.weight");
  CHECK_THROWS_WITH(par::balance_stages(costs, 11),
                    Contains("11 stages of a model of 10 layers: every stage needs at least one"));
}

TEST_CASE("pipeline stages: the cut's largest stage is the least of every cut", "[comm][pipeline]") {
  anvil::Generator gen(7);
  for (int trial = 0; trial < 400; ++trial) {
    const size_t n = 1 + size_t(trial % 9);
    std::vector<int64_t> costs(n);
    for (auto& c : costs) c = int64_t(gen.next_u64() % 50);
    // Half the trials with layers that may not begin a stage (a split input).
    std::vector<bool> starts;
    if (trial % 2)
      for (size_t i = 0; i < n; ++i) starts.push_back(gen.next_u64() % 3 != 0);
    auto may_start = [&](size_t i) { return starts.empty() || starts[i]; };
    for (int stages = 1; stages <= int(std::min<size_t>(n, 4)); ++stages) {
      // Every cut, by brute force over the positions of the stages' starts.
      int64_t best = INT64_MAX;
      std::vector<size_t> cut(size_t(stages) + 1, 0);
      cut.back() = n;
      std::function<void(int, size_t)> each = [&](int s, size_t from) {
        if (s == stages) {
          best = std::min(best, largest(costs, cut));
          return;
        }
        for (size_t b = from; b + size_t(stages - s) <= n; ++b) {
          if (!may_start(b)) continue;
          cut[size_t(s)] = b;
          each(s + 1, b + 1);
        }
      };
      each(1, 1);
      INFO("trial " << trial << ", " << stages << " stages");
      if (best == INT64_MAX) {  // too few layers may begin a stage
        CHECK_THROWS_WITH(par::balance_stages(costs, stages, starts),
                          Contains("may begin a stage"));
        continue;
      }
      const std::vector<size_t> bounds = par::balance_stages(costs, stages, starts);
      REQUIRE(bounds.size() == size_t(stages) + 1);
      REQUIRE(bounds.front() == 0);
      REQUIRE(bounds.back() == n);
      for (size_t s = 0; s + 1 < bounds.size(); ++s) {
        REQUIRE(bounds[s] < bounds[s + 1]);
        REQUIRE((s == 0 || may_start(bounds[s])));
      }
      REQUIRE(largest(costs, bounds) == best);
    }
  }
  // LeNet split for tensor parallelism: no stage begins at ReLU 8 or Linear 9,
  // whose inputs are split (Linear 7's units).
  auto lenet = models::lenet();
  std::vector<std::string> names;
  for (const auto& l : par::pipeline_layers(*lenet, {1, 28, 28}, false)) names.push_back(l.name);
  CHECK(par::stage_starts(names, *lenet, par::tensor_parallel_plan("lenet")) ==
        std::vector<bool>{true, true, true, true, true, true, true, true, false, false});
}

// On the simulator a LeNet step costs seconds: one batch of 4 for LeNet (2
// for the ResNet), the MLP for the rest (every schedule, stage count and mesh).
TEST_CASE("nccl: pipeline-parallel LeNet and MLP on 2 to 4 GPUs end where one device does, bit "
          "for bit",
          "[nccl][pipeline][tsan]") {
  const int available = gpus(2);
  if (available == 0) return;
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
  // An MLP's step of one batch: the threads' exchanges, at the sanitizers' pace.
  pipelines_on_gpus(2, pipeline_setups(2, true));
#else
  using par::Schedule;
  PipelineSetup lenet, empty, three, mesh, split;
  lenet.images = lenet.batch = 4;  // one step of 2 micro-batches of 2
  lenet.micro_batches = 2;
  empty.model = "mlp";
  empty.schedule = Schedule::kGPipe;
  empty.images = 21;  // the last batch, of 1, in 3 micro-batches: two empty
  pipelines_on_gpus(2, {lenet});
  pipelines_on_gpus(2, {empty});
  three.model = "mlp";
  three.mesh = {.dp = 1, .pp = 3};
  three.micro_batches = 4;
  if (enough_gpus(3, available)) pipelines_on_gpus(3, {three});
  mesh.model = "mlp";
  mesh.mesh = {.dp = 2, .pp = 2};
  if (enough_gpus(4, available)) pipelines_on_gpus(4, {mesh});
  split.model = "mlp";  // 2 stages, each split over 2 GPUs
  split.mesh = {.dp = 1, .pp = 2, .tp = 2};
  if (enough_gpus(4, available)) pipelines_on_gpus(4, {split});
#endif
}

TEST_CASE("nccl: a pipeline-parallel narrow ResNet-18 on 2 GPUs ends where one device does, bit "
          "for bit",
          "[nccl][pipeline][tsan]") {
  const int available = gpus(2);
  if (available == 0) return;
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
  skip("a ResNet step on the simulator takes minutes under the sanitizers (the MLP's case runs)");
#else
  PipelineSetup resnet;
  resnet.model = "resnet18-narrow";
  resnet.schedule = par::Schedule::kGPipe;
  resnet.micro_batches = 2;
  resnet.images = resnet.batch = 2;  // BatchNorm over each micro-batch, of 1
  pipelines_on_gpus(2, {resnet});
#endif
}

TEST_CASE("mpi: pipeline-parallel training on every rank of the job ends where one device does, "
          "bit for bit",
          "[mpi_model_parallel]") {
  if (!par::mpi_missing_reason().empty()) return skip(par::mpi_missing_reason());
  par::CommOptions o;
  o.timeout = std::chrono::seconds(60);
  auto world = par::mpi_world(o);
  if (world->size() < 2) return skip("needs 2 or more MPI ranks: one per stage");
  for (const PipelineSetup& s : pipeline_setups(world->size(), false)) {
    INFO(describe(s));
    require_outcomes(pipeline_scenario(*world, s), world->rank());
  }
}
