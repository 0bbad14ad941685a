// Thread ranks under run_thread_ranks (parallel/thread_ranks.h): a rank that
// fails reaches the others as PeerFailed, which names it, and the caller gets
// the failing rank's own error, not an echo. Three simulated GPUs, at most
// two all-reduces of 64 floats; the others learn of the failure either while
// they wait to agree on a call (the board) or while they wait for a
// collective rank 1 has issued but not run (NCCL's wait, the simulator's
// stream hold).
#include <catch2/catch.hpp>

#include <chrono>
#include <latch>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "parallel/mesh.h"
#include "parallel/thread_ranks.h"
#include "tests/parallel/ranks.h"
#include "tests/parallel/scenarios.h"

#if defined(ANVIL_CUDA_SIM)
#include "kernels/cuda/cuda_backend.h"
#include "parallel/nccl_api.h"
#endif

using namespace parallel_test;
namespace par = anvil::parallel;
using Catch::Matchers::EndsWith;
using Catch::Matchers::StartsWith;

namespace {

struct Seen {
  std::vector<std::string> what = std::vector<std::string>(3);
  std::vector<int> blamed = std::vector<int>(3, -2);  // PeerFailed::rank(); -1: another error
  std::string caller;                                 // what run_thread_ranks threw
};

// Ranks 0 and 2 run `others` and record what they throw; rank 1 runs `fail`.
template <typename Fail, typename Others>
Seen three_ranks(Fail fail, Others others) {
  const std::vector<anvil::Device> devices = {anvil::Device::cuda(0), anvil::Device::cuda(1),
                                              anvil::Device::cuda(2)};
  std::mutex mutex;
  Seen seen;
  try {
    par::run_thread_ranks(devices, options(60), "test", [&](par::Communicator& comm) {
      const size_t r = size_t(comm.rank());
      if (r == 1) return fail(comm);
      try {
        others(comm);
      } catch (const par::PeerFailed& e) {
        std::lock_guard lock(mutex);
        seen.blamed[r] = e.rank();
        seen.what[r] = e.what();
        throw;
      } catch (const std::exception& e) {
        std::lock_guard lock(mutex);
        seen.blamed[r] = -1;
        seen.what[r] = e.what();
        throw;
      }
    });
  } catch (const par::PeerFailed& e) {
    FAIL("the caller got an echo, not the cause: " << e.what());
  } catch (const std::exception& e) {
    seen.caller = e.what();
  }
  return seen;
}

void check(const Seen& seen, const std::string& call) {
  INFO("rank 0: " << seen.what[0] << "\nrank 2: " << seen.what[2]);
  REQUIRE(seen.caller == "rank 1: its data loader failed");
  for (size_t r : {0, 2}) {
    REQUIRE(seen.blamed[r] == 1);
    REQUIRE_THAT(seen.what[r], StartsWith("rank " + std::to_string(r) + " (nccl, cuda:" +
                                          std::to_string(r) + "): "));
    REQUIRE_THAT(seen.what[r], EndsWith(call + ": another rank failed (world rank 1): rank 1: "
                                               "its data loader failed"));
  }
}

}  // namespace

TEST_CASE("nccl: thread ranks: a rank's failure reaches the others as PeerFailed naming it, "
          "and the caller gets that rank's own error",
          "[nccl][tsan]") {
  if (gpus(3) == 0) return;
  SECTION("while they wait to agree on a call") {
    std::latch met(3);  // every rank has finished the first all-reduce
    const Seen seen = three_ranks(
        [&](par::Communicator& comm) {
          Tensor t = on(comm, make(1, 64, true));
          comm.allreduce(t);
          comm.synchronize();
          met.arrive_and_wait();
          throw std::runtime_error("rank 1: its data loader failed");
        },
        [&](par::Communicator& comm) {
          Tensor t = on(comm, make(comm.rank(), 64, true));
          comm.allreduce(t);
          comm.synchronize();
          met.arrive_and_wait();
          comm.allreduce(t);  // rank 1 never posts this one
        });
    check(seen, "allreduce #2 (ring, sum) of float32 [64]");
  }
#if defined(ANVIL_CUDA_SIM)
  SECTION("while they wait for a collective that rank 1 issued but never runs") {
    const Seen seen = three_ranks(
        [&](par::Communicator& comm) {
          Tensor t = on(comm, make(1, 64, true));
          const uint64_t hold = ncclSimHoldStream(anvil::cuda::compute_stream(1));
          comm.allreduce(t);  // agreed by all three; rank 1's part waits behind the hold
          comm.abort("rank 1: its data loader failed");
          ncclSimReleaseStream(hold);
          throw std::runtime_error("rank 1: its data loader failed");
        },
        [&](par::Communicator& comm) {
          Tensor t = on(comm, make(comm.rank(), 64, true));
          comm.allreduce(t);
          comm.synchronize();
        });
    check(seen, "allreduce #1 (ring, sum) of float32 [64]");  // issuing it, or waiting for it
  }
#endif
}

// dp 2 × pp 2 on 4 GPUs (world rank = 2 pp + dp): rank 1 fails half a second
// in, while rank 0 waits for it in their dp group's all-reduce, rank 3 in
// their pipeline's receive, and rank 2 in its pipeline's receive from rank
// 0 (which waits for rank 1). The world's failure reaches every group's
// board: each ends at once with PeerFailed naming rank 1, not at its 5 s
// deadline.
TEST_CASE("nccl: thread ranks: a rank's failure ends the others' waits in the mesh's groups, "
          "naming it",
          "[nccl][tsan]") {
  if (gpus(4) == 0) return;
  const std::vector<anvil::Device> devices = {anvil::Device::cuda(0), anvil::Device::cuda(1),
                                              anvil::Device::cuda(2), anvil::Device::cuda(3)};
  using Clock = std::chrono::steady_clock;
  std::mutex mutex;
  std::vector<std::string> what(4);
  std::vector<int> blamed(4, -2);  // PeerFailed::rank(); -1: another error
  std::vector<double> waited(4, -1);
  std::string caller;
  try {
    par::run_thread_ranks(devices, options(5), "test", [&](par::Communicator& world) {
      const par::Mesh mesh = par::make_mesh(world, {.dp = 2, .pp = 2});
      const int r = world.rank();
      if (r == 1) {
        std::this_thread::sleep_for(std::chrono::milliseconds(500));
        throw std::runtime_error("rank 1: its data loader failed");
      }
      const auto start = Clock::now();
      auto record = [&](int rank, const std::string& text) {
        std::lock_guard lock(mutex);
        blamed[size_t(r)] = rank;
        what[size_t(r)] = text;
        waited[size_t(r)] = std::chrono::duration<double>(Clock::now() - start).count();
      };
      try {
        Tensor t = on(world, make(r, 64, true));
        if (r == 0) mesh.dp->allreduce(t);  // with world rank 1
        else mesh.pp->recv(t, 0);           // from world rank 1 (rank 3), or 0 (rank 2)
        mesh.dp->synchronize();
      } catch (const par::PeerFailed& e) {
        record(e.rank(), e.what());
        throw;
      } catch (const std::exception& e) {
        record(-1, e.what());
        throw;
      }
    });
  } catch (const std::exception& e) {
    caller = e.what();
  }
  CHECK(caller == "rank 1: its data loader failed");
  const std::vector<std::string> calls = {
      "dp group 0 of 2, rank 0 of 2 (nccl, cuda:0, world rank 0): allreduce #1 (ring, sum) of "
      "float32 [64]: ",
      "",
      "pp group 0 of 2, rank 1 of 2 (nccl, cuda:2, world rank 2): receive of float32 [64] from "
      "rank 0 (world rank 0): ",
      "pp group 1 of 2, rank 1 of 2 (nccl, cuda:3, world rank 3): receive of float32 [64] from "
      "rank 0 (world rank 1): "};
  for (size_t r : {0, 2, 3}) {
    INFO("rank " << r << " after " << waited[r] << " s: " << what[r]);
    CHECK(blamed[r] == 1);
    CHECK_THAT(what[r], StartsWith(calls[r]));
    CHECK_THAT(what[r], EndsWith("another rank failed (world rank 1): rank 1: its data loader "
                                 "failed"));
    CHECK(waited[r] < 2.0);  // the failure came at 0.5 s; the deadline is 5 s
  }
}

TEST_CASE("comm: the cause among the ranks' errors is the first that is not a PeerFailed",
          "[comm]") {
  auto error = [](auto e) { return std::make_exception_ptr(e); };
  auto text = [](const std::exception_ptr& e) {
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& x) {
      return std::string(x.what());
    }
  };
  const std::exception_ptr echo = error(par::PeerFailed("rank 0: echo", 2));
  REQUIRE(text(par::first_cause({echo, nullptr, error(par::CommError("rank 2: own"))})) ==
          "rank 2: own");
  REQUIRE(text(par::first_cause({echo, error(par::PeerFailed("rank 1: echo", 0))})) ==
          "rank 0: echo");  // only echoes: the first
  REQUIRE(!par::first_cause({nullptr, nullptr}));
}
