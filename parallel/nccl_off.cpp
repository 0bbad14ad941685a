// The NCCL backend in a build without it: everything links, and asking for
// it says how to get it.
#include "parallel/communicator.h"

namespace anvil::parallel {

namespace {
constexpr const char* kMissing =
    "anvil was built without NCCL: it needs the CUDA build (nvcc, with NCCL from the CUDA "
    "toolkit: configure with -DANVIL_CUDA=ON -DANVIL_NCCL=ON), or the simulator build "
    "(-DANVIL_CUDA=SIM) for simulated GPUs";
}

std::string nccl_missing_reason() { return kMissing; }
NcclId nccl_unique_id() { throw CommError(kMissing); }
std::unique_ptr<Communicator> nccl_communicator(const NcclId&, int, int, Device, CommOptions) {
  throw CommError(kMissing);
}
std::unique_ptr<Communicator> nccl_world(CommOptions) { throw CommError(kMissing); }

}  // namespace anvil::parallel
