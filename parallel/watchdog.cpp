#include "parallel/watchdog.h"

#include <fmt/format.h>

#include <algorithm>
#include <exception>

#include "parallel/transport.h"

namespace anvil::parallel {

Watchdog::Watchdog(Fire fire, Poll poll, std::chrono::milliseconds period)
    : fire_(std::move(fire)),
      poll_(std::move(poll)),
      period_(std::max(period, std::chrono::milliseconds(1))),
      thread_([this] { loop(); }) {}

Watchdog::~Watchdog() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  changed_.notify_all();
  thread_.join();
}

uint64_t Watchdog::arm(std::string what, std::chrono::milliseconds timeout) {
  uint64_t id = 0;
  {
    std::lock_guard lock(mutex_);
    id = ++next_id_;
    entries_[id] = Entry{std::chrono::steady_clock::now() + timeout, timeout, std::move(what)};
  }
  changed_.notify_all();
  return id;
}

void Watchdog::disarm(uint64_t id) {
  std::lock_guard lock(mutex_);
  entries_.erase(id);
}

void Watchdog::pause() {
  std::lock_guard lock(mutex_);
  ++paused_;
}

void Watchdog::resume() {
  std::lock_guard lock(mutex_);
  --paused_;
}

size_t Watchdog::armed() const {
  std::lock_guard lock(mutex_);
  return entries_.size();
}

bool Watchdog::fired() const {
  std::lock_guard lock(mutex_);
  return fired_;
}

void Watchdog::loop() {
  using Clock = std::chrono::steady_clock;
  std::unique_lock lock(mutex_);
  while (!stop_) {
    if (fired_ || entries_.empty()) {
      changed_.wait(lock, [&] { return stop_ || (!fired_ && !entries_.empty()); });
      continue;
    }
    auto earliest = [&] {
      return std::min_element(entries_.begin(), entries_.end(), [](const auto& a, const auto& b) {
        return a.second.deadline < b.second.deadline;
      });
    };
    // Wake at the earliest deadline, or sooner to poll; an arm() with an
    // earlier deadline than any so far wakes it too.
    const uint64_t seen = next_id_;
    Clock::time_point wake = earliest()->second.deadline;
    if (poll_) wake = std::min(wake, Clock::now() + period_);
    changed_.wait_until(lock, wake, [&] {
      return stop_ || next_id_ != seen || entries_.empty();
    });
    if (stop_ || entries_.empty()) continue;
    std::string failure;
    if (poll_) {
      lock.unlock();  // poll may disarm what it finds complete
      try {
        failure = poll_(*this);
      } catch (const std::exception& e) {
        failure = e.what();
      }
      lock.lock();
    }
    if (failure.empty() && !entries_.empty() && paused_ == 0) {
      const auto first = earliest();
      if (Clock::now() >= first->second.deadline)
        failure = fmt::format("{}did not complete within {} (ANVIL_COMM_TIMEOUT)",
                              first->second.what, timeout_text(first->second.timeout));
    }
    if (failure.empty()) continue;
    fired_ = true;
    lock.unlock();
    fire_(failure);
    lock.lock();
  }
}

}  // namespace anvil::parallel
