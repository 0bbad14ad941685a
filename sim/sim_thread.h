// A simulated CUDA thread as the fiber scheduler keeps it (scheduler.cpp),
// and the warp collectives among a block's threads (warp_collectives.cpp).
// Internal to sim/. Both files are compiled without TSan instrumentation in
// the tsan build (scheduler.cpp says why).
#pragma once
#include <boost/context/fiber.hpp>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <string>

#include "sim/cp_async_sim.h"
#include "sim/cuda_sim.h"

namespace anvil::sim::detail {

enum class Wait : unsigned char { kNone, kBarrier, kWarp };

struct SimThread {
  boost::context::fiber fiber;  // the suspended CUDA thread
  boost::context::fiber sink;   // the scheduler, to switch back to
  uint3 idx;
  unsigned linear = 0;  // x + y*bx + z*bx*by: warp linear/32, lane linear%32
  bool done = false;
  bool runnable = true;  // resumed in the next round
  Wait wait = Wait::kNone;
  // The pending warp collective (wait == kWarp): written by the lane before
  // it yields, `result` by the scheduler before any lane of the group runs.
  WarpOp op = WarpOp::kSync;
  unsigned mask = 0;
  int arg = 0;
  int width = 32;
  uint64_t value = 0;
  uint64_t result = 0;
  std::exception_ptr error;
  void* stack_bottom = nullptr;
  size_t stack_size = 0;
  void* asan_fake_stack = nullptr;
  void* tsan_fiber = nullptr;  // this CUDA thread as ThreadSanitizer sees it
  bool started = false;        // has been switched to once (TSan: the synchronising switch)
  unsigned barriers = 0;       // __syncthreads passed, for the barrier's TSan sync slot
  unsigned warp_syncs = 0;     // __syncwarp passed, likewise
  cp_async::Queue copies;      // cp.async copies not yet performed (sim/cp_async_sim.h)
};

// "(x,y,z)", and the running block's index so.
std::string dims_text(dim3 d);
std::string block_text();

// The CUDA name of a warp collective, for errors.
const char* op_name(WarpOp op);

// Completes every pending warp collective of the block's `n` threads, or
// returns why one never can (empty when all is well).
std::string resolve_warps(SimThread* threads, size_t n);

}  // namespace anvil::sim::detail
