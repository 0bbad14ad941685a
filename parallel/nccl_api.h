// NCCL as parallel/nccl_comm.cpp sees it: the real <nccl.h> in a CUDA build,
// or the simulator's NCCL (sim/nccl_sim.h) in a simulator build, where the
// same communicator code runs between simulated GPUs.
#pragma once
#include "kernels/cuda/runtime.h"

#if defined(ANVIL_CUDA_SIM)
#include "sim/nccl_sim.h"
#else
#include <nccl.h>
#endif
