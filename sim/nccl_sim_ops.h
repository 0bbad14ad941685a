// Internal to the simulated NCCL (sim/nccl_sim.cpp, sim/nccl_sim_collectives.cpp):
// one rank's operation as the simulator keeps it, and the data movement of
// the collectives once every rank's part has reached the head of its stream.
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "sim/nccl_sim.h"

namespace anvil_sim_nccl::detail {

struct Clique;  // sim/nccl_sim.cpp
struct Item;    // sim/nccl_sim.cpp
struct Remote;  // sim/nccl_sim_remote.cpp

struct CommState {
  std::shared_ptr<Clique> clique;
  int rank = 0;
  int nranks = 0;
  int device = 0;
  bool blocking = true;
  bool aborted = false;        // ncclCommAbort or ncclCommDestroy: operations complete empty
  bool finalizing = false;     // ncclCommFinalize: in progress until no operation is left
  bool group_told = true;      // a non-blocking ncclGroupEnd's "in progress" has been reported
  ncclResult_t error = ncclSuccess;  // the asynchronous error, once one happened
  uint64_t collectives = 0;          // numbers given so far
  std::map<int, uint64_t> sends_to, recvs_from;
  int64_t pending = 0;  // operations issued and not complete
  // Set when the clique's ranks are processes (sim/nccl_sim_remote.cpp): its
  // operations meet through files, not the clique's tables.
  std::shared_ptr<Remote> remote;
  ncclUniqueId id{};  // the clique's
  uint64_t splits = 0;  // ncclCommSplit calls so far (the owning thread's)
};

struct Op {
  enum Kind { kSend, kRecv, kAllReduce, kBroadcast, kAllGather, kReduceScatter } kind = kSend;
  std::shared_ptr<CommState> comm;
  const void* src = nullptr;
  void* dst = nullptr;
  // NCCL's count: elements per rank for send, receive, all-reduce and
  // broadcast; all-gather's sendcount and reduce-scatter's recvcount.
  size_t count = 0;
  ncclDataType_t dtype = ncclFloat32;
  ncclRedOp_t redop = ncclSum;
  int peer = -1;  // send, receive
  int root = -1;  // broadcast
  uint64_t number = 0;
  bool done = false;
  bool published = false;  // remote: this rank's part is in its file
  std::weak_ptr<Item> item;

  bool collective() const { return kind != kSend && kind != kRecv; }
  // What the operation reads from src and writes to dst, in bytes (0: that
  // buffer is not used: a broadcast's src on ranks but the root).
  size_t src_bytes() const;
  size_t dst_bytes() const;
};
using OpPtr = std::shared_ptr<Op>;

// Records `detail` as the calling thread's last error (ncclGetLastError)
// and returns `code`.
ncclResult_t fail(ncclResult_t code, std::string detail);

size_t dtype_bytes(ncclDataType_t t);
const char* op_name(Op::Kind k);

// Moves a collective's data once every rank's operation (ops[r] is rank r's)
// is at the head of its stream. Throws std::runtime_error, naming the ranks,
// when they disagree (kind, count, type, operation, root); nothing is
// written then.
void run_collective(const std::vector<OpPtr>& ops);

// Ranks that are processes (one per rank, as under mpirun; sim/nccl_sim_remote.cpp).
// Each process has its own simulated devices, so their operations meet
// through files in a directory of /dev/shm named by the unique id, which
// holds the id's creator's process id: a rank whose process did not make the
// id is remote, and so is every rank of a clique whose directory exists.
// Whether `id` was made in another process, or ranks of other processes have
// joined it.
bool remote_clique(const ncclUniqueId& id);
// This rank joins the clique's directory.
std::shared_ptr<Remote> remote_join(const ncclUniqueId& id, int rank, int nranks);
// How many ranks have joined.
int remote_joined(const Remote& r);
// Moves op's data once its partners (or every rank of its collective) have
// put theirs in their files: true when it is complete. Throws
// std::runtime_error, naming the ranks, for a mismatch. The caller holds no lock.
bool remote_progress(Op& op);
// This rank leaves; the last to leave removes the directory.
void remote_leave(const Remote& r);
// Removes the directories of cliques whose creating process no longer runs
// and that have not changed for idle_seconds (a crashed job leaves its
// directory behind). ncclGetUniqueId calls it.
void remote_sweep(int64_t idle_seconds = 60);

}  // namespace anvil_sim_nccl::detail

// The handle NCCL calls ncclComm_t.
struct anvil_sim_nccl::ncclComm {
  std::shared_ptr<anvil_sim_nccl::detail::CommState> state;
};
