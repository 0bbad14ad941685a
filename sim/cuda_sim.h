// The CUDA simulator: enough of CUDA C++ and its runtime for the unchanged
// kernels/cuda/*.cu files to compile with g++ and run on the CPU. Included
// only through kernels/cuda/cuda_compat.h (never together with the real
// <cuda_runtime.h>).
//
// Blocks: each CUDA thread is a fiber; a launch's blocks are handed out, one
// at a time through an atomic counter, to ANVIL_SIM_WORKERS host threads
// (default: the hardware's thread count; 1 runs them one after another). The
// thread that runs the launch is one of the workers, the others are a pool of
// persistent threads. Each worker runs one block at a time, so its per-thread
// state (threadIdx, blockIdx, __shared__, dynamic shared memory, the
// sanitizers' fiber state) is the block's. The first error stops the launch.
//
// Streams: each stream is a FIFO of work (launches, async copies and memsets,
// event records and waits). By default (ANVIL_SIM_STREAMS=deferred) work runs
// only when a synchronising call needs it, in stream order, on the thread
// making that call: so work that is not synchronised for is not done yet, as
// on a GPU. ANVIL_SIM_STREAMS=eager runs each item when it is queued. A
// kernel's own errors (not its configuration, refused at launch) come back,
// once, as cudaErrorLaunchFailure from the call that ran it (eager: from the
// next synchronisation of its stream). What each call runs:
// - cudaStreamSynchronize(s): s's queue; a wait on an event first runs the
//   recording stream up to the record. cudaStreamSynchronize(0) runs the
//   device's legacy default stream and every blocking stream.
// - cudaEventSynchronize(e): e's stream up to e. cudaEventQuery(e) and
//   cudaStreamQuery(s) answer cudaErrorNotReady the first time they see
//   pending work, and run it the next time (so polling loops end).
// - cudaDeviceSynchronize: every stream of the current device.
// - cudaMemcpy, cudaMemset (synchronous, on the legacy default stream): the
//   legacy stream and every blocking stream of the current device and of the
//   devices whose memory they touch. Non-blocking streams are not waited for.
// - cudaFree, cudaFreeHost: every stream of every device.
// - Work on the null stream waits for the work queued before it on the
//   device's blocking streams, and work queued on those afterwards waits for it.
// - cudaMemcpyAsync: from pageable host memory the source bytes are copied
//   when the call is made; to pageable host memory the stream is run and the
//   copy done before the call returns; to or from pinned memory
//   (cudaHostAlloc, cudaMallocHost) and device to device it waits in the
//   queue, so pinned bytes the host changes before that reach the device.
// An event recorded on a stream with nothing queued is reached at once;
// otherwise it holds the host's clock when its record item ran.
//
// Warps: __syncthreads is a block barrier. The warp intrinsics
// (__shfl*_sync, __ballot_sync, __any_sync, __all_sync, __syncwarp) are warp
// barriers: lanes are linear thread id % 32 (id = x + y*bx + z*bx*by), a
// collective completes when every lane its mask names (of those that exist in
// the block) waits in the same collective with the same mask, and each lane's
// result is computed before any of them runs on. A mask naming a lane that has
// returned or waits at __syncthreads, or lanes of a warp waiting with
// overlapping different masks, is an error of the launch, not a hang. A
// shuffle from a lane that does not take part (outside the mask or the block)
// yields all-ones bits (NaN for float), as its value is undefined on a GPU.
// __activemask() is the lanes of the warp that call it in the same scheduling
// round: in converged code, every lane that has not returned.
//
// Everything lives in namespace anvil_sim_rt and is made visible globally by
// a using-directive, so kernels see `dim3`, `threadIdx`, `cudaMalloc` as under
// nvcc while the link names never collide with libcudart in a CUDA build.
#pragma once
#include <atomic>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <source_location>
#include <string>
#include <type_traits>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__
#define __launch_bounds__(...)
#define __grid_constant__
// One block runs at a time per worker thread, so a per-thread static is
// exactly the block's shared memory. (It starts zeroed and keeps its values
// between blocks: stale reads do not show; dynamic shared memory does.)
#define __shared__ static thread_local

namespace anvil::sim {

// The warp collectives behind the intrinsics: the calling fiber records its
// operation in its slot and waits until the scheduler completes the
// collective for its whole mask (see warp_collectives.cpp). `value` holds the
// lane's operand bits (a shuffle's value, a vote's predicate), `arg` the
// source lane, delta or lane mask; the result is the bits the lane receives.
// kMma (a tensor-core mma.sync, sim/mma_sim.h) passes the address of the
// lane's mma::LaneOperands in `value` and its shape in `arg`; kLdmatrix
// (mma::ldmatrix_sync) its mma::LdmatrixLane, and N | (.trans ? 8 : 0).
enum class WarpOp : unsigned char {
  kShfl, kShflUp, kShflDown, kShflXor, kBallot, kAny, kAll, kSync, kActive, kMma, kLdmatrix
};
uint64_t warp_collective(WarpOp op, unsigned mask, uint64_t value, int arg, int width);

}  // namespace anvil::sim

namespace anvil_sim_rt {

struct uint3 {
  unsigned x = 0, y = 0, z = 0;
};
// CUDA's 16-byte vector type: one 128-bit load or store on a GPU.
struct alignas(16) float4 {
  float x, y, z, w;
};
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }

struct dim3 {
  unsigned x = 1, y = 1, z = 1;
  constexpr dim3(unsigned vx = 1, unsigned vy = 1, unsigned vz = 1) : x(vx), y(vy), z(vz) {}
};

// Set by the scheduler before it resumes each fiber. constinit: no TLS
// wrapper call on every access (and UBSan then sees a plain address).
extern thread_local constinit uint3 threadIdx;
extern thread_local constinit uint3 blockIdx;
extern thread_local constinit dim3 blockDim;
extern thread_local constinit dim3 gridDim;
constexpr int warpSize = 32;

void __syncthreads();

// ---- warp intrinsics (see the top of this file) ----
namespace warp_detail {
template <typename T>
concept Shuffleable = std::is_trivially_copyable_v<T> && (sizeof(T) == 4 || sizeof(T) == 8);

template <warp_detail::Shuffleable T>
inline T shuffle(anvil::sim::WarpOp op, unsigned mask, T var, int arg, int width) {
  using Bits = std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>;
  const uint64_t out =
      anvil::sim::warp_collective(op, mask, std::bit_cast<Bits>(var), arg, width);
  return std::bit_cast<T>(static_cast<Bits>(out));
}
}  // namespace warp_detail

template <warp_detail::Shuffleable T>
inline T __shfl_sync(unsigned mask, T var, int srcLane, int width = warpSize) {
  return warp_detail::shuffle(anvil::sim::WarpOp::kShfl, mask, var, srcLane, width);
}
template <warp_detail::Shuffleable T>
inline T __shfl_up_sync(unsigned mask, T var, unsigned delta, int width = warpSize) {
  return warp_detail::shuffle(anvil::sim::WarpOp::kShflUp, mask, var, static_cast<int>(delta),
                              width);
}
template <warp_detail::Shuffleable T>
inline T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = warpSize) {
  return warp_detail::shuffle(anvil::sim::WarpOp::kShflDown, mask, var, static_cast<int>(delta),
                              width);
}
template <warp_detail::Shuffleable T>
inline T __shfl_xor_sync(unsigned mask, T var, int laneMask, int width = warpSize) {
  return warp_detail::shuffle(anvil::sim::WarpOp::kShflXor, mask, var, laneMask, width);
}
inline unsigned __ballot_sync(unsigned mask, int predicate) {
  return static_cast<unsigned>(
      anvil::sim::warp_collective(anvil::sim::WarpOp::kBallot, mask, predicate != 0, 0, warpSize));
}
inline int __any_sync(unsigned mask, int predicate) {
  return static_cast<int>(
      anvil::sim::warp_collective(anvil::sim::WarpOp::kAny, mask, predicate != 0, 0, warpSize));
}
inline int __all_sync(unsigned mask, int predicate) {
  return static_cast<int>(
      anvil::sim::warp_collective(anvil::sim::WarpOp::kAll, mask, predicate != 0, 0, warpSize));
}
inline void __syncwarp(unsigned mask = 0xffffffffu) {
  anvil::sim::warp_collective(anvil::sim::WarpOp::kSync, mask, 0, 0, warpSize);
}
inline unsigned __activemask() {
  return static_cast<unsigned>(
      anvil::sim::warp_collective(anvil::sim::WarpOp::kActive, 0, 0, 0, warpSize));
}

// ---- math and intrinsics (full precision on the CPU) ----
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline float __fdividef(float a, float b) { return a / b; }
inline float __expf(float x) { return std::exp(x); }
inline float __logf(float x) { return std::log(x); }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
inline float min(float a, float b) { return std::fmin(a, b); }
inline float max(float a, float b) { return std::fmax(a, b); }
inline int __popc(unsigned x) { return std::popcount(x); }
inline int __clz(int x) { return std::countl_zero(static_cast<unsigned>(x)); }
inline int __ffs(int x) { return x == 0 ? 0 : std::countr_zero(static_cast<unsigned>(x)) + 1; }
template <typename T>
inline T __ldg(const T* p) {
  return *p;
}

// ---- atomics: relaxed, as CUDA's ----
inline float atomicAdd(float* p, float v) {
  return std::atomic_ref<float>(*p).fetch_add(v, std::memory_order_relaxed);
}
inline int atomicAdd(int* p, int v) {
  return std::atomic_ref<int>(*p).fetch_add(v, std::memory_order_relaxed);
}
inline unsigned atomicAdd(unsigned* p, unsigned v) {
  return std::atomic_ref<unsigned>(*p).fetch_add(v, std::memory_order_relaxed);
}
inline unsigned long long atomicAdd(unsigned long long* p, unsigned long long v) {
  return std::atomic_ref<unsigned long long>(*p).fetch_add(v, std::memory_order_relaxed);
}
inline int atomicMax(int* p, int v) {
  std::atomic_ref<int> a(*p);
  int old = a.load(std::memory_order_relaxed);
  while (old < v && !a.compare_exchange_weak(old, v, std::memory_order_relaxed)) {
  }
  return old;
}
inline int atomicCAS(int* p, int expected, int desired) {
  std::atomic_ref<int>(*p).compare_exchange_strong(expected, desired, std::memory_order_relaxed);
  return expected;  // the old value, whether or not it was replaced
}

// ---- runtime subset ----
enum cudaError_t {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorInvalidDevicePointer = 17,
  cudaErrorInvalidMemcpyDirection = 21,
  cudaErrorInvalidDeviceFunction = 98,
  cudaErrorNoDevice = 100,
  cudaErrorInvalidDevice = 101,
  cudaErrorInvalidResourceHandle = 400,
  cudaErrorNotReady = 600,
  cudaErrorLaunchFailure = 719,
  cudaErrorNotSupported = 801,
  // Stream capture (sim/capture.cpp says when each is returned).
  cudaErrorStreamCaptureUnsupported = 900,
  cudaErrorStreamCaptureInvalidated = 901,
  cudaErrorStreamCaptureMerge = 902,
  cudaErrorStreamCaptureUnmatched = 903,
  cudaErrorStreamCaptureUnjoined = 904,
  cudaErrorStreamCaptureIsolation = 905,
  cudaErrorStreamCaptureImplicit = 906,
  cudaErrorCapturedEvent = 907,
  cudaErrorStreamCaptureWrongThread = 908,
};
using cudaError = cudaError_t;

enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4,
};

// Flags, with CUDA's values. Pinned memory is usable by every device here.
constexpr unsigned cudaHostAllocDefault = 0x00;
constexpr unsigned cudaHostAllocPortable = 0x01;
constexpr unsigned cudaStreamDefault = 0x00;      // ordered with the legacy default stream
constexpr unsigned cudaStreamNonBlocking = 0x01;  // not ordered with it
constexpr unsigned cudaEventDefault = 0x00;
constexpr unsigned cudaEventDisableTiming = 0x02;  // no cudaEventElapsedTime

struct CUstream_st;
using cudaStream_t = CUstream_st*;
struct CUevent_st;
using cudaEvent_t = CUevent_st*;
struct CUgraph_st;
using cudaGraph_t = CUgraph_st*;
struct CUgraphExec_st;
using cudaGraphExec_t = CUgraphExec_st*;
struct CUgraphNode_st;
using cudaGraphNode_t = CUgraphNode_st*;

enum cudaStreamCaptureStatus {
  cudaStreamCaptureStatusNone = 0,
  cudaStreamCaptureStatusActive = 1,
  cudaStreamCaptureStatusInvalidated = 2,
};
enum cudaStreamCaptureMode {
  cudaStreamCaptureModeGlobal = 0,
  cudaStreamCaptureModeThreadLocal = 1,
  cudaStreamCaptureModeRelaxed = 2,
};

struct cudaDeviceProp {
  char name[256];
  size_t totalGlobalMem;
  size_t sharedMemPerBlock;
  size_t sharedMemPerBlockOptin;  // the most a kernel may opt in to (cudaFuncSetAttribute)
  int maxThreadsPerBlock;
  int maxThreadsDim[3];
  int maxGridSize[3];
  int warpSize;
  int multiProcessorCount;
  int major;
  int minor;
};

// For cudaErrorLaunchFailure the text also names the failed kernel (its
// launch's file:line and what went wrong): the most recent such failure on
// the calling thread. Other codes give CUDA's text.
const char* cudaGetErrorString(cudaError_t error);
const char* cudaGetErrorName(cudaError_t error);
cudaError_t cudaGetLastError();
cudaError_t cudaPeekAtLastError();
cudaError_t cudaMalloc(void** ptr, size_t bytes);
template <typename T>
cudaError_t cudaMalloc(T** ptr, size_t bytes) {
  return cudaMalloc(reinterpret_cast<void**>(ptr), bytes);
}
cudaError_t cudaFree(void* ptr);
cudaError_t cudaHostAlloc(void** ptr, size_t bytes, unsigned int flags);
template <typename T>
cudaError_t cudaHostAlloc(T** ptr, size_t bytes, unsigned int flags) {
  return cudaHostAlloc(reinterpret_cast<void**>(ptr), bytes, flags);
}
cudaError_t cudaMallocHost(void** ptr, size_t bytes);
template <typename T>
cudaError_t cudaMallocHost(T** ptr, size_t bytes) {
  return cudaMallocHost(reinterpret_cast<void**>(ptr), bytes);
}
cudaError_t cudaFreeHost(void* ptr);
cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t stream = nullptr);
cudaError_t cudaMemset(void* ptr, int value, size_t bytes);
cudaError_t cudaMemsetAsync(void* ptr, int value, size_t bytes, cudaStream_t stream = nullptr);
cudaError_t cudaDeviceSynchronize();
cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes);
cudaError_t cudaStreamCreate(cudaStream_t* stream);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int flags);
// Work still queued on a destroyed stream runs at the next synchronisation
// of its device, as a GPU finishes it.
cudaError_t cudaStreamDestroy(cudaStream_t stream);
cudaError_t cudaStreamSynchronize(cudaStream_t stream);
cudaError_t cudaStreamQuery(cudaStream_t stream);
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags = 0);
cudaError_t cudaEventCreate(cudaEvent_t* event);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags);
cudaError_t cudaEventDestroy(cudaEvent_t event);
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream = nullptr);
cudaError_t cudaEventSynchronize(cudaEvent_t event);
cudaError_t cudaEventQuery(cudaEvent_t event);
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end);
// Stream capture and graphs (sim/capture.cpp: what is captured, the rules and
// their errors, how a graph runs).
cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode mode);
cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* graph);
cudaError_t cudaStreamIsCapturing(cudaStream_t stream, cudaStreamCaptureStatus* status);
cudaError_t cudaThreadExchangeStreamCaptureMode(cudaStreamCaptureMode* mode);
cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph,
                                 unsigned long long flags = 0);
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream);
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec);
cudaError_t cudaGraphDestroy(cudaGraph_t graph);
// Only the count (nodes must be null): the simulator hands out no node handles.
cudaError_t cudaGraphGetNodes(cudaGraph_t graph, cudaGraphNode_t* nodes, size_t* count);
cudaError_t cudaGetDeviceCount(int* count);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaGetDevice(int* device);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device);

// Per-kernel attributes (the CUDA Runtime API's cudaFuncSetAttribute). Only
// cudaFuncAttributeMaxDynamicSharedMemorySize is emulated: a launch may ask
// for at most that many bytes of dynamic shared memory (48 KB until it is
// set), and it can be set up to sharedMemPerBlockOptin (cudaErrorInvalidValue
// beyond). The carveout is a hint, accepted and ignored.
enum cudaFuncAttribute {
  cudaFuncAttributeMaxDynamicSharedMemorySize = 8,
  cudaFuncAttributePreferredSharedMemoryCarveout = 9,
};
cudaError_t cudaFuncSetAttribute(const void* func, cudaFuncAttribute attr, int value);
template <class T>
cudaError_t cudaFuncSetAttribute(T* entry, cudaFuncAttribute attr, int value) {
  return cudaFuncSetAttribute(reinterpret_cast<const void*>(entry), attr, value);
}

}  // namespace anvil_sim_rt

using namespace anvil_sim_rt;  // kernels expect CUDA's names in the global namespace

namespace anvil::sim {

// One launch's kernel and its arguments, converted once as a launch copies
// them to the device (see cuda_compat.h). The stream queue owns it until the
// launch has run, so the arguments outlive the call that launched it.
struct KernelCall {
  virtual ~KernelCall() = default;
  // The kernel's body for one CUDA thread: called by every thread of every
  // block, from several worker threads at once.
  virtual void run_thread() const = 0;
  // The kernel function's address, by which the launch audit names the
  // kernel (its symbol); null when unknown.
  virtual const void* kernel_address() const { return nullptr; }
};

// The launch behind anvil::cuda::launch: checks the configuration and queues
// the launch on `stream` (null: the current device's legacy default stream).
// Throws std::runtime_error naming `where` on a bad configuration or an
// unknown stream. Errors while the kernel runs (a divergent __syncthreads, a
// misused warp collective, an exception thrown by a CUDA thread) are returned
// as cudaErrorLaunchFailure by the synchronising call that ran it, with the
// detail in last_error_detail() and cudaGetErrorString.
void launch_kernel(dim3 grid, dim3 block, size_t shared_bytes, cudaStream_t stream,
                   std::source_location where, std::unique_ptr<KernelCall> call);

// The running block's dynamic shared memory: exactly the launch's bytes,
// filled with NaN bytes (0xFF) before the block starts.
void* dynamic_shared_bytes();

// The readable detail of the most recent failed runtime call on this thread
// (kept after cudaGetLastError resets the code; "" if none yet).
std::string last_error_detail();

// Worker threads that run a launch's blocks (ANVIL_SIM_WORKERS sets the
// first value; at least 1). For tests and tools; takes effect at the next launch.
void set_workers(unsigned count);
unsigned workers();

// When queued work runs (ANVIL_SIM_STREAMS=deferred|eager sets the first
// value). Switching leaves queued work queued: it runs at the next sync.
enum class StreamMode { kDeferred, kEager };
void set_stream_mode(StreamMode mode);
StreamMode stream_mode();

// How many blocking calls so far (cudaDeviceSynchronize, cudaStreamSynchronize,
// cudaEventSynchronize, cudaMemcpy, cudaMemset, cudaMemcpyAsync into pageable
// host memory) found device work still queued, so that on a GPU the host would
// wait and the device then idle until the host issued more. Counted in the
// deferred stream mode (the default; eager mode runs work as it is queued).
// Tests use it to keep such waits out of the training step.
uint64_t host_waits();
// How many of those blocking calls so far, whether or not they found work
// queued: each is a point where the host stops until the device has caught
// up, which a captured CUDA graph cannot hold. Tests use it to keep the
// training step free of them.
uint64_t host_syncs();
// cudaGraphLaunch calls so far (each one launch by the host, whatever its
// graph holds).
uint64_t graph_launches();
// Mutation hook for the tests: every graph instantiated from now on leaves
// out its kernel node number `index` (in capture order; -1, the default:
// none), as a graph missing a node would (ANVIL_SIM_GRAPH_DROP_NODE=K sets
// the first value). The tests that compare a graphed step with the eager
// one fail with it.
void set_graph_drop_node(int64_t index);

// The launch audit (docs/kernels.md, "Launch audit"): while it records, every
// block of every launch is timed (thread CPU time) and each kernel's launches,
// blocks, share of the run's block time and predicted SM utilisation on an
// H100 are kept; finishing writes them to `path`, one JSON object per kernel
// per line. ANVIL_SIM_LAUNCH_AUDIT=FILE starts it at the first launch and
// finishes it at exit. start_launch_audit throws std::runtime_error naming
// `path` when it cannot be written (and when an audit is already recording);
// finish_launch_audit when the file cannot be written, and does nothing when
// no audit records.
void start_launch_audit(const std::string& path);
void finish_launch_audit();

// Run only `count` evenly spread blocks of each launch (0: all; the first
// value comes from ANVIL_SIM_SAMPLE_BLOCKS). For the launch audit of a run
// too slow to simulate whole: the blocks skipped leave their outputs
// unwritten, so the run's numeric results are invalid.
void set_sample_blocks(uint64_t count);
uint64_t sample_blocks();

// Which blocks run, for tests of shapes too large to simulate whole: while a
// BlockFilter lives, every launch of a kernel whose short name
// (core/symbol_name.h's short_kernel_name) contains `kernel` runs only the
// blocks `keep` accepts, in block order, and skips the others, leaving their
// outputs unwritten; launches of other kernels run every block (and
// ANVIL_SIM_SAMPLE_BLOCKS does not apply to the filtered ones). One filter
// at a time: a second throws std::logic_error.
class BlockFilter {
 public:
  using Keep = std::function<bool(const dim3& grid, const uint3& block)>;
  BlockFilter(std::string kernel, Keep keep);
  ~BlockFilter();
  BlockFilter(const BlockFilter&) = delete;
  BlockFilter& operator=(const BlockFilter&) = delete;
  // The filtered launches so far, and the blocks they ran.
  uint64_t launches() const;
  uint64_t blocks_run() const;
};

// Limits the launch enforces (a compute-capability 8.x/9.x device's).
constexpr unsigned kMaxThreadsPerBlock = 1024;
// Dynamic shared memory a kernel may have without opting in; the most it may
// opt in to: compute capability 8.0's 163 KB (the simulated device's; 9.0
// allows 227 KB).
constexpr size_t kMaxDynamicShared = 48 * 1024;
constexpr size_t kMaxDynamicSharedOptin = 163 * 1024;
// The dynamic shared memory a launch of `kernel` may ask for: what
// cudaFuncSetAttribute set, else kMaxDynamicShared.
size_t max_dynamic_shared(const void* kernel);

}  // namespace anvil::sim
