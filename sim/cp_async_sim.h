// The simulator's cp.async (kernels/cuda/cp_async.cuh calls it, and says
// what the PTX ISA promises). The emulation keeps every promise and nothing
// more, at the latest moment the ISA allows:
// - A copy is checked and its source read when it is issued, and queued in
//   its thread's queue; nothing is written to shared memory then.
// - commit_group closes the queued copies not yet committed into a group
//   (an empty group if there are none).
// - wait_group(n) performs the thread's oldest committed groups, in order,
//   until n are left; wait_all commits, then performs every group. The
//   writes are the waiting thread's own, made then (ThreadSanitizer sees
//   them as that thread's writes at that moment): another thread sees them
//   only after a __syncthreads that follows the wait.
// So a kernel that reads its shared memory before the wait that completes
// the copy, or reads another thread's copies without the barrier after
// that thread's wait, reads what was there before (or, under TSan, races).
// - A thread that returns with copies pending, committed or not, has them
//   performed as it returns: the ISA lets copies complete whenever the
//   hardware likes, and an issued copy is not cancelled by the thread's
//   exit. (Waiting threads of the block see them after their next barrier
//   only; a kernel should not rely on them.) A block abandoned on an error
//   drops them.
// Errors (std::invalid_argument, failing the launch): a size other than 4, 8
// or 16, .cg with a size other than 16, src_bytes outside [0, size], dst or
// src not aligned to the size, a call outside a kernel. Whether dst is shared
// memory and src global memory is not checked.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

namespace anvil::sim::cp_async {

enum class Cache { kAll, kGlobal };  // .ca, .cg

// One CUDA thread's copies not yet performed: `copies` in issue order, the
// first group_ends[0] of them committed as the oldest group, the next ones up
// to group_ends[1] as the next group, and so on; those after the last end are
// not committed yet.
struct Queue {
  struct Copy {
    void* dst = nullptr;
    int size = 0;
    unsigned char bytes[16] = {};  // the source's bytes, then zeros
  };
  std::vector<Copy> copies;
  std::vector<size_t> group_ends;
};

void copy(void* dst, const void* src, int size, int src_bytes, Cache cache);
void commit_group();
void wait_group(int n);
void wait_all();

// The calling CUDA thread's committed groups not yet complete, and its
// copies not yet committed (for tests).
int pending_groups();
int uncommitted_copies();

// Performs every copy of q, committed or not, in issue order (the
// scheduler calls it when a CUDA thread returns).
void complete_all(Queue& q);

}  // namespace anvil::sim::cp_async
