// Broadcast and scatter on the transport's grouped sends and receives.
//
// Broadcast is a pipeline down a chain: the ranks in order from the root
// (root, root+1, ..., wrapping round), the buffer cut into chunks. At each
// step a rank receives chunk c from the rank before it and forwards chunk c-1
// to the rank after it, so after the chain fills (n-1 steps) every link is
// busy at once and the time is ~ (n - 2 + chunks) chunk times: for many
// chunks, one buffer's time whatever the rank count. A tree would reach the
// last rank in log n steps but the root's link would carry the buffer twice.
//
// Scatter: the root sends each rank its part in one group of sends (they
// travel at once over their own links) and copies its own.
#include <algorithm>
#include <vector>

#include "parallel/collectives.h"

namespace anvil::parallel::algorithms {

void chain_broadcast(Transport& t, void* data, size_t bytes, int root, size_t chunk_bytes) {
  const int size = t.size(), rank = t.rank();
  if (size == 1 || bytes == 0) return;
  const int position = (rank - root + size) % size;  // 0 is the root
  const int prev = (rank - 1 + size) % size, next = (rank + 1) % size;
  const int chunks =
      chunk_bytes == 0 ? 1 : int(std::max<size_t>(1, (bytes + chunk_bytes - 1) / chunk_bytes));
  const std::vector<int64_t> cut = even_split(int64_t(bytes), chunks, 16);
  auto piece = [&](Message::Kind kind, int peer, int c) {
    return Message{kind, peer, static_cast<char*>(data) + cut[size_t(c)],
                   size_t(cut[size_t(c) + 1] - cut[size_t(c)])};
  };
  const bool first = position == 0, last = position == size - 1;
  // Step i receives chunk i (but at the root) and forwards chunk i-1 (but at the last rank).
  for (int i = 0; i <= chunks; ++i) {
    Message m[2];
    int count = 0;
    if (!first && i < chunks) m[count++] = piece(Message::kRecv, prev, i);
    if (!last && first && i < chunks) m[count++] = piece(Message::kSend, next, i);
    if (!last && !first && i >= 1) m[count++] = piece(Message::kSend, next, i - 1);
    if (count > 0) t.post({m, size_t(count)});
  }
}

void scatter(Transport& t, const void* input, void* output, const std::vector<int64_t>& offsets,
             int root) {
  const int size = t.size(), rank = t.rank();
  auto part_bytes = [&](int j) { return size_t(offsets[size_t(j) + 1] - offsets[size_t(j)]); };
  if (rank != root) {
    if (part_bytes(rank) == 0) return;
    const Message m{Message::kRecv, root, output, part_bytes(rank)};
    t.post({&m, 1});
    return;
  }
  std::vector<Message> sends;
  for (int j = 0; j < size; ++j)
    if (j != root && part_bytes(j) > 0)
      sends.push_back({Message::kSend, j,
                       const_cast<char*>(static_cast<const char*>(input)) + offsets[size_t(j)],
                       part_bytes(j)});
  if (!sends.empty()) t.post(sends);
  if (part_bytes(root) > 0)
    t.copy(output, static_cast<const char*>(input) + offsets[size_t(root)], part_bytes(root), 0);
}

}  // namespace anvil::parallel::algorithms
