// The simulator's CUDA runtime subset, the parts without streams: device and
// pinned host memory (tracked, so that copies can be checked and pinned
// memory told from pageable), devices, and the per-thread error state.
// Streams, events, copies and memsets are in sim/streams.cpp.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>

#include "sim/sim_internal.h"

namespace {

// cudaFuncAttributeMaxDynamicSharedMemorySize per kernel (its address), for
// the whole process, as the attribute of a function is.
struct DynamicSharedLimits {
  std::mutex mutex;
  std::map<const void*, size_t> bytes;
};
DynamicSharedLimits& dynamic_shared_limits() {
  static auto* limits = new DynamicSharedLimits;  // leaked, as Registry
  return *limits;
}

struct Allocation {
  size_t bytes;
  int device;
};

// Every live cudaMalloc block and pinned host block by base address. Leaked
// on purpose: tensors in static objects are freed after static destructors
// would have destroyed it.
struct Registry {
  std::mutex mutex;
  std::map<uintptr_t, Allocation> allocations;
  std::map<uintptr_t, size_t> pinned;  // cudaHostAlloc blocks and their sizes
  std::map<int, size_t> used;          // bytes allocated per device
};
Registry& registry() {
  static auto* r = new Registry();
  return *r;
}

thread_local cudaError_t t_last_error = cudaSuccess;
thread_local std::string t_last_detail;
thread_local std::string t_launch_failure_text;  // cudaGetErrorString(cudaErrorLaunchFailure)
thread_local int t_device = 0;

using anvil::sim::detail::fail;

int device_count() {
  const char* env = std::getenv("ANVIL_SIM_DEVICES");
  if (env == nullptr || *env == '\0') return 2;
  int n = std::atoi(env);
  return n < 0 ? 0 : n;
}

// Each simulated device's memory: ANVIL_SIM_MEMORY_MB (default 16 GiB), so
// that running out of device memory can be tested without exhausting the host.
size_t device_memory() {
  const char* env = std::getenv("ANVIL_SIM_MEMORY_MB");
  if (env == nullptr || *env == '\0') return size_t{16} << 30;
  return size_t(std::strtoull(env, nullptr, 10)) << 20;
}

// The allocation holding [p, p+bytes), or null if p is not device memory.
// Sets `overrun` when p is inside an allocation but the range leaves it.
const Allocation* find(const void* p, size_t bytes, bool& overrun, uintptr_t& base) {
  auto& allocs = registry().allocations;
  uintptr_t a = reinterpret_cast<uintptr_t>(p);
  auto it = allocs.upper_bound(a);
  overrun = false;
  if (it == allocs.begin()) return nullptr;
  --it;
  if (a >= it->first + it->second.bytes && !(a == it->first && it->second.bytes == 0))
    return nullptr;
  base = it->first;
  overrun = a + bytes > it->first + it->second.bytes;
  return &it->second;
}

const char* kind_name(cudaMemcpyKind k) {
  switch (k) {
    case cudaMemcpyHostToHost: return "cudaMemcpyHostToHost";
    case cudaMemcpyHostToDevice: return "cudaMemcpyHostToDevice";
    case cudaMemcpyDeviceToHost: return "cudaMemcpyDeviceToHost";
    case cudaMemcpyDeviceToDevice: return "cudaMemcpyDeviceToDevice";
    case cudaMemcpyDefault: return "cudaMemcpyDefault";
  }
  return "an unknown cudaMemcpyKind";
}

// Checks one side of a copy: is `p` of the kind `want_device` says, and does
// [p, p+bytes) stay inside its allocation? Caller holds the registry mutex.
cudaError_t check_side(const char* api, const char* what, const void* p, size_t bytes,
                       bool want_device, cudaMemcpyKind kind) {
  bool overrun = false;
  uintptr_t base = 0;
  const Allocation* a = find(p, bytes, overrun, base);
  if ((a != nullptr) != want_device) {
    return fail(cudaErrorInvalidValue,
                std::string(api) + ": " + what + " is " + (a ? "device" : "host") +
                    " memory but the kind is " + kind_name(kind));
  }
  if (a != nullptr && overrun) {
    return fail(cudaErrorInvalidValue,
                std::string(api) + ": " + what + " range of " + std::to_string(bytes) +
                    " bytes at offset " + std::to_string(reinterpret_cast<uintptr_t>(p) - base) +
                    " overruns its allocation of " + std::to_string(a->bytes) + " bytes");
  }
  return cudaSuccess;
}

}  // namespace

namespace anvil_sim_rt {

const char* cudaGetErrorName(cudaError_t error) {
  switch (error) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevicePointer: return "cudaErrorInvalidDevicePointer";
    case cudaErrorInvalidDeviceFunction: return "cudaErrorInvalidDeviceFunction";
    case cudaErrorInvalidMemcpyDirection: return "cudaErrorInvalidMemcpyDirection";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
    case cudaErrorNotSupported: return "cudaErrorNotSupported";
    case cudaErrorStreamCaptureUnsupported: return "cudaErrorStreamCaptureUnsupported";
    case cudaErrorStreamCaptureInvalidated: return "cudaErrorStreamCaptureInvalidated";
    case cudaErrorStreamCaptureMerge: return "cudaErrorStreamCaptureMerge";
    case cudaErrorStreamCaptureUnmatched: return "cudaErrorStreamCaptureUnmatched";
    case cudaErrorStreamCaptureUnjoined: return "cudaErrorStreamCaptureUnjoined";
    case cudaErrorStreamCaptureIsolation: return "cudaErrorStreamCaptureIsolation";
    case cudaErrorStreamCaptureImplicit: return "cudaErrorStreamCaptureImplicit";
    case cudaErrorCapturedEvent: return "cudaErrorCapturedEvent";
    case cudaErrorStreamCaptureWrongThread: return "cudaErrorStreamCaptureWrongThread";
  }
  return "cudaErrorUnknown";
}

const char* cudaGetErrorString(cudaError_t error) {
  switch (error) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidDevicePointer: return "invalid device pointer";
    case cudaErrorInvalidDeviceFunction: return "invalid device function";
    case cudaErrorInvalidMemcpyDirection: return "invalid copy direction for memcpy";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorNotSupported: return "operation not supported";
    case cudaErrorStreamCaptureUnsupported: return "operation not permitted when stream is capturing";
    case cudaErrorStreamCaptureInvalidated:
      return "operation failed due to a previous error during capture";
    case cudaErrorStreamCaptureMerge:
      return "operation would result in a merge of separate capture sequences";
    case cudaErrorStreamCaptureUnmatched: return "capture was not ended in the same stream as it began";
    case cudaErrorStreamCaptureUnjoined: return "capturing stream has unjoined work";
    case cudaErrorStreamCaptureIsolation:
      return "dependency created on uncaptured work in another stream";
    case cudaErrorStreamCaptureImplicit:
      return "operation would make the legacy stream depend on a capturing blocking stream";
    case cudaErrorCapturedEvent:
      return "operation not permitted on an event last recorded in a capturing stream";
    case cudaErrorStreamCaptureWrongThread:
      return "attempt to terminate a thread-local capture sequence from another thread";
    case cudaErrorLaunchFailure:
      // Names the kernel, so that anvil::cuda::check's exception does.
      return t_launch_failure_text.empty() ? "unspecified launch failure"
                                           : t_launch_failure_text.c_str();
  }
  return "unknown error";
}

cudaError_t cudaGetLastError() {
  cudaError_t e = t_last_error;
  t_last_error = cudaSuccess;
  return e;
}

cudaError_t cudaPeekAtLastError() { return t_last_error; }

cudaError_t cudaMalloc(void** ptr, size_t bytes) {
  if (ptr == nullptr) return fail(cudaErrorInvalidValue, "cudaMalloc: null result pointer");
  *ptr = nullptr;
  if (cudaError_t e = anvil::sim::detail::capture_unsafe_call("cudaMalloc"); e != cudaSuccess)
    return e;
  std::lock_guard lock(registry().mutex);
  size_t& used = registry().used[t_device];
  if (bytes > device_memory() - used)
    return fail(cudaErrorMemoryAllocation,
                "cudaMalloc: " + std::to_string(bytes) + " bytes requested, " +
                    std::to_string(device_memory() - used) + " free on simulated device " +
                    std::to_string(t_device));
  // 256-byte alignment, as cudaMalloc guarantees, and exactly the bytes
  // asked for (at least one, so every allocation has a distinct address), so
  // that AddressSanitizer reports a kernel reading one element too far.
  void* p = nullptr;
  if (posix_memalign(&p, 256, bytes == 0 ? 1 : bytes) != 0)
    return fail(cudaErrorMemoryAllocation, "cudaMalloc: out of host memory");
  used += bytes;
  registry().allocations[reinterpret_cast<uintptr_t>(p)] = Allocation{bytes, t_device};
  *ptr = p;
  return cudaSuccess;
}

cudaError_t cudaFree(void* ptr) {
  if (ptr == nullptr) return cudaSuccess;
  if (cudaError_t e = anvil::sim::detail::capture_unsafe_call("cudaFree"); e != cudaSuccess)
    return e;
  {
    std::lock_guard lock(registry().mutex);
    if (registry().allocations.count(reinterpret_cast<uintptr_t>(ptr)) == 0)
      return fail(cudaErrorInvalidValue,
                  "cudaFree: pointer is not the start of a cudaMalloc block");
  }
  // cudaFree synchronises: queued work may still use the block (on any
  // device: a peer copy reads another device's memory).
  const cudaError_t queued = anvil::sim::detail::drain_all_devices();
  std::lock_guard lock(registry().mutex);
  auto it = registry().allocations.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == registry().allocations.end())  // freed by another thread meanwhile
    return fail(cudaErrorInvalidValue, "cudaFree: pointer is not the start of a cudaMalloc block");
  registry().used[it->second.device] -= it->second.bytes;
  registry().allocations.erase(it);
  std::free(ptr);
  return queued;
}

cudaError_t cudaHostAlloc(void** ptr, size_t bytes, unsigned int flags) {
  if (ptr == nullptr) return fail(cudaErrorInvalidValue, "cudaHostAlloc: null result pointer");
  *ptr = nullptr;
  if (cudaError_t e = anvil::sim::detail::capture_unsafe_call("cudaHostAlloc"); e != cudaSuccess)
    return e;
  if ((flags & ~cudaHostAllocPortable) != 0)
    return fail(cudaErrorInvalidValue,
                "cudaHostAlloc: flags " + std::to_string(flags) + " are not supported");
  // Page-aligned as pinned pages are, exactly the bytes asked for (ASan).
  void* p = nullptr;
  if (posix_memalign(&p, 4096, bytes == 0 ? 1 : bytes) != 0)
    return fail(cudaErrorMemoryAllocation, "cudaHostAlloc: out of host memory");
  std::lock_guard lock(registry().mutex);
  registry().pinned[reinterpret_cast<uintptr_t>(p)] = bytes;
  *ptr = p;
  return cudaSuccess;
}

cudaError_t cudaMallocHost(void** ptr, size_t bytes) {
  return cudaHostAlloc(ptr, bytes, cudaHostAllocDefault);
}

cudaError_t cudaFreeHost(void* ptr) {
  if (ptr == nullptr) return cudaSuccess;
  if (cudaError_t e = anvil::sim::detail::capture_unsafe_call("cudaFreeHost"); e != cudaSuccess)
    return e;
  {
    std::lock_guard lock(registry().mutex);
    if (registry().pinned.count(reinterpret_cast<uintptr_t>(ptr)) == 0)
      return fail(cudaErrorInvalidValue,
                  "cudaFreeHost: pointer is not the start of a cudaHostAlloc block");
  }
  // Like cudaFree, it waits for the devices: a queued copy may use the block.
  const cudaError_t queued = anvil::sim::detail::drain_all_devices();
  std::lock_guard lock(registry().mutex);
  if (registry().pinned.erase(reinterpret_cast<uintptr_t>(ptr)) == 0)
    return fail(cudaErrorInvalidValue,
                "cudaFreeHost: pointer is not the start of a cudaHostAlloc block");
  std::free(ptr);
  return queued;
}

cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  if (free_bytes == nullptr || total_bytes == nullptr)
    return fail(cudaErrorInvalidValue, "cudaMemGetInfo: null pointer");
  std::lock_guard lock(registry().mutex);
  *total_bytes = device_memory();
  *free_bytes = device_memory() - registry().used[t_device];
  return cudaSuccess;
}

cudaError_t cudaGetDeviceCount(int* count) {
  if (count == nullptr) return fail(cudaErrorInvalidValue, "cudaGetDeviceCount: null pointer");
  *count = device_count();
  if (*count == 0) return fail(cudaErrorNoDevice, "ANVIL_SIM_DEVICES=0");
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
  if (device < 0 || device >= device_count())
    return fail(cudaErrorInvalidDevice,
                "cudaSetDevice(" + std::to_string(device) + "): " +
                    std::to_string(device_count()) + " simulated devices");
  t_device = device;
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int* device) {
  if (device == nullptr) return fail(cudaErrorInvalidValue, "cudaGetDevice: null pointer");
  *device = t_device;
  return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  if (prop == nullptr) return fail(cudaErrorInvalidValue, "cudaGetDeviceProperties: null");
  if (device < 0 || device >= device_count())
    return fail(cudaErrorInvalidDevice, "cudaGetDeviceProperties: no device " +
                                            std::to_string(device));
  *prop = cudaDeviceProp{};
  std::strncpy(prop->name, "anvil simulated GPU", sizeof prop->name - 1);
  prop->totalGlobalMem = device_memory();
  prop->sharedMemPerBlock = anvil::sim::kMaxDynamicShared;
  prop->sharedMemPerBlockOptin = anvil::sim::kMaxDynamicSharedOptin;
  prop->maxThreadsPerBlock = static_cast<int>(anvil::sim::kMaxThreadsPerBlock);
  prop->maxThreadsDim[0] = 1024;
  prop->maxThreadsDim[1] = 1024;
  prop->maxThreadsDim[2] = 64;
  prop->maxGridSize[0] = 2147483647;
  prop->maxGridSize[1] = 65535;
  prop->maxGridSize[2] = 65535;
  prop->warpSize = 32;
  prop->multiProcessorCount = 1;
  prop->major = 8;
  prop->minor = 0;
  return cudaSuccess;
}

cudaError_t cudaFuncSetAttribute(const void* func, cudaFuncAttribute attr, int value) {
  if (func == nullptr)
    return fail(cudaErrorInvalidDeviceFunction, "cudaFuncSetAttribute: null function");
  if (attr == cudaFuncAttributePreferredSharedMemoryCarveout) {
    if (value < -1 || value > 100)
      return fail(cudaErrorInvalidValue, "cudaFuncSetAttribute: carveout " +
                                             std::to_string(value) + " is not -1 or 0..100");
    return cudaSuccess;  // a hint
  }
  if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize)
    return fail(cudaErrorInvalidValue, "cudaFuncSetAttribute: attribute " +
                                           std::to_string(int(attr)) + " is not emulated");
  if (value < 0 || size_t(value) > anvil::sim::kMaxDynamicSharedOptin)
    return fail(cudaErrorInvalidValue,
                "cudaFuncSetAttribute: cudaFuncAttributeMaxDynamicSharedMemorySize " +
                    std::to_string(value) + " is outside [0, sharedMemPerBlockOptin = " +
                    std::to_string(anvil::sim::kMaxDynamicSharedOptin) + "]");
  std::lock_guard lock(dynamic_shared_limits().mutex);
  dynamic_shared_limits().bytes[func] = size_t(value);
  return cudaSuccess;
}

}  // namespace anvil_sim_rt

namespace anvil::sim {

std::string last_error_detail() { return t_last_detail; }

size_t max_dynamic_shared(const void* kernel) {
  std::lock_guard lock(dynamic_shared_limits().mutex);
  const auto it = dynamic_shared_limits().bytes.find(kernel);
  return it == dynamic_shared_limits().bytes.end() ? kMaxDynamicShared : it->second;
}

cudaError_t detail::fail(cudaError_t err, std::string detail) {
  t_last_error = err;
  t_last_detail = std::move(detail);
  if (err == cudaErrorLaunchFailure)
    t_launch_failure_text = "unspecified launch failure (" + t_last_detail + ")";
  return err;
}

int detail::current_device() { return t_device; }

int detail::device_of(const void* p) {
  std::lock_guard lock(registry().mutex);
  bool overrun = false;
  uintptr_t base = 0;
  const Allocation* a = find(p, 1, overrun, base);
  return a ? a->device : -1;
}

bool detail::is_pinned(const void* p, size_t bytes) {
  std::lock_guard lock(registry().mutex);
  auto& pinned = registry().pinned;
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  auto it = pinned.upper_bound(a);
  if (it == pinned.begin()) return false;
  --it;
  return a >= it->first && a + bytes <= it->first + std::max<size_t>(it->second, 1);
}

cudaError_t detail::check_copy(const char* api, void* dst, const void* src, size_t bytes,
                               cudaMemcpyKind& kind) {
  if (dst == nullptr || src == nullptr)
    return fail(cudaErrorInvalidValue, std::string(api) + ": null pointer");
  std::lock_guard lock(registry().mutex);
  if (kind == cudaMemcpyDefault) {
    bool overrun = false;
    uintptr_t base = 0;
    const bool dst_dev = find(dst, bytes, overrun, base) != nullptr;
    const bool src_dev = find(src, bytes, overrun, base) != nullptr;
    kind = static_cast<cudaMemcpyKind>((src_dev ? 2 : 0) + (dst_dev ? 1 : 0));
  }
  if (kind < cudaMemcpyHostToHost || kind > cudaMemcpyDeviceToDevice)
    return fail(cudaErrorInvalidMemcpyDirection, std::string(api) + ": unknown cudaMemcpyKind");
  const bool src_dev = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
  const bool dst_dev = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
  if (cudaError_t e = check_side(api, "source", src, bytes, src_dev, kind); e != cudaSuccess)
    return e;
  return check_side(api, "destination", dst, bytes, dst_dev, kind);
}

cudaError_t detail::check_memset(const char* api, void* p, size_t bytes) {
  std::lock_guard lock(registry().mutex);
  bool overrun = false;
  uintptr_t base = 0;
  if (find(p, bytes, overrun, base) == nullptr)
    return fail(cudaErrorInvalidValue, std::string(api) + ": pointer is not device memory");
  if (overrun)
    return fail(cudaErrorInvalidValue,
                std::string(api) + ": " + std::to_string(bytes) + " bytes overrun the allocation");
  return cudaSuccess;
}

}  // namespace anvil::sim
