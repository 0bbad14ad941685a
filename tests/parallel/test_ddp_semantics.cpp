// What PyTorch's DistributedDataParallel users expect of DataParallel beyond
// the one-device result: a second backward in a step is refused, a
// parameter no batch reaches keeps no gradient, no_sync() accumulates, and
// SyncBN's all-reduces of different micro-batches do not pair.
// Each scenario runs on one rank's communicator and returns what that rank
// saw; the checks run on the test's thread: over NCCL on 2 GPUs (threads),
// over MPI on every rank of the job (2 to 5 processes).
#include <catch2/catch.hpp>

#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/random.h"
#include "nn/layers.h"
#include "nn/optim.h"
#include "parallel/data_parallel.h"
#include "tests/parallel/ranks.h"

using namespace parallel_test;
namespace par = anvil::parallel;
using anvil::DType;
using anvil::Tensor;

namespace {

// ---- a second backward in one step ----

struct SecondBackward {
  std::string error;
  std::vector<float> bias_grad;
};

SecondBackward second_backward(par::Communicator& comm) {
  anvil::manual_seed(0);
  anvil::nn::Linear model(4, 3);
  model.to(comm.device());
  par::DataParallel replicas(comm, model, {});
  const Tensor x = Tensor::ones({2, 4}, DType::Float32, comm.device());
  replicas.begin_step(2, 2 * comm.size());
  anvil::sum(model.forward(x)).backward();
  SecondBackward s;
  try {
    anvil::sum(model.forward(x)).backward();
  } catch (const std::logic_error& e) {
    s.error = e.what();
  }
  replicas.after_backward();  // the step still ends: the first backward's gradients
  comm.synchronize();
  s.bias_grad = model.bias.grad().to_vector();
  return s;
}

void check(const SecondBackward& s, int rank, int ranks) {
  INFO("rank " << rank << ": " << s.error);
  const std::string who = "DataParallel: rank " + std::to_string(rank) + ": parameter '";
  const std::string what = "' got a second gradient in one training step";
  REQUIRE((s.error.find(who + "weight" + what) != std::string::npos ||
           s.error.find(who + "bias" + what) != std::string::npos));
  // Each rank's bias gradient is 2 (two rows of ones), summed over the ranks.
  REQUIRE(s.bias_grad == std::vector<float>(3, 2.0f * float(ranks)));
}

// ---- a parameter no batch reaches ----

// A model with a layer its forward never reaches.
struct HalfUsed final : anvil::nn::Module {
  std::shared_ptr<anvil::nn::Linear> used = std::make_shared<anvil::nn::Linear>(4, 3);
  std::shared_ptr<anvil::nn::Linear> unused = std::make_shared<anvil::nn::Linear>(4, 3);
  HalfUsed() {
    register_module("used", used);
    register_module("unused", unused);
  }
  Tensor forward(const Tensor& x) override { return used->forward(x); }
  std::string describe() const override { return "HalfUsed"; }
};

struct Unused {
  bool unused_grad = true, used_grad = false;
  std::vector<float> unused_before, unused_after, used_bias_grad;
};

// Rank 0 has the batch's 2 examples, the others none (they skip backward).
Unused unused_parameter(par::Communicator& comm) {
  anvil::manual_seed(0);
  const anvil::Device device = comm.device();
  HalfUsed model;
  model.to(device);
  par::DataParallel replicas(comm, model, {});
  anvil::optim::SGDOptions o;
  o.lr = 0.1;
  o.momentum = 0.9;
  o.weight_decay = 0.1;
  anvil::optim::SGD sgd(model.parameters(), o);
  Unused s;
  s.unused_before = model.unused->weight.to_vector();
  sgd.zero_grad();
  replicas.begin_step(comm.rank() == 0 ? 2 : 0, 2);
  if (comm.rank() == 0)
    anvil::sum(model.forward(Tensor::ones({2, 4}, DType::Float32, device))).backward();
  replicas.after_backward();
  sgd.step();
  comm.synchronize();
  s.unused_grad = model.unused->weight.grad().defined() || model.unused->bias.grad().defined();
  s.used_grad = model.used->weight.grad().defined() && model.used->bias.grad().defined();
  s.unused_after = model.unused->weight.to_vector();
  s.used_bias_grad = model.used->bias.grad().to_vector();
  return s;
}

void check(const Unused& s, int rank, int) {
  INFO("rank " << rank);
  REQUIRE(!s.unused_grad);
  REQUIRE(s.unused_after == s.unused_before);  // no weight decay, no momentum
  REQUIRE(s.used_grad);  // on every rank: rank 0's batch reached it
  REQUIRE(s.used_bias_grad == std::vector<float>(3, 2.0f));
}

// ---- no_sync ----

// Rank r's micro-batch k: rows[k] rows of the value (r + 1) * (k + 1).
const std::vector<int64_t> kRows = {2, 3, 1};

struct Accumulated {
  uint64_t collectives_in_no_sync = 0;
  std::vector<float> weight_grad, bias_grad;
};

Accumulated accumulated(par::Communicator& comm) {
  anvil::manual_seed(0);
  const anvil::Device device = comm.device();
  anvil::nn::Linear model(4, 3);
  model.to(device);
  par::DataParallel replicas(comm, model, {});
  auto micro_batch = [&](size_t k) {
    replicas.begin_step(kRows[k], comm.size() * kRows[k]);
    const float v = float((comm.rank() + 1) * int(k + 1));
    anvil::sum(model.forward(Tensor::full({kRows[k], 4}, v, DType::Float32, device))).backward();
    replicas.after_backward();
  };
  Accumulated s;
  {
    const uint64_t before = comm.collectives();
    auto scope = replicas.no_sync();
    micro_batch(0);
    micro_batch(1);
    s.collectives_in_no_sync = comm.collectives() - before;
  }
  micro_batch(2);
  comm.synchronize();
  s.weight_grad = model.weight.grad().to_vector();
  s.bias_grad = model.bias.grad().to_vector();
  return s;
}

void check(const Accumulated& s, int rank, int ranks) {
  // One device on every micro-batch of every rank: each output's bias
  // gradient is the number of rows, each weight's the sum of the inputs.
  double total_rows = 0, total_input = 0;
  for (int r = 0; r < ranks; ++r)
    for (size_t k = 0; k < kRows.size(); ++k) {
      total_rows += double(kRows[k]);
      total_input += double(kRows[k]) * (r + 1) * double(k + 1);
    }
  INFO("rank " << rank);
  REQUIRE(s.collectives_in_no_sync == 0);
  REQUIRE(s.bias_grad == std::vector<float>(3, float(total_rows)));
  REQUIRE(s.weight_grad == std::vector<float>(12, float(total_input)));
}

// ---- SyncBN's all-reduces are fingerprinted ----

// Rank 0 has 2 rows in both micro-batches of a step, rank 1 none in the
// first, whose forward it skips: its first SyncBN all-reduce, of its
// second micro-batch, would meet rank 0's of its first (the same layer and
// shape). The fingerprints (the layer and the forward) stop both there. On
// GPUs only: over MPI a failed collective fails the job's exit.
struct Skipped {
  std::string error;
};

Skipped skipped_micro_batch(par::Communicator& comm) {
  anvil::manual_seed(0);
  const anvil::Device device = comm.device();
  anvil::nn::BatchNorm2d model(3);
  model.to(device);
  par::DataParallel replicas(comm, model, {.sync_batch_norm = true});
  Skipped s;
  try {
    auto scope = replicas.no_sync();
    for (int64_t k = 0; k < 2; ++k) {
      const int64_t rows = comm.rank() == 0 || k == 1 ? 2 : 0;
      replicas.begin_step(rows, k == 0 ? 2 : 4);
      if (rows > 0) model.forward(Tensor::ones({rows, 3, 2, 2}, DType::Float32, device));
      replicas.after_backward();
    }
    comm.synchronize();
  } catch (const par::CommError& e) {
    s.error = e.what();
  }
  return s;
}

void check(const Skipped& s, int rank, int) {
  INFO("rank " << rank << ": " << s.error);
  REQUIRE_THAT(s.error, Catch::Contains("ranks disagree on collective #"));
  REQUIRE_THAT(s.error, Catch::Contains("allreduce #") && Catch::Contains("(fingerprint 0x"));
}

// Runs `scenario` on 2 GPUs (a thread each) and checks each rank's result.
template <typename Scenario>
void on_two_gpus(Scenario scenario) {
  if (gpus(2) == 0) return;
  const par::NcclId id = par::nccl_unique_id();
  const auto seen = each_rank(2, [&](int r) {
    auto comm = par::nccl_communicator(id, r, 2, anvil::Device::cuda(r), options(30));
    return scenario(*comm);
  });
  for (int r = 0; r < 2; ++r) check(seen[size_t(r)], r, 2);
}

// Runs `scenario` on every rank of the MPI job (a job of one has nothing
// to check: DataParallel over one rank does nothing).
template <typename Scenario>
void on_the_job(Scenario scenario) {
  if (!par::mpi_missing_reason().empty()) return skip(par::mpi_missing_reason());
  auto comm = par::mpi_world(options(60));
  if (comm->size() < 2) return skip("needs 2 or more MPI ranks");
  check(scenario(*comm), comm->rank(), comm->size());
}

}  // namespace

TEST_CASE("nccl: a second backward in one data-parallel step is refused and names the parameter",
          "[nccl][data_parallel][tsan]") {
  on_two_gpus(second_backward);
}
TEST_CASE("nccl: a parameter no rank's batch reaches keeps no gradient and SGD leaves it alone",
          "[nccl][data_parallel][tsan]") {
  on_two_gpus(unused_parameter);
}
TEST_CASE("nccl: no_sync accumulates micro-batches and the synced step reduces their sum once",
          "[nccl][data_parallel][tsan]") {
  on_two_gpus(accumulated);
}

TEST_CASE("nccl: SyncBN's all-reduces of different micro-batches are refused at the agreement",
          "[nccl][data_parallel]") {
  on_two_gpus(skipped_micro_batch);
}

TEST_CASE("mpi: a second backward in one data-parallel step is refused and names the parameter",
          "[mpi][data_parallel]") {
  on_the_job(second_backward);
}
TEST_CASE("mpi: a parameter no rank's batch reaches keeps no gradient and SGD leaves it alone",
          "[mpi][data_parallel]") {
  on_the_job(unused_parameter);
}
TEST_CASE("mpi: no_sync accumulates micro-batches and the synced step reduces their sum once",
          "[mpi][data_parallel]") {
  on_the_job(accumulated);
}
