// Communicators and collectives: how ranks (GPUs, or processes) exchange
// tensors to train one model together (docs/parallel.md).
//
// A Communicator is one rank's end of a group of `size()` ranks. Every rank
// calls the same collectives in the same order with matching arguments;
// each call checks that first (a rank that asks for something else, or never
// comes, is named in the error) and then moves the data. The collectives are
// anvil's own, written once on grouped point-to-point sends and receives
// (parallel/collectives.cpp, parallel/allreduce.cpp), or, asked for by
// Algorithm::kNative, the transport's own; over one of two transports:
//   - NCCL, for CUDA tensors: one rank per GPU, as threads of one process
//     (nccl_communicator) or as processes started by mpirun (nccl_world). In
//     the simulator build the same code runs on simulated NCCL (sim/).
//   - MPI, for CPU tensors: one rank per process (mpi_world), on one machine
//     or several (`mpirun --hostfile`).
// A build without MPI or NCCL still links; asking for the missing one throws
// an error that says how to get it. A communicator splits into groups of its
// ranks (split; parallel/mesh.h makes a dp × pp × tp mesh of them), and two
// of its ranks exchange tensors point to point (send, recv, sendrecv).
//
// Ordering. On a GPU a collective is asynchronous, like a kernel: it starts
// after the work already issued on the tensor's device (its compute stream),
// and work issued there afterwards sees its result. Nothing waits on the
// host until synchronize(). On the CPU (MPI) a collective returns when done.
//
// Faults. Every wait on another rank has a deadline (CommOptions::timeout;
// ANVIL_COMM_TIMEOUT seconds in the environment, default 300). A rank that
// disagrees or does not answer makes the others throw CommError naming the
// collective and that rank; an NCCL communicator then aborts, and a
// communicator that has failed refuses further calls. A host that waits
// outside parallel/ behind a collective (an event, a copy) is covered too:
// each NCCL communicator's watchdog thread aborts it when a collective in
// flight passes its deadline or NCCL reports an error (parallel/watchdog.h).
// ANVIL_COMM_DEBUG=INFO prints every collective (comm_debug()); the chunk
// size is part of what ranks must agree on.
#pragma once
#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "core/tensor.h"

namespace anvil::parallel {

// A failed collective: a timeout, ranks that disagree, a transport error.
// The text names this rank, the collective and the rank(s) at fault.
class CommError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Another rank's failure, as this rank sees it: thread ranks share a board
// (parallel/transport.h), so a rank that fails ends the others' waits at once,
// each with this error. rank() is the failed rank's world rank, and the text
// names it and its error: "<this rank>: <call>: another rank failed (world
// rank 1): <its error>". A rank's own errors (a timeout, a mismatch) are
// plain CommErrors: among the errors of a job's ranks, the first that is not
// a PeerFailed is the cause.
class PeerFailed : public CommError {
 public:
  PeerFailed(const std::string& message, int rank) : CommError(message), rank_(rank) {}
  int rank() const noexcept { return rank_; }

 private:
  int rank_;
};

enum class ReduceOp : uint8_t { kSum, kAverage };

// The collectives' algorithms, chosen by name wherever one is used:
//   ring    anvil's own, the default: for all-reduce, reduce-scatter then
//           all-gather, n-1 steps each, chunked so that each chunk's transfer
//           overlaps the reduction of the chunk before (CommOptions::chunk_bytes;
//           0 = whole segments); reduce-scatter and all-gather are its two
//           halves; broadcast is a chunked pipeline down the chain of ranks
//   naive   all-reduce only, the seeds' way: every rank sends to rank 0,
//           which adds and sends the sum back
//   native  the transport's own: ncclAllReduce, ncclBroadcast, ncclAllGather,
//           ncclReduceScatter; MPI_Allreduce, MPI_Bcast, MPI_Allgather(v),
//           MPI_Reduce_scatter_block. For comparison, until a GPU has
//           measured both (docs/parallel.md).
enum class Algorithm : uint8_t { kRing, kNaive, kNative };
// "ring", "naive", "native"; anything else throws std::invalid_argument listing them.
Algorithm parse_algorithm(std::string_view name);
std::string_view algorithm_name(Algorithm algorithm);

// ANVIL_COMM_TIMEOUT (seconds, may be fractional) or 300 s. A value that is
// not a positive number throws std::invalid_argument naming the variable.
std::chrono::milliseconds default_timeout();

// ANVIL_COMM_DEBUG=INFO (as NCCL_DEBUG): every collective prints one line on
// stderr when its call returns: rank, backend and device, the collective and
// its number, algorithm, dtype and shape, bytes, and the host's time in the
// call (on a GPU the time to issue it; the device finishes later). Unset,
// empty or OFF: nothing. Anything else throws std::invalid_argument naming
// the variable.
bool comm_debug();

// ANVIL_COMM_CHECK=OFF (as TORCH_DISTRIBUTED_DEBUG, the other way round):
// no per-call agreement before all-reduce, broadcast and reduce-scatter
// (CommOptions::check_calls). Unset, empty or ON: the check. Anything else
// throws std::invalid_argument naming the variable.
bool comm_check_default();

struct CommOptions {
  std::chrono::milliseconds timeout = default_timeout();
  // The ring's pipeline: each step moves a rank's segment in chunks of about
  // this many bytes, so that one chunk's transfer overlaps the reduction of
  // the one before. 0 moves whole segments (the textbook ring).
  size_t chunk_bytes = size_t{1} << 20;
  // Before each all-reduce, broadcast and reduce-scatter, every rank's call
  // (collective, number, dtype, shape, root, chunk size) is compared with
  // every other's, over the host channel, so that a mismatch stops every
  // rank with one message instead of a hang or a silently wrong exchange.
  // Off saves one small exchange per call (docs/parallel.md measures it);
  // scatter, all-gather and barrier exchange anyway (the answer carries the
  // shapes). Must be the same on every rank.
  bool check_calls = comm_check_default();
};

class Transport;  // parallel/transport.h
struct CallInfo;  // parallel/transport.h
struct PeerCall;  // parallel/transport.h
struct InFlight;  // parallel/transport.h

// A collective in flight (allreduce_async).
class Work {
 public:
  virtual ~Work() = default;
  // Work issued afterwards on the tensor's device sees the result: on a GPU
  // the device waits, not the host; over MPI the host waits. Rethrows the
  // collective's failure. Call it once; until then the tensor must not be
  // used or freed (the Work keeps it alive).
  virtual void wait() = 0;
};

class Communicator {
 public:
  Communicator(std::unique_ptr<Transport> transport, CommOptions options);
  ~Communicator();  // waits (within the timeout) for issued work; aborts after a failure
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const;
  int size() const;
  Device device() const;            // cpu for MPI, cuda:N for NCCL
  std::string_view backend() const;  // "mpi" or "nccl"
  CommOptions options() const;
  void set_chunk_bytes(size_t bytes) { chunk_bytes_.store(bytes); }
  // CommOptions::check_calls, from the next call on (every rank alike).
  void set_check_calls(bool on) { check_calls_.store(on); }
  // Collectives issued so far (each one's number appears in its errors), and
  // how many of them exchanged their call with the other ranks first.
  uint64_t collectives() const { return seq_.load(); }
  uint64_t checked_calls() const { return checked_.load(); }
  // The data bytes this rank has sent to the others so far (the ring's and
  // the chains' pieces, point-to-point sends; not the agreement's messages,
  // nor the native collectives', whose traffic is the backend's): what a
  // step costs on the wire. On a GPU, counted when issued.
  uint64_t bytes_sent() const;

  // ---- collectives: every rank calls them, in the same order ----
  // In place: every rank's `tensor` becomes the elementwise sum (or mean) of
  // all ranks' tensors. float32 (sum, average), bfloat16 (sum, average) or
  // int64 (sum). bfloat16 travels as bfloat16 (half float32's bytes) but is
  // added in float32: each ring step widens the chunk it receives, adds it
  // to its own partial sum in float32 and rounds the result to bfloat16 once,
  // as it stores it to send it on. n ranks: n-1 such roundings, so each
  // element is within g(n-1) * sum_r |x_r| of the exact sum of the bfloat16
  // inputs, g(m) = m u / (1 - m u), u = 2^-8 (docs/parallel.md, "Gradients
  // in bfloat16");
  // native (ncclBfloat16; over MPI, MPI_UINT16_T with an operation that adds
  // in float) has the same bound for sums, one rounding more for the
  // average. For a given rank count, the ring's result is bitwise the same
  // on every rank and from run to run. `fingerprint` says which tensor this is, beyond its dtype
  // and shape (DataParallel: a hash of the bucket's parameters); 0 says
  // nothing. Ranks whose fingerprints differ are refused at the agreement,
  // naming both: same-shaped tensors (a BatchNorm weight and its bias) would
  // otherwise be summed with each other.
  void allreduce(const Tensor& tensor, ReduceOp op = ReduceOp::kSum,
                 Algorithm algorithm = Algorithm::kRing, uint64_t fingerprint = 0);
  // The same, returning at once: the reduction runs while the caller goes on
  // (on a GPU, on the communicator's streams; over MPI, on the
  // communicator's own thread) until Work::wait(). Calls are still made, and
  // run, in order.
  std::shared_ptr<Work> allreduce_async(const Tensor& tensor, ReduceOp op = ReduceOp::kSum,
                                        Algorithm algorithm = Algorithm::kRing,
                                        uint64_t fingerprint = 0);
  // In place: every rank's `tensor` becomes root's. The ring passes it down a
  // chain of ranks from the root in chunks (a pipeline: ~ (n - 2 + chunks)
  // steps); native is ncclBroadcast / MPI_Bcast. Naive is refused.
  void broadcast(const Tensor& tensor, int root, Algorithm algorithm = Algorithm::kRing);
  // Root's `input` split along dim 0 as evenly as possible (the first
  // rows % n ranks get one row more, as torch.tensor_split); returns this
  // rank's part. `input` is read on the root only (elsewhere it may be an
  // undefined Tensor): every rank learns the shape from the root.
  Tensor scatter(const Tensor& input, int root);
  // Every rank's `input` (same shape) summed (or averaged), and split along
  // dim 0 as scatter splits; returns this rank's part. Native
  // (ncclReduceScatter, MPI_Reduce_scatter_block) gives every rank the same
  // count: its rows must divide evenly by the rank count (std::invalid_argument
  // otherwise). Naive is refused.
  Tensor reduce_scatter(const Tensor& input, ReduceOp op = ReduceOp::kSum,
                        Algorithm algorithm = Algorithm::kRing);
  // Every rank's `shard` concatenated along dim 0 in rank order. Shards may
  // differ in their first dimension; the rest of the shape must agree.
  // Native: ncclAllGather / MPI_Allgather for equal shards, a group of
  // ncclBroadcast / MPI_Allgatherv for others. Naive is refused.
  Tensor all_gather(const Tensor& shard, Algorithm algorithm = Algorithm::kRing);
  // Returns once every rank has called it (a collective of nothing).
  void barrier();

  // ---- groups ----
  // The color of a rank that joins no group (MPI_UNDEFINED, NCCL_SPLIT_NOCOLOR).
  static constexpr int kNoColor = -1;
  // A collective: every rank of this communicator calls it at the same point.
  // The ranks that pass the same color (>= 0) form a new communicator, ranked
  // by key, ties by their rank here (MPI_Comm_split, ncclCommSplit); a rank
  // that passes kNoColor gets null. The group has this communicator's backend,
  // device and options (deadline, chunk size, per-call check), and its own
  // agreement, numbering and failure: a group's failure does not break its
  // parent, nor the parent's its groups; but a rank's failure told to the
  // parent's other ranks (thread ranks' board: abort(), or a failed call)
  // ends their waits in the groups too, with PeerFailed naming it, as in the
  // parent. `name` says what the group is for
  // ("dp"): its ranks call themselves "dp group 1 of 2, rank 0 of 2 (...,
  // world rank 2)" in errors and in ANVIL_COMM_DEBUG's lines, where groups
  // are numbered in the order of their colors. Over MPI the split is
  // MPI_Comm_split, over NCCL ncclCommSplit, on one rank a group of one.
  std::unique_ptr<Communicator> split(int color, int key, const std::string& name = "");

  // ---- point to point ----
  // `tensor` to rank `peer`, which calls recv for it (or sendrecv). The two
  // ends agree first, as the collectives do (CommOptions::check_calls): both
  // post what they are about to move to each other and compare, so that a
  // send that meets a receive of another dtype or shape, or another send,
  // stops both ranks with one error naming both, the dtype and the shape,
  // instead of a hang or a garbled tensor; a peer that never posts is named
  // at the deadline. Calls between two ranks pair in the order they are made
  // (the k-th call of a with b meets the k-th of b with a). Over NCCL,
  // ncclSend/ncclRecv on the communicator's stream, after the work issued on
  // the device, like a collective; over MPI, MPI_Isend/MPI_Irecv waited for
  // within the deadline. Not to this rank itself.
  void send(const Tensor& tensor, int peer);
  // Into `tensor` (its dtype and shape those of the send it meets) from `peer`.
  void recv(const Tensor& tensor, int peer);
  // Both at once (one NCCL group, one wait over MPI), so that ranks exchanging
  // in a ring, or two ranks exchanging with each other, do not wait on each
  // other. `to` and `from` may be the same rank.
  void sendrecv(const Tensor& send_tensor, int to, const Tensor& recv_tensor, int from);

  // The host waits until everything issued so far has finished, within the
  // timeout (a no-op for MPI, whose calls return when done).
  void synchronize();

  // Gives up: the other ranks' waits on this one end at once with `why`
  // (ranks that are threads of this process; processes end with the job),
  // work in flight is dropped (ncclCommAbort), and every later call throws.
  // For a rank whose own work failed outside a collective.
  void abort(const std::string& why);

 private:
  class CommThread;
  // Runs `body` where the transport's work is done: inline, or, for a
  // host-synchronous transport (MPI), on the communicator's thread, waiting
  // for it. Every wait inside has its deadline, so this one ends too.
  void on_comm_thread(std::function<void()> body);
  // The all-reduce's body: ends it (end()), or leaves it in flight (returned).
  std::unique_ptr<InFlight> allreduce_body(const Tensor& tensor, ReduceOp op,
                                           Algorithm algorithm, uint64_t fingerprint, bool later);
  // Numbers the call, checks that every rank asks for the same (returns what
  // each asked for), and names it for the transport's errors. A collective
  // cut in chunks sets mine.chunk_bytes from chunk_bytes_ itself, once, and
  // its algorithm uses that value: a set_chunk_bytes in between cannot make
  // the ring differ from what was agreed.
  std::vector<CallInfo> agree(CallInfo mine);
  // The same for a point-to-point call: this rank's side with each peer
  // against the peer's (agreement.cpp). Numbers the call with each peer.
  void agree_with_peers(std::vector<int> peers, std::vector<PeerCall> mine);
  // send, recv and sendrecv: `out` to `to` and/or `in` from `from` (null: none).
  void point_to_point(const char* name, const Tensor* out, int to, const Tensor* in, int from);
  // Checks a call's arguments (an error there leaves the communicator
  // usable: no other rank is involved yet), then runs its body, whose first
  // failure breaks the communicator.
  template <typename Check, typename Body>
  void run(const char* name, Check&& check, Body&& body);

  // The first error, "" while the communicator works; set by its own thread
  // or by the transport's watchdog.
  std::string failure() const;
  // Breaks the communicator with `why` unless it is already broken: aborts
  // the transport, then tells the other ranks. False if it was broken before.
  bool fail(const std::string& why);

  std::unique_ptr<Transport> transport_;
  CommOptions options_;
  bool debug_ = false;  // ANVIL_COMM_DEBUG=INFO
  // The running collective, for its ANVIL_COMM_DEBUG line (set by agree()).
  std::string debug_call_;
  size_t debug_bytes_ = 0;
  std::atomic<size_t> chunk_bytes_;
  std::atomic<bool> check_calls_;
  std::atomic<uint64_t> checked_{0};
  std::atomic<uint64_t> seq_{0};
  std::vector<uint64_t> peer_calls_;  // point-to-point calls so far with each rank
  mutable std::mutex failure_mutex_;
  std::string failure_;
  std::unique_ptr<CommThread> thread_;  // host-synchronous transports only
};

// ---- making communicators ----

// Whether the build has each transport, and if not, one line saying how to
// get it (empty when present).
std::string mpi_missing_reason();
std::string nccl_missing_reason();

// Every process of the MPI job (MPI_COMM_WORLD), for CPU tensors; a program
// started without mpirun is a job of one. Initialises MPI on first use
// (thread level MPI_THREAD_MULTIPLE) and finalises it at exit.
std::unique_ptr<Communicator> mpi_world(CommOptions options = {});
// The MPI job's rank and size without making a communicator (0 and 1 when
// the build has no MPI or the program runs without mpirun); initialises MPI.
int mpi_rank();
int mpi_size();
// The rank mpirun gave this process, read from the environment without
// starting MPI (-1 when not started by an MPI launcher).
int mpi_rank_from_environment();
// Whether this process has started MPI (false in a build without MPI).
bool mpi_started();

// A group of one rank on `device` (cpu or cuda:N): a run on one device as
// data-parallel training over one replica, so callers need no second code
// path (MLX's EmptyGroup). Every collective leaves its tensor as it is
// (scatter and all_gather copy it); send and recv have no peer and throw;
// split gives another group of one (or null for kNoColor).
// backend() is "local". Nothing waits on another rank: ANVIL_COMM_TIMEOUT
// is not read.
std::unique_ptr<Communicator> one_rank_group(Device device);

// Root's text on every rank (its length, then its bytes; two broadcasts).
std::string broadcast_text(Communicator& comm, const std::string& text, int root);

// An NCCL clique's name: made once (nccl_unique_id), handed to every rank.
struct NcclId {
  std::array<char, 128> bytes{};
};
NcclId nccl_unique_id();
// One rank of `size`, on `device`, when the ranks are threads of this
// process (one host thread per GPU): every thread calls this with the same
// id. Returns once all ranks have joined, within the timeout.
std::unique_ptr<Communicator> nccl_communicator(const NcclId& id, int rank, int size,
                                                Device device, CommOptions options = {});
// One rank per process of the MPI job, on GPU cuda:<local rank> (the rank
// among the job's processes on this machine): rank 0's unique id reaches the
// others by MPI_Bcast, as nccl-tests does it.
std::unique_ptr<Communicator> nccl_world(CommOptions options = {});

}  // namespace anvil::parallel
