// Thread ranks under run_thread_ranks (parallel/thread_ranks.h): a rank that
// fails reaches the others as PeerFailed, which names it, and the caller gets
// the failing rank's own error, not an echo. Three simulated GPUs, at most
// two all-reduces of 64 floats; the others learn of the failure either while
// they wait to agree on a call (the board) or while they wait for a
// collective rank 1 has issued but not run (NCCL's wait, the simulator's
// stream hold).
#include <catch2/catch.hpp>

#include <latch>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

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
