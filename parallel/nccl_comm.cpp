// The NCCL backend: CUDA tensors, one rank per GPU. The same source runs on
// real GPUs (<nccl.h>) and, in the simulator build, between simulated GPUs
// (sim/nccl_sim.h): see parallel/nccl_api.h.
//
// Two streams per communicator, both non-blocking (so that the legacy
// default stream never waits for a stalled collective): the wire, where the
// grouped ncclSend/ncclRecv of every post and NCCL's own collectives
// (Algorithm::kNative: ncclAllReduce, ncclBroadcast, ncclAllGather,
// ncclReduceScatter) run, and the lane, where the reduction kernels
// (cuda::accumulate) and local copies run.
// Events order them as transport.h describes: the wire waits for the lane's
// latest work before each post that follows lane work; the lane waits for a
// post's event before reducing what it received. begin() puts both behind the
// device's compute stream, end() puts the compute stream behind both. The
// host never waits, except in synchronize().
//
// The communicator is non-blocking (ncclConfig_t::blocking = 0): NCCL calls
// return at once, perhaps with ncclInProgress, and every wait is a polling
// loop over ncclCommGetAsyncError and cudaEventQuery with the deadline. When
// it passes, the communicator is aborted (ncclCommAbort) so that no kernel
// is left waiting for a peer that will never come.
//
// A host that waits elsewhere (an event, a copy, `item()`) behind a
// collective that never completes is woken by the communicator's watchdog
// (parallel/watchdog.h): every collective is armed with its deadline when it
// is issued (end(), end_later()) and disarmed once its events have been
// reached. The watchdog aborts the communicator when a deadline passes, NCCL
// reports an asynchronous error, or another rank of the process has failed;
// the failure names this rank and the collective, and every later call
// throws it. `mutex_` keeps the watchdog's abort away from the NCCL calls of
// the communicator's own thread.
#include <fmt/format.h>

#include <cstdio>
#include <cstring>
#include <deque>
#include <mutex>
#include <vector>

#include "core/device.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_kernels.h"
#include "parallel/mpi_internal.h"
#include "parallel/nccl_api.h"
#include "parallel/watchdog.h"

namespace anvil::parallel {
namespace {

class NcclTransport final : public Transport {
 public:
  // A rank of a new clique (ncclCommInitRankConfig).
  NcclTransport(int rank, int size, Device device, std::shared_ptr<HostChannel> channel,
                const ncclUniqueId& id, std::chrono::milliseconds timeout)
      : Transport(rank, size, device), channel_(std::move(channel)) {
    create(timeout, [&] {
      // Every rank arrives here first, so that a missing one is named.
      CallInfo hello;
      hello.collective = Collective::kBarrier;
      channel_->exchange(hello, timeout, error_prefix());
      ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
      config.blocking = 0;
      nccl(ncclCommInitRankConfig(&comm_, size, id, rank, &config), "ncclCommInitRankConfig");
    });
  }

  // A group: the communicator ncclCommSplit made, perhaps still being
  // created (non-blocking): polled here until it is ready.
  NcclTransport(const Place& place, Device device, std::shared_ptr<HostChannel> channel,
                ncclComm_t comm, std::chrono::milliseconds timeout)
      : Transport(place, device), channel_(std::move(channel)), comm_(comm) {
    create(timeout, [&] { nccl(ncclInProgress, "ncclCommSplit"); });
  }

  std::unique_ptr<Transport> split(int color, int key, const Place& place) override {
#if defined(ANVIL_CUDA_SIM) || NCCL_VERSION_CODE >= 21800
    activate();
    std::shared_ptr<HostChannel> channel =
        channel_->split(color, key, place.rank, place.size, timeout(), error_prefix());
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclComm_t child = nullptr;
    ncclResult_t r = ncclSuccess;
    {
      std::lock_guard lock(mutex_);
      check_live();
      r = ncclCommSplit(comm_, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &child, &config);
    }
    nccl(r, "ncclCommSplit");  // in progress: the parent is polled until NCCL is done with it
    if (color < 0) return nullptr;
    if (child == nullptr)
      throw CommError(error_prefix() + "ncclCommSplit gave this rank no communicator");
    return std::make_unique<NcclTransport>(place, device(), std::move(channel), child, timeout());
#else
    (void)color, (void)key, (void)place;
    throw CommError(fmt::format("{}this NCCL ({}) has no ncclCommSplit: groups need NCCL 2.18 "
                                "or later",
                                error_prefix(), NCCL_VERSION_CODE));
#endif
  }

 private:
  // The constructors' shared part: `join` makes comm_ (and waits for it),
  // then the streams, events and watchdog; a failure lets go of all of it.
  template <typename Join>
  void create(std::chrono::milliseconds timeout, Join&& join) {
    set_timeout(timeout);
    set_context("creating the communicator");
    try {
      activate();
      join();
      cuda::check(cudaStreamCreateWithFlags(&wire_, cudaStreamNonBlocking), "cudaStreamCreate");
      cuda::check(cudaStreamCreateWithFlags(&lane_, cudaStreamNonBlocking), "cudaStreamCreate");
      for (cudaEvent_t* e : {&start_, &wire_done_, &lane_done_})
        cuda::check(cudaEventCreateWithFlags(e, cudaEventDisableTiming), "cudaEventCreate");
      for (auto& t : tickets_)
        cuda::check(cudaEventCreateWithFlags(&t.event, cudaEventDisableTiming),
                    "cudaEventCreate");
      watchdog_ = std::make_unique<Watchdog>(
          [this](const std::string& why) { watchdog_abort(why); },
          [this](Watchdog& dog) { return poll(dog); },
          std::clamp(timeout / 10, std::chrono::milliseconds(1), std::chrono::milliseconds(100)));
    } catch (const std::exception& e) {
      channel_->report_failure(world_rank(rank()), e.what());
      abort();
      release();
      throw;
    }
  }

 public:
  ~NcclTransport() override {
    quiesce();  // before what the watchdog polls goes; this thread is now the only one
    if (comm_ != nullptr) {
      try {
        activate();
        // Flush and let go; if the peers do not finish in time, abort instead.
        cuda::check(cudaEventRecord(wire_done_, wire_), "cudaEventRecord");
        cuda::check(cudaEventRecord(lane_done_, lane_), "cudaEventRecord");
        const bool idle =
            poll_until(timeout(), [&] { return reached(wire_done_) && reached(lane_done_); });
        ncclResult_t r = idle ? ncclCommFinalize(comm_) : ncclInternalError;
        if (r == ncclInProgress) r = wait_ready() ? ncclSuccess : ncclInternalError;
        if (r == ncclSuccess) {
          ncclCommDestroy(comm_);
          comm_ = nullptr;
        }
      } catch (...) {
      }
      abort_locked();
    }
    release();
  }

  std::string_view name() const override { return "nccl"; }
  HostChannel& channel() override { return *channel_; }

  void begin() override {
    activate();
    cuda::check(cudaEventRecord(start_, cuda::compute_stream(device().index)), "cudaEventRecord");
    cuda::check(cudaStreamWaitEvent(wire_, start_, 0), "cudaStreamWaitEvent");
    cuda::check(cudaStreamWaitEvent(lane_, start_, 0), "cudaStreamWaitEvent");
  }

  void end() override {
    activate();
    const cudaStream_t compute = cuda::compute_stream(device().index);
    cuda::check(cudaEventRecord(wire_done_, wire_), "cudaEventRecord");
    cuda::check(cudaEventRecord(lane_done_, lane_), "cudaEventRecord");
    cuda::check(cudaStreamWaitEvent(compute, wire_done_, 0), "cudaStreamWaitEvent");
    cuda::check(cudaStreamWaitEvent(compute, lane_done_, 0), "cudaStreamWaitEvent");
    watch();
    // The compute stream now waits for the lanes, and the lanes of the next
    // collective for the compute stream: a block freed now is safe to reuse.
    held_.clear();
  }

  // Two events of its own mark where the lanes are; wait() puts the compute
  // stream behind them. The scratch stays with it until it is destroyed.
  std::unique_ptr<InFlight> end_later() override {
    activate();
    struct Later final : InFlight {
      int device = 0;
      cudaEvent_t wire = nullptr, lane = nullptr;
      std::vector<Tensor> held;
      void wait() override {
        cuda::check(cudaSetDevice(device), "cudaSetDevice");
        const cudaStream_t compute = cuda::compute_stream(device);
        cuda::check(cudaStreamWaitEvent(compute, wire, 0), "cudaStreamWaitEvent");
        cuda::check(cudaStreamWaitEvent(compute, lane, 0), "cudaStreamWaitEvent");
      }
      ~Later() override {
        if (wire) cudaEventDestroy(wire);
        if (lane) cudaEventDestroy(lane);
      }
    };
    auto later = std::make_unique<Later>();
    later->device = device().index;
    cuda::check(cudaEventCreateWithFlags(&later->wire, cudaEventDisableTiming), "cudaEventCreate");
    cuda::check(cudaEventCreateWithFlags(&later->lane, cudaEventDisableTiming), "cudaEventCreate");
    cuda::check(cudaEventRecord(later->wire, wire_), "cudaEventRecord");
    cuda::check(cudaEventRecord(later->lane, lane_), "cudaEventRecord");
    later->held = std::move(held_);
    held_.clear();
    watch();
    return later;
  }

  uint64_t post_messages(std::span<const Message> messages) override {
    activate();
    wire_after_lane();
    std::unique_lock lock(mutex_);
    check_live();
    ncclResult_t first_error = ncclSuccess;
    nccl(ncclGroupStart(), "ncclGroupStart");
    for (const Message& m : messages) {
      if (m.bytes == 0) continue;
      const ncclResult_t r =
          m.kind == Message::kSend
              ? ncclSend(m.data, m.bytes, ncclUint8, m.peer, comm_, wire_)
              : ncclRecv(m.data, m.bytes, ncclUint8, m.peer, comm_, wire_);
      if (r != ncclSuccess && r != ncclInProgress && first_error == ncclSuccess) first_error = r;
    }
    const ncclResult_t end = ncclGroupEnd();
    lock.unlock();
    nccl(first_error, "ncclSend/ncclRecv");
    nccl(end, "ncclGroupEnd");
    Ticket& t = record_ticket();
    t.peers.clear();
    for (const Message& m : messages)
      if (m.bytes) t.peers.emplace_back(m.peer, m.kind == Message::kSend);
    return posted_;
  }

  void reduce(void* dst, const void* src, int64_t n, DType dtype, float scale,
              uint64_t ticket) override {
    activate();
    lane_after(ticket);
    if (dtype == DType::Int64)
      cuda::accumulate(n, static_cast<int64_t*>(dst), static_cast<const int64_t*>(src), lane_);
    else if (dtype == DType::BFloat16)
      cuda::accumulate(n, static_cast<bfloat16*>(dst), static_cast<const bfloat16*>(src), scale,
                       lane_);
    else
      cuda::accumulate(n, static_cast<float*>(dst), static_cast<const float*>(src), scale, lane_);
    lane_dirty_ = true;
  }

  void copy(void* dst, const void* src, size_t bytes, uint64_t ticket) override {
    activate();
    lane_after(ticket);
    cuda::check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, lane_),
                "cudaMemcpyAsync");
    lane_dirty_ = true;
  }

  void native_allreduce(void* data, int64_t n, DType dtype, ReduceOp op) override {
    native("ncclAllReduce", [&] {
      return ncclAllReduce(data, data, size_t(n), nccl_type(dtype), nccl_op(op), comm_, wire_);
    });
  }

  void native_broadcast(void* data, size_t bytes, int root) override {
    native("ncclBroadcast", [&] {
      return ncclBroadcast(data, data, bytes, ncclUint8, root, comm_, wire_);
    });
  }

  // Equal shards: one ncclAllGather. Others: NCCL's all-gather takes one
  // count, so each rank's shard is an ncclBroadcast from it into its place,
  // all of them in one group (they run as one operation).
  void native_all_gather(const void* shard, void* output,
                         const std::vector<int64_t>& offsets) override {
    auto length = [&](int j) { return size_t(offsets[size_t(j) + 1] - offsets[size_t(j)]); };
    bool equal = true;
    for (int j = 0; j < size(); ++j) equal = equal && length(j) == length(0);
    char* out = static_cast<char*>(output);
    if (equal) {
      native("ncclAllGather", [&] {
        return ncclAllGather(shard, out, length(0), ncclUint8, comm_, wire_);
      });
      return;
    }
    native("ncclBroadcast (grouped, one per rank)", [&] {
      if (const ncclResult_t start = ncclGroupStart(); start != ncclSuccess) return start;
      ncclResult_t first = ncclSuccess;
      for (int j = 0; j < size(); ++j) {
        if (length(j) == 0) continue;
        char* place = out + offsets[size_t(j)];
        const ncclResult_t r = ncclBroadcast(j == rank() ? shard : place, place, length(j),
                                             ncclUint8, j, comm_, wire_);
        if (r != ncclSuccess && r != ncclInProgress && first == ncclSuccess) first = r;
      }
      const ncclResult_t end = ncclGroupEnd();
      return first != ncclSuccess ? first : end;
    });
  }

  void native_reduce_scatter(const void* input, void* output, int64_t count, DType dtype,
                             ReduceOp op) override {
    native("ncclReduceScatter", [&] {
      return ncclReduceScatter(input, output, size_t(count), nccl_type(dtype), nccl_op(op),
                               comm_, wire_);
    });
  }

  void synchronize() override {
    activate();
    {
      std::lock_guard lock(mutex_);
      check_live();
    }
    cuda::check(cudaEventRecord(wire_done_, wire_), "cudaEventRecord");
    cuda::check(cudaEventRecord(lane_done_, lane_), "cudaEventRecord");
    // This wait names the exchange that never completed: the watchdog leaves
    // the deadline to it.
    struct Pause {  // (no watchdog once the communicator is closing)
      Watchdog* dog;
      explicit Pause(Watchdog* d) : dog(d) {
        if (dog) dog->pause();
      }
      ~Pause() {
        if (dog) dog->resume();
      }
    } pause(watchdog_.get());
    std::string failure;
    const bool done = poll_until(timeout(), [&] {
      failure = problem();
      return !failure.empty() || (reached(wire_done_) && reached(lane_done_));
    });
    if (!failure.empty()) throw_error(error_prefix() + failure);
    if (!done)
      throw CommError(fmt::format("{}did not complete within {} (ANVIL_COMM_TIMEOUT){}",
                                  error_prefix(), timeout_text(timeout()), stuck_peers()));
  }

  void abort() noexcept override {
    std::lock_guard lock(mutex_);
    abort_locked();
  }

  void quiesce() noexcept override { watchdog_.reset(); }

 private:
  // A post's event and who it exchanged with, in a ring of recent posts: a
  // reduction names a post at most one or two back (the ring's lookahead).
  struct Ticket {
    cudaEvent_t event = nullptr;
    std::vector<std::pair<int, bool>> peers;  // (rank, we send)
  };
  static constexpr uint64_t kTickets = 8;

  void activate() const { cuda::check(cudaSetDevice(device().index), "cudaSetDevice"); }

  static ncclDataType_t nccl_type(DType dtype) {
    switch (dtype) {
      case DType::Int64: return ncclInt64;
      case DType::BFloat16: return ncclBfloat16;
      default: return ncclFloat32;
    }
  }
  static ncclRedOp_t nccl_op(ReduceOp op) { return op == ReduceOp::kAverage ? ncclAvg : ncclSum; }

  // One of NCCL's collectives on the wire, after the lane's latest work; its
  // ticket names every other rank, which all take part.
  template <typename Call>
  void native(const char* name, Call&& nccl_call) {
    activate();
    wire_after_lane();
    std::unique_lock lock(mutex_);
    check_live();
    const ncclResult_t r = nccl_call();
    lock.unlock();
    nccl(r, name);
    Ticket& t = record_ticket();
    t.peers.clear();
    for (int j = 0; j < size(); ++j)
      if (j != rank()) t.peers.emplace_back(j, false);
  }

  // A call's result: in progress means poll until NCCL is done with it.
  void nccl(ncclResult_t r, const char* call) {
    if (r == ncclInProgress) {
      if (!wait_ready())
        throw CommError(fmt::format("{}{} did not finish within {} (ANVIL_COMM_TIMEOUT){}",
                                    error_prefix(), call, timeout_text(timeout()),
                                    context() == "creating the communicator"
                                        ? ": not every rank reached NCCL's initialisation"
                                        : ""));
      return;
    }
    if (r != ncclSuccess) {
      std::lock_guard lock(mutex_);
      throw_error(error_prefix() + call + " failed: " + text(r));
    }
  }

  // Polls ncclCommGetAsyncError until NCCL is no longer busy; false when the
  // deadline passes. Throws for an error, NCCL's or a peer's.
  bool wait_ready() {
    ncclResult_t state = ncclInProgress;
    std::string failure;
    const bool done = poll_until(timeout(), [&] {
      if (const std::optional<RankFailure> peer = channel_->peer_failure()) {
        failure = peer->text();
        return true;
      }
      std::lock_guard lock(mutex_);
      if (comm_ == nullptr) {
        failure = aborted_text();
        return true;
      }
      const ncclResult_t r = ncclCommGetAsyncError(comm_, &state);
      if (r != ncclSuccess) state = r;
      return state != ncclInProgress;
    });
    if (!failure.empty()) throw_error(error_prefix() + failure);
    if (done && state != ncclSuccess) {
      std::lock_guard lock(mutex_);
      throw_error(error_prefix() + "NCCL reports an error: " + text(state));
    }
    return done;
  }

  // Caller holds mutex_ (or is the only thread left).
  std::string text(ncclResult_t r) const {
    std::string s = ncclGetErrorString(r);
    const char* last = comm_ != nullptr ? ncclGetLastError(comm_) : nullptr;
    if (last != nullptr && *last != '\0') s += fmt::format(" ({})", last);
    return s;
  }

  // "" while all is well; otherwise what went wrong (polled while waiting).
  std::string problem() {
    {
      std::lock_guard lock(mutex_);
      if (comm_ == nullptr) return aborted_text();
    }
    if (const std::optional<RankFailure> peer = channel_->peer_failure()) return peer->text();
    std::lock_guard lock(mutex_);
    if (comm_ == nullptr) return aborted_text();
    ncclResult_t state = ncclSuccess;
    if (ncclCommGetAsyncError(comm_, &state) == ncclSuccess && state != ncclSuccess &&
        state != ncclInProgress)
      return "NCCL reports an error: " + text(state);
    return "";
  }

  // ---- the watchdog's side ----

  // Caller holds mutex_.
  void abort_locked() noexcept {
    if (comm_ == nullptr) return;
    ncclCommAbort(comm_);  // NCCL's kernels stop: the streams run on
    comm_ = nullptr;
  }
  std::string aborted_text() const {
    return abort_reason_.empty() ? std::string("the communicator was aborted")
                                 : "the communicator was aborted: " + abort_reason_;
  }
  // Caller holds mutex_: throws once the communicator has been aborted.
  void check_live() {
    if (comm_ == nullptr) throw_error(error_prefix() + aborted_text());
  }

  // Arms the collective just issued: events on both lanes mark its end.
  void watch() {
    if (!watchdog_) return;  // closing: nothing more is issued but the flush
    Watched w;
    for (cudaEvent_t* e : {&w.wire, &w.lane}) {
      std::lock_guard lock(watched_mutex_);
      if (!spare_events_.empty()) {
        *e = spare_events_.back();
        spare_events_.pop_back();
      }
    }
    for (cudaEvent_t* e : {&w.wire, &w.lane})
      if (*e == nullptr)
        cuda::check(cudaEventCreateWithFlags(e, cudaEventDisableTiming), "cudaEventCreate");
    cuda::check(cudaEventRecord(w.wire, wire_), "cudaEventRecord");
    cuda::check(cudaEventRecord(w.lane, lane_), "cudaEventRecord");
    w.what = error_prefix();
    std::lock_guard lock(watched_mutex_);
    w.id = watchdog_->arm(w.what, timeout());
    watched_.push_back(std::move(w));
  }

  // On the watchdog's thread: disarms the collectives that have completed
  // (in order: the lanes are streams), and says what went wrong, if anything.
  std::string poll(Watchdog& dog) {
    activate();
    std::string oldest;
    {
      std::lock_guard lock(watched_mutex_);
      while (!watched_.empty()) {
        Watched& w = watched_.front();
        if (!reached(w.wire) || !reached(w.lane)) break;
        dog.disarm(w.id);
        spare_events_.push_back(w.wire);
        spare_events_.push_back(w.lane);
        watched_.pop_front();
      }
      if (watched_.empty()) return "";
      oldest = watched_.front().what;
    }
    if (const std::optional<RankFailure> peer = channel_->peer_failure()) {
      peer_failed_ = true;
      return oldest + peer->text();
    }
    std::lock_guard lock(mutex_);
    if (comm_ == nullptr) return "";  // aborted by this rank's own thread, which reports it
    ncclResult_t state = ncclSuccess;
    if (ncclCommGetAsyncError(comm_, &state) == ncclSuccess && state != ncclSuccess &&
        state != ncclInProgress)
      return oldest + "NCCL reports an asynchronous error: " + text(state);
    return "";
  }

  // On the watchdog's thread: the first failure aborts the communicator,
  // which wakes every thread waiting behind it, and breaks it for good.
  void watchdog_abort(const std::string& why) {
    // A peer's failure is its own text: the abort here is only its echo.
    const std::string what = peer_failed_ ? why : why + "; the watchdog aborted the communicator";
    {
      std::lock_guard lock(mutex_);
      if (comm_ == nullptr) return;  // already aborted, and reported, by its own thread
      abort_reason_ = what;
      abort_locked();
    }
    std::fprintf(stderr, "anvil: %s\n", what.c_str());
    report_failure(what);
  }

  bool reached(cudaEvent_t e) const {
    const cudaError_t r = cudaEventQuery(e);
    if (r == cudaErrorNotReady) return false;
    cuda::check(r, "cudaEventQuery");
    return true;
  }

  // ": the exchange with rank 1 (receive) and rank 3 (send) of its step 4
  // never completed" — the oldest unfinished post, for the timeout message.
  std::string stuck_peers() const {
    const uint64_t oldest = posted_ > kTickets ? posted_ - kTickets + 1 : 1;
    for (uint64_t k = oldest; k <= posted_; ++k) {
      const Ticket& t = tickets_[k % kTickets];
      if (cudaEventQuery(t.event) != cudaErrorNotReady) continue;
      std::string who;
      for (const auto& [peer, send] : t.peers)
        who += fmt::format("{}rank {} ({})", who.empty() ? "" : " and ", peer,
                           send ? "send" : "receive");
      return who.empty() ? std::string()
                         : fmt::format(": its exchange with {} never completed", who);
    }
    return "";
  }

  Ticket& record_ticket() {
    Ticket& t = tickets_[++posted_ % kTickets];
    cuda::check(cudaEventRecord(t.event, wire_), "cudaEventRecord");
    return t;
  }

  // The next post must see the lane's latest reductions and copies.
  void wire_after_lane() {
    if (!lane_dirty_) return;
    cuda::check(cudaEventRecord(lane_done_, lane_), "cudaEventRecord");
    cuda::check(cudaStreamWaitEvent(wire_, lane_done_, 0), "cudaStreamWaitEvent");
    lane_dirty_ = false;
  }

  // The lane's next work must see post `ticket`'s data.
  void lane_after(uint64_t ticket) {
    if (ticket == 0 || ticket <= lane_waited_) return;
    if (ticket > posted_ || posted_ - ticket >= kTickets)
      throw std::logic_error("nccl transport: a reduction names a post too far back");
    cuda::check(cudaStreamWaitEvent(lane_, tickets_[ticket % kTickets].event, 0),
                "cudaStreamWaitEvent");
    lane_waited_ = ticket;
  }

  void release() noexcept {
    for (const Watched& w : watched_) spare_events_.insert(spare_events_.end(), {w.wire, w.lane});
    watched_.clear();
    for (cudaEvent_t e : spare_events_) cudaEventDestroy(e);
    spare_events_.clear();
    for (cudaEvent_t e : {start_, wire_done_, lane_done_})
      if (e) cudaEventDestroy(e);
    for (auto& t : tickets_)
      if (t.event) cudaEventDestroy(t.event);
    for (cudaStream_t s : {wire_, lane_})
      if (s) cudaStreamDestroy(s);
    start_ = wire_done_ = lane_done_ = nullptr;
    wire_ = lane_ = nullptr;
    for (auto& t : tickets_) t.event = nullptr;
  }

  // A collective the watchdog waits for: its lanes' events at its end.
  struct Watched {
    uint64_t id = 0;
    cudaEvent_t wire = nullptr, lane = nullptr;
    std::string what;
  };

  std::shared_ptr<HostChannel> channel_;
  mutable std::mutex mutex_;  // comm_ and abort_reason_, between this rank's thread and the watchdog
  ncclComm_t comm_ = nullptr;
  std::string abort_reason_;  // why the watchdog aborted it
  // The watchdog's poll found another rank's failure (on the watchdog's thread).
  bool peer_failed_ = false;
  cudaStream_t wire_ = nullptr, lane_ = nullptr;
  cudaEvent_t start_ = nullptr, wire_done_ = nullptr, lane_done_ = nullptr;
  Ticket tickets_[kTickets];
  uint64_t posted_ = 0;       // posts so far (tickets)
  uint64_t lane_waited_ = 0;  // the latest ticket the lane waits for
  bool lane_dirty_ = false;   // lane work the wire has not yet been told to wait for
  std::mutex watched_mutex_;  // watched_, spare_events_
  std::deque<Watched> watched_;
  std::vector<cudaEvent_t> spare_events_;
  std::unique_ptr<Watchdog> watchdog_;  // last: stopped first
};

ncclUniqueId to_nccl(const NcclId& id) {
  ncclUniqueId u;
  static_assert(sizeof u.internal == sizeof id.bytes);
  std::memcpy(u.internal, id.bytes.data(), sizeof u.internal);
  return u;
}

void check_gpu(Device device, int rank) {
  if (!device.is_cuda())
    throw CommError(fmt::format("rank {} (nccl): NCCL moves CUDA tensors; {} is not a GPU", rank,
                                device.str()));
  try {
    check_cuda_device(device);
  } catch (const std::exception& e) {
    throw CommError(fmt::format("rank {} (nccl): {}", rank, e.what()));
  }
}

}  // namespace

std::string nccl_missing_reason() { return ""; }

NcclId nccl_unique_id() {
  ncclUniqueId u;
  const ncclResult_t r = ncclGetUniqueId(&u);
  if (r != ncclSuccess)
    throw CommError(std::string("ncclGetUniqueId failed: ") + ncclGetErrorString(r) +
                    " (without a network, set NCCL_SOCKET_IFNAME=lo)");
  NcclId id;
  std::memcpy(id.bytes.data(), u.internal, sizeof u.internal);
  return id;
}

std::unique_ptr<Communicator> nccl_communicator(const NcclId& id, int rank, int size,
                                                Device device, CommOptions options) {
  if (size < 1 || rank < 0 || rank >= size)
    throw CommError(fmt::format("nccl_communicator: rank {} of {} ranks", rank, size));
  check_gpu(device, rank);
  auto channel = shared_board(std::string(id.bytes.data(), id.bytes.size()), rank, size);
  return std::make_unique<Communicator>(
      std::make_unique<NcclTransport>(rank, size, device, std::move(channel), to_nccl(id),
                                      options.timeout),
      options);
}

std::unique_ptr<Communicator> nccl_world(CommOptions options) {
  mpi_detail::ensure_initialized();
  mpi_detail::install_sigterm_handler();
  const int rank = mpi_detail::world_rank(), size = mpi_detail::world_size();
  const int local = mpi_detail::local_rank();
  // A rank that fails here has no communicator to abort: it leaves without
  // MPI_Finalize, so that mpirun ends the job at once instead of the others
  // waiting for it (in the id's broadcast, or in MPI_Finalize) until their
  // deadline.
  try {
    if (local >= device_count())
      throw CommError(fmt::format("rank {} (nccl): this is process {} on its machine, which "
                                  "needs cuda:{}, but the machine has {} GPU(s)",
                                  rank, local, local, device_count()));
    const Device device = Device::cuda(local);
    check_gpu(device, rank);
    NcclId id;
    if (rank == 0) id = nccl_unique_id();
    mpi_detail::broadcast_bytes(id.bytes.data(), id.bytes.size(), 0, options.timeout,
                                "sharing NCCL's unique id");
    return std::make_unique<Communicator>(
        std::make_unique<NcclTransport>(rank, size, device,
                                        mpi_detail::world_channel(options.timeout), to_nccl(id),
                                        options.timeout),
        options);
  } catch (...) {
    mpi_detail::mark_failed();
    throw;
  }
}

}  // namespace anvil::parallel
