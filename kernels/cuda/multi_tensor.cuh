// Multi-tensor apply: one launch over a list of tensors, as PyTorch's
// multi_tensor_apply under its _foreach ops and fused optimizers. The
// tensors' entries travel by value in the kernel's parameters (read through
// __grid_constant__: the table is not copied into each thread's local
// memory when a block indexes it). A table may pass the 4 KB that kernel
// parameters had before CUDA 12.1, which since then takes up to 32764
// bytes on Volta and later (anvil builds for sm_80 and sm_90 with CUDA 13). Each block works on
// one chunk of one tensor: a tensor of n elements gets ceil(n / chunk)
// consecutive blocks, and a block finds its tensor by a binary search of
// the table's block offsets. A list longer than one table (kMax entries)
// takes one launch per table.
#pragma once
#include <climits>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "kernels/cuda/cuda_compat.h"

namespace anvil::cuda::multi_tensor {

template <class Entry, int kMax>
struct Table {
  int count = 0;
  int block_start[kMax + 1] = {};  // blocks before entry i; [count]: the launch's blocks
  Entry entries[kMax] = {};
};

// The index of the entry whose chunks hold block `block`.
template <class Entry, int kMax>
__device__ __forceinline__ int entry_of(const Table<Entry, kMax>& t, int block) {
  int lo = 0, hi = t.count - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (t.block_start[mid] <= block) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

// Calls launch(table, blocks) for each table of at most kMax entries with
// elements, in order (entries with n == 0 are left out); Entry has a field
// n, its element count.
template <int kMax, class Entry, class Launch>
void for_each_table(const Entry* entries, size_t count, int64_t chunk, Launch&& launch) {
  Table<Entry, kMax> t{};
  int64_t blocks = 0;
  auto flush = [&] {
    if (t.count == 0) return;
    t.block_start[t.count] = static_cast<int>(blocks);
    launch(t, static_cast<unsigned>(blocks));
    t = Table<Entry, kMax>{};
    blocks = 0;
  };
  for (size_t i = 0; i < count; ++i) {
    const Entry& e = entries[i];
    if (e.n < 0) throw std::invalid_argument("multi_tensor: negative size " + std::to_string(e.n));
    if (e.n == 0) continue;
    const int64_t need = (e.n + chunk - 1) / chunk;
    if (need > INT_MAX)
      throw std::invalid_argument("multi_tensor: a tensor of " + std::to_string(e.n) +
                                  " elements needs more blocks than a grid has");
    if (t.count == kMax || blocks + need > INT_MAX) flush();
    t.block_start[t.count] = static_cast<int>(blocks);
    t.entries[t.count++] = e;
    blocks += need;
  }
  flush();
}

}  // namespace anvil::cuda::multi_tensor
