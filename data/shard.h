// How `rows` rows (a batch's examples, a tensor's first dimension) are
// shared among `ranks` ranks, as torch.tensor_split shares them: every rank
// gets rows / ranks, and the first rows % ranks one more. The data loader's
// shards of a batch and the communicator's scatter, reduce-scatter and
// all-gather rows both follow it.
#pragma once
#include <algorithm>
#include <cstdint>

namespace anvil::data {

inline int64_t shard_rows(int64_t rows, int ranks, int rank) {
  return rows / ranks + (rank < rows % ranks ? 1 : 0);
}

// The first row of `rank`'s share (rank == ranks: rows).
inline int64_t shard_first_row(int64_t rows, int ranks, int rank) {
  return rank * (rows / ranks) + std::min<int64_t>(rank, rows % ranks);
}

}  // namespace anvil::data
