// The collectives over MPI, one rank per process: ctest runs this binary
// under `mpiexec -np N` for N = 1..5 (tests/parallel/CMakeLists.txt), and
// every process checks its own results against the host's reference.
#include <catch2/catch.hpp>

#include "tests/cuda_test_util.h"
#include "tests/parallel/ranks.h"
#include "tests/parallel/scenarios.h"

using namespace parallel_test;
namespace par = anvil::parallel;

namespace {
par::CommOptions options() {
  par::CommOptions o;
  o.timeout = std::chrono::seconds(60);
  return o;
}
}  // namespace

TEST_CASE("mpi: every collective on every rank of the job against the host's reference", "[mpi]") {
  if (!par::mpi_missing_reason().empty()) return skip(par::mpi_missing_reason());
  auto comm = par::mpi_world(options());
  REQUIRE(comm->backend() == "mpi");
  REQUIRE(comm->device() == anvil::Device::cpu());
  REQUIRE(comm->size() == par::mpi_size());
  for (const auto& [name, scenario] : all_scenarios()) {
    INFO(name << " on " << comm->size() << " ranks");
    require_outcomes(scenario(*comm), comm->rank());
  }
}

TEST_CASE("mpi: argument errors are refused before anything moves, naming what is wrong", "[mpi]") {
  if (!par::mpi_missing_reason().empty()) return skip(par::mpi_missing_reason());
  auto comm = par::mpi_world(options());
  using Catch::Matchers::Contains;
  REQUIRE_THROWS_WITH(comm->allreduce(Tensor()), Contains("allreduce: the tensor is undefined"));
  REQUIRE_THROWS_WITH(comm->broadcast(Tensor::zeros({3}), comm->size()),
                      Contains("root " + std::to_string(comm->size()) + " is not a rank"));
  REQUIRE_THROWS_WITH(comm->allreduce(Tensor::zeros({3}, DType::UInt8)),
                      Contains("uint8; reductions take float32 or int64"));
  REQUIRE_THROWS_WITH(comm->allreduce(Tensor::zeros({3}, DType::Int64), ReduceOp::kAverage),
                      Contains("average of int64"));
  if (cuda_test::have_device("CUDA part")) {
    REQUIRE_THROWS_WITH(comm->allreduce(Tensor::zeros({3}, DType::Float32, anvil::Device::cuda(0))),
                        Contains("not CUDA-aware"));
  }
  // Still usable: argument errors involve no other rank.
  Tensor t = Tensor::ones({5});
  comm->allreduce(t);
  REQUIRE(t.to_vector() == std::vector<float>(5, float(comm->size())));
}
