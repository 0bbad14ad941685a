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
//
// Graph pools (as PyTorch's graph_pool_handle). While a CUDA graph is
// captured (cuda_graph.cpp), the capturing thread's requests are served
// from the graph's private pool: its own freed blocks first (the capture's
// earlier tensors: the graph runs its nodes in capture order, on one
// stream), then a block of the shared cache, which joins the pool, then
// cudaMalloc (relaxed capture mode for it: the capture records no node for
// it, and the graph keeps the address). A pool's blocks, live or freed, are
// never handed to anything else, since every replay of the graph writes
// them again, until the graph is destroyed: then its cached blocks return
// to the shared cache (safe for the same reason as any reuse: later work is
// queued after the replays), and its live ones (a gradient made by the
// capture, say) when they are freed.
#include <fmt/format.h>

#include <map>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>
#include <unordered_map>

#include "kernels/cuda/cuda_backend.h"

namespace anvil::cuda {
namespace {

constexpr size_t kRound = 512;
constexpr uint64_t kShared = 0;  // the shared cache's pool id

std::string mib(size_t bytes) { return fmt::format("{:.2f} MiB", double(bytes) / (1 << 20)); }

class CachingDeviceAllocator final : public Allocator {
 public:
  explicit CachingDeviceAllocator(int device) : device_(device) {}

  void* allocate(size_t bytes) override {
    const size_t size = (std::max<size_t>(bytes, 1) + kRound - 1) / kRound * kRound;
    std::lock_guard lock(mutex_);
    const uint64_t pool =
        capture_pool_ != kShared && capture_thread_ == std::this_thread::get_id() ? capture_pool_
                                                                                 : kShared;
    if (void* p = take_cached(pool, size)) return p;
    if (pool != kShared)
      if (void* p = take_cached(kShared, size)) {
        move_to_pool(p, pool);
        return p;
      }
    void* p = device_malloc(size, pool != kShared);
    live_[p] = {size, pool};
    ++stats_.device_allocations;
    stats_.reserved += size;
    if (pool != kShared) stats_.graph_reserved += size;
    count_allocated(size);
    return p;
  }

  void deallocate(void* ptr, size_t) override {
    std::lock_guard lock(mutex_);
    auto it = live_.find(ptr);
    if (it == live_.end())
      throw std::logic_error(fmt::format("cuda:{} allocator: freeing unknown pointer", device_));
    const auto [size, pool] = it->second;
    stats_.allocated -= size;
    live_.erase(it);
    if (pool != kShared && !pools_.contains(pool)) {
      stats_.graph_reserved -= size;  // its graph is gone: the block joins the shared cache
      free_[kShared].emplace(size, ptr);
      return;
    }
    free_[pool].emplace(size, ptr);
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

  uint64_t begin_graph_pool() {
    std::lock_guard lock(mutex_);
    if (capture_pool_ != kShared)
      throw std::logic_error(fmt::format("cuda:{} allocator: a graph pool is already capturing", device_));
    capture_pool_ = ++last_pool_;
    capture_thread_ = std::this_thread::get_id();
    pools_.insert(capture_pool_);
    return capture_pool_;
  }

  void end_graph_pool() {
    std::lock_guard lock(mutex_);
    capture_pool_ = kShared;
  }

  void release_graph_pool(uint64_t pool) {
    std::lock_guard lock(mutex_);
    if (pool == capture_pool_) capture_pool_ = kShared;
    if (pools_.erase(pool) == 0) return;
    auto cached = free_.find(pool);
    if (cached == free_.end()) return;
    for (auto& [size, p] : cached->second) {
      stats_.graph_reserved -= size;
      free_[kShared].emplace(size, p);
    }
    free_.erase(cached);
  }

 private:
  struct Block {
    size_t size;
    uint64_t pool;
  };

  // A cached block of `pool` that fits, handed out; null if none. Caller holds mutex_.
  void* take_cached(uint64_t pool, size_t size) {
    auto cache = free_.find(pool);
    if (cache == free_.end()) return nullptr;
    auto it = cache->second.lower_bound(size);
    if (it == cache->second.end() || it->first - size > std::max(size / 8, size_t{1} << 20))
      return nullptr;
    void* p = it->second;
    live_[p] = {it->first, pool};
    count_allocated(it->first);
    ++stats_.cache_hits;
    cache->second.erase(it);
    return p;
  }

  // A live block of the shared cache joins `pool`. Caller holds mutex_.
  void move_to_pool(void* p, uint64_t pool) {
    Block& b = live_[p];
    b.pool = pool;
    stats_.graph_reserved += b.size;
  }

  void count_allocated(size_t size) {
    stats_.allocated += size;
    stats_.peak_allocated = std::max(stats_.peak_allocated, stats_.allocated);
  }

  // cudaMalloc, with the shared cache returned and one retry when the
  // device is full. While capturing (for a graph pool), in relaxed capture
  // mode: the capture does not record it, and the graph keeps the block.
  // Caller holds mutex_.
  void* device_malloc(size_t size, bool capturing) {
    check(cudaSetDevice(device_), "cudaSetDevice");
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    if (capturing)
      check(cudaThreadExchangeStreamCaptureMode(&mode), "cudaThreadExchangeStreamCaptureMode");
    void* p = nullptr;
    cudaError_t err = cudaMalloc(&p, size);
    if (err == cudaErrorMemoryAllocation && !capturing && !free_[kShared].empty()) {
      (void)cudaGetLastError();
      release_cached();  // the cache may hold what this request needs
      err = cudaMalloc(&p, size);
    }
    if (capturing)
      check(cudaThreadExchangeStreamCaptureMode(&mode), "cudaThreadExchangeStreamCaptureMode");
    if (err == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      size_t free_bytes = 0, total_bytes = 0;
      if (cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) (void)cudaGetLastError();
      throw std::runtime_error(fmt::format(
          "CUDA out of memory on cuda:{}: tried to allocate {}{}; anvil holds {} in tensors and "
          "{} reserved in total ({} for CUDA graphs); the device has {} free of {}. Try a smaller "
          "--batch-size{}.",
          device_, mib(size), capturing ? " while capturing a CUDA graph" : "",
          mib(stats_.allocated), mib(stats_.reserved), mib(stats_.graph_reserved),
          mib(free_bytes), mib(total_bytes), capturing ? " or --no-cuda-graphs" : ""));
    }
    check(err, "cudaMalloc");
    return p;
  }

  // The shared cache returned to the device (graph pools keep theirs).
  // Caller holds mutex_. Waits for queued work first: a cached block may
  // still be read by a kernel that has not run yet.
  void release_cached() {
    auto cache = free_.find(kShared);
    if (cache == free_.end() || cache->second.empty()) return;
    check(cudaSetDevice(device_), "cudaSetDevice");
    check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    for (auto& [size, p] : cache->second) {
      check(cudaFree(p), "cudaFree");
      stats_.reserved -= size;
    }
    cache->second.clear();
  }

  const int device_;
  mutable std::mutex mutex_;
  std::map<uint64_t, std::multimap<size_t, void*>> free_;  // cached blocks by pool, by size
  std::unordered_map<void*, Block> live_;                  // handed-out blocks
  std::set<uint64_t> pools_;                               // the graph pools alive
  uint64_t last_pool_ = kShared;
  uint64_t capture_pool_ = kShared;  // the pool a capture allocates from (kShared: none)
  std::thread::id capture_thread_;
  MemoryStats stats_;
};

}  // namespace

std::unique_ptr<Allocator> make_caching_allocator(int device) {
  return std::make_unique<CachingDeviceAllocator>(device);
}

uint64_t begin_graph_pool(Allocator& a) { return static_cast<CachingDeviceAllocator&>(a).begin_graph_pool(); }
void end_graph_pool(Allocator& a) { static_cast<CachingDeviceAllocator&>(a).end_graph_pool(); }
void release_graph_pool(Allocator& a, uint64_t pool) {
  static_cast<CachingDeviceAllocator&>(a).release_graph_pool(pool);
}

}  // namespace anvil::cuda
