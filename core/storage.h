// Ref-counted device memory. Each device has one allocator; the CPU one
// caches freed blocks by size so a training loop that allocates the same
// shapes every step stops calling malloc after the first step.
#pragma once
#include <cstddef>
#include <memory>

#include "core/device.h"

namespace anvil {

class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual void* allocate(size_t bytes) = 0;
  virtual void deallocate(void* ptr, size_t bytes) = 0;
  virtual void empty_cache() {}
};

// The allocator of a device; throws when the build has no backend for it.
Allocator& allocator_for(Device device);

class Storage {
 public:
  Storage(size_t bytes, Device device);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  Device device() const { return device_; }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
  Device device_;
};

}  // namespace anvil
