// Internal to parallel/: what the NCCL backend needs from MPI when its ranks
// are processes of an MPI job (nccl_world): the job's ranks, the check
// channel and a bounded broadcast of NCCL's unique id. mpi_comm.cpp
// implements them; mpi_off.cpp, in a build without MPI, throws.
#pragma once
#include <chrono>
#include <cstddef>
#include <memory>
#include <string>

#include "parallel/transport.h"

namespace anvil::parallel::mpi_detail {

// MPI_Init_thread on first use (MPI_THREAD_MULTIPLE); MPI_Finalize at exit
// unless a collective failed (then the process leaves without it, and
// mpirun ends the job rather than wait in MPI_Finalize). Throws CommError,
// naming the level, when MPI gives less than MPI_THREAD_MULTIPLE (also when
// the program initialised MPI itself).
void ensure_initialized();
// Under mpirun, and unless the program has a SIGTERM handler of its own: on
// SIGTERM (mpirun ending the job after another rank failed) the process says
// so, naming its rank, and exits. Async-signal-safe: the rank is read now.
void install_sigterm_handler();
// This process leaves without MPI_Finalize (which would wait for every other
// rank): a rank that fails before it has a communicator (nccl_world,
// mpi_world) exits at once, and mpirun, seeing it gone, ends the job rather
// than let the others wait for it until their deadline.
void mark_failed() noexcept;
int world_rank();
int world_size();
// This process's rank among the job's processes on its machine.
int local_rank();
// Root's bytes to every process of the job (MPI_Ibcast), within `timeout`.
void broadcast_bytes(void* data, size_t bytes, int root, std::chrono::milliseconds timeout,
                     const std::string& what);
// The largest piece one MPI message carries (1 GiB, MPI's counts being
// ints): longer messages go as several. A test sets it small to run that
// path without gigabytes; returns the previous value.
size_t set_max_message_bytes(size_t bytes);
// The check channel over the job's processes (its own MPI communicator). A
// failure reported on it marks the process so that exit skips MPI_Finalize.
std::shared_ptr<HostChannel> world_channel(std::chrono::milliseconds timeout);

}  // namespace anvil::parallel::mpi_detail
