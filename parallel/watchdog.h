// Internal to parallel/: the thread that keeps a communicator's deadlines
// while the host is elsewhere, like PyTorch's ProcessGroupNCCL watchdog.
//
// A collective on a GPU is finished by the device long after the host issued
// it; a host that then waits outside parallel/ (an event, a copy, `item()`)
// behind work that will never complete would wait for ever. Each piece of
// work is armed with its deadline when issued; the watchdog's thread checks,
// every `period` while something is armed, what `poll` says (NCCL's
// asynchronous error, a failed peer; it also disarms the work it finds
// complete) and whether the earliest deadline has passed. On the first
// failure it calls `fire` once, on its own thread (NCCL: ncclCommAbort, which
// wakes every thread blocked behind the communicator; MPI: MPI_Abort), and
// stays quiet after.
//
// Every armed piece has its own deadline: concurrent calls never share one.
#pragma once
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>

namespace anvil::parallel {

class Watchdog {
 public:
  // What went wrong, or "" while all is well; it may disarm() what it finds done.
  using Poll = std::function<std::string(Watchdog&)>;
  using Fire = std::function<void(const std::string& why)>;

  explicit Watchdog(Fire fire, Poll poll = {},
                    std::chrono::milliseconds period = std::chrono::milliseconds(100));
  ~Watchdog();  // stops the thread (a `fire` under way finishes first)
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // Work that must be done within `timeout` from now. `what` begins its error
  // ("rank 0 (nccl, cuda:0): allreduce #3 (ring, sum) of float32 [10]: ").
  // Returns its id for disarm().
  uint64_t arm(std::string what, std::chrono::milliseconds timeout);
  // The work is done (an unknown or already disarmed id is ignored).
  void disarm(uint64_t id);
  // While paused (pause() more often than resume()), deadlines do not fire;
  // `poll` still runs. For a host that waits inside parallel/ with a deadline
  // of its own, which names more than the watchdog could.
  void pause();
  void resume();
  // How many pieces are armed; whether fire() has been called.
  size_t armed() const;
  bool fired() const;

 private:
  struct Entry {
    std::chrono::steady_clock::time_point deadline;
    std::chrono::milliseconds timeout;
    std::string what;
  };
  void loop();

  Fire fire_;
  Poll poll_;
  std::chrono::milliseconds period_;
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::map<uint64_t, Entry> entries_;
  uint64_t next_id_ = 0;
  int paused_ = 0;
  bool fired_ = false;
  bool stop_ = false;
  std::thread thread_;  // last: starts once the rest is ready
};

}  // namespace anvil::parallel
