// The simulator's launch: one Boost.Context fiber per CUDA thread. A block's
// fibers run in turn, each until it reaches __syncthreads or returns; when
// all of them wait at the barrier the next round starts. Fibers switch in
// tens of nanoseconds without a syscall, which is what makes a 1024-thread
// block with a barrier per tile affordable on a CPU.
#include <sys/mman.h>
#include <unistd.h>

#include <boost/context/fiber.hpp>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "sim/cuda_sim.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#define ANVIL_SIM_ASAN 1
#endif

namespace anvil_sim_rt {
thread_local constinit uint3 threadIdx;
thread_local constinit uint3 blockIdx;
thread_local constinit dim3 blockDim;
thread_local constinit dim3 gridDim;
}  // namespace anvil_sim_rt

namespace anvil::sim {
namespace {

namespace ctx = boost::context;

#if defined(ANVIL_SIM_ASAN)
constexpr size_t kStackBytes = size_t{1} << 20;  // ASan's redzones make frames larger
#else
constexpr size_t kStackBytes = size_t{256} << 10;
#endif

// Fiber stacks with a guard page, kept per worker thread and reused: a
// launch creates thousands of fibers, and mmap per fiber would dominate.
struct StackPool {
  std::vector<ctx::stack_context> free;
  ~StackPool() {
    for (auto& s : free) munmap(static_cast<char*>(s.sp) - s.size - page(), s.size + page());
  }
  static size_t page() { return static_cast<size_t>(sysconf(_SC_PAGESIZE)); }
};
thread_local StackPool t_stacks;

struct SimThread {
  ctx::fiber fiber;  // the suspended CUDA thread
  ctx::fiber sink;   // the scheduler, to switch back to
  uint3 idx;
  bool done = false;
  bool at_barrier = false;
  std::exception_ptr error;
  void* stack_bottom = nullptr;
  size_t stack_size = 0;
  void* asan_fake_stack = nullptr;
};

// Hands out pooled stacks and tells the thread where its stack lies (ASan
// needs the bounds at every switch).
struct PooledStack {
  SimThread* owner;
  ctx::stack_context allocate() {
    ctx::stack_context s;
    if (!t_stacks.free.empty()) {
      s = t_stacks.free.back();
      t_stacks.free.pop_back();
    } else {
      size_t total = kStackBytes + StackPool::page();
      void* mem = mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (mem == MAP_FAILED) throw std::bad_alloc();
      mprotect(mem, StackPool::page(), PROT_NONE);  // guard page below the stack
      s.size = kStackBytes;
      s.sp = static_cast<char*>(mem) + total;
    }
    owner->stack_bottom = static_cast<char*>(s.sp) - s.size;
    owner->stack_size = s.size;
    return s;
  }
  void deallocate(ctx::stack_context& s) {
#if defined(ANVIL_SIM_ASAN)
    // Frames left poisoned by the last fiber must not trip the next one.
    __asan_unpoison_memory_region(static_cast<char*>(s.sp) - s.size, s.size);
#endif
    t_stacks.free.push_back(s);
  }
};

struct BlockAborted {};  // unwinds fibers still waiting when a block is abandoned

thread_local SimThread* t_current = nullptr;
thread_local bool t_abort = false;
thread_local void* t_dynamic_shared = nullptr;
thread_local const void* t_sched_bottom = nullptr;
thread_local size_t t_sched_size = 0;

// ASan must be told about every stack switch, or it reports false overflows
// when an exception unwinds a fiber stack.
inline void asan_start(void** fake, const void* bottom, size_t size) {
#if defined(ANVIL_SIM_ASAN)
  __sanitizer_start_switch_fiber(fake, bottom, size);
#else
  (void)fake, (void)bottom, (void)size;
#endif
}
inline void asan_finish(void* fake, const void** bottom, size_t* size) {
#if defined(ANVIL_SIM_ASAN)
  __sanitizer_finish_switch_fiber(fake, bottom, size);
#else
  (void)fake, (void)bottom, (void)size;
#endif
}

void resume(SimThread& t) {
  t_current = &t;
  threadIdx = t.idx;
  void* fake = nullptr;
  asan_start(&fake, t.stack_bottom, t.stack_size);
  t.fiber = std::move(t.fiber).resume();
  asan_finish(fake, nullptr, nullptr);
  t_current = nullptr;
}

std::string where_text(const std::source_location& where) {
  return std::string("kernel launch at ") + where.file_name() + ":" + std::to_string(where.line());
}

std::string dims_text(dim3 d) {
  char text[48];  // not string concatenation: GCC 12 warns falsely (-Wrestrict) on "(" + s
  std::snprintf(text, sizeof text, "(%u,%u,%u)", d.x, d.y, d.z);
  return text;
}

void check_config(dim3 grid, dim3 block, size_t shared_bytes, const std::source_location& where) {
  auto refuse = [&](const std::string& why) {
    throw std::runtime_error(where_text(where) + ": invalid configuration: " + why);
  };
  unsigned long long threads = 1ull * block.x * block.y * block.z;
  if (block.x == 0 || block.y == 0 || block.z == 0) refuse("block " + dims_text(block) + " is empty");
  if (threads > kMaxThreadsPerBlock)
    refuse("block " + dims_text(block) + " has " + std::to_string(threads) +
           " threads, the limit is " + std::to_string(kMaxThreadsPerBlock));
  if (block.x > 1024 || block.y > 1024 || block.z > 64)
    refuse("block " + dims_text(block) + " exceeds the per-dimension limits (1024,1024,64)");
  if (grid.x == 0 || grid.y == 0 || grid.z == 0) refuse("grid " + dims_text(grid) + " is empty");
  if (grid.x > 2147483647u || grid.y > 65535 || grid.z > 65535)
    refuse("grid " + dims_text(grid) + " exceeds the limits (2^31-1,65535,65535)");
  if (shared_bytes > kMaxDynamicShared)
    refuse(std::to_string(shared_bytes) + " bytes of dynamic shared memory, the limit is " +
           std::to_string(kMaxDynamicShared));
}

void run_block(void (*body)(void*), void* ctx_ptr, const std::source_location& where) {
  const dim3 b = blockDim;
  const size_t n = size_t{b.x} * b.y * b.z;
  std::vector<SimThread> threads(n);
  for (size_t i = 0; i < n; ++i) {
    SimThread& t = threads[i];
    t.idx = uint3{static_cast<unsigned>(i % b.x), static_cast<unsigned>(i / b.x % b.y),
                  static_cast<unsigned>(i / (size_t{b.x} * b.y))};
    t.fiber = ctx::fiber(std::allocator_arg, PooledStack{&t},
                         [&t, body, ctx_ptr](ctx::fiber&& sink) {
                           asan_finish(nullptr, &t_sched_bottom, &t_sched_size);
                           t.sink = std::move(sink);
                           try {
                             body(ctx_ptr);
                           } catch (const ctx::detail::forced_unwind&) {
                             throw;  // Boost.Context's own unwinding must pass
                           } catch (const BlockAborted&) {
                           } catch (...) {
                             t.error = std::current_exception();
                           }
                           t.done = true;
                           asan_start(nullptr, t_sched_bottom, t_sched_size);
                           return std::move(t.sink);
                         });
  }

  for (;;) {
    size_t waiting = 0, done = 0;
    for (auto& t : threads) {
      if (t.done) continue;
      t.at_barrier = false;
      resume(t);
    }
    std::exception_ptr error;
    for (auto& t : threads) {
      waiting += t.at_barrier && !t.done;
      done += t.done;
      if (t.error && !error) error = t.error;
    }
    if (waiting == 0) {
      if (error) std::rethrow_exception(error);
      return;
    }
    if (done == 0 && !error) continue;  // all at the barrier: release it
    // Abandon the block: unwind the fibers still waiting, then report.
    t_abort = true;
    for (auto& t : threads)
      if (!t.done) resume(t);
    t_abort = false;
    if (error) std::rethrow_exception(error);
    {
      throw std::runtime_error(
          where_text(where) + ": divergent __syncthreads in block " +
          dims_text(dim3(blockIdx.x, blockIdx.y, blockIdx.z)) + ": " + std::to_string(waiting) +
          " of " + std::to_string(n) + " threads wait at the barrier, " + std::to_string(done) +
          " have returned");
    }
  }
}

}  // namespace

void launch_kernel(dim3 grid, dim3 block, size_t shared_bytes, cudaStream_t,
                   std::source_location where, void (*thread_body)(void*), void* ctx_ptr) {
  check_config(grid, block, shared_bytes, where);
  gridDim = grid;
  blockDim = block;
  // Blocks run one after another on this thread; running them on a pool of
  // workers only needs this loop split (every piece of state is thread_local).
  for (unsigned z = 0; z < grid.z; ++z)
    for (unsigned y = 0; y < grid.y; ++y)
      for (unsigned x = 0; x < grid.x; ++x) {
        blockIdx = uint3{x, y, z};
        // Exact size so that ASan sees overflows; NaN bytes expose reads
        // of shared memory no thread has written.
        std::unique_ptr<void, void (*)(void*)> smem(
            shared_bytes ? std::malloc(shared_bytes) : nullptr, std::free);
        if (shared_bytes && !smem) throw std::bad_alloc();
        if (shared_bytes) std::memset(smem.get(), 0xFF, shared_bytes);
        t_dynamic_shared = smem.get();
        try {
          run_block(thread_body, ctx_ptr, where);
        } catch (...) {
          t_dynamic_shared = nullptr;
          throw;
        }
        t_dynamic_shared = nullptr;
      }
}

void* dynamic_shared_bytes() { return t_dynamic_shared; }

}  // namespace anvil::sim

namespace anvil_sim_rt {

void __syncthreads() {
  using namespace anvil::sim;
  SimThread* t = t_current;
  if (t == nullptr) throw std::logic_error("__syncthreads called outside a kernel");
  t->at_barrier = true;
  asan_start(&t->asan_fake_stack, t_sched_bottom, t_sched_size);
  t->sink = std::move(t->sink).resume();
  asan_finish(t->asan_fake_stack, &t_sched_bottom, &t_sched_size);
  if (t_abort) throw BlockAborted{};
}

}  // namespace anvil_sim_rt
