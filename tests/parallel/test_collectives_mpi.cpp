// The collectives over MPI, one rank per process: ctest runs this binary
// under `mpiexec -np N` for N = 1..5 (tests/parallel/CMakeLists.txt), and
// every process checks its own results against the host's reference.
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <thread>
#include <vector>

#include "parallel/mpi_internal.h"

#include "tests/cuda_test_util.h"
#include "tests/parallel/bf16_scenarios.h"
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

// bfloat16 all-reduce, added in float32 (the ring's steps; native: MPI_UINT16_T
// with anvil's MPI_Op), against the FP64 sum within n-1 roundings
// (tests/parallel/bf16_scenarios.h), on 1 to 5 ranks (one ctest entry each).
TEST_CASE("mpi: bfloat16 all-reduce is within n-1 roundings of the FP64 sum", "[mpi][bf16]") {
  if (!par::mpi_missing_reason().empty()) return skip(par::mpi_missing_reason());
  auto comm = par::mpi_world(options());
  INFO("bfloat16 all-reduce on " << comm->size() << " ranks");
  require_outcomes(bf16_allreduce_scenario(*comm), comm->rank());
}

// MPI_Bcast, MPI_Allgather(v) and MPI_Reduce_scatter_block against the ring.
TEST_CASE("mpi: native broadcast, all-gather and reduce-scatter match the ring", "[mpi]") {
  if (!par::mpi_missing_reason().empty()) return skip(par::mpi_missing_reason());
  auto comm = par::mpi_world(options());
  INFO("native collectives on " << comm->size() << " ranks");
  require_outcomes(native_scenario(*comm), comm->rank());
}

// MPI's counts are ints, so a message over 1 GiB goes as several pieces.
// The same path with 1000-byte pieces: every collective again, its messages
// (up to MiBs) cut into pieces of 1000 bytes and a rest, the native ones too.
TEST_CASE("mpi: every collective with messages cut into 1000-byte pieces", "[mpi]") {
  if (!par::mpi_missing_reason().empty()) return skip(par::mpi_missing_reason());
  auto comm = par::mpi_world(options());
  const size_t previous = par::mpi_detail::set_max_message_bytes(1000);
  struct Restore {
    size_t bytes;
    ~Restore() { par::mpi_detail::set_max_message_bytes(bytes); }
  } restore{previous};
  for (const auto& [name, scenario] : all_scenarios()) {
    INFO(name << " on " << comm->size() << " ranks, 1000-byte pieces");
    require_outcomes(scenario(*comm), comm->rank());
  }
  {
    INFO("native collectives on " << comm->size() << " ranks, 1000-byte pieces");
    require_outcomes(native_scenario(*comm), comm->rank());
  }
  REQUIRE_THROWS_WITH(par::mpi_detail::set_max_message_bytes(0),
                      Catch::Matchers::Contains("is not in 1.."));
}

// CommOptions::check_calls off (ANVIL_COMM_CHECK=OFF): the same results,
// and no exchange of calls before all-reduce, broadcast and reduce-scatter;
// scatter, all-gather and barrier exchange anyway (their answer carries the
// shapes).
TEST_CASE("mpi: with the per-call check off every collective gives the same results", "[mpi]") {
  if (!par::mpi_missing_reason().empty()) return skip(par::mpi_missing_reason());
  auto comm = par::mpi_world(options());
  comm->set_check_calls(false);
  struct Restore {
    par::Communicator& c;
    ~Restore() { c.set_check_calls(true); }
  } restore{*comm};
  for (const auto& [name, scenario] : all_scenarios()) {
    INFO(name << " on " << comm->size() << " ranks, unchecked");
    require_outcomes(scenario(*comm), comm->rank());
  }
  const Tensor t = Tensor::ones({10});
  uint64_t before = comm->checked_calls();
  comm->allreduce(t);
  comm->broadcast(t, 0);
  comm->reduce_scatter(Tensor::ones({int64_t(comm->size()), 3}));
  comm->synchronize();
  CHECK(comm->checked_calls() == before);
  CHECK(t.to_vector()[0] == float(comm->size()));
  comm->barrier();
  CHECK(comm->checked_calls() == before + 1);
  comm->set_check_calls(true);
  before = comm->checked_calls();
  comm->allreduce(t);
  comm->synchronize();
  CHECK(comm->checked_calls() == before + 1);
}

// The communicator's destructor finishes the work already issued before
// letting go; the Work outlives the communicator.
TEST_CASE("mpi: destroying a communicator with an all-reduce in flight finishes it first", "[mpi]") {
  if (!par::mpi_missing_reason().empty()) return skip(par::mpi_missing_reason());
  auto comm = par::mpi_world(options());
  const int n = comm->size();
  Tensor t = Tensor::full({int64_t(1) << 16}, double(comm->rank() + 1));
  std::shared_ptr<par::Work> work = comm->allreduce_async(t);
  comm.reset();
  work->wait();
  const std::vector<float> v = t.to_vector();
  const float want = float(n * (n + 1) / 2);
  CHECK(*std::min_element(v.begin(), v.end()) == want);
  CHECK(*std::max_element(v.begin(), v.end()) == want);
}

TEST_CASE("mpi: argument errors are refused before anything moves, naming what is wrong", "[mpi]") {
  if (!par::mpi_missing_reason().empty()) return skip(par::mpi_missing_reason());
  auto comm = par::mpi_world(options());
  using Catch::Matchers::Contains;
  REQUIRE_THROWS_WITH(comm->allreduce(Tensor()), Contains("allreduce: the tensor is undefined"));
  REQUIRE_THROWS_WITH(comm->broadcast(Tensor::zeros({3}), comm->size()),
                      Contains("root " + std::to_string(comm->size()) + " is not a rank"));
  REQUIRE_THROWS_WITH(comm->allreduce(Tensor::zeros({3}, DType::UInt8)),
                      Contains("uint8; reductions take float32, bfloat16 (added in float32) or int64"));
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

// A timed-out broadcast's request stays with MPI (a collective's request
// cannot be cancelled) and completes whenever the root sends: it must do so
// into a buffer of its own, not the caller's, which may be gone by then.
// Rank 1 gives up after 100 ms; the root broadcasts 300 ms later; after two
// barriers (MPI progresses the orphaned request inside them) rank 1's
// buffer must still hold what it held.
TEST_CASE("mpi: a broadcast that timed out never writes into its caller's buffer later", "[mpi]") {
  if (!par::mpi_missing_reason().empty()) return skip(par::mpi_missing_reason());
  auto comm = par::mpi_world(options());
  if (comm->size() < 2) return skip("needs 2 ranks: one that gives up, and the root");
  const std::vector<char> sent(64, 'x'), before(64, '.');
  std::vector<char> buffer = comm->rank() == 0 ? sent : before;
  using namespace std::chrono_literals;
  if (comm->rank() == 1) {
    REQUIRE_THROWS_WITH(par::mpi_detail::broadcast_bytes(buffer.data(), buffer.size(), 0, 100ms,
                                                         "a test broadcast"),
                        Catch::Matchers::Contains("did not complete within"));
  } else {
    if (comm->rank() == 0) std::this_thread::sleep_for(400ms);
    par::mpi_detail::broadcast_bytes(buffer.data(), buffer.size(), 0, 10s, "a test broadcast");
  }
  comm->barrier();
  std::this_thread::sleep_for(50ms);
  comm->barrier();
  CHECK(buffer == (comm->rank() == 1 ? before : sent));
}
