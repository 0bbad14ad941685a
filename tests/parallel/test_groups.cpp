// Groups (Communicator::split, make_mesh) and point to point: over MPI on
// every rank count ctest runs (1 to 5 processes), and over NCCL with one
// host thread per (simulated) GPU, with the faults: a send that meets a
// receive of another dtype or shape, two sends that meet, a peer that never
// comes. The MPI faults end the job, so they are anvil-comm-fault's
// (tests/parallel/CMakeLists.txt).
#include <catch2/catch.hpp>

#include <chrono>
#include <string>

#include "parallel/mesh.h"
#include "tests/parallel/ranks.h"
#include "tests/parallel/split_scenarios.h"

using namespace parallel_test;
namespace par = anvil::parallel;
using Catch::Matchers::Contains;

namespace {

par::CommOptions mpi_options() {
  par::CommOptions o;
  o.timeout = std::chrono::seconds(60);
  return o;
}

// Runs scenario(world) on every rank of n simulated GPUs and checks each
// rank's outcomes.
template <class Scenario>
void on_gpus(int n, const char* what, Scenario scenario) {
  const par::NcclId id = par::nccl_unique_id();
  const auto per_rank = each_rank(n, [&](int r) {
    auto world = par::nccl_communicator(id, r, n, anvil::Device::cuda(r), options(120));
    return scenario(*world);
  });
  for (int r = 0; r < n; ++r) {
    INFO(what << " on " << n << " GPUs");
    require_outcomes(per_rank[size_t(r)], r);
  }
}

// What each of n thread ranks threw ("" if nothing), and how long it took.
template <class Call>
std::vector<std::pair<std::string, double>> errors_on_gpus(int n, double timeout, Call call) {
  const par::NcclId id = par::nccl_unique_id();
  return each_rank(n, [&](int r) {
    auto world = par::nccl_communicator(id, r, n, anvil::Device::cuda(r), options(timeout));
    const auto start = std::chrono::steady_clock::now();
    std::string error;
    try {
      call(*world, r);
      world->synchronize();
    } catch (const par::CommError& e) {
      error = e.what();
    }
    return std::pair{error,
                     std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()};
  });
}

}  // namespace

// ---- MPI: this process is one rank of the job ----

TEST_CASE("mpi: split groups, each group's all-reduce its own sum", "[mpi]") {
  if (!par::mpi_missing_reason().empty()) return skip(par::mpi_missing_reason());
  auto world = par::mpi_world(mpi_options());
  require_outcomes(split_scenario(*world), world->rank());
}

TEST_CASE("mpi: every dp × pp × tp mesh of the job, each group's all-reduce its own sum", "[mpi]") {
  if (!par::mpi_missing_reason().empty()) return skip(par::mpi_missing_reason());
  auto world = par::mpi_world(mpi_options());
  for (const MeshShape& shape : mesh_shapes(world->size()))
    require_outcomes(mesh_scenario(*world, shape), world->rank());
}

TEST_CASE("mpi: send and recv bit for bit, in the world and in a group", "[mpi]") {
  if (!par::mpi_missing_reason().empty()) return skip(par::mpi_missing_reason());
  auto world = par::mpi_world(mpi_options());
  if (world->size() < 2) return skip("needs 2 or more MPI ranks: a rank sends to another");
  require_outcomes(p2p_scenario(*world), world->rank());
}

TEST_CASE("mpi: bytes_sent counts the ring's and point-to-point sends, each group its own", "[mpi]") {
  if (!par::mpi_missing_reason().empty()) return skip(par::mpi_missing_reason());
  auto world = par::mpi_world(mpi_options());
  require_outcomes(bytes_sent_scenario(*world), world->rank());
}

// ---- NCCL: one thread per simulated GPU ----

TEST_CASE("nccl: split groups on 1 to 4 GPUs, each group's all-reduce its own sum", "[nccl][tsan]") {
  const int available = gpus(1);
  if (available == 0) return;
#if defined(__SANITIZE_THREAD__)
  const std::vector<int> rank_counts = {3};  // the threads' races, at a tenth of the speed
#else
  const std::vector<int> rank_counts = {1, 2, 3, 4};
#endif
  for (int n : rank_counts)
    if (enough_gpus(n, available)) on_gpus(n, "split", split_scenario);
}

TEST_CASE("nccl: 2 × 2 meshes on 4 GPUs, each group's all-reduce its own sum", "[nccl][tsan]") {
  const int available = gpus(4);
  if (available == 0) return;
  on_gpus(4, "mesh", [](par::Communicator& world) {
    Outcomes out = mesh_scenario(world, {.dp = 2, .pp = 1, .tp = 2});
#if !defined(__SANITIZE_THREAD__)
    for (Outcome& o : mesh_scenario(world, {.dp = 1, .pp = 2, .tp = 2})) out.push_back(o);
#endif
    return out;
  });
}

TEST_CASE("nccl: bytes_sent counts the ring's and point-to-point sends on 3 GPUs", "[nccl][tsan]") {
  const int available = gpus(3);
  if (available == 0) return;
  const par::NcclId id = par::nccl_unique_id();
  const auto per_rank = each_rank(3, [&](int r) {
    auto world = par::nccl_communicator(id, r, 3, anvil::Device::cuda(r), options(60));
    return bytes_sent_scenario(*world);
  });
  for (int r = 0; r < 3; ++r) require_outcomes(per_rank[size_t(r)], r);
}

TEST_CASE("nccl: send and recv bit for bit on 2 and 3 GPUs, in the world and in a group",
          "[nccl][tsan]") {
  const int available = gpus(2);
  if (available == 0) return;
#if defined(__SANITIZE_THREAD__)
  const std::vector<int> rank_counts = {2};  // the threads' races, at a tenth of the speed
#else
  const std::vector<int> rank_counts = {2, 3};
#endif
  for (int n : rank_counts)
    if (enough_gpus(n, available)) on_gpus(n, "send and recv", p2p_scenario);
}

TEST_CASE("nccl: a send that meets a receive of another dtype and shape stops both, naming both",
          "[nccl][tsan]") {
  if (gpus(3) == 0) return;
  // Inside a group of world ranks 1 and 2: 128 bytes either way, so only the
  // agreement can tell float32 [4, 8] from bfloat16 [4, 16].
  const auto errors = errors_on_gpus(3, 30, [](par::Communicator& world, int r) {
    auto group = world.split(r == 0 ? par::Communicator::kNoColor : 0, r, "pp");
    if (r == 1) group->send(Tensor::zeros({4, 8}, DType::Float32, group->device()), 1);
    if (r == 2) group->recv(Tensor::zeros({4, 16}, DType::BFloat16, group->device()), 0);
    if (group) group->synchronize();
  });
  CHECK(errors[0].first.empty());
  const std::string mismatch =
      "point-to-point call #1 between rank 0 (world rank 1) and rank 1 (world rank 2) does not "
      "match: rank 0 (world rank 1) sends float32 [4, 8] to rank 1 (world rank 2); rank 1 (world "
      "rank 2) receives bfloat16 [4, 16] from rank 0 (world rank 1)";
  INFO(errors[1].first);
  REQUIRE_THAT(errors[1].first,
               Contains("pp group 0 of 1, rank 0 of 2 (nccl, cuda:1, world rank 1): send of "
                        "float32 [4, 8] to rank 1 (world rank 2): " + mismatch));
  INFO(errors[2].first);
  REQUIRE_THAT(errors[2].first,
               Contains("pp group 0 of 1, rank 1 of 2 (nccl, cuda:2, world rank 2): receive of "
                        "bfloat16 [4, 16] from rank 0 (world rank 1): " + mismatch));
  // Two sends that meet would wait on each other: refused, with the way out.
  const auto both_send = errors_on_gpus(2, 30, [](par::Communicator& world, int r) {
    world.send(Tensor::zeros({5}, DType::Int64, world.device()), 1 - r);
  });
  for (int r = 0; r < 2; ++r) {
    INFO(both_send[size_t(r)].first);
    REQUIRE_THAT(both_send[size_t(r)].first,
                 Contains("rank 0 sends int64 [5] to rank 1; rank 1 sends int64 [5] to rank 0 "
                          "(both send, neither receives: one must recv, or both sendrecv)"));
  }
}

TEST_CASE("nccl: a peer that never posts its side of a send is named at the deadline", "[nccl][tsan]") {
  if (gpus(2) == 0) return;
  const auto errors = errors_on_gpus(2, 1, [](par::Communicator& world, int r) {
    if (r == 0) world.recv(Tensor::zeros({10}, DType::Float32, world.device()), 1);
  });
  INFO(errors[0].first);
  REQUIRE_THAT(errors[0].first,
               Contains("rank 0 (nccl, cuda:0): receive of float32 [10] from rank 1: rank 1 did "
                        "not post its side of point-to-point call #1 within 1 s "
                        "(ANVIL_COMM_TIMEOUT)"));
  CHECK(errors[0].second >= 1.0);
  CHECK(errors[0].second < 30);
  CHECK(errors[1].first.empty());
}

TEST_CASE("mesh: world rank <-> coordinates, tp fastest, then dp, then pp", "[comm]") {
  const MeshShape shape{.dp = 2, .pp = 3, .tp = 2};
  CHECK(par::mesh_coords(shape, 0) == MeshCoords{0, 0, 0});
  CHECK(par::mesh_coords(shape, 1) == MeshCoords{.dp = 0, .pp = 0, .tp = 1});
  CHECK(par::mesh_coords(shape, 2) == MeshCoords{.dp = 1, .pp = 0, .tp = 0});
  CHECK(par::mesh_coords(shape, 4) == MeshCoords{.dp = 0, .pp = 1, .tp = 0});
  CHECK(par::mesh_coords(shape, 11) == MeshCoords{.dp = 1, .pp = 2, .tp = 1});
  for (int r = 0; r < shape.size(); ++r) CHECK(par::mesh_rank(shape, par::mesh_coords(shape, r)) == r);
  CHECK_THROWS_WITH(par::mesh_coords(shape, 12),
                    Contains("mesh dp 2 × pp 3 × tp 2: rank 12 is not one of its 12 ranks"));
  CHECK_THROWS_WITH(par::mesh_rank({.dp = 0}, {}), Contains("every dimension needs at least 1"));
  auto one = par::one_rank_group(anvil::Device::cpu());
  CHECK_THROWS_WITH(par::make_mesh(*one, {.dp = 2}),
                    Contains("mesh dp 2 × pp 1 × tp 1 needs 2 ranks, but the world has 1"));
  par::Mesh mesh = par::make_mesh(*one, {});
  CHECK(mesh.dp->size() == 1);
  CHECK(mesh.tp->rank() == 0);
}
