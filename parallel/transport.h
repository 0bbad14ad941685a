// Internal to parallel/: what a backend (MPI, NCCL) provides so that the
// collectives can be written once (parallel/collectives.cpp, allreduce.cpp).
//
// A Transport moves bytes between ranks and reduces them on its device, in
// two lanes of work: the wire (grouped sends and receives, one `post` at a
// time) and the reduction lane (dst = (dst + src) * scale, and local copies).
// Their order is what the collectives rely on:
//   - a post starts once every earlier post has delivered and every earlier
//     reduction or copy has finished (so it may send what they produced, and
//     receive into buffers they have finished reading);
//   - a reduction or copy starts once the post it names (its ticket) has
//     delivered, and after the earlier reductions, but not after later posts:
//     issuing post(k+1) before reduce(k) lets chunk k+1 travel while chunk k
//     is added up. That is the ring's pipeline.
// On a GPU both lanes are streams (NCCL calls on one, reduction kernels on
// the other, ordered by events) and nothing waits on the host. Over MPI the
// host does both: a post waits for the one before it (with the deadline) and
// starts non-blocking sends and receives, a reduction waits for its post.
#pragma once
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <memory>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "core/device.h"
#include "core/dtype.h"
#include "core/tensor.h"
#include "parallel/communicator.h"

namespace anvil::parallel {

// What one rank asks of a collective. Every rank exchanges it before any data
// moves (HostChannel), so ranks that disagree are caught and named, and ranks
// learn the shapes they need (scatter's input, all_gather's shards) from it.
// Plain bytes: it travels over MPI as they are.
enum class Collective : uint8_t { kAllreduce, kBroadcast, kScatter, kReduceScatter, kAllGather,
                                  kBarrier, kSplit, kSend, kRecv };
std::string_view collective_name(Collective c);

struct CallInfo {
  static constexpr int kMaxDims = 8;
  uint64_t seq = 0;  // the collective's number on this communicator, from 1
  Collective collective = Collective::kBarrier;
  Algorithm algorithm = Algorithm::kRing;
  ReduceOp op = ReduceOp::kSum;
  DType dtype = DType::Float32;
  int32_t root = -1;
  int32_t ndim = -1;  // -1: no tensor (scatter's non-roots, barrier)
  int64_t shape[kMaxDims] = {};
  // Where the message is cut (CommOptions::chunk_bytes) for the collectives
  // whose schedule depends on it (the ring all-reduce, broadcast,
  // reduce-scatter); 0 for the others. Ranks that cut differently would
  // exchange pieces of different sizes.
  uint64_t chunk_bytes = 0;
  // Which tensor the caller says this is (Communicator::allreduce's
  // fingerprint); 0: unsaid. Part of what ranks must agree on.
  uint64_t fingerprint = 0;
  // split: the group this rank asks for (Communicator::kNoColor: none) and
  // its place in it. Ranks differ here by design; the exchange tells every
  // rank every other's.
  int32_t color = 0;
  int32_t key = 0;

  Shape tensor_shape() const { return Shape(shape, shape + (ndim > 0 ? ndim : 0)); }
  int64_t numel() const;
  // A collective's call on tensor t: its dtype and shape (agreement.cpp).
  static CallInfo of(Collective collective, const Tensor& t);
};

// One rank's side of a point-to-point call with one peer: what it sends to
// the peer and what it receives from it (CallInfo::ndim -1: nothing), under
// the call's number between the two (from 1). The two sides of a call must
// mirror each other: one's send is the other's receive, dtype and shape alike.
struct PeerCall {
  uint64_t seq = 0;
  CallInfo send;  // collective kSend
  CallInfo recv;  // collective kRecv
};

// A rank's failure as the channel passes it on: its world rank and error.
struct RankFailure {
  int rank = -1;
  std::string what;
  // "another rank failed (world rank 1): <what>", how the others' errors say it.
  std::string text() const;
};

// The host-side channel the ranks check their calls over. Thread ranks share
// a board in memory; processes use MPI.
class HostChannel {
 public:
  virtual ~HostChannel() = default;
  // Every rank's CallInfo for this rank's next exchange, in rank order (the
  // k-th exchange of every rank meets the k-th of every other). Throws
  // CommError naming the ranks that did not post within `timeout`; its text
  // begins with `who` ("rank 1 (mpi, cpu): allreduce #2 (...): ").
  virtual std::vector<CallInfo> exchange(const CallInfo& mine, std::chrono::milliseconds timeout,
                                         const std::string& who) = 0;
  // This rank's PeerCall with each of `peers` (distinct, not this rank), and
  // each peer's with this rank back, in the same order: the k-th exchange of
  // rank a with rank b meets the k-th of b with a, whatever either exchanged
  // with other ranks in between. Throws CommError naming the peers that did
  // not post within `timeout`.
  virtual std::vector<PeerCall> exchange_with(std::span<const int> peers,
                                              std::span<const PeerCall> mine,
                                              std::chrono::milliseconds timeout,
                                              const std::string& who);
  // The channel of this rank's group after a split that every rank of this
  // channel makes at the same point, each with its color (< 0: no group;
  // then null comes back) and key; `rank` and `size` are this rank's place
  // and its group's size, as the split's agreement computed them.
  virtual std::shared_ptr<HostChannel> split(int color, int key, int rank, int size,
                                             std::chrono::milliseconds timeout,
                                             const std::string& who);
  // Tells the other ranks that this one (world rank `rank`) failed, so that
  // their waits end at once instead of at their deadline (thread ranks;
  // processes end the job).
  virtual void report_failure(int /*rank*/, const std::string& /*what*/) noexcept {}
  // The first failure a rank of this channel reported, if any.
  virtual std::optional<RankFailure> peer_failure() const { return std::nullopt; }
};

// A collective whose end() was left for later (Transport::end_later). It
// holds the collective's scratch until it is destroyed, so no block the
// lanes may still touch goes back to the allocator.
struct InFlight {
  virtual ~InFlight() = default;
  virtual void wait() = 0;  // what end() would have done
};

// One send or receive of a post.
struct Message {
  enum Kind : uint8_t { kSend, kRecv } kind = kSend;
  int peer = -1;
  void* data = nullptr;  // device memory for NCCL, host memory for MPI
  size_t bytes = 0;
};

class Transport {
 public:
  virtual ~Transport() = default;
  virtual std::string_view name() const = 0;
  int rank() const { return rank_; }
  int size() const { return size_; }
  Device device() const { return device_; }
  virtual HostChannel& channel() = 0;

  // Brackets a collective: after begin() both lanes start behind the work
  // already issued on the device; after end() work issued on the device
  // waits for both lanes (over MPI: the host has waited for the last post).
  // end() also lets go of the collective's scratch (scratch()).
  virtual void begin() = 0;
  virtual void end() = 0;
  // end(), left for later: the collective stays in flight, and
  // InFlight::wait() does what end() would have done.
  virtual std::unique_ptr<InFlight> end_later();
  // True when the host does the work (MPI): every call returns when done,
  // and asynchronous calls need a thread of their own (Communicator does it).
  virtual bool host_synchronous() const { return false; }

  // `bytes` of memory on the transport's device for the running collective,
  // from the device's caching allocator; kept until end() (or by the InFlight).
  void* scratch(size_t bytes);
  // The caller's tensor the running collective reads or writes: held as its
  // scratch is, so that a transport that cannot take back a request (a
  // cancelled MPI receive that never completes) can keep its memory alive.
  void hold(const Tensor& t) { held_.push_back(t); }
  // Starts a group of sends and receives (see the top of this file); returns
  // its ticket. An empty group is allowed and still gets a ticket. Counts
  // the bytes sent to other ranks (bytes_sent()).
  uint64_t post(std::span<const Message> messages) {
    for (const Message& m : messages)
      if (m.kind == Message::kSend && m.peer != rank_)
        bytes_sent_.fetch_add(m.bytes, std::memory_order_relaxed);
    return post_messages(messages);
  }
  // The bytes this rank has posted to other ranks so far: every collective's
  // and point-to-point call's, but the native collectives' (the backend's
  // own algorithms, whose traffic it does not say).
  uint64_t bytes_sent() const { return bytes_sent_.load(std::memory_order_relaxed); }
  // dst = (dst + src) * scale over n elements (int64: scale must be 1), once
  // post `ticket` has delivered (0: no post to wait for).
  virtual void reduce(void* dst, const void* src, int64_t n, DType dtype, float scale,
                      uint64_t ticket) = 0;
  // dst = src (bytes), in the reduction lane, once post `ticket` has delivered.
  virtual void copy(void* dst, const void* src, size_t bytes, uint64_t ticket) = 0;
  // The backend's own collectives (Algorithm::kNative), in the wire lane.
  // All-reduce, in place (ncclAllReduce, MPI_Allreduce).
  virtual void native_allreduce(void* data, int64_t n, DType dtype, ReduceOp op) = 0;
  // Root's `bytes` to every rank, in place (ncclBroadcast, MPI_Bcast).
  virtual void native_broadcast(void* data, size_t bytes, int root) = 0;
  // Rank j's shard, offsets[j+1] - offsets[j] bytes (size()+1 byte offsets),
  // at offsets[j] of every rank's `output`; `shard` is this rank's. Equal
  // shards go as one all-gather (ncclAllGather, MPI_Allgather), others as
  // the backend allows (a group of ncclBroadcast, MPI_Allgatherv).
  virtual void native_all_gather(const void* shard, void* output,
                                 const std::vector<int64_t>& offsets) = 0;
  // `input` holds size() blocks of `count` elements; `output` receives block
  // rank() of their elementwise sum (or mean) over the ranks
  // (ncclReduceScatter, MPI_Reduce_scatter_block).
  virtual void native_reduce_scatter(const void* input, void* output, int64_t count,
                                     DType dtype, ReduceOp op) = 0;
  // The host waits for both lanes, within the deadline; throws CommError
  // (after aborting, for NCCL) when it passes or the backend reports an error.
  virtual void synchronize() = 0;
  // Gives up on everything in flight (NCCL: ncclCommAbort). Never throws.
  virtual void abort() noexcept = 0;
  // Stops the transport's own threads that call back into the Communicator
  // (NCCL's watchdog): the Communicator's destructor calls it first.
  virtual void quiesce() noexcept {}
  // This rank's transport in its group after a split (MPI_Comm_split,
  // ncclCommSplit): every rank of this transport calls it at the same point
  // (after the split's agreement), with its color (< 0: no group; then null
  // comes back) and key, and `place`: its rank, the group's size and name
  // as the agreement computed them. The new transport has this one's
  // deadline and device.
  struct Place {
    int rank = 0;
    int size = 1;
    std::string label;           // "dp group 0 of 2"
    std::vector<int> world;      // the world rank of each of the group's ranks
  };
  virtual std::unique_ptr<Transport> split(int color, int key, const Place& place);

  // What the running collective is, for error messages ("allreduce #3 (ring,
  // sum, float32 [1000])"), and the deadline of every wait.
  void set_context(std::string what) { context_ = std::move(what); }
  const std::string& context() const { return context_; }
  void set_timeout(std::chrono::milliseconds t) { timeout_ = t; }
  std::chrono::milliseconds timeout() const { return timeout_; }

  // "rank 2 (nccl, cuda:2)": who this rank is, in every message it writes;
  // in a group, "dp group 0 of 2, rank 1 of 2 (nccl, cuda:2, world rank 2)".
  std::string identity() const;
  // "rank 1", or in a group "rank 1 (world rank 3)": a peer as messages name it.
  std::string peer_name(int rank) const;
  // The group's name ("" for the world) and the world rank of each of its ranks.
  const std::string& label() const { return label_; }
  int world_rank(int rank) const {
    return world_.empty() ? rank : world_[size_t(rank)];
  }
  // "rank 2 (nccl, cuda:2): <context>: " — how every error of this rank begins.
  std::string error_prefix() const;
  // Throws `message`: as PeerFailed when the first failure reported on this
  // rank's channel is another rank's (this error is its echo), else as
  // CommError.
  [[noreturn]] void throw_error(const std::string& message);

  // Who is told when the transport fails on a thread of its own (NCCL's
  // watchdog): the Communicator, which then refuses every call and tells the
  // other ranks. Set before the first collective.
  void set_failure_handler(std::function<void(const std::string&)> handler) {
    failure_handler_ = std::move(handler);
  }

 protected:
  Transport(int rank, int size, Device device) : rank_(rank), size_(size), device_(device) {}
  // A group's transport: its place from split().
  Transport(const Place& place, Device device)
      : rank_(place.rank), size_(place.size), device_(device), label_(place.label),
        world_(place.world) {}
  // post()'s work, the backend's.
  virtual uint64_t post_messages(std::span<const Message> messages) = 0;
  // The running collective's scratch tensors (see scratch()).
  std::vector<Tensor> held_;
  void report_failure(const std::string& why) {
    if (failure_handler_) failure_handler_(why);
  }

 private:
  int rank_;
  int size_;
  Device device_;
  std::string label_;
  std::vector<int> world_;  // empty: this is the world
  std::string context_;
  std::chrono::milliseconds timeout_{300000};
  std::function<void(const std::string&)> failure_handler_;
  std::atomic<uint64_t> bytes_sent_{0};
};

// How long "ANVIL_COMM_TIMEOUT" seconds is, as a message fragment ("5 s").
std::string timeout_text(std::chrono::milliseconds t);

// A thread-rank board: the HostChannel for ranks that are threads of one
// process, shared through a registry by name (an NCCL unique id). Each rank
// holds it while its communicator lives.
std::shared_ptr<HostChannel> shared_board(const std::string& name, int rank, int size);

// Polls `done` until it returns true or `timeout` passes (false then). The
// first 20 ms it only spins and yields, since polling is what moves MPI's
// messages along (a sleeping rank would hold up its peers) and a collective's
// steps are short; past that the wait is probably for a slow or silent peer,
// and it sleeps in growing steps up to 1 ms so a long wait costs no CPU.
template <typename Done>
bool poll_until(std::chrono::milliseconds timeout, Done&& done) {
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  const auto deadline = start + timeout;
  auto pause = std::chrono::microseconds(10);
  for (int spins = 0;; ++spins) {
    if (done()) return true;
    if ((spins & 63) != 0) continue;
    const auto now = Clock::now();
    if (now >= deadline) return done();
    if (now - start < std::chrono::milliseconds(20)) {
      std::this_thread::yield();
      continue;
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(1000));
  }
}

}  // namespace anvil::parallel
