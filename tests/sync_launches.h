// ANVIL_CUDA_SYNC's switch (kernels/cuda/runtime.h) set for a scope: on for
// the switch's own test, off for the tests that count the host's waits for
// the device or that rely on a fault surfacing later (with it on, every
// launch is a wait and reports its own fault).
#pragma once
#if defined(ANVIL_CUDA_BACKEND)
#include "kernels/cuda/runtime.h"

namespace cuda_test {

class SyncLaunches {
 public:
  explicit SyncLaunches(bool on) : before_(anvil::cuda::sync_launches()) {
    anvil::cuda::set_sync_launches(on);
  }
  ~SyncLaunches() { anvil::cuda::set_sync_launches(before_); }
  SyncLaunches(const SyncLaunches&) = delete;
  SyncLaunches& operator=(const SyncLaunches&) = delete;

 private:
  bool before_;
};

}  // namespace cuda_test
#endif
