// Ranks as threads of one process, one per GPU, over NCCL (anvil-train
// --gpus N): each thread gets its rank's communicator and runs the same
// body; the caller waits for all of them and gets the cause of a failure.
//
// A rank that fails aborts its communicator, so the others' waits end at
// once with PeerFailed (parallel/communicator.h) instead of at their
// deadline. The cause is the first error, in rank order, that is not a
// PeerFailed: the failing rank's own, not its echoes. A rank that does not
// stop within min(CommOptions::timeout, 10 s) of the first failure (a
// thread hung outside anvil's waits) cannot be joined: the process prints
// "<program>: error: <cause> (rank 1 (cuda:1) did not stop within 10 s of
// that failure: the process ends without it)" and ends at once, status 1,
// without destructors or exit handlers (a thread still runs).
#pragma once
#include <exception>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "core/device.h"
#include "parallel/communicator.h"

namespace anvil::parallel {

// Runs body(comm) on one thread per device (rank i on devices[i]), each
// with its rank's NCCL communicator; returns when every rank has returned,
// or rethrows the cause of the first failure (above).
void run_thread_ranks(std::span<const Device> devices, const CommOptions& options,
                      const std::string& program,
                      const std::function<void(Communicator& comm)>& body);

// The cause among the ranks' errors (null where a rank succeeded): the
// first that is not a PeerFailed, else the first; null when there is none.
std::exception_ptr first_cause(const std::vector<std::exception_ptr>& errors);

}  // namespace anvil::parallel
