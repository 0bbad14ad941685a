// The simulated NCCL: the subset of NCCL's API that anvil calls, under the
// real names, between the simulator's devices. Included only through
// parallel/nccl_api.h, which picks the real <nccl.h> in a CUDA build, so the
// communicator in parallel/nccl_comm.cpp is the same source in both builds.
//
// Ranks are host threads of one process, one per simulated device (as with
// one host thread per GPU on a real machine): each thread calls
// ncclCommInitRank(Config) with the same unique id after cudaSetDevice.
//
// Every operation is asynchronous, as on a GPU: a group (ncclGroupStart ..
// ncclGroupEnd, or one call on its own) becomes one item of work on each
// stream it names, queued behind the work already there (sim/streams.cpp).
// The item completes when the streams run it and every peer has queued the
// matching operation: the k-th ncclSend from rank a to rank b meets the k-th
// ncclRecv at b from a, and the k-th collective of a communicator meets the
// k-th collective of every other rank (all-reduce, broadcast, all-gather,
// reduce-scatter; ranks that call different ones there fail as a mismatch).
// Data moves when all the items involved have reached the heads of their
// streams (everything queued before them has run). Until a peer queues its
// part, the stream stalls there: cudaEventQuery / cudaStreamQuery answer
// cudaErrorNotReady, and a blocking synchronisation waits (up to ANVIL_SIM_STALL_TIMEOUT seconds,
// default 300, then fails: on a GPU it would hang for ever).
//
// What the simulator checks that a GPU would not tell you:
// - buffers must be device memory of the communicator's device, in range;
// - the stream must belong to the communicator's device;
// - sendbuff and recvbuff of an all-gather or reduce-scatter may overlap
//   only at NCCL's in-place offset;
// - a send and its receive (or the ranks of a collective) must agree on the
//   byte count (and a collective on its kind, type, operation and root): a
//   mismatch fails both items with a message naming both ranks and sets
//   ncclInvalidUsage as the communicators' asynchronous error.
//
// Non-blocking communicators (config.blocking = 0) answer ncclInProgress from
// ncclCommInitRankConfig until every rank has joined, and from every
// ncclGroupEnd once (the next ncclCommGetAsyncError then says ncclSuccess),
// so the polling loops written for real NCCL run here too. ncclCommAbort
// completes the communicator's unfinished operations without moving data, as
// aborting NCCL's kernels does, so the streams behind them run on.
#pragma once
#include <climits>
#include <cstddef>
#include <cstdint>

#include "sim/cuda_sim.h"

namespace anvil_sim_nccl {

constexpr int NCCL_MAJOR = 2;
constexpr int NCCL_MINOR = 28;
constexpr int NCCL_PATCH = 9;
constexpr int NCCL_VERSION_CODE = 22809;

typedef struct ncclComm* ncclComm_t;
#define NCCL_UNIQUE_ID_BYTES 128
typedef struct {
  char internal[NCCL_UNIQUE_ID_BYTES];
} ncclUniqueId;

typedef enum {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,
  ncclInProgress = 7,
  ncclNumResults = 8
} ncclResult_t;

typedef enum { ncclSum = 0, ncclProd = 1, ncclMax = 2, ncclMin = 3, ncclAvg = 4 } ncclRedOp_t;

typedef enum {
  ncclInt8 = 0, ncclChar = 0,
  ncclUint8 = 1,
  ncclInt32 = 2, ncclInt = 2,
  ncclUint32 = 3,
  ncclInt64 = 4,
  ncclUint64 = 5,
  ncclFloat16 = 6, ncclHalf = 6,
  ncclFloat32 = 7, ncclFloat = 7,
  ncclFloat64 = 8, ncclDouble = 8,
  ncclBfloat16 = 9,
} ncclDataType_t;

// The fields anvil sets; NCCL_CONFIG_INITIALIZER leaves the rest to NCCL.
typedef struct {
  size_t size;
  unsigned int magic;
  unsigned int version;
  int blocking;
} ncclConfig_t;
#define NCCL_CONFIG_INITIALIZER \
  { sizeof(ncclConfig_t), 0xcafebeef, NCCL_VERSION_CODE, INT_MIN }

const char* ncclGetErrorString(ncclResult_t result);
// The detail of the calling thread's latest failed call ("" if none).
const char* ncclGetLastError(ncclComm_t comm);
ncclResult_t ncclGetVersion(int* version);
ncclResult_t ncclGetUniqueId(ncclUniqueId* id);
ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank,
                                    ncclConfig_t* config);
ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank);
// The color of a rank that joins no communicator in ncclCommSplit.
#define NCCL_SPLIT_NOCOLOR -1
// A collective over `comm`'s ranks: those with the same color (>= 0) form a
// new communicator, ranked by key, ties by their rank in `comm`; a rank with
// NCCL_SPLIT_NOCOLOR gets null. Every rank's color and key travel by an
// all-gather over `comm`, which the call waits for (up to
// ANVIL_SIM_STALL_TIMEOUT, as a blocking synchronisation does); the new
// communicator then answers as ncclCommInitRankConfig's does (config null:
// `comm`'s blocking mode). Ranks that are processes split as threads do.
ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm,
                           ncclConfig_t* config);
ncclResult_t ncclCommFinalize(ncclComm_t comm);
ncclResult_t ncclCommDestroy(ncclComm_t comm);
ncclResult_t ncclCommAbort(ncclComm_t comm);
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* async_error);
ncclResult_t ncclCommCount(const ncclComm_t comm, int* count);
ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device);
ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank);
ncclResult_t ncclGroupStart();
ncclResult_t ncclGroupEnd();
ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream);
// Root's count elements to every rank's recvbuff (sendbuff is read on the
// root only; in place when sendbuff == recvbuff).
ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, int root, ncclComm_t comm,
                           cudaStream_t stream);
// Every rank's sendcount elements, in rank order, into every rank's recvbuff
// of nranks * sendcount (in place when sendbuff == recvbuff + rank * sendcount).
ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream);
// The elementwise reduction of every rank's nranks * recvcount elements;
// rank r receives block r, recvcount elements (in place when recvbuff ==
// sendbuff + rank * recvcount).
ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                               ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                               cudaStream_t stream);

// Test hooks, for the communicator's fault tests (NCCL has no such calls):
// ncclSimHoldStream queues an item that stalls `stream` (null: the current
// device's legacy stream) until ncclSimReleaseStream(its number), as a
// kernel that hangs would; 0 for an unknown stream. ncclSimInjectAsyncError
// makes every communicator of `device` report `error` from
// ncclCommGetAsyncError from then on, its operations left stalled as a
// failed NCCL leaves them until ncclCommAbort (ncclSuccess stops injecting
// into communicators that have not yet reported it).
uint64_t ncclSimHoldStream(cudaStream_t stream);
void ncclSimReleaseStream(uint64_t hold);
void ncclSimInjectAsyncError(int device, ncclResult_t error);

}  // namespace anvil_sim_nccl

using namespace anvil_sim_nccl;  // NCCL's names, as <nccl.h> declares them
