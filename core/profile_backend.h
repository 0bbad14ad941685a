// The recording wrapper backend_for hands out while profiling is on
// (core/profile.h). Internal to core.
#pragma once
#include "core/backend.h"

namespace anvil {

// The wrapper of `inner`, device's backend: each method is one op of its
// family for the profiler.
Backend& profiling_backend(Backend& inner, Device device);

}  // namespace anvil
