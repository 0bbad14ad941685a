// The simulator's launch: one Boost.Context fiber per CUDA thread. A block's
// fibers run in rounds: each runnable fiber runs until it reaches
// __syncthreads or a warp collective, or returns. After a round every live
// fiber waits somewhere, so the state is complete and is resolved at once:
// first the warp collectives (each completes, or is an error), and when none
// is left, the block barrier (released when every live fiber waits there).
// Fibers switch in tens of nanoseconds without a syscall, which is what
// makes a 1024-thread block with a barrier per tile affordable on a CPU.
//
// A launch's blocks are shared by worker threads: the thread running the
// launch and up to ANVIL_SIM_WORKERS-1 persistent pool threads take block
// numbers from an atomic counter until none is left or one block has failed.
// Everything a block needs (threadIdx & co., dynamic shared memory, the fiber
// stacks, the sanitizers' view of the host thread) is thread_local, set by
// each worker when it joins the launch.
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <boost/context/fiber.hpp>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "core/symbol_name.h"
#include "sim/sim_internal.h"
#include "sim/sim_thread.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#define ANVIL_SIM_ASAN 1
#endif

// ThreadSanitizer sees each CUDA thread as a fiber of its own (its fiber API),
// and switches between them carry no happens-before: only what orders a
// GPU's threads orders them here. The first switch into a fiber (before the
// kernel body runs) and the last one out of it synchronise with the
// launching thread, as a launch and its completion do; __syncthreads is a
// release by every arriving thread and an acquire by every leaving one. So a
// block that reads another thread's shared memory without a barrier is a
// data race. This file itself is compiled without TSan instrumentation in
// the tsan build (CMake defines ANVIL_SIM_TSAN): the scheduler's bookkeeping
// is not part of what a kernel does, and instrumented function entries and
// exits on both sides of a fiber switch would unbalance TSan's shadow stacks.
// Workers are real threads: a launch's blocks on different workers are not
// ordered with each other (the block counter is invisible to TSan), only with
// the launch through the pool's mutex, so two blocks writing one global
// element without atomics is a data race, as it is on a GPU.
#if defined(ANVIL_SIM_TSAN)
#include <sanitizer/tsan_interface.h>
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

#if defined(ANVIL_SIM_ASAN) || defined(ANVIL_SIM_TSAN)
constexpr size_t kStackBytes = size_t{1} << 20;  // sanitizers make frames larger
constexpr size_t kAsanStackTop = size_t{64} << 10;  // see PooledStack::deallocate
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

using detail::block_text;
using detail::dims_text;
using detail::op_name;
using detail::resolve_warps;
using detail::SimThread;
using detail::Wait;

// Set while a failed block's waiting fibers are unwound (BlockAborted).
thread_local bool t_abort = false;

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
    // Frames left poisoned by the last fiber must not trip the next one. A
    // fiber that ran its kernel to the end left only its entry frames so,
    // at the stack's top (the kernel's frames unpoisoned themselves as they
    // returned; a throw unpoisons what it unwinds): unpoisoning 64 KiB there,
    // not the whole 1 MiB, is an 8 KiB shadow write instead of 128 KiB, per
    // CUDA thread of every launch (it was two thirds of a simulated
    // training step under ASan). A fiber that did not finish is cleared whole.
    const bool finished = owner->done && !owner->error && !t_abort;
    const size_t n = finished ? std::min(s.size, kAsanStackTop) : s.size;
    __asan_unpoison_memory_region(static_cast<char*>(s.sp) - n, n);
#endif
    t_stacks.free.push_back(s);
  }
};

struct BlockAborted {};  // unwinds fibers still waiting when a block is abandoned

thread_local SimThread* t_current = nullptr;
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

// ---- ThreadSanitizer (no-ops in other builds) ----
#if defined(ANVIL_SIM_TSAN)
thread_local void* t_tsan_host = nullptr;  // the launching thread's TSan context
thread_local char t_barrier_sync[2];       // sync addresses of even and odd barriers
thread_local char t_warp_sync[32][2];      // the same per warp, for __syncwarp
#endif

#if defined(ANVIL_SIM_TSAN)
// TSan's contexts of the CUDA threads, kept per worker thread and reused by
// its blocks: __tsan_create_fiber and __tsan_destroy_fiber each map, clear
// and unmap a thread state, which took most of a simulated launch under TSan
// (perf: 80% in its memset and page faults). Reuse hides no race: a worker
// runs its blocks one after another, every fiber of a block ends with a
// synchronising switch to the host, and every fiber of the next block starts
// with one from it, so consecutive blocks were ordered already.
struct TsanFiberPool {
  std::vector<void*> fibers;
  ~TsanFiberPool() {
    for (void* f : fibers) __tsan_destroy_fiber(f);
  }
};
thread_local TsanFiberPool t_tsan_fibers;
#endif

// Switches TSan's view to `fiber` (host: null); `sync` orders everything
// before the switch before everything after it.
inline void tsan_switch([[maybe_unused]] void* fiber, [[maybe_unused]] bool sync) {
#if defined(ANVIL_SIM_TSAN)
  __tsan_switch_to_fiber(fiber ? fiber : t_tsan_host, sync ? 0 : __tsan_switch_to_fiber_no_sync);
#endif
}
#if defined(ANVIL_SIM_TSAN)
// A barrier (__syncthreads, or __syncwarp within a warp) for TSan: every
// arriving thread releases, every leaving one acquires. Two alternating
// addresses: a thread that runs ahead to the next barrier must not publish
// its later writes to threads still leaving this one.
inline void tsan_barrier_arrive(char (&slots)[2], unsigned count) {
  __tsan_release(&slots[count & 1]);
}
inline void tsan_barrier_leave(char (&slots)[2], unsigned& count) {
  __tsan_acquire(&slots[count & 1]);
  ++count;
}
#endif
inline void tsan_launch_begin() {
#if defined(ANVIL_SIM_TSAN)
  t_tsan_host = __tsan_get_current_fiber();
#endif
}

void resume(SimThread& t) {
  t_current = &t;
  threadIdx = t.idx;
  void* fake = nullptr;
  asan_start(&fake, t.stack_bottom, t.stack_size);
  tsan_switch(t.tsan_fiber, !t.started);
  t.started = true;
  t.fiber = std::move(t.fiber).resume();
  asan_finish(fake, nullptr, nullptr);
  t_current = nullptr;
}

}  // namespace

std::string detail::dims_text(dim3 d) {
  char text[48];  // not string concatenation: GCC 12 warns falsely (-Wrestrict) on "(" + s
  std::snprintf(text, sizeof text, "(%u,%u,%u)", d.x, d.y, d.z);
  return text;
}

std::string detail::block_text() { return dims_text(dim3(blockIdx.x, blockIdx.y, blockIdx.z)); }

std::string detail::launch_site(const std::source_location& where) {
  return std::string("kernel launch at ") + where.file_name() + ":" + std::to_string(where.line());
}

void detail::check_launch_config(dim3 grid, dim3 block, size_t shared_bytes, const void* kernel,
                                 const std::source_location& where) {
  auto refuse = [&](const std::string& why) {
    throw std::runtime_error(detail::launch_site(where) + ": invalid configuration: " + why);
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
  if (const size_t limit = max_dynamic_shared(kernel); shared_bytes > limit)
    refuse(std::to_string(shared_bytes) + " bytes of dynamic shared memory, the kernel's limit is " +
           std::to_string(limit) +
           (limit == kMaxDynamicShared
                ? " (more needs cudaFuncSetAttribute(kernel, "
                  "cudaFuncAttributeMaxDynamicSharedMemorySize, bytes) first)"
                : ""));
}

namespace {


// What a CUDA thread's exception says, with where it was thrown from.
std::string thread_error_text(const SimThread& t, const std::exception_ptr& error,
                              const std::source_location& where) {
  std::string what = "an exception that is not a std::exception";
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    what = e.what();
  } catch (...) {
  }
  return detail::launch_site(where) + ": block " + block_text() + ", thread " +
         dims_text(dim3(t.idx.x, t.idx.y, t.idx.z)) + " threw: " + what;
}

// Runs the block blockIdx of the launch on this thread; throws
// std::runtime_error (naming the launch) if it fails.
void run_block(const KernelCall& call, const std::source_location& where) {
  const dim3 b = blockDim;
  const size_t n = size_t{b.x} * b.y * b.z;
  std::vector<SimThread> threads(n);
  for (size_t i = 0; i < n; ++i) {
    SimThread& t = threads[i];
    t.linear = static_cast<unsigned>(i);
    t.idx = uint3{static_cast<unsigned>(i % b.x), static_cast<unsigned>(i / b.x % b.y),
                  static_cast<unsigned>(i / (size_t{b.x} * b.y))};
    t.fiber = ctx::fiber(std::allocator_arg, PooledStack{&t},
                         [&t, &call](ctx::fiber&& sink) {
                           asan_finish(nullptr, &t_sched_bottom, &t_sched_size);
                           t.sink = std::move(sink);
#if defined(ANVIL_SIM_TSAN)
                           // Back at once: every fiber of the block takes its
                           // synchronising first switch before any runs the
                           // kernel, so none inherits another's accesses.
                           tsan_switch(nullptr, false);
                           t.sink = std::move(t.sink).resume();
#endif
                           try {
                             call.run_thread();
                             cp_async::complete_all(t.copies);  // issued copies land
                           } catch (const ctx::detail::forced_unwind&) {
                             throw;  // Boost.Context's own unwinding must pass
                           } catch (const BlockAborted&) {
                           } catch (...) {
                             t.error = std::current_exception();
                           }
                           t.done = true;
                           asan_start(nullptr, t_sched_bottom, t_sched_size);
                           tsan_switch(nullptr, true);  // completion orders the kernel before the host
                           return std::move(t.sink);
                         });
  }
#if defined(ANVIL_SIM_TSAN)
  std::vector<void*>& pool = t_tsan_fibers.fibers;
  while (pool.size() < n) pool.push_back(__tsan_create_fiber(0));
  for (size_t i = 0; i < n; ++i) threads[i].tsan_fiber = pool[i];
  for (auto& t : threads) resume(t);  // the synchronising first switches (see the fiber)
#endif

  // Unwinds the fibers still waiting (they throw BlockAborted), then reports.
  auto abandon = [&](const std::string& why) {
    t_abort = true;
    for (auto& t : threads)
      if (!t.done) resume(t);
    t_abort = false;
    throw std::runtime_error(why);
  };

  for (;;) {
    for (auto& t : threads) {
      if (!t.runnable) continue;
      t.runnable = false;
      t.wait = Wait::kNone;
      resume(t);
    }
    size_t at_barrier = 0, at_warp = 0, done = 0;
    const SimThread* failed = nullptr;
    for (auto& t : threads) {
      done += t.done;
      if (!t.done) {
        at_barrier += t.wait == Wait::kBarrier;
        at_warp += t.wait == Wait::kWarp;
      }
      if (t.error && !failed) failed = &t;
    }
    if (failed) abandon(thread_error_text(*failed, failed->error, where));
    if (at_warp > 0) {
      std::string why = resolve_warps(threads.data(), n);
      if (!why.empty()) {
        const void* kernel = call.kernel_address();
        abandon(detail::launch_site(where) + ": " +
                (kernel ? "kernel " + anvil::kernel_name_at(kernel) + ": " : std::string()) +
                why);
      }
      continue;
    }
    if (at_barrier == 0) return;  // every thread has returned
    if (done == 0) {              // all at the barrier: release it
      for (auto& t : threads) t.runnable = true;
      continue;
    }
    abandon(detail::launch_site(where) + ": divergent __syncthreads in block " + block_text() +
            ": " + std::to_string(at_barrier) + " of " + std::to_string(n) +
            " threads wait at the barrier, " + std::to_string(done) + " have returned");
  }
}

// Leaves the fiber for the scheduler until the barrier or collective it waits
// at is complete.
void yield_to_scheduler(SimThread* t) {
  asan_start(&t->asan_fake_stack, t_sched_bottom, t_sched_size);
  tsan_switch(nullptr, false);
  t->sink = std::move(t->sink).resume();
  asan_finish(t->asan_fake_stack, &t_sched_bottom, &t_sched_size);
  if (t_abort) throw BlockAborted{};
}

// ---- workers ----

std::atomic<unsigned>& worker_setting() {
  static std::atomic<unsigned> count = [] {
    const char* env = std::getenv("ANVIL_SIM_WORKERS");
    long n = env && *env ? std::strtol(env, nullptr, 10)
                         : static_cast<long>(std::thread::hardware_concurrency());
    return static_cast<unsigned>(std::clamp(n, 1L, 1024L));
  }();
  return count;
}

// This thread's CPU time: a block's cost for the launch audit. Every fiber
// of a block runs on the worker thread that runs the block, and CPU time
// leaves out the time other processes hold the core.
double thread_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

// One launch as its workers share it. Block numbers run x fastest, then y,
// then z: with one worker, the order blocks always ran in.
struct LaunchJob {
  explicit LaunchJob(const detail::KernelLaunch& l) : launch(l) {}
  const detail::KernelLaunch& launch;
  uint64_t blocks = 0;
  uint64_t run = 0;  // the blocks that run: all, or ANVIL_SIM_SAMPLE_BLOCKS of them
  const std::vector<uint64_t>* chosen = nullptr;  // a BlockFilter's blocks, else null
  double* seconds = nullptr;  // per block, while the launch audit records
  std::atomic<uint64_t> next{0};
  std::atomic<bool> failed{false};
  std::mutex error_mutex;
  std::string error;  // the first failure's message

  // Takes blocks until none is left or one (on any worker) has failed.
  void work() {
    tsan_launch_begin();
    gridDim = launch.grid;
    blockDim = launch.block;
    const dim3 g = launch.grid;
    const size_t shared_bytes = launch.shared_bytes;
    while (!failed.load(std::memory_order_relaxed)) {
      const uint64_t taken = next.fetch_add(1, std::memory_order_relaxed);
      if (taken >= run) return;
      // A sample is spread evenly: the middle block of each run-th of the grid.
      using Wide = unsigned __int128;  // (2 taken + 1) * blocks may pass 2^64
      const uint64_t b =
          chosen ? (*chosen)[taken]
          : run == blocks ? taken
                          : static_cast<uint64_t>((2 * Wide(taken) + 1) * blocks / (2 * run));
      blockIdx = uint3{static_cast<unsigned>(b % g.x), static_cast<unsigned>(b / g.x % g.y),
                       static_cast<unsigned>(b / (uint64_t{g.x} * g.y))};
      try {
        // Exact size so that ASan sees overflows; NaN bytes expose reads
        // of shared memory no thread has written.
        std::unique_ptr<void, void (*)(void*)> smem(
            shared_bytes ? std::malloc(shared_bytes) : nullptr, std::free);
        if (shared_bytes && !smem) throw std::bad_alloc();
        if (shared_bytes) std::memset(smem.get(), 0xFF, shared_bytes);
        t_dynamic_shared = smem.get();
        const double start = seconds ? thread_seconds() : 0.0;
        run_block(*launch.call, launch.where);
        if (seconds) seconds[b] = thread_seconds() - start;
        t_dynamic_shared = nullptr;
      } catch (const std::exception& e) {
        t_dynamic_shared = nullptr;
        record(e.what());
      } catch (...) {
        t_dynamic_shared = nullptr;
        record((detail::launch_site(launch.where) + ": unknown error in block " + block_text())
                   .c_str());
      }
    }
  }

  void record(const char* what) {
    std::lock_guard lock(error_mutex);
    if (error.empty()) error = what;
    failed.store(true, std::memory_order_relaxed);
  }
};

// Persistent helper threads, started on demand and never stopped (a launch
// may come from a static destructor; a pool destroyed before it would hang
// it). A launch opens a job with some seats, wakes the helpers, works on it
// itself, then closes it and waits only for the helpers that took a seat: a
// helper that wakes after the blocks are gone finds the job closed and costs
// the launch nothing.
class WorkerPool {
 public:
  void run(LaunchJob& job, unsigned helpers) {
    // Launches are run by one host thread at a time (the streams serialise
    // them); should two meet anyway, the second runs alone rather than wait.
    std::unique_lock serial(running_, std::try_to_lock);
    if (!serial.owns_lock()) return job.work();
    {
      std::lock_guard lock(mutex_);
      for (; started_ < helpers; ++started_) std::thread([this] { serve(); }).detach();
      job_ = &job;
      seats_ = helpers;
      ++generation_;
    }
    // One wake-up per seat: on a many-core host most helpers sleep through
    // a small launch.
    for (unsigned i = 0; i < helpers; ++i) wake_.notify_one();
    job.work();
    std::unique_lock lock(mutex_);
    job_ = nullptr;
    seats_ = 0;
    done_.wait(lock, [this] { return active_ == 0; });
  }

 private:
  void serve() {
    uint64_t joined = 0;  // the last job this helper took part in
    std::unique_lock lock(mutex_);
    for (;;) {
      wake_.wait(lock, [&] { return job_ != nullptr && seats_ > 0 && generation_ != joined; });
      joined = generation_;
      --seats_;
      ++active_;
      LaunchJob* job = job_;
      lock.unlock();
      job->work();
      lock.lock();
      if (--active_ == 0) done_.notify_all();
    }
  }

  std::mutex running_;  // held by the launch using the pool
  std::mutex mutex_;    // everything below
  std::condition_variable wake_, done_;
  unsigned started_ = 0;
  LaunchJob* job_ = nullptr;  // the open job, if any
  unsigned seats_ = 0;        // helpers that may still join it
  unsigned active_ = 0;       // helpers working on a job
  uint64_t generation_ = 0;   // counts jobs, so that no helper joins one twice
};

WorkerPool& pool() {
  static auto* p = new WorkerPool();  // leaked on purpose: see WorkerPool
  return *p;
}

}  // namespace

uint64_t warp_collective(WarpOp op, unsigned mask, uint64_t value, int arg, int width) {
  SimThread* t = t_current;
  if (t == nullptr) throw std::logic_error(std::string(op_name(op)) + " called outside a kernel");
  t->wait = Wait::kWarp;
  t->op = op;
  t->mask = mask;
  t->value = value;
  t->arg = arg;
  t->width = width;
#if defined(ANVIL_SIM_TSAN)
  // Only __syncwarp orders memory; a shuffle moves registers.
  const bool orders_memory = op == WarpOp::kSync;
  if (orders_memory) tsan_barrier_arrive(t_warp_sync[t->linear / 32], t->warp_syncs);
  yield_to_scheduler(t);
  if (orders_memory) tsan_barrier_leave(t_warp_sync[t->linear / 32], t->warp_syncs);
#else
  yield_to_scheduler(t);
#endif
  return t->result;
}

namespace {

// The live BlockFilter (cuda_sim.h): what it keeps, and what it has run.
struct FilterState {
  std::mutex mutex;
  bool active = false;
  std::string kernel;
  BlockFilter::Keep keep;
  uint64_t launches = 0, blocks = 0;
};
FilterState& filter_state() {
  static FilterState state;
  return state;
}

// The blocks of `launch` the live filter keeps, in block order, if one is
// live and names its kernel; else nullopt (every block, or the sample).
std::optional<std::vector<uint64_t>> filtered_blocks(const detail::KernelLaunch& launch,
                                                     uint64_t blocks) {
  FilterState& f = filter_state();
  std::lock_guard lock(f.mutex);
  if (!f.active) return std::nullopt;
  const void* address = launch.call->kernel_address();
  const std::string mangled = address ? mangled_name_at(address) : std::string();
  if (mangled.empty() || short_kernel_name(demangle(mangled.c_str())).find(f.kernel) == std::string::npos)
    return std::nullopt;
  const dim3 g = launch.grid;
  std::vector<uint64_t> chosen;
  for (uint64_t b = 0; b < blocks; ++b) {
    const uint3 block{static_cast<unsigned>(b % g.x), static_cast<unsigned>(b / g.x % g.y),
                      static_cast<unsigned>(b / (uint64_t{g.x} * g.y))};
    if (f.keep(g, block)) chosen.push_back(b);
  }
  ++f.launches;
  f.blocks += chosen.size();
  return chosen;
}

}  // namespace

BlockFilter::BlockFilter(std::string kernel, Keep keep) {
  FilterState& f = filter_state();
  std::lock_guard lock(f.mutex);
  if (f.active) throw std::logic_error("sim::BlockFilter: another filter is live (one at a time)");
  f.active = true;
  f.launches = f.blocks = 0;
  f.kernel = std::move(kernel);
  f.keep = std::move(keep);
}
BlockFilter::~BlockFilter() {
  FilterState& f = filter_state();
  std::lock_guard lock(f.mutex);
  f.active = false;
  f.keep = nullptr;
}
uint64_t BlockFilter::launches() const {
  std::lock_guard lock(filter_state().mutex);
  return filter_state().launches;
}
uint64_t BlockFilter::blocks_run() const {
  std::lock_guard lock(filter_state().mutex);
  return filter_state().blocks;
}

void detail::run_kernel(const detail::KernelLaunch& launch) {
  LaunchJob job(launch);
  const dim3 g = launch.grid;
  job.blocks = uint64_t{g.x} * g.y * g.z;
  const std::optional<std::vector<uint64_t>> chosen = filtered_blocks(launch, job.blocks);
  if (chosen) {
    job.chosen = &*chosen;
    job.run = chosen->size();
  } else {
    const uint64_t sample = detail::sample_blocks_for_launch();
    job.run = sample > 0 && sample < job.blocks ? sample : job.blocks;
  }
  if (job.run == 0) return;  // a filter that keeps none of its blocks
  std::vector<double> seconds;  // negative: not run (sampled out)
  if (detail::launch_audit_recording()) {
    seconds.assign(job.blocks, -1.0);
    job.seconds = seconds.data();
  }
  const uint64_t helpers = std::min<uint64_t>(workers() - 1, job.run - 1);
  if (helpers == 0) {
    job.work();  // one worker: blocks in order on this thread, no pool involved
  } else {
    pool().run(job, static_cast<unsigned>(helpers));
  }
  if (!job.error.empty()) throw std::runtime_error(job.error);
  if (job.seconds) detail::record_launch(launch, seconds);
}

void set_workers(unsigned count) { worker_setting().store(std::max(count, 1u)); }
unsigned workers() { return worker_setting().load(); }

void* dynamic_shared_bytes() { return t_dynamic_shared; }

int detail::current_lane() {
  return t_current == nullptr ? -1 : static_cast<int>(t_current->linear % 32);
}

cp_async::Queue& detail::current_cp_async_queue(const char* what) {
  SimThread* t = t_current;
  if (t == nullptr) throw std::logic_error(std::string(what) + " called outside a kernel");
  return t->copies;
}

}  // namespace anvil::sim

namespace anvil_sim_rt {

void __syncthreads() {
  using namespace anvil::sim;
  SimThread* t = t_current;
  if (t == nullptr) throw std::logic_error("__syncthreads called outside a kernel");
  t->wait = Wait::kBarrier;
#if defined(ANVIL_SIM_TSAN)
  tsan_barrier_arrive(t_barrier_sync, t->barriers);
  yield_to_scheduler(t);
  tsan_barrier_leave(t_barrier_sync, t->barriers);
#else
  yield_to_scheduler(t);
#endif
}

}  // namespace anvil_sim_rt
