// The MPI backend: CPU tensors, one rank per process (Debian's OpenMPI, which
// is not CUDA-aware: it is never handed device memory).
//
// The host does both of the transport's lanes (transport.h): a post waits for
// the one before it, then starts non-blocking sends and receives of raw
// bytes; a reduction waits for its post, then adds on the CPU
// (cpu::accumulate). So while rank r adds chunk k, chunk k+1 is already on
// its way. Every wait is a polling loop with the communicator's deadline
// (MPI's blocking calls have none), and it names the ranks whose messages
// are missing when the deadline passes.
//
// Each communicator duplicates MPI_COMM_WORLD twice, without blocking
// (MPI_Comm_idup), so that its data and its check messages never meet other
// traffic. Errors come back as codes (MPI_ERRORS_RETURN) and become
// CommError with MPI's text.
#include <fmt/format.h>
#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"
#include "parallel/mpi_internal.h"
#include "parallel/watchdog.h"

namespace anvil::parallel {
namespace {

std::atomic<bool> g_failed{false};  // a collective failed: leave without MPI_Finalize

// How long a cancellation may take to complete: a cancelled receive that has
// not met its message completes at once, one that has waits for the rest of
// its data.
std::chrono::milliseconds cancel_wait(std::chrono::milliseconds timeout) {
  return std::min(timeout, std::chrono::milliseconds(2000));
}

// Buffers of requests that did not complete when cancelled: never freed, so
// that a late receive lands in memory nobody else uses. The job is failing
// by then; a few leaked blocks beat a write into freed memory.
void keep_forever(std::vector<Tensor> buffers) {
  static std::mutex mutex;
  static auto* kept = new std::vector<Tensor>();
  std::lock_guard lock(mutex);
  for (Tensor& t : buffers) kept->push_back(std::move(t));
}

// MPI has no bfloat16 type, so its native reductions of bfloat16 move the
// 16-bit words as MPI_UINT16_T and add them with an operation of anvil's:
// each pair is widened to float, added in float and rounded to bfloat16
// once, the same step as the ring's (cpu::accumulate). MPI applies it n-1
// times to every element, in an order of its choosing, so the error bound
// is the ring's (docs/parallel.md, "Gradients in bfloat16"). Float addition
// is commutative, which lets MPI pick its usual algorithms.
void bf16_sum(void* in, void* inout, int* length, MPI_Datatype*) {
  const auto* a = static_cast<const bfloat16*>(in);
  auto* b = static_cast<bfloat16*>(inout);
  for (int i = 0; i < *length; ++i) b[i] = bfloat16(a[i].to_float() + b[i].to_float());
}

// The MPI type and sum operation for a dtype's native reductions.
std::pair<MPI_Datatype, MPI_Op> mpi_sum(DType dtype) {
  if (dtype == DType::Int64) return {MPI_INT64_T, MPI_SUM};
  if (dtype != DType::BFloat16) return {MPI_FLOAT, MPI_SUM};
  static MPI_Op op = MPI_OP_NULL;
  static std::once_flag once;
  std::call_once(once, [] { MPI_Op_create(&bf16_sum, /*commute=*/1, &op); });
  return {MPI_UINT16_T, op};
}

const char* thread_level_name(int level) {
  if (level == MPI_THREAD_SINGLE) return "MPI_THREAD_SINGLE";
  if (level == MPI_THREAD_FUNNELED) return "MPI_THREAD_FUNNELED";
  if (level == MPI_THREAD_SERIALIZED) return "MPI_THREAD_SERIALIZED";
  if (level == MPI_THREAD_MULTIPLE) return "MPI_THREAD_MULTIPLE";
  return "(unknown)";
}

std::string mpi_text(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) return fmt::format("MPI error {}", code);
  return std::string(text, size_t(length));
}

void check(int code, const char* call, const std::string& who) {
  if (code != MPI_SUCCESS) throw CommError(fmt::format("{}{} failed: {}", who, call, mpi_text(code)));
}

void finalize_at_exit() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && !g_failed.load()) MPI_Finalize();
}

// A duplicate of MPI_COMM_WORLD made without blocking, within the deadline.
MPI_Comm duplicate_world(std::chrono::milliseconds timeout, const std::string& who) {
  MPI_Comm comm = MPI_COMM_NULL;
  MPI_Request request = MPI_REQUEST_NULL;
  check(MPI_Comm_idup(MPI_COMM_WORLD, &comm, &request), "MPI_Comm_idup", who);
  int done = 0;
  int code = MPI_SUCCESS;
  if (!poll_until(timeout, [&] {
        code = MPI_Test(&request, &done, MPI_STATUS_IGNORE);
        return code != MPI_SUCCESS || done;
      }))
    throw CommError(fmt::format("{}not every rank of the MPI job created the communicator "
                                "within {} (ANVIL_COMM_TIMEOUT)",
                                who, timeout_text(timeout)));
  check(code, "MPI_Comm_idup", who);
  MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
  return comm;
}

// A blocking MPI call that passes its deadline cannot be taken back: the
// whole job ends (MPI_Abort, allowed from any thread at MPI_THREAD_MULTIPLE).
void abort_job(const std::string& why) {
  std::fprintf(stderr, "anvil: %s: ending the job\n", why.c_str());
  g_failed.store(true);
  MPI_Abort(MPI_COMM_WORLD, 1);
}

// This rank's part of `parent` after MPI_Comm_split (MPI_COMM_NULL for a
// color < 0: MPI_UNDEFINED), checked to rank it `rank` as the split's
// agreement did. MPI_Comm_split blocks and has no non-blocking twin: a
// watchdog keeps its deadline (every rank has already agreed to make it).
MPI_Comm split_comm(MPI_Comm parent, int color, int key, int rank,
                    std::chrono::milliseconds timeout, const std::string& who) {
  Watchdog dog(abort_job);
  const uint64_t armed = dog.arm(who + "MPI_Comm_split ", timeout);
  MPI_Comm out = MPI_COMM_NULL;
  const int code = MPI_Comm_split(parent, color < 0 ? MPI_UNDEFINED : color, key, &out);
  dog.disarm(armed);
  check(code, "MPI_Comm_split", who);
  if (out == MPI_COMM_NULL) return out;
  MPI_Comm_set_errhandler(out, MPI_ERRORS_RETURN);
  int got = -1;
  MPI_Comm_rank(out, &got);
  if (got != rank)
    throw CommError(fmt::format("{}MPI_Comm_split ranked this rank {} in its group, where the "
                                "split's agreement ranked it {}",
                                who, got, rank));
  return out;
}

// Outstanding requests with the peer and direction of each, for the message
// that names who is missing when a deadline passes.
struct Requests {
  std::vector<MPI_Request> handles;
  std::vector<int> peers;
  std::vector<bool> is_send;
  std::vector<size_t> expected;  // receives: the bytes asked for

  void add(MPI_Request r, int peer, bool send, size_t bytes) {
    handles.push_back(r);
    peers.push_back(peer);
    is_send.push_back(send);
    expected.push_back(bytes);
  }
  bool empty() const { return handles.empty(); }

  // Waits for all of them within `timeout`: false if some are still
  // outstanding then (pending_peers names them). Throws CommError for an MPI
  // error, or a receive of another size than asked for.
  bool wait(std::chrono::milliseconds timeout, const std::string& who) {
    if (handles.empty()) return true;
    std::vector<int> indices(handles.size());
    std::vector<MPI_Status> statuses(handles.size());
    size_t left = 0;
    for (MPI_Request r : handles) left += r != MPI_REQUEST_NULL;
    int code = MPI_SUCCESS;
    const bool done = poll_until(timeout, [&] {
      int count = 0;
      code = MPI_Testsome(int(handles.size()), handles.data(), &count, indices.data(),
                          statuses.data());
      if (code != MPI_SUCCESS || count == MPI_UNDEFINED) return true;
      for (int i = 0; i < count; ++i) {
        const size_t k = size_t(indices[size_t(i)]);
        if (is_send[k]) continue;
        int got = 0;
        MPI_Get_count(&statuses[size_t(i)], MPI_BYTE, &got);
        if (size_t(got) != expected[k])
          throw CommError(fmt::format("{}rank {} sent {} bytes where {} were expected", who,
                                      peers[k], got, expected[k]));
      }
      left -= size_t(count);
      return left == 0;
    });
    check(code, "MPI_Testsome", who);
    if (done) clear();
    return done;
  }

  // "rank 1, rank 3": the peers of the outstanding receives (or sends).
  std::string pending_peers(bool sends) const {
    std::string list;
    for (size_t k = 0; k < handles.size(); ++k) {
      if (handles[k] == MPI_REQUEST_NULL || is_send[k] != sends) continue;
      const std::string peer = fmt::format("rank {}", peers[k]);
      if (list.find(peer) == std::string::npos) list += (list.empty() ? "" : ", ") + peer;
    }
    return list;
  }

  // What a wait that timed out says: the ranks whose data never came (or
  // that never took ours).
  std::string timeout_message(std::chrono::milliseconds timeout, const std::string& who) const {
    const std::string silent = pending_peers(false), unread = pending_peers(true);
    return fmt::format(
        "{}{} within {} (ANVIL_COMM_TIMEOUT); a rank that stopped answering may itself be "
        "waiting on another",
        who, !silent.empty() ? "no data from " + silent : "no receive posted by " + unread,
        timeout_text(timeout));
  }

  // Cancels every outstanding request and waits, up to `timeout`, until each
  // has completed: a cancelled receive that has not met its message
  // completes at once; one that has is filled first. Only a request that has
  // completed is sure never to touch its buffer again, so MPI_Request_free
  // (which lets a request run on unseen) is never used. True when none is
  // left; otherwise the rest stay here, and their buffers must stay alive.
  bool cancel(std::chrono::milliseconds timeout) noexcept {
    for (MPI_Request& r : handles)
      if (r != MPI_REQUEST_NULL) MPI_Cancel(&r);
    int all_done = 0;
    poll_until(timeout, [&] {
      if (MPI_Testall(int(handles.size()), handles.data(), &all_done, MPI_STATUSES_IGNORE) !=
          MPI_SUCCESS)
        all_done = 0;
      return all_done != 0;
    });
    if (all_done) clear();
    return all_done != 0;
  }
  void clear() {
    handles.clear();
    peers.clear();
    is_send.clear();
    expected.clear();
  }
};

// MPI counts are ints: a large message goes as several of at most 1 GiB
// (less where a test sets it: set_max_message_bytes).
constexpr size_t kMaxPiece = size_t(1) << 30;
std::atomic<size_t> g_max_piece{kMaxPiece};

// The message tags of the check channel: every rank's call, and a
// point-to-point call's two sides.
constexpr int kCallTag = 0;
constexpr int kPeerTag = 1;

class MpiChannel final : public HostChannel {
 public:
  // A channel of its own over `comm` (which it frees).
  explicit MpiChannel(MPI_Comm comm) : comm_(comm) {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
  }
  // Over every process of the job.
  explicit MpiChannel(std::chrono::milliseconds timeout)
      : MpiChannel(duplicate_world(timeout, fmt::format("rank {} (mpi, cpu): creating the communicator: ",
                                                        mpi_detail::world_rank()))) {}
  ~MpiChannel() override {
    if (!g_failed.load()) MPI_Comm_free(&comm_);
  }

  std::vector<CallInfo> exchange(const CallInfo& mine, std::chrono::milliseconds timeout,
                                 const std::string& who) override {
    if (size_ == 1) return {mine};
    // On the heap: if a request outlives its cancellation, its buffer is left
    // to it (see give_up).
    auto all = std::make_unique<std::vector<CallInfo>>(size_t(size_), mine);
    Requests requests;
    bool done = false;
    try {
      for (int j = 0; j < size_; ++j) {
        if (j == rank_) continue;
        MPI_Request r;
        check(MPI_Irecv(&(*all)[size_t(j)], sizeof(CallInfo), MPI_BYTE, j, kCallTag, comm_, &r),
              "MPI_Irecv", who);
        requests.add(r, j, false, sizeof(CallInfo));
        check(MPI_Isend(&(*all)[size_t(rank_)], sizeof(CallInfo), MPI_BYTE, j, kCallTag, comm_,
                        &r),
              "MPI_Isend", who);
        requests.add(r, j, true, 0);
      }
      done = requests.wait(timeout, who);
    } catch (...) {
      give_up(requests, std::move(all), timeout);
      throw;
    }
    if (!done) {
      const std::string missing = requests.pending_peers(false);
      give_up(requests, std::move(all), timeout);
      throw CommError(fmt::format("{}{} did not join within {} (ANVIL_COMM_TIMEOUT)", who,
                                  missing.empty() ? "a rank" : missing, timeout_text(timeout)));
    }
    return std::move(*all);
  }

  std::vector<PeerCall> exchange_with(std::span<const int> peers, std::span<const PeerCall> mine,
                                      std::chrono::milliseconds timeout,
                                      const std::string& who) override {
    // Both on the heap, for the same reason as exchange()'s.
    auto buffers = std::make_unique<std::vector<PeerCall>>(mine.begin(), mine.end());
    buffers->resize(2 * mine.size());  // then the peers' sides
    Requests requests;
    bool done = false;
    try {
      for (size_t i = 0; i < peers.size(); ++i) {
        MPI_Request r;
        check(MPI_Irecv(&(*buffers)[mine.size() + i], sizeof(PeerCall), MPI_BYTE, peers[i],
                        kPeerTag, comm_, &r),
              "MPI_Irecv", who);
        requests.add(r, peers[i], false, sizeof(PeerCall));
        check(MPI_Isend(&(*buffers)[i], sizeof(PeerCall), MPI_BYTE, peers[i], kPeerTag, comm_, &r),
              "MPI_Isend", who);
        requests.add(r, peers[i], true, 0);
      }
      done = requests.wait(timeout, who);
    } catch (...) {
      give_up(requests, std::move(buffers), timeout);
      throw;
    }
    if (!done) {
      const std::string missing = requests.pending_peers(false);
      give_up(requests, std::move(buffers), timeout);
      throw CommError(fmt::format("{}{} did not post its side of point-to-point call #{} within "
                                  "{} (ANVIL_COMM_TIMEOUT)",
                                  who, missing.empty() ? "a peer" : missing, mine[0].seq,
                                  timeout_text(timeout)));
    }
    return {buffers->begin() + std::ptrdiff_t(mine.size()), buffers->end()};
  }

  std::shared_ptr<HostChannel> split(int color, int key, int rank, int,
                                     std::chrono::milliseconds timeout,
                                     const std::string& who) override {
    MPI_Comm group = split_comm(comm_, color, key, rank, timeout, who);
    if (group == MPI_COMM_NULL) return nullptr;
    return std::make_shared<MpiChannel>(group);
  }

  void report_failure(int, const std::string&) noexcept override { g_failed.store(true); }

 private:
  template <typename Buffers>
  static void give_up(Requests& requests, std::unique_ptr<Buffers> buffers,
                      std::chrono::milliseconds timeout) noexcept {
    if (!requests.cancel(cancel_wait(timeout))) (void)buffers.release();  // still theirs
  }

  MPI_Comm comm_;
  int rank_ = 0, size_ = 1;
};

class MpiTransport final : public Transport {
 public:
  // Every process of the job.
  explicit MpiTransport(std::chrono::milliseconds timeout)
      : Transport(mpi_detail::world_rank(), mpi_detail::world_size(), Device::cpu()),
        channel_(std::make_shared<MpiChannel>(timeout)),
        data_(duplicate_world(timeout, error_prefix())),
        watchdog_(abort_job) {
    set_timeout(timeout);
  }
  // A group: its data communicator and check channel, made by split().
  MpiTransport(const Place& place, MPI_Comm data, std::shared_ptr<HostChannel> channel,
               std::chrono::milliseconds timeout)
      : Transport(place, Device::cpu()),
        channel_(std::move(channel)),
        data_(data),
        watchdog_(abort_job) {
    set_timeout(timeout);
  }

  // Both of its communicators split alike: the check channel's, then the data's.
  std::unique_ptr<Transport> split(int color, int key, const Place& place) override {
    wait_pending();
    std::shared_ptr<HostChannel> channel =
        channel_->split(color, key, place.rank, place.size, timeout(), error_prefix());
    MPI_Comm data = split_comm(data_, color, key, place.rank, timeout(), error_prefix());
    if (data == MPI_COMM_NULL) return nullptr;
    return std::make_unique<MpiTransport>(place, data, std::move(channel), timeout());
  }
  ~MpiTransport() override {
    give_up();
    if (!g_failed.load()) MPI_Comm_free(&data_);
  }

  std::string_view name() const override { return "mpi"; }
  HostChannel& channel() override { return *channel_; }
  void begin() override {}
  // A collective over MPI returns when it is done: the last post is waited for.
  void end() override {
    wait_pending();
    held_.clear();
  }
  bool host_synchronous() const override { return true; }

  uint64_t post_messages(std::span<const Message> messages) override {
    wait_pending();
    const std::string who = error_prefix();
    for (const Message& m : messages) {
      const size_t max_piece = g_max_piece.load();
      for (size_t offset = 0; offset < m.bytes; offset += max_piece) {
        const int piece = int(std::min(max_piece, m.bytes - offset));
        char* p = static_cast<char*>(m.data) + offset;
        MPI_Request r;
        if (m.kind == Message::kSend)
          check(MPI_Isend(p, piece, MPI_BYTE, m.peer, 0, data_, &r), "MPI_Isend", who);
        else
          check(MPI_Irecv(p, piece, MPI_BYTE, m.peer, 0, data_, &r), "MPI_Irecv", who);
        pending_.add(r, m.peer, m.kind == Message::kSend, size_t(piece));
      }
    }
    return ++posted_;
  }

  void reduce(void* dst, const void* src, int64_t n, DType dtype, float scale,
              uint64_t ticket) override {
    if (ticket == posted_) wait_pending();
    if (dtype == DType::Int64)
      cpu::accumulate(n, static_cast<int64_t*>(dst), static_cast<const int64_t*>(src));
    else if (dtype == DType::BFloat16)
      cpu::accumulate(n, static_cast<bfloat16*>(dst), static_cast<const bfloat16*>(src), scale);
    else
      cpu::accumulate(n, static_cast<float*>(dst), static_cast<const float*>(src), scale);
  }

  void copy(void* dst, const void* src, size_t bytes, uint64_t ticket) override {
    if (ticket != 0 && ticket == posted_) wait_pending();
    std::memcpy(dst, src, bytes);
  }

  // The backend's own collectives are MPI's blocking ones (their
  // non-blocking twins run other, often slower, algorithms: they would not
  // be the baseline users know). Each call's deadline is kept by the
  // communicator's watchdog, which ends the job if it passes; the agreement
  // before it has already made sure every rank is making this call. Counts
  // are ints, so a long message goes as several calls of at most
  // set_max_message_bytes() each (1 GiB).
  void native_allreduce(void* data, int64_t n, DType dtype, ReduceOp op) override {
    wait_pending();
    const MPI_Datatype type = mpi_sum(dtype).first;
    const MPI_Op sum = mpi_sum(dtype).second;
    const int64_t esize = int64_t(dtype_size(dtype));
    const int64_t piece = std::max<int64_t>(1, int64_t(g_max_piece.load()) / esize);
    for (int64_t offset = 0; offset < n; offset += piece) {
      const int count = int(std::min(piece, n - offset));
      blocking("MPI_Allreduce", [&] {
        return MPI_Allreduce(MPI_IN_PLACE, static_cast<char*>(data) + offset * esize, count, type,
                             sum, data_);
      });
    }
    if (op == ReduceOp::kAverage) scale(data, n, dtype);
  }

  void native_broadcast(void* data, size_t bytes, int root) override {
    wait_pending();
    const size_t piece = g_max_piece.load();
    for (size_t offset = 0; offset < bytes; offset += piece) {
      const int count = int(std::min(piece, bytes - offset));
      blocking("MPI_Bcast", [&] {
        return MPI_Bcast(static_cast<char*>(data) + offset, count, MPI_BYTE, root, data_);
      });
    }
  }

  void native_all_gather(const void* shard, void* output,
                         const std::vector<int64_t>& offsets) override {
    wait_pending();
    const int n = size();
    const size_t piece = g_max_piece.load();
    auto length = [&](int j) { return size_t(offsets[size_t(j) + 1] - offsets[size_t(j)]); };
    size_t longest = 0;
    bool equal = true;
    for (int j = 0; j < n; ++j) {
      longest = std::max(longest, length(j));
      equal = equal && length(j) == length(0);
    }
    const char* in = static_cast<const char*>(shard);
    char* out = static_cast<char*>(output);
    if (equal) {
      // Piece k of every shard in one call: rank j's lands at j * shard +
      // k * piece, so the receive type is one piece whose extent is a shard.
      for (size_t offset = 0; offset < longest; offset += piece) {
        const int count = int(std::min(piece, longest - offset));
        MPI_Datatype type = MPI_BYTE;
        int type_count = count;
        if (size_t(count) != longest) {
          MPI_Datatype contiguous;
          MPI_Type_contiguous(count, MPI_BYTE, &contiguous);
          MPI_Type_create_resized(contiguous, 0, MPI_Aint(longest), &type);
          MPI_Type_free(&contiguous);
          MPI_Type_commit(&type);
          type_count = 1;
        }
        const int code = call("MPI_Allgather", [&] {
          return MPI_Allgather(in + offset, count, MPI_BYTE, out + offset, type_count, type, data_);
        });
        if (type != MPI_BYTE) MPI_Type_free(&type);
        check(code, "MPI_Allgather", error_prefix());
      }
      return;
    }
    // Shards of different sizes: MPI_Allgatherv, whose displacements are ints.
    if (offsets.back() > INT_MAX)
      throw CommError(fmt::format(
          "{}MPI_Allgatherv: shards of different sizes gather {} bytes, more than MPI's int "
          "displacements reach; gather equal shards, or use the ring",
          error_prefix(), offsets.back()));
    std::vector<int> counts(static_cast<size_t>(n)), displacements(static_cast<size_t>(n));
    for (size_t offset = 0; offset < longest; offset += piece) {
      for (int j = 0; j < n; ++j) {
        const size_t done = std::min(offset, length(j));
        counts[size_t(j)] = int(std::min(piece, length(j) - done));
        displacements[size_t(j)] = int(offsets[size_t(j)] + int64_t(done));
      }
      const size_t mine = std::min(offset, length(rank()));
      blocking("MPI_Allgatherv", [&] {
        return MPI_Allgatherv(in + mine, counts[size_t(rank())], MPI_BYTE, out, counts.data(),
                              displacements.data(), MPI_BYTE, data_);
      });
    }
  }

  void native_reduce_scatter(const void* input, void* output, int64_t count, DType dtype,
                             ReduceOp op) override {
    wait_pending();
    const int n = size();
    const MPI_Datatype type = mpi_sum(dtype).first;
    const MPI_Op sum = mpi_sum(dtype).second;
    const int64_t esize = int64_t(dtype_size(dtype));
    const int64_t piece = std::max<int64_t>(1, int64_t(g_max_piece.load()) / esize);
    const char* in = static_cast<const char*>(input);
    char* out = static_cast<char*>(output);
    if (count <= piece) {
      blocking("MPI_Reduce_scatter_block", [&] {
        return MPI_Reduce_scatter_block(in, out, int(count), type, sum, data_);
      });
    } else {
      // Piece k of every block, packed side by side, is reduced and
      // scattered in one call: block j's piece reaches rank j.
      char* packed = static_cast<char*>(scratch(size_t(n * piece * esize)));
      for (int64_t offset = 0; offset < count; offset += piece) {
        const int64_t length = std::min(piece, count - offset);
        for (int j = 0; j < n; ++j)
          std::memcpy(packed + j * length * esize, in + (j * count + offset) * esize,
                      size_t(length * esize));
        blocking("MPI_Reduce_scatter_block", [&] {
          return MPI_Reduce_scatter_block(packed, out + offset * esize, int(length), type, sum,
                                          data_);
        });
      }
    }
    if (op == ReduceOp::kAverage) scale(output, count, dtype);
  }

  void synchronize() override { wait_pending(); }
  void abort() noexcept override {
    g_failed.store(true);
    give_up();
  }

 private:
  // Waits for the outstanding requests within the deadline; on a timeout,
  // cancels them and throws CommError naming the ranks that never answered.
  void wait_pending() {
    try {
      if (pending_.wait(timeout(), error_prefix())) return;
    } catch (...) {
      give_up();
      throw;
    }
    const std::string message = pending_.timeout_message(timeout(), error_prefix());
    give_up();
    throw CommError(message);
  }
  // Cancels what is outstanding and lets go of the collective's buffers (its
  // scratch and the caller's tensors) once no request can touch them; a
  // request that does not complete keeps them for good (keep_forever).
  void give_up() noexcept {
    if (pending_.empty() || pending_.cancel(cancel_wait(timeout()))) {
      held_.clear();
      return;
    }
    keep_forever(std::move(held_));
    held_.clear();
  }

  // One blocking MPI collective, armed with the deadline; its result code.
  template <typename Call>
  int call(const char* name, Call&& mpi_call) {
    const uint64_t armed = watchdog_.arm(error_prefix() + name + " ", timeout());
    const int code = mpi_call();
    watchdog_.disarm(armed);
    return code;
  }
  // The same, throwing CommError for an error.
  template <typename Call>
  void blocking(const char* name, Call&& mpi_call) {
    check(call(name, std::forward<Call>(mpi_call)), name, error_prefix());
  }
  // A sum becomes a mean (float32 or bfloat16, scaled in float and rounded
  // once more: an average of int64 is refused).
  void scale(void* data, int64_t n, DType dtype) const {
    const float factor = 1.0f / float(size());
    if (dtype == DType::BFloat16) {
      bfloat16* p = static_cast<bfloat16*>(data);
      for (int64_t i = 0; i < n; ++i) p[i] = bfloat16(p[i].to_float() * factor);
      return;
    }
    float* p = static_cast<float*>(data);
    for (int64_t i = 0; i < n; ++i) p[i] *= factor;
  }

  std::shared_ptr<HostChannel> channel_;
  MPI_Comm data_;
  Requests pending_;
  uint64_t posted_ = 0;
  Watchdog watchdog_;
};

}  // namespace

// ---- the job ----

namespace mpi_detail {

void ensure_initialized() {
  static std::once_flag once;
  static std::string problem;  // the thread level's, told to every caller
  std::call_once(once, [] {
    int initialized = 0;
    MPI_Initialized(&initialized);
    int provided = 0;
    if (initialized) {  // by the program itself, at a level of its choosing
      MPI_Query_thread(&provided);
    } else {
      if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS)
        throw CommError("MPI_Init_thread failed");
      MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
      std::atexit(finalize_at_exit);
    }
    // Each communicator's own thread calls MPI, as do the caller's thread and
    // the watchdog (MPI_Abort): at once, so nothing less will do.
    if (provided < MPI_THREAD_MULTIPLE)
      problem = fmt::format(
          "MPI gives thread level {}, but anvil needs MPI_THREAD_MULTIPLE (its communicators "
          "call MPI from threads of their own){}",
          thread_level_name(provided),
          initialized ? ": the program initialised MPI itself at a lower level before anvil"
                      : ": this MPI library was built without thread support");
  });
  if (!problem.empty()) throw CommError(problem);
}

void mark_failed() noexcept { g_failed.store(true); }

int world_rank() {
  ensure_initialized();
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

int world_size() {
  ensure_initialized();
  int n = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

int local_rank() {
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"})
    if (const char* v = std::getenv(name); v && *v) return std::atoi(v);
  return 0;  // a job of one process
}

void broadcast_bytes(void* data, size_t bytes, int root, std::chrono::milliseconds timeout,
                     const std::string& what) {
  ensure_initialized();
  const std::string who = fmt::format("rank {} (mpi): {}: ", world_rank(), what);
  // The broadcast goes through a buffer of its own: a collective's request
  // cannot be cancelled, so one that times out may still write later, and
  // must not write into the caller's (often a stack frame that is gone by
  // then). On a timeout the buffer is left to it, deliberately: the job is
  // failing, and a few bytes leaked beat a write into freed memory.
  auto staging = std::make_unique<std::vector<char>>(static_cast<char*>(data),
                                                     static_cast<char*>(data) + bytes);
  MPI_Request r;
  check(MPI_Ibcast(staging->data(), int(bytes), MPI_BYTE, root, MPI_COMM_WORLD, &r), "MPI_Ibcast",
        who);
  Requests one;
  one.add(r, root, true, 0);
  if (!one.wait(timeout, who)) {
    (void)staging.release();  // still the request's: see above
    throw CommError(fmt::format("{}the broadcast from rank {} did not complete within {} "
                                "(ANVIL_COMM_TIMEOUT)",
                                who, root, timeout_text(timeout)));
  }
  std::memcpy(data, staging->data(), bytes);
}

size_t set_max_message_bytes(size_t bytes) {
  if (bytes == 0 || bytes > kMaxPiece)
    throw std::invalid_argument(fmt::format(
        "set_max_message_bytes: {} is not in 1..{} (MPI counts are ints)", bytes, kMaxPiece));
  return g_max_piece.exchange(bytes);
}

std::shared_ptr<HostChannel> world_channel(std::chrono::milliseconds timeout) {
  ensure_initialized();
  return std::make_shared<MpiChannel>(timeout);
}

}  // namespace mpi_detail

std::string mpi_missing_reason() { return ""; }

bool mpi_started() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  return initialized != 0;
}
int mpi_rank() { return mpi_detail::world_rank(); }
int mpi_size() { return mpi_detail::world_size(); }

std::unique_ptr<Communicator> mpi_world(CommOptions options) {
  mpi_detail::ensure_initialized();
  mpi_detail::install_sigterm_handler();
  try {
    return std::make_unique<Communicator>(std::make_unique<MpiTransport>(options.timeout),
                                          options);
  } catch (...) {
    mpi_detail::mark_failed();  // no MPI_Finalize at exit: mpirun ends the job
    throw;
  }
}

}  // namespace anvil::parallel
