#include "core/profile.h"

#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>

namespace anvil::profile {
namespace {

using Clock = std::chrono::steady_clock;

struct ThreadState {
  Thread data;
  int64_t next_step = 0;
  int64_t step = -1;  // the open step, -1 outside one
  int depth = 0;      // open Scopes
  bool host_scope = false;  // the outermost one is timed on the host
  Family family = Family::Other;
  std::unordered_map<const void*, int> stream_ids;
  std::unordered_map<const char*, uint32_t> name_ids;  // Scope's static names
};

struct Registry {
  std::mutex mutex;
  std::vector<std::shared_ptr<ThreadState>> threads;
  std::unordered_map<std::string, uint32_t> ids;
  std::vector<std::string> names;
  Clock::time_point origin = Clock::now();
  FlushLaunches flush = nullptr;
};

Registry& registry() {
  static auto* r = new Registry();  // leaked: threads may record during exit
  return *r;
}

ThreadState& state() {
  thread_local std::shared_ptr<ThreadState> s = [] {
    auto t = std::make_shared<ThreadState>();
    t->data.streams = {"host"};
    Registry& r = registry();
    std::lock_guard lock(r.mutex);
    r.threads.push_back(t);
    return t;
  }();
  return *s;
}

}  // namespace

const char* family_name(Family f) {
  switch (f) {
    case Family::ConvForward: return "conv forward";
    case Family::ConvBackwardData: return "conv backward-data";
    case Family::ConvBackwardWeight: return "conv backward-weight";
    case Family::Gemm: return "GEMM";
    case Family::BatchNorm: return "BatchNorm";
    case Family::Relu: return "ReLU";
    case Family::Pooling: return "pooling";
    case Family::Add: return "add";
    case Family::CrossEntropy: return "cross-entropy";
    case Family::Sgd: return "SGD";
    case Family::Conversion: return "conversions";
    case Family::AllReduce: return "all-reduce";
    case Family::DataWait: return "data wait";
    case Family::Other: return "other";
  }
  return "other";
}

void set_enabled(bool on) { detail::g_enabled.store(on, std::memory_order_relaxed); }

double now_us() {
  return std::chrono::duration<double, std::micro>(Clock::now() - registry().origin).count();
}

uint32_t name_id(std::string_view name) {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  auto [it, added] = r.ids.emplace(std::string(name), uint32_t(r.names.size()));
  if (added) r.names.emplace_back(name);
  return it->second;
}

std::string name_of(uint32_t id) {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  return id < r.names.size() ? r.names[id] : std::string("?");
}

void set_thread_rank(int rank) { state().data.rank = rank; }

void begin_step(Device device) {
  ThreadState& s = state();
  s.data.device = device.str();
  s.step = s.next_step++;
  s.data.steps.push_back({s.step, now_us(), 0});
}

void end_step(Device device) {
  ThreadState& s = state();
  if (s.step < 0) return;
  if (!device.is_cpu()) {
    synchronize(device);
    if (FlushLaunches f = registry().flush) f();
  }
  s.data.steps.back().end_us = now_us();
  s.step = -1;
}

void cancel_step() {
  ThreadState& s = state();
  if (s.step < 0) return;
  while (!s.data.records.empty() && s.data.records.back().step == s.step)
    s.data.records.pop_back();
  s.data.steps.pop_back();
  s.next_step = s.step;
  s.step = -1;
}

bool records_launches() {
  const ThreadState& s = state();
  return s.step >= 0 && !s.host_scope;
}

void add(Family family, uint32_t name, int stream, double start_us, double end_us) {
  ThreadState& s = state();
  if (s.step < 0) return;
  s.data.records.push_back({family, int16_t(stream), name, s.step, start_us, end_us});
}

int stream_index(const void* stream) {
  ThreadState& s = state();
  auto [it, added] = s.stream_ids.emplace(stream, int(s.data.streams.size()));
  if (added) s.data.streams.push_back("stream " + std::to_string(it->second));
  return it->second;
}

std::vector<Thread> collected() {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  std::map<int, Thread> by_rank;
  for (auto& t : r.threads)
    if (!t->data.steps.empty()) by_rank.emplace(t->data.rank, t->data);
  std::vector<Thread> out;
  for (auto& [rank, t] : by_rank) out.push_back(std::move(t));
  return out;
}

void clear() {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  for (auto& t : r.threads) {
    t->data.steps.clear();
    t->data.records.clear();
    t->next_step = 0;
  }
}

Family current_family() { return state().family; }

void Scope::open(Family family, const char* name, bool host) {
  ThreadState& s = state();
  active_ = true;
  if (s.depth++ > 0) return;  // inside another op: that op's time
  outer_ = true;
  host_ = host;
  family_ = family;
  name_ = name;
  s.family = family;
  s.host_scope = host;
  if (host) start_us_ = now_us();
}

void Scope::close() {
  ThreadState& s = state();
  --s.depth;
  if (!outer_) return;
  s.family = Family::Other;
  s.host_scope = false;
  if (!host_) return;
  const double end = now_us();
  auto [it, added] = s.name_ids.emplace(name_, 0);
  if (added) it->second = name_id(name_);
  add(family_, it->second, 0, start_us_, end);
}

void set_launch_flush(FlushLaunches f) {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  r.flush = f;
}

}  // namespace anvil::profile
