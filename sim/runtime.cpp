// The simulator's CUDA runtime subset: device memory (tracked so that
// copies can be checked), devices, synchronous streams, host-clock events
// and error state.
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <string>

#include "sim/cuda_sim.h"

namespace anvil_sim_rt {
struct CUstream_st {
  int device;
};
struct CUevent_st {
  bool recorded = false;
  std::chrono::steady_clock::time_point time;
};
}  // namespace anvil_sim_rt

namespace {

struct Allocation {
  size_t bytes;
  int device;
};

// Every live cudaMalloc block by base address; streams by handle.
struct Registry {
  std::mutex mutex;
  std::map<uintptr_t, Allocation> allocations;
  std::set<cudaStream_t> streams;
  std::set<cudaEvent_t> events;
  std::map<int, size_t> used;  // bytes allocated per device
};
Registry& registry() {
  static Registry r;
  return r;
}

thread_local cudaError_t t_last_error = cudaSuccess;
thread_local std::string t_last_detail;
thread_local int t_device = 0;

cudaError_t fail(cudaError_t err, std::string detail) {
  t_last_error = err;
  t_last_detail = std::move(detail);
  return err;
}

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
// [p, p+bytes) stay inside its allocation?
cudaError_t check_side(const char* what, const void* p, size_t bytes, bool want_device,
                       cudaMemcpyKind kind) {
  bool overrun = false;
  uintptr_t base = 0;
  const Allocation* a = find(p, bytes, overrun, base);
  if ((a != nullptr) != want_device) {
    return fail(cudaErrorInvalidValue,
                std::string("cudaMemcpy: ") + what + " is " + (a ? "device" : "host") +
                    " memory but the kind is " + kind_name(kind));
  }
  if (a != nullptr && overrun) {
    return fail(cudaErrorInvalidValue,
                std::string("cudaMemcpy: ") + what + " range of " + std::to_string(bytes) +
                    " bytes at offset " +
                    std::to_string(reinterpret_cast<uintptr_t>(p) - base) +
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
    case cudaErrorInvalidMemcpyDirection: return "cudaErrorInvalidMemcpyDirection";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
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
    case cudaErrorInvalidMemcpyDirection: return "invalid copy direction for memcpy";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorLaunchFailure: return "unspecified launch failure";
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
  std::lock_guard lock(registry().mutex);
  auto it = registry().allocations.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == registry().allocations.end())
    return fail(cudaErrorInvalidValue, "cudaFree: pointer is not the start of a cudaMalloc block");
  registry().used[it->second.device] -= it->second.bytes;
  registry().allocations.erase(it);
  std::free(ptr);
  return cudaSuccess;
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  if (bytes == 0) return cudaSuccess;
  if (dst == nullptr || src == nullptr)
    return fail(cudaErrorInvalidValue, "cudaMemcpy: null pointer");
  std::lock_guard lock(registry().mutex);
  if (kind == cudaMemcpyDefault) {
    bool overrun = false;
    uintptr_t base = 0;
    bool dst_dev = find(dst, bytes, overrun, base) != nullptr;
    bool src_dev = find(src, bytes, overrun, base) != nullptr;
    kind = static_cast<cudaMemcpyKind>((src_dev ? 2 : 0) + (dst_dev ? 1 : 0));
  }
  if (kind < cudaMemcpyHostToHost || kind > cudaMemcpyDeviceToDevice)
    return fail(cudaErrorInvalidMemcpyDirection, "cudaMemcpy: unknown cudaMemcpyKind");
  bool src_dev = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
  bool dst_dev = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
  if (cudaError_t e = check_side("source", src, bytes, src_dev, kind); e != cudaSuccess) return e;
  if (cudaError_t e = check_side("destination", dst, bytes, dst_dev, kind); e != cudaSuccess)
    return e;
  std::memmove(dst, src, bytes);
  return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t) {
  return cudaMemcpy(dst, src, bytes, kind);  // streams are synchronous in this simulator
}

cudaError_t cudaMemset(void* ptr, int value, size_t bytes) {
  if (bytes == 0) return cudaSuccess;
  std::lock_guard lock(registry().mutex);
  bool overrun = false;
  uintptr_t base = 0;
  if (find(ptr, bytes, overrun, base) == nullptr)
    return fail(cudaErrorInvalidValue, "cudaMemset: pointer is not device memory");
  if (overrun)
    return fail(cudaErrorInvalidValue, "cudaMemset: " + std::to_string(bytes) +
                                           " bytes overrun the allocation");
  std::memset(ptr, value, bytes);
  return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize() { return cudaSuccess; }

cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  if (free_bytes == nullptr || total_bytes == nullptr)
    return fail(cudaErrorInvalidValue, "cudaMemGetInfo: null pointer");
  std::lock_guard lock(registry().mutex);
  *total_bytes = device_memory();
  *free_bytes = device_memory() - registry().used[t_device];
  return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t* stream) {
  if (stream == nullptr) return fail(cudaErrorInvalidValue, "cudaStreamCreate: null pointer");
  *stream = new CUstream_st{t_device};
  std::lock_guard lock(registry().mutex);
  registry().streams.insert(*stream);
  return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  std::lock_guard lock(registry().mutex);
  if (registry().streams.erase(stream) == 0)
    return fail(cudaErrorInvalidResourceHandle, "cudaStreamDestroy: unknown stream");
  delete stream;
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  std::lock_guard lock(registry().mutex);
  if (stream != nullptr && registry().streams.count(stream) == 0)
    return fail(cudaErrorInvalidResourceHandle, "cudaStreamSynchronize: unknown stream");
  return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t* event) {
  if (event == nullptr) return fail(cudaErrorInvalidValue, "cudaEventCreate: null pointer");
  *event = new CUevent_st{};
  std::lock_guard lock(registry().mutex);
  registry().events.insert(*event);
  return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t event) {
  std::lock_guard lock(registry().mutex);
  if (registry().events.erase(event) == 0)
    return fail(cudaErrorInvalidResourceHandle, "cudaEventDestroy: unknown event");
  delete event;
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  std::lock_guard lock(registry().mutex);
  if (registry().events.count(event) == 0)
    return fail(cudaErrorInvalidResourceHandle, "cudaEventRecord: unknown event");
  if (stream != nullptr && registry().streams.count(stream) == 0)
    return fail(cudaErrorInvalidResourceHandle, "cudaEventRecord: unknown stream");
  event->recorded = true;
  event->time = std::chrono::steady_clock::now();
  return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  std::lock_guard lock(registry().mutex);
  if (registry().events.count(event) == 0)
    return fail(cudaErrorInvalidResourceHandle, "cudaEventSynchronize: unknown event");
  return cudaSuccess;  // what it follows has already run
}

cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  if (ms == nullptr) return fail(cudaErrorInvalidValue, "cudaEventElapsedTime: null pointer");
  std::lock_guard lock(registry().mutex);
  if (registry().events.count(start) == 0 || registry().events.count(end) == 0)
    return fail(cudaErrorInvalidResourceHandle, "cudaEventElapsedTime: unknown event");
  if (!start->recorded || !end->recorded)
    return fail(cudaErrorInvalidResourceHandle,
                "cudaEventElapsedTime: an event has not been recorded");
  *ms = std::chrono::duration<float, std::milli>(end->time - start->time).count();
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

}  // namespace anvil_sim_rt

namespace anvil::sim {
std::string last_error_detail() { return t_last_detail; }
}  // namespace anvil::sim
