// What sim/streams.cpp (the queues, their running and the synchronising
// calls) and sim/capture.cpp (stream capture and graphs) share: the work
// items, the stream and event state, the registry and its lock, and the
// capture state a capturing stream and a captured event point to. Nothing
// outside those two files includes it.
#pragma once
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "sim/sim_internal.h"

namespace anvil::sim::detail {

using Clock = std::chrono::steady_clock;

enum class WorkKind : unsigned char { kKernel, kCopy, kMemset, kRecord, kWait, kComm, kGraph };

// One node of a captured graph: a kernel, a copy or a memset, and the nodes
// it depends on (always earlier ones, so index order is a topological order).
struct GraphNode {
  WorkKind kind = WorkKind::kKernel;
  std::shared_ptr<const KernelLaunch> kernel;
  void* dst = nullptr;
  const void* src = nullptr;
  size_t bytes = 0;
  int value = 0;
  std::vector<size_t> deps;
};
using GraphNodes = std::shared_ptr<const std::vector<GraphNode>>;

struct Work {
  uint64_t seq = 0;  // its place in the stream, from 1
  WorkKind kind = WorkKind::kKernel;
  std::shared_ptr<const KernelLaunch> kernel;
  // kCopy, kMemset
  void* dst = nullptr;
  const void* src = nullptr;          // null when the source bytes were staged
  std::vector<unsigned char> staged;  // a pageable source, copied when queued
  size_t bytes = 0;
  int value = 0;
  // kRecord: the event; kWait: run `other` up to item `until`
  std::shared_ptr<CUevent_st> event;
  std::shared_ptr<CUstream_st> other;
  uint64_t until = 0;
  // kComm: a group of simulated NCCL operations
  std::shared_ptr<CommWork> comm;
  // kGraph: an instantiated graph's nodes, run in order
  GraphNodes graph;
};

// One capture sequence (cudaStreamBeginCapture to cudaStreamEndCapture): the
// graph it builds and the streams capturing into it, the origin first.
struct Capture {
  uint64_t id = 0;
  int device = 0;
  cudaStream_t origin = nullptr;
  std::thread::id thread;
  cudaStreamCaptureMode mode = cudaStreamCaptureModeGlobal;
  std::vector<GraphNode> nodes;
  std::string invalid;  // why the capture was invalidated ("" while it is not)
  std::vector<std::shared_ptr<CUstream_st>> members;
};

}  // namespace anvil::sim::detail

namespace anvil_sim_rt {

struct CUstream_st {
  int device = 0;
  bool blocking = true;   // cudaStreamDefault: ordered with the legacy default stream
  bool legacy = false;    // the device's legacy default stream (handle 0)
  bool destroyed = false; // its handle is gone; kept until its queue has run
  std::deque<anvil::sim::detail::Work> queue;
  uint64_t queued = 0;     // the last item queued
  uint64_t completed = 0;  // the last item run
  bool running = false;    // an item of it is running
  uint64_t not_ready_told = 0;  // cudaStreamQuery answered "not ready" with this much queued
  std::string eager_error;      // eager mode: a failure of work run when queued, for the next sync
  // While it captures: the sequence, and the nodes its next node depends on.
  std::shared_ptr<anvil::sim::detail::Capture> capture;
  std::vector<size_t> frontier;
};

struct CUevent_st {
  bool timing = true;
  std::shared_ptr<CUstream_st> stream;  // where the latest record was queued (null: never)
  uint64_t seq = 0;                     // the latest record's item
  anvil::sim::detail::Clock::time_point time;  // when that record ran
  bool not_ready_told = false;          // cudaEventQuery answered "not ready" for that record
  // Recorded last in a capturing stream: the sequence and the nodes it stands for.
  std::shared_ptr<anvil::sim::detail::Capture> capture;
  std::vector<size_t> nodes;
};

}  // namespace anvil_sim_rt

namespace anvil::sim::detail {

using StreamPtr = std::shared_ptr<CUstream_st>;

struct Registry {
  std::mutex running;  // held while queued work runs
  std::mutex mutex;    // everything below, and the streams', events' and captures' fields
  std::map<cudaStream_t, StreamPtr> streams;  // live handles
  std::map<cudaEvent_t, std::shared_ptr<CUevent_st>> events;
  // Per device: its legacy stream first, then every stream that has a handle
  // or still has work, in creation order (the order device syncs run them).
  std::map<int, std::vector<StreamPtr>> by_device;
  // Counts every item queued and every abort, so that a blocking call waiting
  // for a stalled stream wakes when there may be something new to run.
  uint64_t generation = 0;
  std::condition_variable changed;
};
Registry& reg();

// Caller holds reg().mutex.
std::vector<StreamPtr>& device_streams(int device);
// The stream a handle names (0: the current device's legacy stream), or null.
StreamPtr resolve(cudaStream_t handle);

// Queues w on the stream `handle` names (a capturing stream captures it
// instead: seq 0); in eager mode runs it at once. `api` names the call in errors.
struct Queued {
  StreamPtr stream;
  uint64_t seq = 0;
  cudaError_t error = cudaSuccess;
};
Queued enqueue(cudaStream_t handle, Work w, const char* api);

// ---- capture.cpp, called by streams.cpp with reg().mutex held ----
// Each returns cudaSuccess, or records and returns the error the CUDA
// Programming Guide's capture rules give (invalidating the sequences
// involved, as its "Invalidation" says).
//
// Work about to be queued on s by `api`: when s captures, w becomes a node of
// its graph instead (`captured` true; w is consumed). Use of the legacy
// stream while a blocking stream of its device captures is an error.
cudaError_t capture_work(CUstream_st& s, Work& w, const char* api, bool& captured);
// A copy by `api` on s with a pageable host side: an error while s captures.
cudaError_t capture_pageable_copy(const CUstream_st& s, const char* api);
// cudaEventRecord(e, s): while s captures, e becomes a captured event.
cudaError_t capture_record(CUevent_st& e, CUstream_st& s, bool& captured);
// cudaStreamWaitEvent(s, e): joins or merges captures; an uncaptured event
// waited for by a capturing stream is an error.
cudaError_t capture_wait(CUstream_st& s, const CUevent_st& e, bool& captured);
// A synchronisation or query by `api` of stream s (null: none), of event e
// (null: none), or of every stream of `device` (-1: none).
cudaError_t capture_sync(const char* api, const CUstream_st* s, const CUevent_st* e, int device);
// cudaMemcpy, cudaMemset: the legacy stream of `device` while a blocking
// stream captures.
cudaError_t capture_legacy(const char* api, int device);

}  // namespace anvil::sim::detail
