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

  void deallocate(void* ptr, size_t bytes) override {
    const size_t size = std::max<size_t>(bytes, 1);
    std::vector<cudaEvent_t> events;
    for (int d = 0; d < cuda_hooks::device_count(); ++d) {
      check(cudaSetDevice(d), "cudaSetDevice");
      for (cudaStream_t s : {compute_stream(d), copy_stream(d)}) {
        cudaEvent_t e;
        check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreateWithFlags");
        check(cudaEventRecord(e, s), "cudaEventRecord");
        events.push_back(e);
      }
    }
    std::lock_guard lock(mutex_);
    stats_.allocated -= size;
    free_.emplace(size, Block{ptr, std::move(events)});
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
  static void release_events(std::vector<cudaEvent_t>& events) {
    for (cudaEvent_t e : events) check(cudaEventDestroy(e), "cudaEventDestroy");
    events.clear();
  }

  mutable std::mutex mutex_;
  std::multimap<size_t, Block> free_;
  MemoryStats stats_;
};

}  // namespace
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
