// The simulator's cp.async (see cp_async_sim.h). The queues live in the
// scheduler's per-CUDA-thread state (scheduler.cpp); this file, unlike the
// scheduler, is instrumented by the sanitizers, so the copies' reads and
// writes are seen as the CUDA thread's own.
#include "sim/cp_async_sim.h"

#include <cstring>
#include <stdexcept>
#include <string>

#include "sim/sim_internal.h"

namespace anvil::sim::cp_async {
namespace {

void perform(const Queue::Copy& c) { std::memcpy(c.dst, c.bytes, static_cast<size_t>(c.size)); }

// Performs the oldest `groups` committed groups of q.
void complete_groups(Queue& q, size_t groups) {
  if (groups == 0) return;
  const size_t end = q.group_ends[groups - 1];
  for (size_t i = 0; i < end; ++i) perform(q.copies[i]);
  q.copies.erase(q.copies.begin(), q.copies.begin() + static_cast<std::ptrdiff_t>(end));
  q.group_ends.erase(q.group_ends.begin(),
                     q.group_ends.begin() + static_cast<std::ptrdiff_t>(groups));
  for (size_t& e : q.group_ends) e -= end;
}

bool aligned(const void* p, int size) {
  return reinterpret_cast<uintptr_t>(p) % static_cast<uintptr_t>(size) == 0;
}

}  // namespace

void copy(void* dst, const void* src, int size, int src_bytes, Cache cache) {
  const char* name = cache == Cache::kGlobal ? "cp.async.cg" : "cp.async.ca";
  auto refuse = [&](const std::string& why) {
    throw std::invalid_argument(std::string(name) + ".shared.global of " + std::to_string(size) +
                                " bytes: " + why);
  };
  if (size != 4 && size != 8 && size != 16) refuse("the size must be 4, 8 or 16");
  if (cache == Cache::kGlobal && size != 16) refuse(".cg copies 16 bytes only");
  if (src_bytes < 0 || src_bytes > size)
    refuse("src-size " + std::to_string(src_bytes) + " is outside [0, " + std::to_string(size) +
           "]");
  if (!aligned(dst, size)) refuse("the shared-memory address is not aligned to the size");
  if (!aligned(src, size)) refuse("the global address is not aligned to the size");
  Queue& q = detail::current_cp_async_queue(name);
  Queue::Copy& c = q.copies.emplace_back();
  c.dst = dst;
  c.size = size;
  if (src_bytes > 0) std::memcpy(c.bytes, src, static_cast<size_t>(src_bytes));
}

void commit_group() {
  Queue& q = detail::current_cp_async_queue("cp.async.commit_group");
  q.group_ends.push_back(q.copies.size());
}

void wait_group(int n) {
  if (n < 0) throw std::invalid_argument("cp.async.wait_group " + std::to_string(n));
  Queue& q = detail::current_cp_async_queue("cp.async.wait_group");
  const size_t keep = static_cast<size_t>(n);
  if (q.group_ends.size() > keep) complete_groups(q, q.group_ends.size() - keep);
}

void wait_all() {
  Queue& q = detail::current_cp_async_queue("cp.async.wait_all");
  q.group_ends.push_back(q.copies.size());
  complete_groups(q, q.group_ends.size());
}

int pending_groups() {
  return static_cast<int>(detail::current_cp_async_queue("pending_groups").group_ends.size());
}

int uncommitted_copies() {
  const Queue& q = detail::current_cp_async_queue("uncommitted_copies");
  return static_cast<int>(q.copies.size() - (q.group_ends.empty() ? 0 : q.group_ends.back()));
}

void complete_all(Queue& q) {
  for (const Queue::Copy& c : q.copies) perform(c);
  q.copies.clear();
  q.group_ends.clear();
}

}  // namespace anvil::sim::cp_async
