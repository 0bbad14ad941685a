// The group of one rank (parallel::one_rank_group): every collective leaves
// its tensor as it is, and data-parallel training over it is training on one
// device, bit for bit, with no collective issued.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "core/random.h"
#include "data/dataloader.h"
#include "nn/models.h"
#include "nn/optim.h"
#include "nn/train.h"
#include "parallel/communicator.h"
#include "parallel/data_parallel.h"
#include "parallel/sync_batch_norm.h"
#include "core/ops.h"
#include "tests/cuda_test_util.h"
#include "tests/nn_test_util.h"

using namespace anvil;
using Catch::Contains;

TEST_CASE("one_rank_group: rank 0 of 1, its collectives keep the data", "[one-rank]") {
  auto comm = parallel::one_rank_group(Device::cpu());
  CHECK(comm->rank() == 0);
  CHECK(comm->size() == 1);
  CHECK(comm->backend() == "local");
  CHECK(comm->device() == Device::cpu());

  const std::vector<float> values = {1.5f, -2.0f, 3.25f, 0.0f, 7.0f, -0.5f};
  Tensor t = Tensor::from_vector(values, {3, 2});
  comm->allreduce(t);
  CHECK(t.to_vector() == values);
  comm->allreduce(t, parallel::ReduceOp::kAverage, parallel::Algorithm::kNaive);
  CHECK(t.to_vector() == values);
  comm->allreduce(t, parallel::ReduceOp::kSum, parallel::Algorithm::kNative);
  CHECK(t.to_vector() == values);
  Tensor counts = Tensor::from_vector(std::vector<int64_t>{4, -9}, {2});
  comm->allreduce(counts);
  CHECK(counts.to_int_vector() == std::vector<int64_t>{4, -9});
  comm->broadcast(t, 0);
  CHECK(t.to_vector() == values);
  CHECK(comm->scatter(t, 0).to_vector() == values);
  CHECK(comm->reduce_scatter(t).to_vector() == values);
  CHECK(comm->all_gather(t).to_vector() == values);
  comm->barrier();
  comm->synchronize();
  CHECK(comm->collectives() == 9);
  CHECK(parallel::broadcast_text(*comm, "settings", 0) == "settings");
  // No other rank: point to point has no peer.
  CHECK_THROWS_WITH(comm->send(t, 0), Contains("no other rank to send to"));
}

// A group of one splits into a group of one (or none), so that a mesh of
// one rank needs no second code path; sendrecv to itself (a ring of one) copies.
TEST_CASE("one_rank_group: split gives a group of one or none, and a ring of one copies",
          "[one-rank]") {
  auto comm = parallel::one_rank_group(Device::cpu());
  std::unique_ptr<parallel::Communicator> group = comm->split(3, -5, "dp");
  REQUIRE(group != nullptr);
  CHECK(group->rank() == 0);
  CHECK(group->size() == 1);
  CHECK(group->backend() == "local");
  const std::vector<float> values = {1.5f, -2.0f, 3.25f};
  Tensor t = Tensor::from_vector(values, {3});
  group->allreduce(t);
  CHECK(t.to_vector() == values);
  CHECK(comm->split(parallel::Communicator::kNoColor, 0) == nullptr);
  CHECK(comm->collectives() == 2);
  Tensor in = Tensor::zeros({3});
  group->sendrecv(t, 0, in, 0);
  CHECK(in.to_vector() == values);
  CHECK_THROWS_WITH(group->send(t, 0),
                    Contains("dp group 0 of 1, rank 0 of 1 (local, cpu, world rank 0): send: peer "
                             "0 is this rank: a group of one rank has no other rank to send to"));
  CHECK_THROWS_WITH(comm->split(-2, 0), Contains("split: color -2 is negative"));
}

TEST_CASE("one_rank_group on a GPU: scatter and all_gather copy on the device", "[one-rank]") {
  if (!cuda_test::have_device("one_rank_group on cuda:0")) return;
  auto comm = parallel::one_rank_group(Device::cuda(0));
  CHECK(comm->device() == Device::cuda(0));
  const std::vector<float> values = {0.5f, -1.0f, 2.0f, 4.5f};
  Tensor t = Tensor::from_vector(values, {2, 2}, Device::cuda(0));
  comm->allreduce(t, parallel::ReduceOp::kAverage);
  Tensor part = comm->scatter(t, 0);
  Tensor all = comm->all_gather(part);
  comm->synchronize();
  CHECK(part.device() == Device::cuda(0));
  CHECK(part.to_vector() == values);
  CHECK(all.to_vector() == values);
}

TEST_CASE("one_rank_group: DataParallel over it is plain training, with no collective",
          "[one-rank]") {
  // 40 synthetic images in batches of 16: the last batch is short.
  data::ImageSet set;
  set.count = 40;
  set.rows = set.cols = 28;
  set.pixels.resize(size_t(set.count * 28 * 28));
  for (size_t i = 0; i < set.pixels.size(); ++i) set.pixels[i] = uint8_t(i * 37 % 251);
  for (int64_t i = 0; i < set.count; ++i) set.labels.push_back(i * 7 % 10);
  auto images = std::make_shared<const data::ImageSet>(set);

  // The same run twice: on its own, and through DataParallel over one rank.
  auto run = [&](bool replicated) {
    Generator gen(3);
    auto model = models::lenet(models::Init::Kaiming, &gen);
    optim::SGD sgd(model->parameters(), {.lr = 0.05, .momentum = 0.9});
    data::DataLoader loader(images, 16, /*shuffle=*/true, /*drop_last=*/false, 5);
    auto comm = parallel::one_rank_group(Device::cpu());
    std::unique_ptr<parallel::DataParallel> dp;
    train::EpochOptions options;
    if (replicated) {
      dp = std::make_unique<parallel::DataParallel>(*comm, *model,
                                                    parallel::DataParallelOptions{});
      dp->broadcast_state(&sgd);
      options.replicas = dp.get();
      CHECK(dp->buckets().empty());  // no gradient buffers
    }
    std::vector<double> losses;
    for (int epoch = 0; epoch < 2; ++epoch)
      losses.push_back(train::train_epoch(*model, sgd, loader, Device::cpu(), options).loss);
    data::DataLoader test(images, 16, false, false, 5);
    const train::EpochStats eval = train::evaluate(*model, test, Device::cpu(), options.replicas);
    CHECK(eval.examples == 40);
    CHECK(comm->collectives() == 0);  // no all-reduce, no broadcast
    return std::pair{losses, testing::clone_state(model->state_dict())};
  };
  const auto [plain_losses, plain_state] = run(false);
  const auto [replica_losses, replica_state] = run(true);
  CHECK(replica_losses == plain_losses);
  CHECK(plain_losses[1] < plain_losses[0]);
  testing::require_same_state(replica_state, plain_state);
}

TEST_CASE("ANVIL_COMM_CHECK: ON or unset checks every call, OFF none, anything else is refused",
          "[one-rank]") {
  const char* saved = std::getenv("ANVIL_COMM_CHECK");
  const std::string previous = saved ? saved : "";
  auto restore = [&] {
    if (saved) setenv("ANVIL_COMM_CHECK", previous.c_str(), 1);
    else unsetenv("ANVIL_COMM_CHECK");
  };
  unsetenv("ANVIL_COMM_CHECK");
  CHECK(parallel::comm_check_default());
  setenv("ANVIL_COMM_CHECK", "OFF", 1);
  CHECK_FALSE(parallel::comm_check_default());
  CHECK_FALSE(parallel::CommOptions{}.check_calls);
  setenv("ANVIL_COMM_CHECK", "sometimes", 1);
  CHECK_THROWS_WITH(parallel::comm_check_default(),
                    Catch::Matchers::Contains("ANVIL_COMM_CHECK='sometimes': expected ON"));
  restore();
  // On one rank too: an unchecked all-reduce exchanges nothing.
  auto comm = parallel::one_rank_group(Device::cpu());
  Tensor t = Tensor::ones({4});
  comm->allreduce(t);
  CHECK(comm->checked_calls() == 1);
  comm->set_check_calls(false);
  comm->allreduce(t);
  CHECK(comm->checked_calls() == 1);
  CHECK(comm->collectives() == 2);
  CHECK(t.to_vector() == std::vector<float>(4, 1.0f));
}

TEST_CASE("sync_batch_norm on bfloat16 activations: bfloat16 out, as batch_norm, statistics in "
          "float32",
          "[one-rank][autocast]") {
  Generator gen(7);
  const Tensor x32 = Tensor::randn({4, 3, 5, 5}, &gen);
  const Tensor gamma = Tensor::ones({3}), beta = Tensor::zeros({3});
  Tensor rm1 = Tensor::zeros({3}), rv1 = Tensor::ones({3}), rm2 = rm1.clone(), rv2 = rv1.clone();
  Tensor xa = x32.to(DType::BFloat16).set_requires_grad();
  Tensor xb = x32.to(DType::BFloat16).set_requires_grad();
  auto comm = parallel::one_rank_group(Device::cpu());
  const Tensor ys = parallel::sync_batch_norm(*comm, xa, gamma, beta, rm1, rv1, 0.1, 1e-5, 100);
  const Tensor yb = batch_norm(xb, gamma, beta, rm2, rv2, true);
  REQUIRE(ys.dtype() == DType::BFloat16);
  sum(ys).backward();
  sum(yb).backward();
  REQUIRE(xa.grad().dtype() == DType::BFloat16);
  // Two float32 computations of the same statistics, rounded to bfloat16:
  // one spacing (2^-7 relative) apart at most, with float32's noise near 0.
  const std::vector<float> a = ys.to_vector(), b = yb.to_vector();
  for (size_t i = 0; i < a.size(); ++i) REQUIRE(std::fabs(a[i] - b[i]) <= std::fabs(b[i]) / 128 + 1e-5);
  CHECK(rm1.to_vector() == rm2.to_vector());
}
