// ncclCommSplit in the simulated NCCL (sim/nccl_sim.h). Every rank's color
// and key travel by an all-gather over the parent communicator, as NCCL's
// bootstrap exchanges them, on a stream of the split's own that the call
// waits for; the ranks of one color then make a new clique whose id is
// derived from the parent's, the split's number and the color. The id keeps
// the parent's creator process, so ranks that are processes
// (sim/nccl_sim_remote.cpp) find each other through it as they found the
// parent's.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "sim/nccl_sim.h"
#include "sim/nccl_sim_ops.h"

namespace anvil_sim_nccl {

namespace {

// The new clique's id: the parent's, its first word mixed with the split's
// number and the color (the creator's process id, the third word, stays).
ncclUniqueId derived_id(const ncclUniqueId& parent, uint64_t split, int color) {
  ncclUniqueId id = parent;
  uint64_t word = 0;
  std::memcpy(&word, id.internal, sizeof word);
  uint64_t x = word ^ (split * 0x9e3779b97f4a7c15ull) ^ (uint64_t(uint32_t(color)) << 17);
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  x ^= x >> 31;
  std::memcpy(id.internal, &x, sizeof x);
  return id;
}

// Every rank's {color, key}, by an all-gather over `comm` on the current
// device, waited for; "" or what went wrong.
std::string gather_colors(ncclComm_t comm, int rank, int nranks, int color, int key,
                          std::vector<int32_t>& all) {
  int32_t* table = nullptr;
  if (cudaMalloc(reinterpret_cast<void**>(&table), sizeof(int32_t) * 2 * size_t(nranks)) !=
      cudaSuccess)
    return "cudaMalloc failed";
  const int32_t mine[2] = {color, key};
  cudaStream_t stream = nullptr;
  std::string problem;
  if (cudaMemcpy(table + 2 * rank, mine, sizeof mine, cudaMemcpyHostToDevice) != cudaSuccess ||
      cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) {
    problem = "a CUDA call failed";
  } else {
    ncclResult_t r = ncclAllGather(table + 2 * rank, table, 2, ncclInt32, comm, stream);
    // A non-blocking communicator answers "in progress" once; until it is
    // told, it accepts no further call.
    ncclResult_t state = r;
    while (r == ncclInProgress && state == ncclInProgress)
      if (ncclCommGetAsyncError(comm, &state) != ncclSuccess) state = ncclInternalError;
    if (r != ncclSuccess && r != ncclInProgress) problem = ncclGetLastError(comm);
    else if (state != ncclSuccess && state != ncclInProgress) problem = "the all-gather failed";
    else if (cudaStreamSynchronize(stream) != cudaSuccess)
      problem = "the all-gather of every rank's color and key did not complete: " +
                std::string(cudaGetErrorString(cudaGetLastError()));
    else if (cudaMemcpy(all.data(), table, sizeof(int32_t) * all.size(),
                        cudaMemcpyDeviceToHost) != cudaSuccess)
      problem = "cudaMemcpy failed";
  }
  if (stream) cudaStreamDestroy(stream);
  cudaFree(table);
  return problem;
}

}  // namespace

ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm,
                           ncclConfig_t* config) {
  using detail::fail;
  if (!comm || !comm->state || !newcomm)
    return fail(ncclInvalidArgument, "ncclCommSplit: null argument");
  *newcomm = nullptr;
  if (color < 0 && color != NCCL_SPLIT_NOCOLOR)
    return fail(ncclInvalidArgument, "ncclCommSplit: color " + std::to_string(color) +
                                         " is neither >= 0 nor NCCL_SPLIT_NOCOLOR");
  detail::CommState& c = *comm->state;
  const uint64_t split = ++c.splits;
  int previous = 0;
  cudaGetDevice(&previous);
  cudaSetDevice(c.device);
  std::vector<int32_t> all(2 * size_t(c.nranks));
  const std::string problem = gather_colors(comm, c.rank, c.nranks, color, key, all);
  cudaSetDevice(previous);
  if (!problem.empty())
    return fail(ncclInternalError, "ncclCommSplit (rank " + std::to_string(c.rank) + "): " +
                                       problem);
  if (color == NCCL_SPLIT_NOCOLOR) return ncclSuccess;
  // The ranks of this color, by key, ties by rank (a stable sort of rank order).
  std::vector<int> members;
  for (int r = 0; r < c.nranks; ++r)
    if (all[2 * size_t(r)] == color) members.push_back(r);
  std::stable_sort(members.begin(), members.end(),
                   [&](int a, int b) { return all[2 * size_t(a) + 1] < all[2 * size_t(b) + 1]; });
  const int new_rank = int(std::find(members.begin(), members.end(), c.rank) - members.begin());
  ncclConfig_t inherited = NCCL_CONFIG_INITIALIZER;
  inherited.blocking = c.blocking ? 1 : 0;
  cudaSetDevice(c.device);
  const ncclResult_t r =
      ncclCommInitRankConfig(newcomm, int(members.size()), derived_id(c.id, split, color),
                             new_rank, config ? config : &inherited);
  cudaSetDevice(previous);
  return r;
}

}  // namespace anvil_sim_nccl
