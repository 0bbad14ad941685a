// anvil-train --profile and --profile-trace (docs/profiling.md): the table
// of the steady steps by op family, and the Chrome trace of the same steps,
// from what core/profile.h recorded.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/profile.h"

namespace anvil::app {

// The steps a profile leaves out: the first, where allocators, caches and
// the CUDA runtime warm up (as torch.profiler's schedule skips its first).
inline constexpr int64_t kProfileWarmupSteps = 1;

struct ProfileRow {
  profile::Family family;
  double calls_per_step = 0;
  double ms_per_step = 0;
  double percent = 0;  // of the step
};

// One rank's steady steps, a row per family in profile::Family's order.
// The rows' ms add up to step_ms: "other" is the step less every other
// row (its ops of no family and the host's time between ops).
struct ProfileTable {
  int rank = 0;
  std::string device;
  int64_t steps = 0;    // steady steps averaged
  int64_t skipped = 0;  // warm-up steps left out
  double step_ms = 0;   // mean measured step
  std::vector<ProfileRow> rows;
};

// The table of `t`'s steps after the first `warmup`. Throws
// std::runtime_error when no step is left.
ProfileTable profile_table(const profile::Thread& t, int64_t warmup = kProfileWarmupSteps);

// The table as anvil-train prints it; `time_label` heads the time column's
// note ("measured wall clock", "simulator's wall clock, not a GPU's", ...).
std::string format_profile_table(const ProfileTable& table, const std::string& time_label);

// The same steps of every thread as a Chrome trace-event document
// (chrome://tracing, Perfetto): a process per rank, a thread per stream
// (0: the host), an "X" slice per op or kernel and one per step.
nlohmann::json chrome_trace(const std::vector<profile::Thread>& threads,
                            int64_t warmup = kProfileWarmupSteps);

// After a run with --profile or --profile-trace: this process's records,
// rank 0's table printed (when `print`), the trace written to `trace_path`
// (when not empty). `simulated`: the CUDA devices are the simulator's.
void report_profile(bool print, const std::string& trace_path, bool simulated);

}  // namespace anvil::app
