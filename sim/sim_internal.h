// What the simulator's own files share, and nothing else includes: the
// scheduler (sim/scheduler.cpp) runs a launch's blocks; the streams
// (sim/streams.cpp) decide when; the runtime (sim/runtime.cpp) owns device
// and pinned memory and the per-thread error state.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <source_location>
#include <string>
#include <vector>

#include "sim/cp_async_sim.h"
#include "sim/cuda_sim.h"

namespace anvil::sim::detail {

// A kernel launch as the stream queue holds it until it runs.
struct KernelLaunch {
  dim3 grid;
  dim3 block;
  size_t shared_bytes = 0;
  std::source_location where;
  std::unique_ptr<KernelCall> call;
};

// "kernel launch at file:line": how every error of a launch begins.
std::string launch_site(const std::source_location& where);

// Throws std::runtime_error naming the launch site if the configuration is
// one a GPU refuses (the launch itself then fails, before anything is queued).
// `kernel` (null: unknown) is the kernel's address, whose opt-in to more
// dynamic shared memory the check honours.
void check_launch_config(dim3 grid, dim3 block, size_t shared_bytes, const void* kernel,
                         const std::source_location& where);

// Runs every block of the launch on the worker threads (the calling thread is
// one of them) and returns when all have finished. Throws std::runtime_error
// with the first error: a divergent barrier, a misused warp collective, or an
// exception thrown by a CUDA thread; workers take no new block after it.
void run_kernel(const KernelLaunch& launch);

// The calling CUDA thread's cp.async queue (cp_async_sim.cpp); throws
// std::logic_error naming `what` outside a kernel.
cp_async::Queue& current_cp_async_queue(const char* what);
// The calling CUDA thread's lane (its linear index in the block mod 32), or
// -1 outside a kernel.
int current_lane();

// ---- launch_audit.cpp ----
// True while the launch audit records; the first call starts it when
// ANVIL_SIM_LAUNCH_AUDIT names a file (throws std::runtime_error when that
// file cannot be written).
bool launch_audit_recording();
// Records a launch that has run: seconds[b] is block b's thread CPU time, or
// negative for a block that ANVIL_SIM_SAMPLE_BLOCKS skipped (it is then taken
// to have lasted the mean of those that ran).
void record_launch(const KernelLaunch& launch, std::vector<double>& seconds);
// While it lives, the calling thread runs a graph launch's nodes
// (streams.cpp): the audit records the graph launch once, and the kernels
// launched meanwhile as its nodes (their work in their own rows).
struct GraphLaunchScope {
  explicit GraphLaunchScope(size_t kernel_nodes);
  ~GraphLaunchScope();
  GraphLaunchScope(const GraphLaunchScope&) = delete;
  GraphLaunchScope& operator=(const GraphLaunchScope&) = delete;
};
// sample_blocks(), and a one-time note on stderr that sampling makes the
// run's numbers invalid (throws for a malformed ANVIL_SIM_SAMPLE_BLOCKS).
uint64_t sample_blocks_for_launch();

// ---- runtime.cpp ----
// Records err and its readable detail as this thread's last error.
cudaError_t fail(cudaError_t err, std::string detail);
int current_device();
// The device whose cudaMalloc block holds p, or -1 for host memory.
int device_of(const void* p);
// True when [p, p+bytes) lies inside one cudaHostAlloc/cudaMallocHost block.
bool is_pinned(const void* p, size_t bytes);
// Checks a copy as cudaMemcpy does (the kind against the pointers, the ranges
// against their allocations); resolves cudaMemcpyDefault. `api` names the
// call in the error detail.
cudaError_t check_copy(const char* api, void* dst, const void* src, size_t bytes,
                       cudaMemcpyKind& kind);
cudaError_t check_memset(const char* api, void* p, size_t bytes);

// ---- capture.cpp ----
// A potentially unsafe call during stream capture (cudaMalloc, cudaFree,
// cudaHostAlloc, cudaMallocHost, cudaFreeHost): cudaErrorStreamCaptureUnsupported
// where cudaThreadExchangeStreamCaptureMode's rules prohibit it, the captures
// that prohibit it invalidated; else cudaSuccess.
cudaError_t capture_unsafe_call(const char* api);

// ---- streams.cpp: the implicit synchronisations of runtime calls ----
// Runs every queued item of every stream of every device (cudaFree and
// cudaFreeHost wait for that); returns a deferred kernel's error, if one failed.
// Streams stalled at a communication item are left there.
cudaError_t drain_all_devices();

// ---- streams.cpp, for the simulated NCCL (sim/nccl_sim.cpp) ----
using StreamRef = std::shared_ptr<CUstream_st>;

// One group of simulated NCCL operations of one rank on one stream: an item
// of the stream's queue that completes only together with its peers' items.
struct CommWork {
  virtual ~CommWork() = default;
  // Called under the queue's lock as the item is queued: where it stands.
  virtual void queued(const StreamRef& stream, uint64_t seq) = 0;
  // Called when every item queued before it on its stream has run, by the one
  // thread that runs device work. Returns true once the item is complete (it
  // then leaves the queue), false while a peer has not queued its part (the
  // stream stalls here). Throws std::runtime_error for a failed operation.
  virtual bool progress() = 0;
};

// Queues `work` on `stream` (null: the current device's legacy stream); in
// eager mode also tries to run it. False for an unknown stream.
bool enqueue_comm(cudaStream_t stream, std::shared_ptr<CommWork> work);
// For CommWork::progress: runs the stream's items queued before `seq`, so that
// item `seq` is at its head. False when the stream stalls before it; throws
// when that work waits for the item being progressed (a deadlock on a GPU).
bool run_before(const StreamRef& stream, uint64_t seq);
// The device a stream handle belongs to (null: the current device), or -1.
int stream_device(cudaStream_t stream);
// Wakes blocking synchronisations that wait for a stalled stream to move
// (the simulated NCCL calls it when an abort completes operations).
void wake_streams();
// While a simulated NCCL communicator has ranks in other processes, whose
// progress wakes nothing here, blocking synchronisations that wait for a
// stalled stream poll every millisecond instead of sleeping until something
// is queued in this process.
void remote_comm_opened();
void remote_comm_closed();

}  // namespace anvil::sim::detail
