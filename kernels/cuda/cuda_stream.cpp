// Events, asynchronous copies on the copy stream, and pinned host memory:
// the CUDA side of core/stream.h.
//
// The rule that keeps the two streams of a device from trampling each other:
// a copy issued to the copy stream first waits for everything already issued
// to the compute stream. The destination block may have been freed by a
// tensor whose last kernels are still queued (the caching allocator is
// stream-unaware), and a device source is produced by the compute stream, so
// the copy must come after them; it still overlaps every kernel issued after
// copy_async returns, which is the point (the next batch copies while this
// batch computes).
#include <fmt/format.h>

#include <atomic>
#include <cstdio>
#include <map>
#include <mutex>
#include <stdexcept>
#include <vector>

#include "core/cuda_hooks.h"
#include "kernels/cuda/cuda_backend.h"

namespace anvil::cuda {
namespace {

cudaStream_t stream_of(int device, Stream stream) {
  return stream == Stream::Copy ? copy_stream(device) : compute_stream(device);
}

class CudaEvent final : public Event::Impl {
 public:
  CudaEvent(int device, bool timing) : device_(device) {
    check(cudaSetDevice(device), "cudaSetDevice");
    check(cudaEventCreateWithFlags(&event_, timing ? cudaEventDefault : cudaEventDisableTiming),
          "cudaEventCreateWithFlags");
  }
  ~CudaEvent() override {
    // Not checked: a destructor must not throw, and a failure here leaks one handle.
    (void)cudaEventDestroy(event_);
  }
  void record(Stream stream) override {
    check(cudaSetDevice(device_), "cudaSetDevice");
    check(cudaEventRecord(event_, stream_of(device_, stream)), "cudaEventRecord");
  }
  void wait(Stream stream) const override {
    check(cudaSetDevice(device_), "cudaSetDevice");
    check(cudaStreamWaitEvent(stream_of(device_, stream), event_, 0), "cudaStreamWaitEvent");
  }
  void synchronize() const override { check(cudaEventSynchronize(event_), "cudaEventSynchronize"); }
  bool ready() const override {
    cudaError_t err = cudaEventQuery(event_);
    if (err == cudaErrorNotReady) {
      (void)cudaGetLastError();
      return false;
    }
    check(err, "cudaEventQuery");
    return true;
  }
  double elapsed_ms(const Impl& end) const override {
    float ms = 0;
    check(cudaEventSynchronize(static_cast<const CudaEvent&>(end).event_), "cudaEventSynchronize");
    check(cudaEventElapsedTime(&ms, event_, static_cast<const CudaEvent&>(end).event_),
          "cudaEventElapsedTime");
    return ms;
  }

 private:
  int device_;
  cudaEvent_t event_ = nullptr;
};

// Makes `stream` of `device` wait for the work issued so far to the compute stream.
void wait_for_compute(int device, cudaStream_t stream) {
  cudaEvent_t event;
  check(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "cudaEventCreateWithFlags");
  check(cudaEventRecord(event, compute_stream(device)), "cudaEventRecord");
  check(cudaStreamWaitEvent(stream, event, 0), "cudaStreamWaitEvent");
  // Destroying a recorded event is allowed: the wait keeps what it needs.
  check(cudaEventDestroy(event), "cudaEventDestroy");
}

// Set by fail_next_pinned_free: the next PinnedHostAllocator::deallocate
// fails with this error, as after a kernel fault (0: none).
std::atomic<int> injected_free_error{0};

// Page-locked host blocks, cached by size: cudaHostAlloc maps the pages for
// the GPU, which costs milliseconds. A freed block may still be the source or
// destination of a queued copy, so it is reused only once events recorded on
// every stream at the time of the free have been reached.
class PinnedHostAllocator final : public Allocator {
 public:
  void* allocate(size_t bytes) override {
    const size_t size = std::max<size_t>(bytes, 1);
    {
      std::lock_guard lock(mutex_);
      auto [first, last] = free_.equal_range(size);
      for (auto it = first; it != last; ++it) {
        if (!reached(it->second.events)) continue;
        void* p = it->second.ptr;
        release_events(it->second.events);
        free_.erase(it);
        ++stats_.cache_hits;
        stats_.allocated += size;
        stats_.peak_allocated = std::max(stats_.peak_allocated, stats_.allocated);
        return p;
      }
    }
    void* p = nullptr;
    check(cudaHostAlloc(&p, size, cudaHostAllocDefault), "cudaHostAlloc");
    std::lock_guard lock(mutex_);
    ++stats_.device_allocations;
    stats_.reserved += size;
    stats_.allocated += size;
    stats_.peak_allocated = std::max(stats_.peak_allocated, stats_.allocated);
    return p;
  }

  // Called by ~Storage, so it never throws: a CUDA error here (a device
  // left in an error state by a faulted kernel) leaks the block, says so
  // once on stderr, and leaves the next CUDA call to report the error. It
  // records on the devices already in use only (a queued copy can only be on
  // one of those; asking another would create a context on it) and leaves
  // the caller's current device as it was.
  void deallocate(void* ptr, size_t bytes) noexcept override {
    const size_t size = std::max<size_t>(bytes, 1);
    std::vector<cudaEvent_t> events;
    cudaError_t err = cudaSuccess;
    const char* what = "";
    try {
      events.reserve(size_t(2 * cuda_hooks::device_count()));
      int current = 0;
      const bool know_current = (err = cudaGetDevice(&current)) == cudaSuccess;
      if (!know_current) what = "cudaGetDevice";
      if (const int injected = injected_free_error.exchange(0); err == cudaSuccess && injected) {
        err = cudaError_t(injected);
        what = "cudaSetDevice (an error injected by a test)";
      }
      for (int d = 0; err == cudaSuccess && d < cuda_hooks::device_count(); ++d) {
        if (!initialised(d)) continue;
        if ((err = cudaSetDevice(d)) != cudaSuccess) {
          what = "cudaSetDevice";
          break;
        }
        for (cudaStream_t s : {compute_stream(d), copy_stream(d)}) {
          cudaEvent_t e = nullptr;
          if ((err = cudaEventCreateWithFlags(&e, cudaEventDisableTiming)) != cudaSuccess) {
            what = "cudaEventCreateWithFlags";
            break;
          }
          events.push_back(e);
          if ((err = cudaEventRecord(e, s)) != cudaSuccess) {
            what = "cudaEventRecord";
            break;
          }
        }
      }
      if (know_current) (void)cudaSetDevice(current);
      if (err == cudaSuccess) {
        std::lock_guard lock(mutex_);
        stats_.allocated -= size;
        free_.emplace(size, Block{ptr, std::move(events)});
        return;
      }
    } catch (...) {  // std::bad_alloc from the event list or the cache
      what = "caching the block (out of host memory)";
    }
    for (cudaEvent_t e : events) (void)cudaEventDestroy(e);
    (void)cudaGetLastError();
    leak(size, what, err);
  }

  void empty_cache() override {
    std::lock_guard lock(mutex_);
    for (auto& [size, block] : free_) {
      for (cudaEvent_t e : block.events) check(cudaEventSynchronize(e), "cudaEventSynchronize");
      release_events(block.events);
      check(cudaFreeHost(block.ptr), "cudaFreeHost");
      stats_.reserved -= size;
    }
    free_.clear();
  }

  MemoryStats stats() const override {
    std::lock_guard lock(mutex_);
    return stats_;
  }
  void reset_peak() override {
    std::lock_guard lock(mutex_);
    stats_.peak_allocated = stats_.allocated;
  }

 private:
  struct Block {
    void* ptr;
    std::vector<cudaEvent_t> events;
  };
  static bool reached(const std::vector<cudaEvent_t>& events) {
    for (cudaEvent_t e : events) {
      cudaError_t err = cudaEventQuery(e);
      if (err == cudaErrorNotReady) {
        (void)cudaGetLastError();
        return false;
      }
      check(err, "cudaEventQuery");
    }
    return true;
  }
  // A block that cannot be cached safely is leaked: freeing it could pull
  // the pages from under a copy still queued (cudaFreeHost is as unsafe as
  // the calls that just failed). Said once, on the first such block.
  void leak(size_t size, const char* what, cudaError_t err) noexcept {
    {
      std::lock_guard lock(mutex_);
      stats_.allocated -= size;
      stats_.reserved -= size;
      ++leaked_blocks_;
    }
    if (!warned_leak_.exchange(true))
      std::fprintf(stderr,
                   "anvil: a pinned host block of %zu bytes was not returned to the cache "
                   "(%s failed: %s); it and any later such blocks are leaked\n",
                   size, what, err == cudaSuccess ? "no CUDA error" : cudaGetErrorString(err));
  }

 public:
  // Blocks leaked by deallocate after a CUDA error (for tests).
  size_t leaked_blocks() const {
    std::lock_guard lock(mutex_);
    return leaked_blocks_;
  }

 private:
  static void release_events(std::vector<cudaEvent_t>& events) {
    for (cudaEvent_t e : events) check(cudaEventDestroy(e), "cudaEventDestroy");
    events.clear();
  }

  mutable std::mutex mutex_;
  std::multimap<size_t, Block> free_;
  MemoryStats stats_;
  size_t leaked_blocks_ = 0;
  std::atomic<bool> warned_leak_{false};
};

}  // namespace

void fail_next_pinned_free(cudaError_t err) { injected_free_error.store(int(err)); }

size_t pinned_blocks_leaked() {
  return static_cast<const PinnedHostAllocator&>(cuda_hooks::pinned_allocator()).leaked_blocks();
}

}  // namespace anvil::cuda

namespace anvil::cuda_hooks {

std::unique_ptr<Event::Impl> make_event(int index, bool timing) {
  return std::make_unique<cuda::CudaEvent>(index, timing);
}

void copy_async(int index, Stream stream, void* dst, Device dst_device, const void* src,
                Device src_device, size_t bytes) {
  using namespace anvil::cuda;
  // A peer source is produced by its own device's compute stream.
  if (src_device.is_cuda() && src_device.index != index) synchronize(src_device.index);
  check(cudaSetDevice(index), "cudaSetDevice");
  cudaStream_t s = cuda::stream_of(index, stream);
  if (stream == Stream::Copy) cuda::wait_for_compute(index, s);
  cudaMemcpyKind kind = src_device.is_cpu()   ? cudaMemcpyHostToDevice
                        : dst_device.is_cpu() ? cudaMemcpyDeviceToHost
                        : src_device == dst_device ? cudaMemcpyDeviceToDevice
                                                   : cudaMemcpyDefault;
  check(cudaMemcpyAsync(dst, src, bytes, kind, s), "cudaMemcpyAsync");
  // A host destination must hold the data on return, as the header promises.
  if (dst_device.is_cpu()) check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
}

Allocator& pinned_allocator() {
  // Leaked on purpose, as the device allocators: pinned tensors in static
  // objects may be freed after static destructors ran.
  static auto* allocator = new cuda::PinnedHostAllocator();
  return *allocator;
}

}  // namespace anvil::cuda_hooks
