// The simulator's streams and events, and every runtime call that queues work
// or waits for it (see the top of sim/cuda_sim.h for what each one runs).
//
// A stream is a FIFO of work items numbered from 1. An event names the item
// that recorded it last (stream, number); a wait on an event is an item that,
// when it runs, first runs the recording stream up to that number. Every wait
// names an item queued before the wait itself (cudaStreamWaitEvent uses the
// record made before the call), so running a wait never needs work that is
// queued after it, and nothing can wait in a cycle.
//
// Work runs on the thread of the call that needs it, one such thread at a
// time (`running`); queueing only takes the short `mutex`, so another host
// thread can queue while work runs. Lock order: running, then mutex.
//
// A communication item (the simulated NCCL, sim/nccl_sim.cpp) completes only
// together with its peers' items on other streams, which may not be queued
// yet: the stream then stalls at it, and so does every wait that needs it. A
// query answers "not ready"; a blocking call lets go of `running` and sleeps
// until something new is queued (another rank's thread queueing its part),
// then tries again. Waits may now form a cycle through communication items
// (a deadlock on a GPU too): running into a stream that is mid-item is
// reported as an error of the work, not a hang.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "sim/streams_internal.h"

namespace anvil::sim::detail {

// Leaked on purpose, like the memory registry: queued work may be synchronised
// for by a static destructor.
Registry& reg() {
  static auto* r = new Registry();
  return *r;
}

std::vector<StreamPtr>& device_streams(int device) {
  auto& list = reg().by_device[device];
  if (list.empty()) {
    auto legacy = std::make_shared<CUstream_st>();
    legacy->device = device;
    legacy->legacy = true;
    list.push_back(std::move(legacy));
  }
  return list;
}

StreamPtr resolve(cudaStream_t handle) {
  if (handle == nullptr) return device_streams(anvil::sim::detail::current_device()).front();
  auto it = reg().streams.find(handle);
  return it == reg().streams.end() ? nullptr : it->second;
}

}  // namespace anvil::sim::detail

namespace {

using namespace anvil::sim::detail;

// Defined below.
bool eager();
void run_eagerly(const StreamPtr& s, uint64_t seq);
uint64_t push(CUstream_st& s, Work w);
cudaError_t unknown_stream(const char* api);

}  // namespace

namespace anvil::sim::detail {

Queued enqueue(cudaStream_t handle, Work w, const char* api) {
  StreamPtr s;
  uint64_t seq = 0;
  {
    std::lock_guard lock(reg().mutex);
    s = resolve(handle);
    if (!s) return {nullptr, 0, unknown_stream(api)};
    bool captured = false;
    if (cudaError_t e = capture_work(*s, w, api, captured); e != cudaSuccess) return {s, 0, e};
    if (captured) return {s, 0, cudaSuccess};
    seq = push(*s, std::move(w));
  }
  if (eager()) run_eagerly(s, seq);
  return {s, seq, cudaSuccess};
}

}  // namespace anvil::sim::detail

namespace {

std::atomic<anvil::sim::StreamMode>& mode_setting() {
  static std::atomic<anvil::sim::StreamMode> mode = [] {
    const char* env = std::getenv("ANVIL_SIM_STREAMS");
    return env && std::string(env) == "eager" ? anvil::sim::StreamMode::kEager
                                              : anvil::sim::StreamMode::kDeferred;
  }();
  return mode;
}
bool eager() { return mode_setting().load() == anvil::sim::StreamMode::kEager; }

// Simulated NCCL communicators with ranks in other processes (remote_comm_opened).
std::atomic<int> remote_comms{0};

// Blocking calls that found device work still to run (anvil::sim::host_waits),
// and all blocking calls (anvil::sim::host_syncs).
std::atomic<uint64_t> host_wait_count{0};
std::atomic<uint64_t> host_sync_count{0};

// The first failure among the work one call runs.
struct Outcome {
  std::string error;
  void note(std::string what) {
    if (error.empty()) error = std::move(what);
  }
  cudaError_t result() const {
    return error.empty() ? cudaSuccess : fail(cudaErrorLaunchFailure, error);
  }
};

// ---- queueing (caller holds reg().mutex) ----

bool pending(const CUstream_st& s) { return s.queued > s.completed; }

uint64_t push_item(CUstream_st& s, Work w) {
  w.seq = ++s.queued;
  s.queue.push_back(std::move(w));
  ++reg().generation;
  reg().changed.notify_all();
  return s.queued;
}

Work wait_item(const StreamPtr& other) {
  Work w;
  w.kind = WorkKind::kWait;
  w.other = other;
  w.until = other->queued;
  return w;
}

// Queues w on s behind the legacy default stream's implicit waits: work on
// the legacy stream waits for the work queued so far on the device's blocking
// streams, and work on a blocking stream for the legacy stream's.
uint64_t push(CUstream_st& s, Work w) {
  auto& list = device_streams(s.device);
  if (s.legacy) {
    for (auto& other : list)
      if (!other->legacy && other->blocking && pending(*other)) push_item(s, wait_item(other));
  } else if (s.blocking && !s.capture && pending(*list.front())) {
    push_item(s, wait_item(list.front()));
  }
  return push_item(s, std::move(w));
}

// Forgets destroyed streams whose work has all run.
void prune(int device) {
  auto& list = reg().by_device[device];
  std::erase_if(list, [](const StreamPtr& s) { return s->destroyed && !pending(*s); });
}

// ---- running (caller holds reg().running) ----

// The limit on how long a blocking call waits for a stalled stream to move
// (ANVIL_SIM_STALL_TIMEOUT seconds, default 300): on a GPU it would hang.
Clock::duration stall_limit() {
  static const Clock::duration limit = [] {
    const char* env = std::getenv("ANVIL_SIM_STALL_TIMEOUT");
    const double seconds = env && *env ? std::atof(env) : 300.0;
    return std::chrono::duration_cast<Clock::duration>(
        std::chrono::duration<double>(seconds > 0 ? seconds : 300.0));
  }();
  return limit;
}

bool run_until(CUstream_st& s, uint64_t until, Outcome& out);

// The Outcome of the synchronisation running on this thread, for work that
// communication items run on their peers' streams (run_before).
thread_local Outcome* t_outcome = nullptr;
struct OutcomeScope {
  explicit OutcomeScope(Outcome& out) { t_outcome = &out; }
  ~OutcomeScope() { t_outcome = nullptr; }
};

// A graph's node, or an item of the same kind.
void run_node(WorkKind kind, const KernelLaunch* kernel, void* dst, const void* src, size_t bytes,
              int value) {
  switch (kind) {
    case WorkKind::kKernel: run_kernel(*kernel); break;
    case WorkKind::kCopy: std::memmove(dst, src, bytes); break;
    case WorkKind::kMemset: std::memset(dst, value, bytes); break;
    default: throw std::logic_error("sim streams: a graph node that is not a kernel, copy or memset");
  }
}

void execute(CUstream_st& s, Work& w, Outcome& out) {
  try {
    switch (w.kind) {
      case WorkKind::kKernel:
      case WorkKind::kCopy:
      case WorkKind::kMemset:
        run_node(w.kind, w.kernel.get(), w.dst, w.src ? w.src : w.staged.data(), w.bytes, w.value);
        break;
      case WorkKind::kGraph: {
        size_t kernels = 0;
        for (const GraphNode& n : *w.graph) kernels += n.kind == WorkKind::kKernel;
        GraphLaunchScope scope(kernels);
        for (const GraphNode& n : *w.graph)
          run_node(n.kind, n.kernel.get(), n.dst, n.src, n.bytes, n.value);
        break;
      }
      case WorkKind::kRecord: {
        std::lock_guard lock(reg().mutex);
        // An event re-recorded since keeps the time of its latest record only.
        if (w.event->stream.get() == &s && w.event->seq == w.seq) w.event->time = Clock::now();
        break;
      }
      case WorkKind::kWait:
      case WorkKind::kComm: break;  // run in place by run_until
    }
  } catch (const std::exception& e) {
    out.note(e.what());
  }
}

// Runs s up to item `until`. Returns false when s stalls first: a
// communication item, or a wait for a stream that stalls, stays at the head.
bool run_until(CUstream_st& s, uint64_t until, Outcome& out) {
  for (;;) {
    Work* head = nullptr;  // a wait or communication item, left in the queue while it runs
    Work w;
    {
      std::lock_guard lock(reg().mutex);
      if (s.completed >= until || s.queue.empty()) return true;
      // Without communication every wait names work queued before it, which
      // has run; with it, two ranks' items can wait for each other.
      if (s.running)
        throw std::runtime_error(
            "sim streams: work waits for itself (a simulated NCCL operation waits for work "
            "that waits for it: on a GPU this is a deadlock)");
      s.running = true;
      if (s.queue.front().kind == WorkKind::kWait || s.queue.front().kind == WorkKind::kComm) {
        head = &s.queue.front();  // deque: pushes at the back keep this reference valid
      } else {
        w = std::move(s.queue.front());
        s.queue.pop_front();
      }
    }
    bool done = true;
    if (head == nullptr) {
      execute(s, w, out);
    } else {
      try {
        done = head->kind == WorkKind::kWait ? run_until(*head->other, head->until, out)
                                             : head->comm->progress();
      } catch (const std::exception& e) {
        out.note(e.what());  // the item fails and leaves the queue
      }
    }
    std::lock_guard lock(reg().mutex);
    s.running = false;
    if (!done) return false;
    if (head != nullptr) {
      // A communication item that ran may have finished its peers' items too
      // (sim/nccl_sim.cpp): a host waiting for one of them must look again.
      const bool comm = head->kind == WorkKind::kComm;
      s.completed = head->seq;
      s.queue.pop_front();
      if (comm) {
        ++reg().generation;
        reg().changed.notify_all();
      }
    } else {
      s.completed = w.seq;
    }
  }
}

using Targets = std::vector<std::pair<StreamPtr, uint64_t>>;  // run each up to its item

// Whether the calling runtime function blocks the host on a GPU (a query
// does not: in the simulator it runs the work it asks about, a GPU would not wait).
enum class HostBlocks { kNo, kYes };
// What a call does when a target stalls at a communication item: wait for
// the peers (blocking calls), answer cudaErrorNotReady (queries), or leave
// it (cudaFree's drain of every device).
enum class OnStall { kWait, kNotReady, kLeave };

// Runs the targets (the call's synchronisation) and returns the first failure
// among the work it ran and the targets' failures from eager runs. A blocking
// call that finds work still queued is counted: on a GPU the host would wait
// for that work and the device would then sit idle until the host issued more.
cudaError_t synchronise(const Targets& targets, HostBlocks blocks = HostBlocks::kNo,
                        OnStall on_stall = OnStall::kWait) {
  Outcome out;
  const Clock::time_point deadline = Clock::now() + stall_limit();
  if (blocks == HostBlocks::kYes) host_sync_count.fetch_add(1, std::memory_order_relaxed);
  bool counted = blocks == HostBlocks::kNo;
  for (;;) {
    bool stalled = false;
    uint64_t generation = 0;
    {
      std::lock_guard running(reg().running);
      if (!counted) {
        counted = true;
        std::lock_guard lock(reg().mutex);
        if (std::any_of(targets.begin(), targets.end(),
                        [](const auto& t) { return t.second > t.first->completed; }))
          host_wait_count.fetch_add(1, std::memory_order_relaxed);
      }
      {
        OutcomeScope scope(out);
        for (const auto& [s, until] : targets)
          if (!run_until(*s, until, out)) stalled = true;
      }
      std::lock_guard lock(reg().mutex);
      generation = reg().generation;
      for (const auto& [s, until] : targets) {
        if (!s->eager_error.empty()) out.note(std::exchange(s->eager_error, {}));
        if (s->destroyed) prune(s->device);
      }
    }
    if (!stalled || on_stall == OnStall::kLeave || !out.error.empty()) return out.result();
    if (on_stall == OnStall::kNotReady) return cudaErrorNotReady;
    std::unique_lock lock(reg().mutex);
    const Clock::time_point until =
        remote_comms.load() > 0 ? std::min(deadline, Clock::now() + std::chrono::milliseconds(1))
                                : deadline;
    if (!reg().changed.wait_until(lock, until, [&] { return reg().generation != generation; }) &&
        Clock::now() >= deadline) {
      return fail(cudaErrorLaunchFailure,
                  "a stream stalled for " +
                      std::to_string(std::chrono::duration_cast<std::chrono::seconds>(
                                         stall_limit()).count()) +
                      " s (ANVIL_SIM_STALL_TIMEOUT) at a simulated NCCL operation that no peer "
                      "matched: on a GPU this call would hang");
    }
  }
}

// Eager mode: runs s up to the item just queued; a failure waits for the
// next synchronisation of s.
void run_eagerly(const StreamPtr& s, uint64_t seq) {
  Outcome out;
  std::lock_guard running(reg().running);
  {
    OutcomeScope scope(out);
    run_until(*s, seq, out);  // a stall leaves the rest for a later synchronisation
  }
  std::lock_guard lock(reg().mutex);
  if (!out.error.empty() && s->eager_error.empty()) s->eager_error = out.error;
}

// Everything queued on a device's streams: all of them, or (`legacy_only`)
// the legacy stream and the blocking streams. Caller holds reg().mutex.
void add_device(Targets& targets, int device, bool legacy_only) {
  for (const auto& s : device_streams(device))
    if (!legacy_only || s->legacy || s->blocking) targets.emplace_back(s, s->queued);
}

// A synchronous call on the legacy stream: waits for the legacy and blocking
// streams of the current device and of the devices the pointers belong to.
cudaError_t synchronise_legacy(std::initializer_list<const void*> pointers) {
  std::vector<int> devices{anvil::sim::detail::current_device()};
  for (const void* p : pointers) {
    const int d = p ? anvil::sim::detail::device_of(p) : -1;
    if (d >= 0 && std::find(devices.begin(), devices.end(), d) == devices.end())
      devices.push_back(d);
  }
  Targets targets;
  {
    std::lock_guard lock(reg().mutex);
    for (int d : devices) add_device(targets, d, true);
  }
  return synchronise(targets, HostBlocks::kYes);
}

cudaError_t unknown_stream(const char* api) {
  return fail(cudaErrorInvalidResourceHandle, std::string(api) + ": unknown stream");
}

std::shared_ptr<CUevent_st> find_event(cudaEvent_t e) {  // caller holds reg().mutex
  auto it = reg().events.find(e);
  return it == reg().events.end() ? nullptr : it->second;
}

cudaError_t unknown_event(const char* api) {
  return fail(cudaErrorInvalidResourceHandle, std::string(api) + ": unknown event");
}

// A synchronous call on the current device's legacy stream, while a
// blocking stream of the device captures: an error (capture.cpp).
cudaError_t legacy_capture_rule(const char* api) {
  std::lock_guard lock(reg().mutex);
  return capture_legacy(api, current_device());
}

}  // namespace

// ---- kernel launches and the implicit synchronisations ----

namespace anvil::sim {

void launch_kernel(dim3 grid, dim3 block, size_t shared_bytes, cudaStream_t stream,
                   std::source_location where, std::unique_ptr<KernelCall> call) {
  detail::check_launch_config(grid, block, shared_bytes, call ? call->kernel_address() : nullptr,
                              where);
  Work w;
  w.kind = WorkKind::kKernel;
  w.kernel = std::make_shared<const detail::KernelLaunch>(
      detail::KernelLaunch{grid, block, shared_bytes, where, std::move(call)});
  if (detail::enqueue(stream, std::move(w), "kernel launch").error != cudaSuccess)
    throw std::runtime_error(detail::launch_site(where) + ": " + last_error_detail());
}

cudaError_t detail::drain_all_devices() {
  Targets targets;
  {
    std::lock_guard lock(reg().mutex);
    for (auto& [device, list] : reg().by_device) add_device(targets, device, false);
  }
  return synchronise(targets, HostBlocks::kNo, OnStall::kLeave);
}

bool detail::enqueue_comm(cudaStream_t stream, std::shared_ptr<CommWork> work) {
  StreamPtr s;
  uint64_t seq = 0;
  {
    std::lock_guard lock(reg().mutex);
    s = resolve(stream);
    if (!s) return false;
    Work w;
    w.kind = WorkKind::kComm;
    w.comm = work;
    bool captured = false;  // never: a capture refuses it (capture.cpp)
    if (capture_work(*s, w, "a simulated NCCL operation", captured) != cudaSuccess) return false;
    seq = push(*s, std::move(w));
    work->queued(s, seq);
  }
  if (eager()) run_eagerly(s, seq);
  return true;
}

bool detail::run_before(const StreamRef& stream, uint64_t seq) {
  Outcome local;
  return run_until(*stream, seq - 1, t_outcome ? *t_outcome : local);
}

int detail::stream_device(cudaStream_t stream) {
  std::lock_guard lock(reg().mutex);
  StreamPtr s = resolve(stream);
  return s ? s->device : -1;
}

void detail::wake_streams() {
  std::lock_guard lock(reg().mutex);
  ++reg().generation;
  reg().changed.notify_all();
}

void detail::remote_comm_opened() { remote_comms.fetch_add(1); }
void detail::remote_comm_closed() { remote_comms.fetch_sub(1); }

void set_stream_mode(StreamMode mode) { mode_setting().store(mode); }
StreamMode stream_mode() { return mode_setting().load(); }

uint64_t host_waits() { return host_wait_count.load(std::memory_order_relaxed); }
uint64_t host_syncs() { return host_sync_count.load(std::memory_order_relaxed); }

}  // namespace anvil::sim

namespace anvil_sim_rt {

// ---- copies and memsets ----

cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  if (bytes == 0) return cudaSuccess;
  if (cudaError_t e = anvil::sim::detail::check_copy("cudaMemcpy", dst, src, bytes, kind);
      e != cudaSuccess)
    return e;
  if (cudaError_t e = legacy_capture_rule("cudaMemcpy"); e != cudaSuccess) return e;
  if (cudaError_t e = synchronise_legacy({dst, src}); e != cudaSuccess) return e;
  std::memmove(dst, src, bytes);
  return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t stream) {
  using namespace anvil::sim::detail;
  if (bytes == 0) return cudaSuccess;
  if (cudaError_t e = check_copy("cudaMemcpyAsync", dst, src, bytes, kind); e != cudaSuccess)
    return e;
  const bool src_host = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyHostToHost;
  const bool dst_host = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyHostToHost;
  Work w;
  w.kind = WorkKind::kCopy;
  w.dst = dst;
  w.bytes = bytes;
  // CUDA stages a pageable source before returning: the caller may reuse it.
  if (src_host && !is_pinned(src, bytes)) {
    const auto* p = static_cast<const unsigned char*>(src);
    w.staged.assign(p, p + bytes);
  } else {
    w.src = src;
  }
  // And a pageable destination holds the bytes when the call returns.
  const bool wait_here = dst_host && !is_pinned(dst, bytes);
  if (!w.staged.empty() || wait_here) {  // a capturing stream cannot hold either
    std::lock_guard lock(reg().mutex);
    StreamPtr s = resolve(stream);
    if (!s) return unknown_stream("cudaMemcpyAsync");
    if (cudaError_t e = capture_pageable_copy(*s, "cudaMemcpyAsync"); e != cudaSuccess) return e;
  }
  const Queued q = enqueue(stream, std::move(w), "cudaMemcpyAsync");
  if (q.error != cudaSuccess) return q.error;
  return wait_here && q.seq ? synchronise(Targets{{q.stream, q.seq}}, HostBlocks::kYes)
                            : cudaSuccess;
}

cudaError_t cudaMemset(void* ptr, int value, size_t bytes) {
  if (bytes == 0) return cudaSuccess;
  if (cudaError_t e = anvil::sim::detail::check_memset("cudaMemset", ptr, bytes); e != cudaSuccess)
    return e;
  if (cudaError_t e = legacy_capture_rule("cudaMemset"); e != cudaSuccess) return e;
  if (cudaError_t e = synchronise_legacy({ptr}); e != cudaSuccess) return e;
  std::memset(ptr, value, bytes);
  return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void* ptr, int value, size_t bytes, cudaStream_t stream) {
  if (bytes == 0) return cudaSuccess;
  if (cudaError_t e = anvil::sim::detail::check_memset("cudaMemsetAsync", ptr, bytes);
      e != cudaSuccess)
    return e;
  Work w;
  w.kind = WorkKind::kMemset;
  w.dst = ptr;
  w.bytes = bytes;
  w.value = value;
  return enqueue(stream, std::move(w), "cudaMemsetAsync").error;
}

cudaError_t cudaDeviceSynchronize() {
  Targets targets;
  {
    std::lock_guard lock(reg().mutex);
    const int device = anvil::sim::detail::current_device();
    if (cudaError_t e = capture_sync("cudaDeviceSynchronize", nullptr, nullptr, device);
        e != cudaSuccess)
      return e;
    add_device(targets, device, false);
  }
  return synchronise(targets, HostBlocks::kYes);
}

// ---- streams ----

cudaError_t cudaStreamCreate(cudaStream_t* stream) {
  return cudaStreamCreateWithFlags(stream, cudaStreamDefault);
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int flags) {
  if (stream == nullptr) return fail(cudaErrorInvalidValue, "cudaStreamCreate: null pointer");
  if ((flags & ~cudaStreamNonBlocking) != 0)
    return fail(cudaErrorInvalidValue,
                "cudaStreamCreateWithFlags: unknown flags " + std::to_string(flags));
  auto s = std::make_shared<CUstream_st>();
  s->device = anvil::sim::detail::current_device();
  s->blocking = (flags & cudaStreamNonBlocking) == 0;
  std::lock_guard lock(reg().mutex);
  device_streams(s->device).push_back(s);
  reg().streams[s.get()] = s;
  *stream = s.get();
  return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  std::lock_guard lock(reg().mutex);
  auto it = reg().streams.find(stream);
  if (it == reg().streams.end()) return unknown_stream("cudaStreamDestroy");
  it->second->destroyed = true;
  const int device = it->second->device;
  reg().streams.erase(it);
  prune(device);
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  Targets targets;
  {
    std::lock_guard lock(reg().mutex);
    StreamPtr s = resolve(stream);
    if (!s) return unknown_stream("cudaStreamSynchronize");
    if (cudaError_t e = capture_sync("cudaStreamSynchronize", s.get(), nullptr, -1);
        e != cudaSuccess)
      return e;
    if (s->legacy)
      add_device(targets, s->device, true);  // the legacy stream waits for the blocking ones
    else
      targets.emplace_back(s, s->queued);
  }
  return synchronise(targets, HostBlocks::kYes);
}

cudaError_t cudaStreamQuery(cudaStream_t stream) {
  Targets targets;
  {
    std::lock_guard lock(reg().mutex);
    StreamPtr s = resolve(stream);
    if (!s) return unknown_stream("cudaStreamQuery");
    if (cudaError_t e = capture_sync("cudaStreamQuery", s.get(), nullptr, -1); e != cudaSuccess)
      return e;
    if (s->legacy)
      add_device(targets, s->device, true);
    else
      targets.emplace_back(s, s->queued);
    uint64_t queued = 0;  // a fingerprint of the work the answer is about
    bool busy = false;
    for (const auto& [t, until] : targets) {
      queued += t->queued;
      busy = busy || pending(*t);
    }
    // Not ready once for the same work, then run it: a polling loop ends
    // (unless the work waits for a peer that has not queued its part).
    if (busy && s->not_ready_told != queued) {
      s->not_ready_told = queued;
      return cudaErrorNotReady;
    }
  }
  return synchronise(targets, HostBlocks::kNo, OnStall::kNotReady);
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags) {
  if (flags != 0)
    return fail(cudaErrorInvalidValue, "cudaStreamWaitEvent: flags must be 0");
  StreamPtr s;
  uint64_t seq = 0;
  {
    std::lock_guard lock(reg().mutex);
    auto e = find_event(event);
    if (!e) return unknown_event("cudaStreamWaitEvent");
    s = resolve(stream);
    if (!s) return unknown_stream("cudaStreamWaitEvent");
    bool captured = false;
    if (cudaError_t err = capture_wait(*s, *e, captured); err != cudaSuccess) return err;
    if (captured) return cudaSuccess;
    // Never recorded, already reached, or on the same stream: nothing to wait for.
    if (!e->stream || e->stream == s || e->stream->completed >= e->seq) return cudaSuccess;
    Work w;
    w.kind = WorkKind::kWait;
    w.other = e->stream;
    w.until = e->seq;
    seq = push(*s, std::move(w));
  }
  if (eager()) run_eagerly(s, seq);
  return cudaSuccess;
}

// ---- events ----

cudaError_t cudaEventCreate(cudaEvent_t* event) {
  return cudaEventCreateWithFlags(event, cudaEventDefault);
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags) {
  if (event == nullptr) return fail(cudaErrorInvalidValue, "cudaEventCreate: null pointer");
  if ((flags & ~cudaEventDisableTiming) != 0)
    return fail(cudaErrorInvalidValue,
                "cudaEventCreateWithFlags: unknown flags " + std::to_string(flags));
  auto e = std::make_shared<CUevent_st>();
  e->timing = (flags & cudaEventDisableTiming) == 0;
  std::lock_guard lock(reg().mutex);
  reg().events[e.get()] = e;
  *event = e.get();
  return cudaSuccess;
}

// A record still queued keeps the event's state alive; a wait needs only the
// stream and item it names.
cudaError_t cudaEventDestroy(cudaEvent_t event) {
  std::lock_guard lock(reg().mutex);
  if (reg().events.erase(event) == 0) return unknown_event("cudaEventDestroy");
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  StreamPtr s;
  uint64_t seq = 0;
  {
    std::lock_guard lock(reg().mutex);
    auto e = find_event(event);
    if (!e) return unknown_event("cudaEventRecord");
    s = resolve(stream);
    if (!s) return unknown_stream("cudaEventRecord");
    bool captured = false;
    if (cudaError_t err = capture_record(*e, *s, captured); err != cudaSuccess) return err;
    if (captured) return cudaSuccess;
    Work w;
    w.kind = WorkKind::kRecord;
    w.event = e;
    seq = push(*s, std::move(w));
    e->stream = s;
    e->seq = seq;
    e->not_ready_told = false;
    // A record with nothing before it is reached at once, as on an idle GPU:
    // it is a point in the stream, not work.
    if (s->queue.size() == 1 && !s->running) {
      s->queue.pop_front();
      s->completed = seq;
      e->time = Clock::now();
      return cudaSuccess;
    }
  }
  if (eager()) run_eagerly(s, seq);
  return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  Targets targets;
  {
    std::lock_guard lock(reg().mutex);
    auto e = find_event(event);
    if (!e) return unknown_event("cudaEventSynchronize");
    if (cudaError_t err = capture_sync("cudaEventSynchronize", nullptr, e.get(), -1);
        err != cudaSuccess)
      return err;
    if (!e->stream) return cudaSuccess;  // never recorded: nothing to wait for
    targets.emplace_back(e->stream, e->seq);
  }
  return synchronise(targets, HostBlocks::kYes);
}

cudaError_t cudaEventQuery(cudaEvent_t event) {
  Targets targets;
  {
    std::lock_guard lock(reg().mutex);
    auto e = find_event(event);
    if (!e) return unknown_event("cudaEventQuery");
    if (cudaError_t err = capture_sync("cudaEventQuery", nullptr, e.get(), -1); err != cudaSuccess)
      return err;
    if (!e->stream) return cudaSuccess;
    // Not ready once for the same record, then run up to it: a polling loop ends.
    if (e->stream->completed < e->seq && !e->not_ready_told) {
      e->not_ready_told = true;
      return cudaErrorNotReady;
    }
    targets.emplace_back(e->stream, e->seq);
  }
  return synchronise(targets, HostBlocks::kNo, OnStall::kNotReady);
}

cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  if (ms == nullptr) return fail(cudaErrorInvalidValue, "cudaEventElapsedTime: null pointer");
  std::lock_guard lock(reg().mutex);
  auto a = find_event(start), b = find_event(end);
  if (!a || !b) return unknown_event("cudaEventElapsedTime");
  if (!a->timing || !b->timing)
    return fail(cudaErrorInvalidResourceHandle,
                "cudaEventElapsedTime: an event was created with cudaEventDisableTiming");
  if (!a->stream || !b->stream)
    return fail(cudaErrorInvalidResourceHandle,
                "cudaEventElapsedTime: an event has not been recorded");
  if (a->stream->completed < a->seq || b->stream->completed < b->seq)
    return cudaErrorNotReady;  // as cudaEventQuery: not an error to remember
  *ms = std::chrono::duration<float, std::milli>(b->time - a->time).count();
  return cudaSuccess;
}

}  // namespace anvil_sim_rt
