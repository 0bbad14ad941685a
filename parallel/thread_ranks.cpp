// Thread ranks and their supervision (parallel/thread_ranks.h).
#include "parallel/thread_ranks.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>

namespace anvil::parallel {

std::exception_ptr first_cause(const std::vector<std::exception_ptr>& errors) {
  std::exception_ptr first;
  for (const std::exception_ptr& e : errors) {
    if (!e) continue;
    if (!first) first = e;
    try {
      std::rethrow_exception(e);
    } catch (const PeerFailed&) {
      // another rank's failure, echoed
    } catch (...) {
      return e;
    }
  }
  return first;
}

void run_thread_ranks(std::span<const Device> devices, const CommOptions& options,
                      const std::string& program,
                      const std::function<void(Communicator& comm)>& body) {
  const int n = int(devices.size());
  const NcclId id = nccl_unique_id();
  // Shared with the threads; on the heap, since a thread that never stops
  // is left behind (below) and must not find it gone. So is what the
  // threads read: their copy of the devices and of the body.
  struct Shared {
    std::vector<Device> devices;
    std::function<void(Communicator&)> body;
    std::mutex mutex;
    std::condition_variable changed;
    std::vector<std::exception_ptr> errors;
    std::vector<bool> finished;
    int running = 0;
    std::optional<std::chrono::steady_clock::time_point> first_failure;
  };
  auto shared = std::make_shared<Shared>();
  shared->devices.assign(devices.begin(), devices.end());
  shared->body = body;
  shared->errors.resize(size_t(n));
  shared->finished.assign(size_t(n), false);
  shared->running = n;
  std::vector<std::thread> threads;
  for (int rank = 0; rank < n; ++rank)
    threads.emplace_back([id, options, n, shared, rank] {
      std::unique_ptr<Communicator> comm;
      std::exception_ptr error;
      try {
        comm = nccl_communicator(id, rank, n, shared->devices[size_t(rank)], options);
        shared->body(*comm);
      } catch (const std::exception& e) {
        error = std::current_exception();
        if (comm) comm->abort(e.what());  // the others stop at once, not at their deadline
      }
      comm.reset();
      {
        std::lock_guard lock(shared->mutex);
        shared->errors[size_t(rank)] = error;
        shared->finished[size_t(rank)] = true;
        --shared->running;
        if (error && !shared->first_failure)
          shared->first_failure = std::chrono::steady_clock::now();
      }
      shared->changed.notify_all();
    });
  const auto grace = std::min<std::chrono::milliseconds>(options.timeout, std::chrono::seconds(10));
  {
    std::unique_lock lock(shared->mutex);
    shared->changed.wait(lock, [&] { return shared->running == 0 || shared->first_failure; });
    if (!shared->changed.wait_until(lock, shared->first_failure.value_or(
                                              std::chrono::steady_clock::now()) + grace,
                                    [&] { return shared->running == 0; })) {
      std::string stuck;
      for (int rank = 0; rank < n; ++rank)
        if (!shared->finished[size_t(rank)])
          stuck += fmt::format("{}rank {} ({})", stuck.empty() ? "" : ", ", rank,
                               shared->devices[size_t(rank)].str());
      std::string cause;
      try {
        if (std::exception_ptr e = first_cause(shared->errors)) std::rethrow_exception(e);
      } catch (const std::exception& x) {
        cause = x.what();
      }
      std::cout << std::flush;
      std::cerr << fmt::format("{}: error: {} ({} did not stop within {} of that failure: the "
                               "process ends without it)\n",
                               program, cause, stuck,
                               fmt::format("{:g} s", double(grace.count()) / 1000))
                << std::flush;
      std::_Exit(1);  // a thread still runs: no destructors, no exit handlers
    }
  }
  for (auto& t : threads) t.join();
  if (std::exception_ptr cause = first_cause(shared->errors)) std::rethrow_exception(cause);
}

}  // namespace anvil::parallel
