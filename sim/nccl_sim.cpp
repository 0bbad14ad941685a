// The simulated NCCL (see sim/nccl_sim.h for what it promises).
//
// A clique is the set of ranks sharing a unique id. Each operation a rank
// issues gets a number when its group ends: the k-th send from a to b, the
// k-th receive at b from a, the k-th collective of the clique. The clique's
// tables hold the operations still to run under those numbers, so an
// operation finds its partner (or the ranks of its collective) by number.
// A group becomes one Item per stream: the stream's queue entry, which
// progresses when the stream runs it (sim/streams.cpp): for each of its
// operations it runs the partners' streams up to their items, then moves the
// data, and reports a stall while a partner is missing.
//
// Locks: `mutex` below guards the cliques, communicators, operations and
// items' places. The streams' lock is taken first when both are held
// (Item::queued is called under it); progress() lets go of `mutex` before it
// runs other streams.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "sim/nccl_sim.h"
#include "sim/nccl_sim_ops.h"
#include "sim/sim_internal.h"

namespace {

using anvil::sim::detail::StreamRef;
using Clock = std::chrono::steady_clock;
using namespace anvil_sim_nccl::detail;

}  // namespace

struct anvil_sim_nccl::detail::Clique {
  int nranks = 0;
  int joined = 0;
  int members = 0;  // communicators not yet destroyed
  std::map<std::tuple<int, int, uint64_t>, OpPtr> sends, recvs;  // (from, to, number)
  std::map<uint64_t, std::vector<OpPtr>> collectives;            // number -> by rank
};

namespace {

struct State {
  std::mutex mutex;
  std::condition_variable joined;  // a rank joined a clique
  std::map<std::string, std::shared_ptr<Clique>> cliques;
  std::map<int, ncclResult_t> injected;  // ncclSimInjectAsyncError, by device
};
State& state() {  // leaked on purpose, like the simulator's other registries
  static auto* s = new State();
  return *s;
}

thread_local std::string t_last_error;
thread_local int t_group_depth = 0;
struct PendingOp {
  OpPtr op;
  cudaStream_t stream;
};
thread_local std::vector<PendingOp> t_group;


// Caller holds state().mutex. Completes an operation: it leaves the tables.
void finish(Op& op) {
  if (op.done) return;
  op.done = true;
  --op.comm->pending;
  Clique& c = *op.comm->clique;
  const int me = op.comm->rank;
  switch (op.kind) {
    case Op::kSend: c.sends.erase({me, op.peer, op.number}); break;
    case Op::kRecv: c.recvs.erase({op.peer, me, op.number}); break;
    default: {  // a collective
      auto it = c.collectives.find(op.number);
      if (it != c.collectives.end()) {
        it->second[size_t(me)].reset();
        if (std::none_of(it->second.begin(), it->second.end(), [](const OpPtr& p) { return p; }))
          c.collectives.erase(it);
      }
      break;
    }
  }
}

// Caller holds state().mutex. Completes every unfinished operation of a
// communicator without moving data (abort, destroy).
void finish_all(CommState& comm) {
  Clique& c = *comm.clique;
  std::vector<OpPtr> mine;
  for (auto& [key, op] : c.sends)
    if (op->comm.get() == &comm) mine.push_back(op);
  for (auto& [key, op] : c.recvs)
    if (op->comm.get() == &comm) mine.push_back(op);
  for (auto& [number, ops] : c.collectives)
    for (auto& op : ops)
      if (op && op->comm.get() == &comm) mine.push_back(op);
  for (auto& op : mine) finish(*op);
}

// Caller holds state().mutex. Whether every rank has joined c's clique; a
// rank in the process that made the id finds out here that the others are
// processes (their directory appeared), and joins them there.
bool joined_all(CommState& c) {
  if (!c.remote && c.clique->joined < c.nranks && remote_clique(c.id)) {
    try {
      c.remote = remote_join(c.id, c.rank, c.nranks);
    } catch (const std::exception& e) {
      c.error = ncclSystemError;
      t_last_error = e.what();
      return false;
    }
  }
  return c.remote ? remote_joined(*c.remote) >= c.nranks : c.clique->joined >= c.nranks;
}

}  // namespace

struct anvil_sim_nccl::detail::Item final : anvil::sim::detail::CommWork {
  std::vector<OpPtr> ops;
  StreamRef stream;  // where it was queued (guarded by state().mutex)
  uint64_t seq = 0;

  void queued(const StreamRef& s, uint64_t n) override {
    std::lock_guard lock(state().mutex);
    stream = s;
    seq = n;
  }

  bool progress() override {
    try {
      for (const OpPtr& op : ops)
        if (!progress(*op)) return false;
      return true;
    } catch (...) {
      // The item fails: its unfinished operations leave the tables, and
      // their communicators report the error.
      std::lock_guard lock(state().mutex);
      for (const OpPtr& op : ops) {
        if (op->done) continue;
        if (op->comm->error == ncclSuccess) op->comm->error = ncclInvalidUsage;
        finish(*op);
      }
      throw;
    }
  }

 private:
  // The operations `op` meets (its partner, or its collective's other ranks),
  // or an empty list while one of them is missing. Caller holds the mutex.
  static std::vector<OpPtr> partners(const Op& op) {
    Clique& c = *op.comm->clique;
    const int me = op.comm->rank;
    std::vector<OpPtr> out;
    switch (op.kind) {
      case Op::kSend:
      case Op::kRecv: {
        auto& table = op.kind == Op::kSend ? c.recvs : c.sends;
        auto it = op.kind == Op::kSend ? table.find({me, op.peer, op.number})
                                       : table.find({op.peer, me, op.number});
        if (it != table.end()) out.push_back(it->second);
        break;
      }
      default: {  // a collective: every rank's operation of its number
        auto it = c.collectives.find(op.number);
        if (it == c.collectives.end()) break;
        for (const OpPtr& p : it->second) {
          if (!p) return {};
          out.push_back(p);
        }
        break;
      }
    }
    return out;
  }

  bool progress(Op& op) {
    if (op.comm->remote) {  // ranks in other processes: through files
      {
        std::lock_guard lock(state().mutex);
        if (op.done) return true;
        if (op.comm->aborted) {
          finish(op);
          return true;
        }
      }
      if (!remote_progress(op)) return false;
      std::lock_guard lock(state().mutex);
      finish(op);
      return true;
    }
    std::vector<std::pair<StreamRef, uint64_t>> places;  // the partners' items
    {
      std::lock_guard lock(state().mutex);
      if (op.done) return true;
      if (op.comm->aborted) {
        finish(op);
        return true;
      }
      const std::vector<OpPtr> group = partners(op);
      if (group.empty()) return false;  // a partner has not issued its part yet
      for (const OpPtr& p : group) {
        auto item = p->item.lock();
        if (!item || !item->stream) return false;  // issued, not queued yet
        if (item.get() != this) places.emplace_back(item->stream, item->seq);
      }
    }
    for (const auto& [s, seq] : places)
      if (!anvil::sim::detail::run_before(s, seq)) return false;

    std::lock_guard lock(state().mutex);
    if (op.done) return true;  // a partner's abort or an earlier transfer finished it
    std::vector<OpPtr> group = partners(op);
    if (group.empty()) return false;  // a partner was aborted meanwhile: it never comes
    if (op.collective()) {
      try {
        run_collective(group);
      } catch (...) {
        for (const OpPtr& p : group) {
          p->comm->error = ncclInvalidUsage;
          finish(*p);
        }
        throw;
      }
      for (const OpPtr& p : group) finish(*p);
      return true;
    }
    Op& send = op.kind == Op::kSend ? op : *group.front();
    Op& recv = op.kind == Op::kRecv ? op : *group.front();
    const size_t send_bytes = send.count * dtype_bytes(send.dtype);
    const size_t recv_bytes = recv.count * dtype_bytes(recv.dtype);
    if (send_bytes != recv_bytes) {
      send.comm->error = recv.comm->error = ncclInvalidUsage;
      const std::string what = "simulated NCCL: ncclSend #" + std::to_string(send.number) +
                               " of " + std::to_string(send_bytes) + " bytes from rank " +
                               std::to_string(send.comm->rank) + " meets ncclRecv of " +
                               std::to_string(recv_bytes) + " bytes at rank " +
                               std::to_string(recv.comm->rank);
      finish(send);
      finish(recv);
      throw std::runtime_error(what);
    }
    if (send_bytes) std::memcpy(recv.dst, send.src, send_bytes);
    finish(send);
    finish(recv);
    return true;
  }
};

ncclResult_t anvil_sim_nccl::detail::fail(ncclResult_t code, std::string detail) {
  t_last_error = std::move(detail);
  return code;
}

namespace {

std::string id_key(const ncclUniqueId& id) { return std::string(id.internal, sizeof id.internal); }

CommState* live(ncclComm_t comm);

}  // namespace

namespace {
CommState* live(ncclComm_t comm) { return comm ? comm->state.get() : nullptr; }

// Checks one operation before it is queued; "" when it is fine. `stream_dev`
// is the stream's device (-1: unknown), asked before state().mutex is taken,
// since the streams' lock comes first in the lock order.
std::string check_op(const Op& op, int stream_dev, const char* api) {
  const CommState& c = *op.comm;
  const std::string who = std::string(api) + " (rank " + std::to_string(c.rank) + ")";
  if (c.aborted) return who + ": the communicator was aborted";
  if (!joined_all(const_cast<CommState&>(c)))
    return who + ": the communicator is still being created (poll ncclCommGetAsyncError "
                 "until ncclSuccess)";
  if (!c.blocking && !c.group_told)
    return who + ": the previous ncclGroupEnd answered ncclInProgress and "
                 "ncclCommGetAsyncError has not yet said ncclSuccess";
  if (dtype_bytes(op.dtype) == 0) return who + ": unknown data type";
  if (!op.collective() && (op.peer < 0 || op.peer >= c.nranks))
    return who + ": peer " + std::to_string(op.peer) + " is not a rank of a communicator of " +
           std::to_string(c.nranks);
  if (op.kind == Op::kBroadcast && (op.root < 0 || op.root >= c.nranks))
    return who + ": root " + std::to_string(op.root) + " is not a rank of a communicator of " +
           std::to_string(c.nranks);
  const int sd = stream_dev;
  if (sd < 0) return who + ": unknown stream";
  if (sd != c.device)
    return who + ": the stream belongs to cuda:" + std::to_string(sd) +
           ", the communicator to cuda:" + std::to_string(c.device);
  const std::pair<const void*, size_t> buffers[] = {{op.src, op.src_bytes()},
                                                    {op.dst, op.dst_bytes()}};
  for (const auto& [p, bytes] : buffers) {
    if (bytes == 0) continue;
    if (p == nullptr) return who + ": a buffer of " + std::to_string(bytes) + " bytes is null";
    if (anvil::sim::detail::device_of(p) != c.device)
      return who + ": a buffer is not memory of cuda:" + std::to_string(c.device);
    if (anvil::sim::detail::check_memset(api, const_cast<void*>(p), bytes) != cudaSuccess) {
      (void)cudaGetLastError();
      return who + ": " + anvil::sim::last_error_detail();
    }
  }
  // Overlapping buffers are in place only at NCCL's one offset: anything else
  // is undefined on a GPU.
  if (op.kind == Op::kAllGather || op.kind == Op::kReduceScatter) {
    const auto* s = static_cast<const char*>(op.src);
    const auto* d = static_cast<const char*>(op.dst);
    const size_t block = op.count * dtype_bytes(op.dtype);
    const bool overlap = block > 0 && s < d + op.dst_bytes() && d < s + op.src_bytes();
    const bool in_place = op.kind == Op::kAllGather ? s == d + size_t(c.rank) * block
                                                    : d == s + size_t(c.rank) * block;
    if (overlap && !in_place)
      return who + ": sendbuff and recvbuff overlap but are not in place (" +
             (op.kind == Op::kAllGather ? "sendbuff must be recvbuff + rank * sendcount"
                                        : "recvbuff must be sendbuff + rank * recvcount") +
             ")";
  }
  return "";
}

// Gives the group's operations their numbers, queues one item per stream, and
// answers for a non-blocking communicator "in progress" once.
ncclResult_t submit(std::vector<PendingOp> group) {
  for (const PendingOp& p : group) {
    std::string problem;
    const int stream_dev = anvil::sim::detail::stream_device(p.stream);
    {
      std::lock_guard lock(state().mutex);
      problem = check_op(*p.op, stream_dev, op_name(p.op->kind));
    }
    if (!problem.empty())
      return fail(problem.find("aborted") != std::string::npos ? ncclInvalidUsage
                                                               : ncclInvalidArgument,
                  problem);
  }
  std::vector<std::pair<cudaStream_t, std::shared_ptr<Item>>> items;
  bool in_progress = false;
  {
    std::lock_guard lock(state().mutex);
    for (const PendingOp& p : group) {
      auto it = std::find_if(items.begin(), items.end(),
                             [&](const auto& e) { return e.first == p.stream; });
      if (it == items.end()) {
        items.emplace_back(p.stream, std::make_shared<Item>());
        it = items.end() - 1;
      }
      Op& op = *p.op;
      CommState& c = *op.comm;
      Clique& clique = *c.clique;
      op.item = it->second;
      switch (op.kind) {
        case Op::kSend:
          op.number = c.sends_to[op.peer]++;
          clique.sends[{c.rank, op.peer, op.number}] = p.op;
          break;
        case Op::kRecv:
          op.number = c.recvs_from[op.peer]++;
          clique.recvs[{op.peer, c.rank, op.number}] = p.op;
          break;
        default: {  // a collective: the clique's next number
          op.number = c.collectives++;
          auto& slots = clique.collectives[op.number];
          slots.resize(size_t(c.nranks));
          slots[size_t(c.rank)] = p.op;
          break;
        }
      }
      ++c.pending;
      it->second->ops.push_back(p.op);
      if (!c.blocking) {
        c.group_told = false;
        in_progress = true;
      }
    }
  }
  for (auto& [stream, item] : items) anvil::sim::detail::enqueue_comm(stream, item);
  return in_progress ? ncclInProgress : ncclSuccess;
}

ncclResult_t issue(OpPtr op, cudaStream_t stream) {
  if (t_group_depth > 0) {
    t_group.push_back({std::move(op), stream});
    return ncclSuccess;
  }
  return submit({{std::move(op), stream}});
}

}  // namespace

namespace anvil_sim_nccl {

const char* ncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "a CUDA call failed";
    case ncclSystemError: return "a system call failed";
    case ncclInternalError: return "internal error of the simulated NCCL";
    case ncclInvalidArgument: return "invalid argument";
    case ncclInvalidUsage: return "invalid usage";
    case ncclRemoteError: return "a remote rank failed";
    case ncclInProgress: return "operation in progress";
    default: return "unknown result code";
  }
}

const char* ncclGetLastError(ncclComm_t) { return t_last_error.c_str(); }

ncclResult_t ncclGetVersion(int* version) {
  if (!version) return fail(ncclInvalidArgument, "ncclGetVersion: null pointer");
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  if (!id) return fail(ncclInvalidArgument, "ncclGetUniqueId: null pointer");
  static std::atomic<uint64_t> counter{0};
  static const uint64_t salt = std::random_device{}();
  std::memset(id->internal, 0, sizeof id->internal);
  // The creator's process id: a rank in another process joins through files
  // (sim/nccl_sim_remote.cpp).
  const uint64_t words[3] = {salt, ++counter, uint64_t(::getpid())};
  std::memcpy(id->internal, words, sizeof words);
  remote_sweep();
  return ncclSuccess;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank,
                                    ncclConfig_t* config) {
  if (!comm) return fail(ncclInvalidArgument, "ncclCommInitRank: null communicator pointer");
  *comm = nullptr;
  if (nranks < 1 || rank < 0 || rank >= nranks)
    return fail(ncclInvalidArgument, "ncclCommInitRank: rank " + std::to_string(rank) +
                                         " of " + std::to_string(nranks));
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return fail(ncclUnhandledCudaError, "cudaGetDevice");
  auto c = std::make_shared<CommState>();
  c->rank = rank;
  c->nranks = nranks;
  c->device = device;
  c->blocking = !(config && config->blocking == 0);
  c->id = id;
  try {
    if (remote_clique(id)) c->remote = remote_join(id, rank, nranks);
  } catch (const std::exception& e) {
    return fail(ncclSystemError, std::string("ncclCommInitRank: ") + e.what());
  }
  std::shared_ptr<Clique> clique;
  {
    std::lock_guard lock(state().mutex);
    auto& slot = state().cliques[id_key(id)];
    if (!slot) {
      slot = std::make_shared<Clique>();
      slot->nranks = nranks;
    }
    clique = slot;
    if (clique->nranks != nranks)
      return fail(ncclInvalidUsage, "ncclCommInitRank: rank " + std::to_string(rank) +
                                        " says " + std::to_string(nranks) +
                                        " ranks, another said " + std::to_string(clique->nranks));
    ++clique->joined;
    ++clique->members;
    c->clique = clique;
  }
  state().joined.notify_all();
  *comm = new ncclComm{c};
  if (!c->blocking) {
    std::lock_guard lock(state().mutex);
    return joined_all(*c) ? ncclSuccess : ncclInProgress;
  }
  // Blocking: wait for every rank, as ncclCommInitRank does (bounded here;
  // ranks in other processes are looked for every 10 ms).
  std::unique_lock lock(state().mutex);
  const char* env = std::getenv("ANVIL_SIM_STALL_TIMEOUT");
  const double seconds = env && *env ? std::atof(env) : 300.0;
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(seconds));
  bool joined = false;
  while (!(joined = joined_all(*c)) && Clock::now() < deadline)
    state().joined.wait_for(lock, std::chrono::milliseconds(10));
  if (!joined) {
    c->error = ncclSystemError;
    return fail(ncclSystemError, "ncclCommInitRank: only " + std::to_string(clique->joined) +
                                     " of " + std::to_string(nranks) + " ranks joined");
  }
  return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
  return ncclCommInitRankConfig(comm, nranks, id, rank, nullptr);
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* async_error) {
  CommState* c = live(comm);
  if (!c || !async_error) return fail(ncclInvalidArgument, "ncclCommGetAsyncError: null argument");
  std::lock_guard lock(state().mutex);
  if (auto it = state().injected.find(c->device);
      c->error == ncclSuccess && it != state().injected.end())
    c->error = it->second;
  if (c->error != ncclSuccess) {
    *async_error = c->error;
  } else if (!joined_all(*c)) {
    *async_error = ncclInProgress;
  } else if (!c->group_told) {
    c->group_told = true;
    *async_error = ncclInProgress;
  } else if (c->finalizing && c->pending > 0) {
    *async_error = ncclInProgress;
  } else {
    *async_error = ncclSuccess;
  }
  return ncclSuccess;
}

ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  CommState* c = live(comm);
  if (!c) return fail(ncclInvalidArgument, "ncclCommFinalize: null communicator");
  std::lock_guard lock(state().mutex);
  c->finalizing = true;
  return c->blocking || c->pending == 0 ? ncclSuccess : ncclInProgress;
}

namespace {
ncclResult_t release(ncclComm_t comm, const char* api) {
  CommState* c = live(comm);
  if (!c) return fail(ncclInvalidArgument, std::string(api) + ": null communicator");
  std::shared_ptr<Remote> remote;
  {
    std::lock_guard lock(state().mutex);
    c->aborted = true;
    remote = c->remote;
    finish_all(*c);
    if (--c->clique->members == 0) {
      for (auto it = state().cliques.begin(); it != state().cliques.end(); ++it)
        if (it->second == c->clique) {
          state().cliques.erase(it);
          break;
        }
    }
  }
  delete comm;
  if (remote) remote_leave(*remote);
  anvil::sim::detail::wake_streams();  // streams stalled at its operations run on
  return ncclSuccess;
}
}  // namespace

ncclResult_t ncclCommDestroy(ncclComm_t comm) { return release(comm, "ncclCommDestroy"); }
ncclResult_t ncclCommAbort(ncclComm_t comm) { return release(comm, "ncclCommAbort"); }

ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  if (!live(comm) || !count) return fail(ncclInvalidArgument, "ncclCommCount: null argument");
  *count = comm->state->nranks;
  return ncclSuccess;
}
ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device) {
  if (!live(comm) || !device) return fail(ncclInvalidArgument, "ncclCommCuDevice: null argument");
  *device = comm->state->device;
  return ncclSuccess;
}
ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  if (!live(comm) || !rank) return fail(ncclInvalidArgument, "ncclCommUserRank: null argument");
  *rank = comm->state->rank;
  return ncclSuccess;
}

ncclResult_t ncclGroupStart() {
  ++t_group_depth;
  return ncclSuccess;
}

ncclResult_t ncclGroupEnd() {
  if (t_group_depth == 0) return fail(ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
  if (--t_group_depth > 0) return ncclSuccess;
  return submit(std::exchange(t_group, {}));
}

namespace {
// The operation a call issues: its kind, communicator, buffers, count and type.
std::shared_ptr<Op> new_op(Op::Kind kind, ncclComm_t comm, const void* src, void* dst,
                           size_t count, ncclDataType_t dtype) {
  auto op = std::make_shared<Op>();
  op->kind = kind;
  op->comm = comm->state;
  op->src = src;
  op->dst = dst;
  op->count = count;
  op->dtype = dtype;
  return op;
}
}  // namespace

ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream) {
  if (!live(comm)) return fail(ncclInvalidArgument, "ncclSend: null communicator");
  auto op = new_op(Op::kSend, comm, sendbuff, nullptr, count, datatype);
  op->peer = peer;
  return issue(std::move(op), stream);
}

ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream) {
  if (!live(comm)) return fail(ncclInvalidArgument, "ncclRecv: null communicator");
  auto op = new_op(Op::kRecv, comm, nullptr, recvbuff, count, datatype);
  op->peer = peer;
  return issue(std::move(op), stream);
}

ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream) {
  if (!live(comm)) return fail(ncclInvalidArgument, "ncclAllReduce: null communicator");
  auto o = new_op(Op::kAllReduce, comm, sendbuff, recvbuff, count, datatype);
  o->redop = op;
  return issue(std::move(o), stream);
}

ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, int root, ncclComm_t comm,
                           cudaStream_t stream) {
  if (!live(comm)) return fail(ncclInvalidArgument, "ncclBroadcast: null communicator");
  // sendbuff is read on the root only.
  auto o = new_op(Op::kBroadcast, comm, sendbuff, recvbuff, count, datatype);
  o->root = root;
  return issue(std::move(o), stream);
}

ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
  if (!live(comm)) return fail(ncclInvalidArgument, "ncclAllGather: null communicator");
  return issue(new_op(Op::kAllGather, comm, sendbuff, recvbuff, sendcount, datatype), stream);
}

ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                               ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                               cudaStream_t stream) {
  if (!live(comm)) return fail(ncclInvalidArgument, "ncclReduceScatter: null communicator");
  auto o = new_op(Op::kReduceScatter, comm, sendbuff, recvbuff, recvcount, datatype);
  o->redop = op;
  return issue(std::move(o), stream);
}

// ---- test hooks ----

namespace {
// An item that stalls its stream until released: a kernel that never ends,
// as far as the work queued behind it can tell.
struct Hold final : anvil::sim::detail::CommWork {
  std::atomic<bool> released{false};
  void queued(const StreamRef&, uint64_t) override {}
  bool progress() override { return released.load(); }
};
std::mutex g_holds_mutex;
std::map<uint64_t, std::shared_ptr<Hold>> g_holds;
uint64_t g_next_hold = 0;
}  // namespace

uint64_t ncclSimHoldStream(cudaStream_t stream) {
  auto hold = std::make_shared<Hold>();
  if (!anvil::sim::detail::enqueue_comm(stream, hold)) return 0;
  std::lock_guard lock(g_holds_mutex);
  g_holds[++g_next_hold] = hold;
  return g_next_hold;
}

void ncclSimReleaseStream(uint64_t hold) {
  {
    std::lock_guard lock(g_holds_mutex);
    auto it = g_holds.find(hold);
    if (it == g_holds.end()) return;
    it->second->released.store(true);
    g_holds.erase(it);
  }
  anvil::sim::detail::wake_streams();
}

void ncclSimInjectAsyncError(int device, ncclResult_t error) {
  std::lock_guard lock(state().mutex);
  if (error == ncclSuccess) state().injected.erase(device);
  else state().injected[device] = error;
}

}  // namespace anvil_sim_nccl
