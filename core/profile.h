// The profiler's recording half (anvil-train --profile, --profile-trace;
// docs/profiling.md): while it is on, each thread keeps the spans of its
// training steps and, inside them, one record per op, by op family, which
// apps/train_profile.cpp turns into the table and the Chrome trace.
//
// Where the records come from:
// - The op layer: backend_for (core/backend.h) hands out a recording wrapper
//   of the device's Backend, so each Backend method is one op of a family
//   (conv2d_backward_data is conv backward-data, gemm is GEMM, ...). On the
//   CPU the record is the method's wall clock. Only the outermost method of
//   a thread is timed: one that calls another is one record.
// - CUDA devices: each kernel launch (kernels/cuda/launch.cpp) records a
//   pair of CUDA events on its stream, under the family of the method that
//   launched it; end_step waits for the device and turns them into records.
// - The training loop (nn/train.cpp): the steps, and the wait for the next
//   batch (data wait); parallel/: the wait for the gradients' all-reduce.
//
// Off (the default), the only cost is the test of one flag per Backend
// method and per launch.
#pragma once
#include <atomic>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/device.h"

namespace anvil::profile {

enum class Family : uint8_t {
  ConvForward,
  ConvBackwardData,
  ConvBackwardWeight,
  Gemm,
  BatchNorm,
  Relu,
  Pooling,
  Add,
  CrossEntropy,
  Sgd,
  Conversion,
  AllReduce,
  DataWait,
  Other,  // measured ops of no family above; the table adds the host's gap
};
inline constexpr int kFamilies = int(Family::Other) + 1;
const char* family_name(Family f);  // "conv forward", "GEMM", ...

namespace detail {
inline std::atomic<bool> g_enabled{false};
}
inline bool enabled() { return detail::g_enabled.load(std::memory_order_relaxed); }
// Turns recording on or off for every thread; records are kept until clear().
void set_enabled(bool on);

// Microseconds on the steady clock since the profiler's origin.
double now_us();

// One op's span. stream 0 is the host (CPU ops, data wait, all-reduce
// waits); 1, 2, ... are a device's streams in the order first seen.
struct Record {
  Family family;
  int16_t stream;
  uint32_t name;  // into names()
  int64_t step;   // the thread's step it fell in
  double start_us, end_us;
};

struct Step {
  int64_t index;  // 0-based, counted per thread from the first begin_step
  double start_us, end_us;
};

// What one thread (one rank) recorded.
struct Thread {
  int rank = 0;
  std::string device;  // "cpu", "cuda:0", ...
  std::vector<Step> steps;
  std::vector<Record> records;
  std::vector<std::string> streams;  // stream k's name is streams[k]
};

// The names of records, interned: name_id("conv2d_forward").
uint32_t name_id(std::string_view name);
std::string name_of(uint32_t id);

// This thread's rank and device, for the trace's process and the table.
void set_thread_rank(int rank);

// The training loop's step boundaries on this thread. end_step waits for
// `device` (a CUDA device's launches are read back then), so a step holds
// its own kernels.
void begin_step(Device device);
void end_step(Device device);

// Drops the step begun last and what it recorded (the loop found no batch).
void cancel_step();

// Whether a kernel launched now is recorded: inside a step, and not inside
// a Scope timed on the host (a data or all-reduce wait), whose time stands
// for the kernels it launches.
bool records_launches();

// Adds a record to this thread (inside a step: outside one it is dropped).
void add(Family family, uint32_t name, int stream, double start_us, double end_us);

// A stream of this thread's device (a cudaStream_t) as its track for
// records: 1, 2, ... in the order first seen, named "stream 1", ...
int stream_index(const void* stream);

// Every thread's records so far (copies), by rank. clear() forgets them
// and starts the step count again (while no thread records).
std::vector<Thread> collected();
void clear();

// The family in force on this thread (Other outside any Scope): what a
// kernel launch is recorded under.
Family current_family();

// Times the code inside it as one op of `family` named `name` (a static
// string), on the host track when `host` (a CPU op, or a host wait); on a
// CUDA device (host false) it only sets the family its launches get. Only
// the outermost scope of a thread counts.
class Scope {
 public:
  Scope(Family family, const char* name, bool host) {
    if (enabled()) open(family, name, host);
  }
  ~Scope() {
    if (active_) close();
  }
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  void open(Family family, const char* name, bool host);
  void close();
  bool active_ = false;
  bool outer_ = false;
  bool host_ = false;
  Family family_ = Family::Other;
  const char* name_ = nullptr;
  double start_us_ = 0;
};

// Set by kernels/cuda/launch.cpp: reads this thread's pending launches
// back into records (after the device has been synchronised).
using FlushLaunches = void (*)();
void set_launch_flush(FlushLaunches f);

}  // namespace anvil::profile
