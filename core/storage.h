// Ref-counted device memory. Each device has one allocator; the CPU one
// caches freed blocks by size so a training loop that allocates the same
// shapes every step stops calling malloc after the first step, and counts
// its bytes as the CUDA one does (MemoryStats; device_allocations are its
// calls to aligned_alloc).
#pragma once
#include <cstddef>
#include <memory>

#include "core/device.h"

namespace anvil {

// Bytes as a caching allocator sees them (PyTorch's torch.cuda.memory_*
// figures): `allocated` is held by live tensors, `reserved` is allocated
// plus cached free blocks, both rounded to the allocator's block sizes.
struct MemoryStats {
  size_t allocated = 0;
  size_t reserved = 0;
  size_t peak_allocated = 0;
  size_t device_allocations = 0;  // calls into the device's allocator (e.g. cudaMalloc)
  size_t cache_hits = 0;          // requests served from the cache
  // Of reserved: the blocks CUDA graphs' private pools hold (live and
  // cached), which no other allocation is given while their graph lives.
  size_t graph_reserved = 0;
};

class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual void* allocate(size_t bytes) = 0;
  virtual void deallocate(void* ptr, size_t bytes) = 0;
  // Returns cached free blocks to the device.
  virtual void empty_cache() {}
  virtual MemoryStats stats() const { return {}; }
  virtual void reset_peak() {}
};

// The allocator of a device; throws when the build has no backend for it.
Allocator& allocator_for(Device device);

// The device's caching-allocator figures, and its cache returned to the device.
MemoryStats memory_stats(Device device);
void empty_cache(Device device);
void reset_peak_memory_stats(Device device);

// Page-locked host memory for fast, asynchronous host-to-device copies
// (cudaHostAlloc behind a cache). Throws when there is no CUDA device.
Allocator& pinned_host_allocator();

class Storage {
 public:
  Storage(size_t bytes, Device device);
  // Host memory from pinned_host_allocator() (device is cpu).
  struct Pinned {};
  Storage(size_t bytes, Pinned);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  Device device() const { return device_; }
  bool pinned() const { return pinned_; }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
  Device device_;
  bool pinned_ = false;
};

}  // namespace anvil
