// The caching device allocator. cudaMalloc and cudaFree are slow (cudaFree
// synchronises the whole device), and a training loop allocates the same
// sizes every step, so freed blocks are kept and handed out again:
//
// - Requests are rounded up to 512 bytes (the block sizes `allocated` and
//   `reserved` count in).
// - A free block is reused for a request when it is at least as large and
//   at most 1/8 (or 1 MiB) larger, so a small tensor does not pin a large block.
// - Blocks are never split, and are only returned to the device by
//   empty_cache() or when cudaMalloc fails (then the request is retried once).
//
// Reuse is safe without events because every kernel of a device runs on its
// one compute stream: work queued before a free precedes work queued after
// the block is handed out again. The copy stream keeps that promise too:
// each copy issued to it first waits for the compute stream's queued work
// (cuda_stream.cpp).
#include <fmt/format.h>

#include <map>
#include <mutex>
#include <stdexcept>
#include <unordered_map>

#include "kernels/cuda/cuda_backend.h"

namespace anvil::cuda {
namespace {

constexpr size_t kRound = 512;

std::string mib(size_t bytes) { return fmt::format("{:.2f} MiB", double(bytes) / (1 << 20)); }

class CachingDeviceAllocator final : public Allocator {
 public:
  explicit CachingDeviceAllocator(int device) : device_(device) {}

  void* allocate(size_t bytes) override {
    const size_t size = (std::max<size_t>(bytes, 1) + kRound - 1) / kRound * kRound;
    std::lock_guard lock(mutex_);
    auto it = free_.lower_bound(size);
    if (it != free_.end() && it->first - size <= std::max(size / 8, size_t{1} << 20)) {
      void* p = it->second;
      live_[p] = it->first;
      stats_.allocated += it->first;
      stats_.peak_allocated = std::max(stats_.peak_allocated, stats_.allocated);
      ++stats_.cache_hits;
      free_.erase(it);
      return p;
    }
    check(cudaSetDevice(device_), "cudaSetDevice");
    void* p = nullptr;
    cudaError_t err = cudaMalloc(&p, size);
    if (err == cudaErrorMemoryAllocation && !free_.empty()) {
      (void)cudaGetLastError();
      release_cached();  // the cache may hold what this request needs
      err = cudaMalloc(&p, size);
    }
    if (err == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      size_t free_bytes = 0, total_bytes = 0;
      if (cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) (void)cudaGetLastError();
      throw std::runtime_error(fmt::format(
          "CUDA out of memory on cuda:{}: tried to allocate {}; anvil holds {} in tensors and "
          "{} reserved in total; the device has {} free of {}. Try a smaller --batch-size.",
          device_, mib(size), mib(stats_.allocated), mib(stats_.reserved), mib(free_bytes),
          mib(total_bytes)));
    }
    check(err, "cudaMalloc");
    live_[p] = size;
    ++stats_.device_allocations;
    stats_.reserved += size;
    stats_.allocated += size;
    stats_.peak_allocated = std::max(stats_.peak_allocated, stats_.allocated);
    return p;
  }

  void deallocate(void* ptr, size_t) override {
    std::lock_guard lock(mutex_);
    auto it = live_.find(ptr);
    if (it == live_.end())
      throw std::logic_error(fmt::format("cuda:{} allocator: freeing unknown pointer", device_));
    stats_.allocated -= it->second;
    free_.emplace(it->second, ptr);
    live_.erase(it);
  }

  void empty_cache() override {
    std::lock_guard lock(mutex_);
    release_cached();
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
  // Caller holds mutex_. Waits for queued work first: a cached block may still
  // be read by a kernel that has not run yet.
  void release_cached() {
    if (free_.empty()) return;
    check(cudaSetDevice(device_), "cudaSetDevice");
    check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    for (auto& [size, p] : free_) {
      check(cudaFree(p), "cudaFree");
      stats_.reserved -= size;
    }
    free_.clear();
  }

  const int device_;
  mutable std::mutex mutex_;
  std::multimap<size_t, void*> free_;       // cached blocks by size
  std::unordered_map<void*, size_t> live_;  // handed-out blocks and their sizes
  MemoryStats stats_;
};

}  // namespace

std::unique_ptr<Allocator> make_caching_allocator(int device) {
  return std::make_unique<CachingDeviceAllocator>(device);
}

}  // namespace anvil::cuda
