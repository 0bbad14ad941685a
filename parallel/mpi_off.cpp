// The MPI backend in a build without MPI: everything links, and asking for
// it says how to get it. A program without MPI is a job of one process.
#include "parallel/mpi_internal.h"

namespace anvil::parallel {

namespace {
constexpr const char* kMissing =
    "anvil was built without MPI: install Debian's OpenMPI (apt-get install libopenmpi-dev "
    "openmpi-bin, or bash scripts/install-deps.sh) and configure again";
}

std::string mpi_missing_reason() { return kMissing; }
int mpi_rank() { return 0; }
bool mpi_started() { return false; }
int mpi_size() { return 1; }
std::unique_ptr<Communicator> mpi_world(CommOptions) { throw CommError(kMissing); }

namespace mpi_detail {
void ensure_initialized() { throw CommError(kMissing); }
void install_sigterm_handler() {}
void mark_failed() noexcept {}
int world_rank() { return 0; }
int world_size() { return 1; }
int local_rank() { return 0; }
void broadcast_bytes(void*, size_t, int, std::chrono::milliseconds, const std::string&) {
  throw CommError(kMissing);
}
size_t set_max_message_bytes(size_t) { throw CommError(kMissing); }
std::shared_ptr<HostChannel> world_channel(std::chrono::milliseconds) { throw CommError(kMissing); }
}  // namespace mpi_detail

}  // namespace anvil::parallel
