#include "core/unfinished_files.h"

#include <unistd.h>

#include <atomic>
#include <cstring>

namespace anvil {
namespace {

// A fixed table (no allocation, lock-free atomics): a signal handler may read
// it at any moment. A slot is free (0), being filled (1) or holds a path (2).
constexpr int kSlots = 16;
constexpr size_t kMaxPath = 4096;
struct Slot {
  std::atomic<int> state{0};
  char path[kMaxPath];
};
Slot g_slots[kSlots];
static_assert(std::atomic<int>::is_always_lock_free);

}  // namespace

int track_unfinished_file(const std::string& path) {
  if (path.size() >= kMaxPath) return -1;
  for (int i = 0; i < kSlots; ++i) {
    int expected = 0;
    if (!g_slots[i].state.compare_exchange_strong(expected, 1)) continue;
    std::memcpy(g_slots[i].path, path.c_str(), path.size() + 1);
    g_slots[i].state.store(2, std::memory_order_release);
    return i;
  }
  return -1;
}

void untrack_unfinished_file(int slot) {
  if (slot >= 0 && slot < kSlots) g_slots[slot].state.store(0, std::memory_order_release);
}

void remove_unfinished_files() {
  for (Slot& s : g_slots)
    if (s.state.load(std::memory_order_acquire) == 2) ::unlink(s.path);
}

}  // namespace anvil
