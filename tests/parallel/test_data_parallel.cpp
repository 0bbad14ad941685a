// Data-parallel training (parallel/data_parallel.h): N replicas, each on its
// shard of every batch, end where one model trained on the whole batches
// ends (LeNet, every all-reduce, with and without overlap, several bucket
// sizes), and two runs on N ranks agree to the bit. Over NCCL on 2 and 3
// GPUs (one thread each; simulated in the simulator build), and over MPI on
// as many processes as mpiexec starts.
#include <catch2/catch.hpp>

#include "core/precision.h"
#include "tests/parallel/bf16_scenarios.h"
#include "tests/parallel/data_parallel_scenarios.h"
#include "tests/parallel/ranks.h"

using namespace parallel_test;
namespace par = anvil::parallel;

namespace {

// Each scenario on each count of GPUs (one thread per rank, a fresh NCCL
// communicator each), every rank's outcomes checked; counts beyond the GPUs
// present are left out (enough_gpus says so).
template <class Scenarios>
void run_on_gpus(const std::vector<int>& rank_counts, int available, const Scenarios& scenarios) {
  // FP32 convolutions (cuda:0's default is TF32): a rank's shard of the batch
  // sums its gradients in another order than the whole batch does, and the
  // comparisons' tolerances are FP32's, not TF32's 2^-11 per operand.
  const anvil::ScopedFp32Precision fp32(anvil::Fp32Precision::kIeee);
  for (int n : rank_counts) {
    if (!enough_gpus(n, available)) continue;
    for (const auto& [name, scenario] : scenarios) {
      const par::NcclId id = par::nccl_unique_id();
      const auto per_rank = each_rank(n, [&](int r) {
        anvil::manual_seed(0);
        auto comm = par::nccl_communicator(id, r, n, anvil::Device::cuda(r), options(120));
        return scenario(*comm);
      });
      for (int r = 0; r < n; ++r) {
        INFO(name << " on " << n << " GPUs");
        require_outcomes(per_rank[size_t(r)], r);
      }
    }
  }
}

}  // namespace

TEST_CASE("nccl: data-parallel training on 2 and 3 GPUs ends where one device does",
          "[nccl][data_parallel][tsan]") {
  const int available = gpus(2);
  if (available == 0) return;
  const std::vector<int> rank_counts = {2, 3};
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
  // Under the sanitizers a LeNet step on the simulator takes minutes (the
  // whole set took over 25 minutes under either). A small MLP keeps what
  // they are here to see: the whole step on 2 and 3 threads, all-reduces
  // started from backward's hooks or after it, and (ASan) the SyncBN op.
  // ThreadSanitizer, where each simulated CUDA thread is a fiber and a
  // switch between them costs most, gets one step of one batch. The
  // release and simulator builds run the whole set.
  auto mlp = [](Algorithm a, bool overlap, size_t bucket) {
    return [=](Communicator& c) {
      TrainSetup s;
      s.model = "mlp";
      s.options.algorithm = a;
      s.options.overlap = overlap;
      s.options.bucket_bytes = bucket;
#if defined(__SANITIZE_THREAD__)
      s.images = 7;  // one batch: shards of 4 and 3, or 3, 2 and 2
      s.epochs = 1;
#endif
      return data_parallel_scenario(c, s);
    };
  };
  const std::vector<std::pair<std::string, Scenario>> scenarios = {
      {"mlp, ring, overlap, one bucket per parameter", mlp(Algorithm::kRing, true, 1)},
#if !defined(__SANITIZE_THREAD__)
      {"mlp, naive, no overlap, one bucket", mlp(Algorithm::kNaive, false, 25 << 20)},
      {"sync_batch_norm op", sync_batch_norm_scenario},
#endif
  };
#else
  const auto scenarios = data_parallel_scenarios();
#endif
  run_on_gpus(rank_counts, available, scenarios);
}

TEST_CASE("mpi: data-parallel training on every rank of the job ends where one device does",
          "[mpi][data_parallel]") {
  if (!par::mpi_missing_reason().empty()) return skip(par::mpi_missing_reason());
  par::CommOptions o;
  o.timeout = std::chrono::seconds(60);
  auto comm = par::mpi_world(o);
  for (const auto& [name, scenario] : data_parallel_scenarios()) {
    INFO(name << " on " << comm->size() << " ranks");
    require_outcomes(scenario(*comm), comm->rank());
  }
}

// Buckets meet in one order on every rank: a rank that gets no example of a
// batch (it skips backward) against ranks whose backward's hooks finish the
// gradients out of bucket order (empty_rank_scenarios).
TEST_CASE("nccl: data-parallel training with ranks that get no example ends where one device does",
          "[nccl][data_parallel][tsan]") {
  const int available = gpus(2);
  if (available == 0) return;
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
  const auto scenarios = empty_rank_scenarios({"mlp"}, {1, size_t(25) << 20});
#else
  auto scenarios = empty_rank_scenarios({"lenet"}, {1, 4 << 10, size_t(25) << 20});
  for (auto& s : empty_rank_scenarios({"resnet18-narrow"}, {1, size_t(25) << 20}))
    scenarios.push_back(std::move(s));
#endif
#if defined(__SANITIZE_THREAD__)
  const std::vector<int> rank_counts = {2};
#else
  const std::vector<int> rank_counts = {2, 3};
#endif
  run_on_gpus(rank_counts, available, scenarios);
}

TEST_CASE("mpi: data-parallel training with ranks that get no example ends where one device does",
          "[mpi][data_parallel]") {
  if (!par::mpi_missing_reason().empty()) return skip(par::mpi_missing_reason());
  par::CommOptions o;
  o.timeout = std::chrono::seconds(60);
  auto comm = par::mpi_world(o);
  for (const auto& [name, scenario] :
       empty_rank_scenarios({"lenet", "resnet18-narrow"}, {1, size_t(25) << 20})) {
    INFO(name << " on " << comm->size() << " ranks");
    require_outcomes(scenario(*comm), comm->rank());
  }
}

// DataParallelOptions::grad_dtype = bfloat16: each step's reduced gradient
// within the derived bound of the exact sum, and the weights after 6 steps
// within the drift that bound allows (tests/parallel/bf16_scenarios.h).
TEST_CASE("nccl: data-parallel training with bfloat16 gradients on 2 GPUs stays within the bound",
          "[nccl][data_parallel][bf16]") {
  const int available = gpus(2);
  if (available == 0) return;
  run_on_gpus({2}, available,
              std::vector<std::pair<std::string, Scenario>>{
                  {"mlp, bfloat16 gradients", bf16_data_parallel_scenario}});
}

TEST_CASE("mpi: data-parallel training with bfloat16 gradients stays within the bound",
          "[mpi][data_parallel][bf16]") {
  if (!par::mpi_missing_reason().empty()) return skip(par::mpi_missing_reason());
  par::CommOptions o;
  o.timeout = std::chrono::seconds(60);
  auto comm = par::mpi_world(o);
  INFO("mlp, bfloat16 gradients on " << comm->size() << " ranks");
  require_outcomes(bf16_data_parallel_scenario(*comm), comm->rank());
}

TEST_CASE("nccl: ranks with different gradient dtypes are refused, naming them",
          "[nccl][data_parallel][bf16][tsan]") {
  const int available = gpus(2);
  if (available == 0) return;
  const par::NcclId id = par::nccl_unique_id();
  const auto errors = each_rank(2, [&](int r) {
    auto comm = par::nccl_communicator(id, r, 2, anvil::Device::cuda(r), options(60));
    return mismatched_grad_dtype(*comm);
  });
  for (const std::string& e : errors) {
    CHECK_THAT(e, Catch::Matchers::Contains(
                      "ranks reduce gradients in different dtypes: rank 0 in float32, rank 1 in "
                      "bfloat16 (DataParallelOptions::grad_dtype, anvil-train --grad-dtype)"));
  }
}

TEST_CASE("mpi: ranks with different gradient dtypes are refused, naming them",
          "[mpi][data_parallel][bf16]") {
  if (!par::mpi_missing_reason().empty()) return skip(par::mpi_missing_reason());
  par::CommOptions o;
  o.timeout = std::chrono::seconds(60);
  auto comm = par::mpi_world(o);
  const std::string e = mismatched_grad_dtype(*comm);
  if (comm->size() == 1) {
    CHECK(e.empty());  // one rank agrees with itself
    return;
  }
  CHECK_THAT(e, Catch::Matchers::Contains(
                    "ranks reduce gradients in different dtypes: rank 0 in float32, rank 1 in "
                    "bfloat16 (DataParallelOptions::grad_dtype, anvil-train --grad-dtype)"));
}
