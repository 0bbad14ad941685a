// The CUDA simulator: enough of CUDA C++ and its runtime for the unchanged
// kernels/cuda/*.cu files to compile with g++ and run on the CPU. Included
// only through kernels/cuda/cuda_compat.h (never together with the real
// <cuda_runtime.h>). Each CUDA thread is a fiber; blocks run one after
// another on the launching thread.
//
// Synchronisation: __syncthreads is a block barrier. The warp intrinsics
// (__shfl*_sync, __ballot_sync, __any_sync, __all_sync, __syncwarp) are warp
// barriers: lanes are linear thread id % 32 (id = x + y*bx + z*bx*by), a
// collective completes when every lane its mask names (of those that exist in
// the block) waits in the same collective with the same mask, and each lane's
// result is computed before any of them runs on. A mask naming a lane that has
// returned or waits at __syncthreads, or lanes of a warp waiting with
// overlapping different masks, is an error from the launch, not a hang. A
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
#include <source_location>
#include <string>
#include <type_traits>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__
// One block runs at a time per worker thread, so a per-thread static is
// exactly the block's shared memory. (It starts zeroed and keeps its values
// between blocks: stale reads do not show; dynamic shared memory does.)
#define __shared__ static thread_local

namespace anvil::sim {

// The warp collectives behind the intrinsics: the calling fiber records its
// operation in its slot and waits until the scheduler completes the
// collective for its whole mask (see scheduler.cpp). `value` holds the
// lane's operand bits (a shuffle's value, a vote's predicate), `arg` the
// source lane, delta or lane mask; the result is the bits the lane receives.
enum class WarpOp : unsigned char {
  kShfl, kShflUp, kShflDown, kShflXor, kBallot, kAny, kAll, kSync, kActive
};
uint64_t warp_collective(WarpOp op, unsigned mask, uint64_t value, int arg, int width);

}  // namespace anvil::sim

namespace anvil_sim_rt {

struct uint3 {
  unsigned x = 0, y = 0, z = 0;
};
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
  cudaErrorNoDevice = 100,
  cudaErrorInvalidDevice = 101,
  cudaErrorInvalidResourceHandle = 400,
  cudaErrorLaunchFailure = 719,
};
using cudaError = cudaError_t;

enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4,
};

struct CUstream_st;
using cudaStream_t = CUstream_st*;
struct CUevent_st;
using cudaEvent_t = CUevent_st*;

struct cudaDeviceProp {
  char name[256];
  size_t totalGlobalMem;
  size_t sharedMemPerBlock;
  int maxThreadsPerBlock;
  int maxThreadsDim[3];
  int maxGridSize[3];
  int warpSize;
  int multiProcessorCount;
  int major;
  int minor;
};

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
cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t stream = nullptr);
cudaError_t cudaMemset(void* ptr, int value, size_t bytes);
// Launches and copies are synchronous in the simulator, so the async form
// does the work at once.
inline cudaError_t cudaMemsetAsync(void* ptr, int value, size_t bytes, cudaStream_t = nullptr) {
  return cudaMemset(ptr, value, bytes);
}
cudaError_t cudaDeviceSynchronize();
cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes);
cudaError_t cudaStreamCreate(cudaStream_t* stream);
cudaError_t cudaStreamDestroy(cudaStream_t stream);
cudaError_t cudaStreamSynchronize(cudaStream_t stream);
// Events hold the host's steady clock at cudaEventRecord (work on a stream is
// done by the time the call that queued it returns, so the clock is the
// simulator's time, not a GPU's). Elapsed time needs both events recorded.
cudaError_t cudaEventCreate(cudaEvent_t* event);
cudaError_t cudaEventDestroy(cudaEvent_t event);
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream = nullptr);
cudaError_t cudaEventSynchronize(cudaEvent_t event);
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end);
cudaError_t cudaGetDeviceCount(int* count);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaGetDevice(int* device);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device);

}  // namespace anvil_sim_rt

using namespace anvil_sim_rt;  // kernels expect CUDA's names in the global namespace

namespace anvil::sim {

// The launch behind anvil::cuda::launch: checks the configuration, then runs
// every block (each CUDA thread a fiber) and returns when all have finished.
// Throws std::runtime_error naming `where` on a bad configuration, a
// divergent __syncthreads or an exception thrown by a CUDA thread.
void launch_kernel(dim3 grid, dim3 block, size_t shared_bytes, cudaStream_t stream,
                   std::source_location where, void (*thread_body)(void*), void* ctx);

// The running block's dynamic shared memory: exactly the launch's bytes,
// filled with NaN bytes (0xFF) before the block starts.
void* dynamic_shared_bytes();

// The readable detail of the most recent failed runtime call on this thread
// (kept after cudaGetLastError resets the code; "" if none yet).
std::string last_error_detail();

// Limits the launch enforces (a compute-capability 8.x/9.x device's).
constexpr unsigned kMaxThreadsPerBlock = 1024;
constexpr size_t kMaxDynamicShared = 48 * 1024;

}  // namespace anvil::sim
