#include "core/storage.h"

#include <algorithm>
#include <cstdlib>
#include <map>
#include <mutex>
#include <new>
#include <stdexcept>
#include <vector>

#include <fmt/format.h>

#include "core/cuda_hooks.h"

namespace anvil {
namespace {

// Caching host allocator: freed blocks go to a free list keyed by their
// (rounded) size and are handed out again for the next request of that size.
// Blocks are 64-byte aligned for the vector units. The cache is bounded so a
// program that changes shapes does not hoard memory.
class CachingCpuAllocator final : public Allocator {
 public:
  static constexpr size_t kAlign = 64;
  static constexpr size_t kMaxCached = size_t(2) << 30;

  void* allocate(size_t bytes) override {
    size_t size = round(bytes);
    {
      std::lock_guard lock(mutex_);
      auto it = free_.find(size);
      if (it != free_.end() && !it->second.empty()) {
        void* p = it->second.back();
        it->second.pop_back();
        cached_ -= size;
        ++stats_.cache_hits;
        taken(size);
        return p;
      }
    }
    void* p = std::aligned_alloc(kAlign, size);
    if (!p) {
      throw std::bad_alloc();
    }
    std::lock_guard lock(mutex_);
    ++stats_.device_allocations;
    taken(size);
    return p;
  }

  void deallocate(void* ptr, size_t bytes) override {
    size_t size = round(bytes);
    std::lock_guard lock(mutex_);
    stats_.allocated -= size;
    if (cached_ + size > kMaxCached) {
      std::free(ptr);
      return;
    }
    free_[size].push_back(ptr);
    cached_ += size;
  }

  void empty_cache() override {
    std::lock_guard lock(mutex_);
    for (auto& [size, list] : free_)
      for (void* p : list) std::free(p);
    free_.clear();
    cached_ = 0;
  }

  MemoryStats stats() const override {
    std::lock_guard lock(mutex_);
    MemoryStats s = stats_;
    s.reserved = s.allocated + cached_;
    return s;
  }

  void reset_peak() override {
    std::lock_guard lock(mutex_);
    stats_.peak_allocated = stats_.allocated;
  }

  ~CachingCpuAllocator() override { empty_cache(); }

 private:
  static size_t round(size_t bytes) {
    size_t b = bytes == 0 ? kAlign : bytes;
    return (b + kAlign - 1) / kAlign * kAlign;
  }
  // A block of `size` handed out (the mutex held).
  void taken(size_t size) {
    stats_.allocated += size;
    stats_.peak_allocated = std::max(stats_.peak_allocated, stats_.allocated);
  }
  mutable std::mutex mutex_;
  std::map<size_t, std::vector<void*>> free_;
  size_t cached_ = 0;
  MemoryStats stats_;  // reserved is computed by stats()
};

}  // namespace

Allocator& allocator_for(Device device) {
  if (device.is_cpu()) {
    // Leaked on purpose: tensors held in static objects may be freed after
    // a function-local static allocator would have been destroyed.
    static auto* cpu = new CachingCpuAllocator();
    return *cpu;
  }
  check_cuda_device(device);
  return cuda_hooks::allocator(device.index);
}

MemoryStats memory_stats(Device device) { return allocator_for(device).stats(); }
void empty_cache(Device device) { allocator_for(device).empty_cache(); }
void reset_peak_memory_stats(Device device) { allocator_for(device).reset_peak(); }

Storage::Storage(size_t bytes, Device device) : bytes_(bytes), device_(device) {
  data_ = allocator_for(device).allocate(bytes);
}

Allocator& pinned_host_allocator() {
  if (device_count() == 0)
    throw std::runtime_error("pinned host memory needs a CUDA device: " + no_gpu_reason());
  return cuda_hooks::pinned_allocator();
}

Storage::Storage(size_t bytes, Pinned) : bytes_(bytes), device_(Device::cpu()), pinned_(true) {
  data_ = pinned_host_allocator().allocate(bytes);
}

Storage::~Storage() {
  Allocator& a = pinned_ ? cuda_hooks::pinned_allocator() : allocator_for(device_);
  a.deallocate(data_, bytes_);
}

}  // namespace anvil
