// Deadlines outside the collectives: the watchdog (parallel/watchdog.h) on
// its own, then on NCCL communicators, where a host blocked behind a
// collective that never completes (in a copy, outside parallel/) must wake
// within the deadline with an error naming the rank and the collective. The
// hung peer and NCCL's asynchronous error are the simulator's test hooks
// (sim/nccl_sim.h), so those cases run in the simulator build only.
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <future>
#include <string>
#include <thread>

#include "parallel/watchdog.h"
#include "tests/parallel/ranks.h"
#include "tests/parallel/scenarios.h"

#if defined(ANVIL_CUDA_SIM)
#include "kernels/cuda/cuda_backend.h"
#include "parallel/nccl_api.h"
#endif

using namespace parallel_test;
namespace par = anvil::parallel;
using Catch::Matchers::Contains;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

namespace {

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// A watchdog whose firing is recorded: the reason, and when.
struct Recorder {
  std::promise<std::string> fired;
  std::future<std::string> why = fired.get_future();
  std::atomic<int> calls{0};
  par::Watchdog::Fire fire() {
    return [this](const std::string& w) {
      if (calls.fetch_add(1) == 0) fired.set_value(w);
    };
  }
};

}  // namespace

TEST_CASE("watchdog: each armed call keeps its own deadline whatever is armed after it",
          "[comm][tsan]") {
  for (bool short_first : {true, false}) {
    INFO((short_first ? "the short deadline armed first" : "the long deadline armed first"));
    Recorder r;
    par::Watchdog dog(r.fire());
    const auto start = Clock::now();
    if (short_first) {
      dog.arm("short: ", 200ms);
      dog.arm("long: ", 60s);
    } else {
      dog.arm("long: ", 60s);
      dog.arm("short: ", 200ms);
    }
    REQUIRE(r.why.wait_for(10s) == std::future_status::ready);
    const double waited = seconds_since(start);
    REQUIRE(r.why.get() == "short: did not complete within 0.2 s (ANVIL_COMM_TIMEOUT)");
    REQUIRE(waited >= 0.19);
    REQUIRE(waited < 5);
    REQUIRE(dog.fired());
  }
}

TEST_CASE("watchdog: disarmed work never fires and a poll's failure fires at once and only once", "[comm][tsan]") {
  Recorder r;
  std::atomic<bool> broken{false};
  par::Watchdog dog(r.fire(), [&](par::Watchdog&) { return broken ? std::string("it broke") : std::string(); },
                    10ms);
  const uint64_t done = dog.arm("done: ", 50ms);
  dog.disarm(done);
  REQUIRE(dog.armed() == 0);
  std::this_thread::sleep_for(150ms);
  REQUIRE(!dog.fired());
  const auto start = Clock::now();
  dog.arm("waiting: ", 60s);
  broken = true;
  REQUIRE(r.why.wait_for(10s) == std::future_status::ready);
  REQUIRE(r.why.get() == "it broke");
  REQUIRE(seconds_since(start) < 5);
  dog.arm("another: ", 1ms);
  std::this_thread::sleep_for(50ms);
  REQUIRE(r.calls == 1);
}

#if defined(ANVIL_CUDA_SIM)
namespace {

// What rank 0 of two saw: its host blocked in a copy behind an all-reduce
// that rank 1 issued behind a stream that never completes.
struct HungPeer {
  double woke_after = 0;  // seconds in the blocking copy
  std::string error;      // what the next call on the communicator threw
  std::string peer_error;
  std::string copy_error;  // the copy's own failure, if it had one
};

// Rank 1 hangs outside the collective; `meanwhile(comm)` runs on rank 1's
// thread once rank 0 has issued its part, and `on_rank0_blocked` on a third
// thread as rank 0 blocks.
template <typename Meanwhile, typename Aside>
HungPeer hung_peer(double timeout, Meanwhile meanwhile, Aside on_rank0_blocked) {
  const par::NcclId id = par::nccl_unique_id();
  std::atomic<bool> rank0_issued{false}, rank0_done{false};
  auto wait_for = [](const std::atomic<bool>& flag) {
    const auto start = Clock::now();
    while (!flag && seconds_since(start) < 30) std::this_thread::sleep_for(10ms);
  };
  HungPeer out;
  each_rank(2, [&](int r) {
    // Rank 1's deadline is later, so that rank 0's watchdog is the first to act.
    auto comm = par::nccl_communicator(id, r, 2, anvil::Device::cuda(r),
                                       options(r == 0 ? timeout : std::max(timeout, 30.0)));
    Tensor t = on(*comm, make(r, 1000, true));
    const uint64_t hold = r == 1 ? ncclSimHoldStream(anvil::cuda::compute_stream(1)) : 0;
    struct Done {  // rank 1 lets its stream go however rank 0 ends
      std::atomic<bool>& flag;
      bool mine;
      ~Done() {
        if (mine) flag = true;
      }
    } done{rank0_done, r == 0};
    comm->allreduce(t);  // agreed by both; rank 1's part waits behind its hung stream
    if (r == 0) rank0_issued = true;
    auto error_of = [&] {
      try {
        comm->synchronize();
      } catch (const par::CommError& e) {
        return std::string(e.what());
      }
      return std::string();
    };
    if (r == 0) {
      std::thread aside(on_rank0_blocked);
      const auto start = Clock::now();
      try {
        (void)t.to_vector();  // a blocking copy, outside parallel/
      } catch (const std::exception& e) {
        out.copy_error = e.what();  // the simulator gave up waiting: no watchdog woke it
      }
      out.woke_after = seconds_since(start);
      aside.join();
      out.error = error_of();
    } else {
      wait_for(rank0_issued);
      meanwhile(*comm);
      wait_for(rank0_done);
      ncclSimReleaseStream(hold);
      out.peer_error = error_of();
    }
    return 0;
  });
  return out;
}

}  // namespace

TEST_CASE("nccl: a rank hung outside a collective: the peer blocked in a copy wakes at the "
          "deadline and the error names the collective",
          "[nccl][tsan]") {
  if (gpus(2) == 0) return;
  const HungPeer seen = hung_peer(1.0, [](par::Communicator&) {}, [] {});
  INFO("rank 0: " << seen.error << "\nrank 1: " << seen.peer_error << "\ncopy: " << seen.copy_error);
  REQUIRE_THAT(seen.error, Contains("rank 0 (nccl, cuda:0): allreduce #1 (ring, sum) of float32 "
                                    "[1000]: did not complete within 1 s (ANVIL_COMM_TIMEOUT); "
                                    "the watchdog aborted the communicator"));
  REQUIRE(seen.woke_after >= 0.9);
  REQUIRE(seen.copy_error.empty());
  REQUIRE(seen.woke_after < 10);
  REQUIRE(seen.copy_error.empty());
  REQUIRE(!seen.peer_error.empty());
}

TEST_CASE("nccl: an asynchronous NCCL error wakes the rank blocked behind it long before the "
          "deadline",
          "[nccl][tsan]") {
  if (gpus(2) == 0) return;
  const HungPeer seen = hung_peer(60.0, [](par::Communicator&) {}, [] {
    std::this_thread::sleep_for(200ms);
    ncclSimInjectAsyncError(0, ncclRemoteError);
  });
  ncclSimInjectAsyncError(0, ncclSuccess);
  INFO("rank 0: " << seen.error << "\nrank 1: " << seen.peer_error << "\ncopy: " << seen.copy_error);
  REQUIRE_THAT(seen.error, Contains("rank 0 (nccl, cuda:0): allreduce #1 (ring, sum) of float32 "
                                    "[1000]: NCCL reports an asynchronous error: a remote rank "
                                    "failed"));
  REQUIRE_THAT(seen.error, Contains("the watchdog aborted the communicator"));
  REQUIRE(seen.woke_after < 10);
  REQUIRE(seen.copy_error.empty());
  REQUIRE_THAT(seen.peer_error, Contains("another rank failed"));
}

TEST_CASE("nccl: a rank that gives up ends the waits of the others at once", "[nccl][tsan]") {
  if (gpus(2) == 0) return;
  const HungPeer seen = hung_peer(
      60.0,
      [](par::Communicator& c) {
        std::this_thread::sleep_for(100ms);  // rank 0 is in its copy by then
        c.abort("rank 1: its data loader failed");
      },
      [] {});
  INFO("rank 0: " << seen.error << "\nrank 1: " << seen.peer_error << "\ncopy: " << seen.copy_error);
  REQUIRE_THAT(seen.error, Contains("allreduce #1 (ring, sum) of float32 [1000]: another rank "
                                    "failed (world rank 1): rank 1: its data loader failed"));
  REQUIRE(seen.woke_after < 10);
  REQUIRE(seen.copy_error.empty());
  REQUIRE_THAT(seen.peer_error, Contains("rank 1: its data loader failed"));
}
#endif
