// Internal to the simulated NCCL (sim/nccl_sim.cpp, sim/nccl_sim_collectives.cpp):
// one rank's operation as the simulator keeps it, and the data movement of
// the collectives once every rank's part has reached the head of its stream.
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "sim/nccl_sim.h"

namespace anvil_sim_nccl::detail {

struct Clique;  // sim/nccl_sim.cpp
struct Item;    // sim/nccl_sim.cpp

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
  std::weak_ptr<Item> item;

  bool collective() const { return kind != kSend && kind != kRecv; }
  // What the operation reads from src and writes to dst, in bytes (0: that
  // buffer is not used: a broadcast's src on ranks but the root).
  size_t src_bytes() const;
  size_t dst_bytes() const;
};
using OpPtr = std::shared_ptr<Op>;

size_t dtype_bytes(ncclDataType_t t);
const char* op_name(Op::Kind k);

// Moves a collective's data once every rank's operation (ops[r] is rank r's)
// is at the head of its stream. Throws std::runtime_error, naming the ranks,
// when they disagree (kind, count, type, operation, root); nothing is
// written then.
void run_collective(const std::vector<OpPtr>& ops);

}  // namespace anvil_sim_nccl::detail
