// All-reduce, from naive to pipelined (see docs/parallel.md for the ring,
// step by step, with a diagram).
//
// 1. naive (the seeds' way): gather to rank 0, add, send back. Rank 0's
//    links carry 2(n-1) buffers while every other link carries 2: the time
//    grows linearly with the rank count.
// 2. ring: split the buffer into n segments. Reduce-scatter: at step s
//    (0..n-2) rank r sends segment (r-s-1) mod n to rank r+1 and receives
//    segment (r-s-2) mod n from rank r-1, adding it to its own copy; after
//    n-1 steps segment r on rank r holds the sum of all ranks. All-gather:
//    at step s rank r sends segment (r-s) mod n on and receives segment
//    (r-s-1) mod n in place; after n-1 more steps every rank has every sum.
//    Every rank sends 2(n-1)/n of the buffer, over its own link, all links at
//    once: the time is ~ 2(n-1)/n * bytes / link bandwidth, almost flat in n.
// 3. chunked ring: as 2, but each step moves its segment in chunks, and the
//    transfer of chunk k+1 is issued before the reduction of chunk k, so the
//    two overlap (the transport orders them; transport.h) and each chunk is
//    added while it is still in cache.
//
// The reduction of every element happens in a fixed order for a given rank
// count (segment j is summed starting at rank j+1 and going round the ring),
// and the all-gather copies the one finished sum to every rank: the result
// is bitwise the same on every rank and from run to run.
#include <algorithm>
#include <stdexcept>
#include <vector>

#include "parallel/collectives.h"

namespace anvil::parallel::algorithms {

namespace {

char* at(void* base, int64_t element, DType dtype) {
  return static_cast<char*>(base) + element * int64_t(dtype_size(dtype));
}

int wrap(int i, int n) { return ((i % n) + n) % n; }

}  // namespace

std::vector<int64_t> even_split(int64_t n, int parts, int64_t align) {
  std::vector<int64_t> b(size_t(parts) + 1);
  for (int k = 0; k <= parts; ++k) {
    int64_t v = int64_t((__int128)n * k / parts);
    if (k > 0 && k < parts) v -= v % align;
    b[size_t(k)] = v;
  }
  return b;
}

void allreduce_naive(Transport& t, void* data, int64_t n, DType dtype, ReduceOp op) {
  const int size = t.size(), rank = t.rank();
  if (size == 1 || n == 0) return;
  const size_t bytes = size_t(n) * dtype_size(dtype);
  const float last_scale = op == ReduceOp::kAverage ? 1.0f / float(size) : 1.0f;
  if (rank != 0) {
    const Message up{Message::kSend, 0, data, bytes};
    t.post({&up, 1});
    const Message down{Message::kRecv, 0, data, bytes};
    t.post({&down, 1});
    return;
  }
  // Rank 0 receives every buffer at once, then adds them in rank order.
  void* inbox = t.scratch(bytes * size_t(size - 1));
  std::vector<Message> gather;
  for (int j = 1; j < size; ++j)
    gather.push_back({Message::kRecv, j, at(inbox, int64_t(j - 1) * n, dtype), bytes});
  const uint64_t arrived = t.post(gather);
  for (int j = 1; j < size; ++j)
    t.reduce(data, at(inbox, int64_t(j - 1) * n, dtype), n, dtype,
             j == size - 1 ? last_scale : 1.0f, arrived);
  std::vector<Message> spread;
  for (int j = 1; j < size; ++j) spread.push_back({Message::kSend, j, data, bytes});
  t.post(spread);
}

void ring_reduce_scatter(Transport& t, void* data, const std::vector<int64_t>& bounds,
                         DType dtype, float scale, size_t chunk_bytes) {
  const int size = t.size(), rank = t.rank();
  if (size == 1) return;  // one rank's sum (and mean) is its own data
  const int64_t esize = int64_t(dtype_size(dtype));
  int64_t longest = 0;
  for (int j = 0; j < size; ++j) longest = std::max(longest, bounds[j + 1] - bounds[j]);
  // Chunks per segment: the same on every rank (every rank knows all bounds).
  const int chunks =
      chunk_bytes == 0
          ? 1
          : int(std::max<int64_t>(1, (longest * esize + int64_t(chunk_bytes) - 1) /
                                         int64_t(chunk_bytes)));
  const int64_t chunk_capacity = (longest + chunks - 1) / chunks + 4;  // elements, with rounding slack
  // Two receive slots: chunk k+1 arrives in one while chunk k is added from the other.
  const int lookahead = chunks >= 2 ? 1 : 0;
  void* inbox = t.scratch(size_t(chunk_capacity * esize) * size_t(1 + lookahead));
  const int left = wrap(rank - 1, size), right = wrap(rank + 1, size);
  const int items = (size - 1) * chunks;

  struct Chunk {
    int64_t begin, length;
  };
  auto chunk_of = [&](int segment, int c) {
    const int64_t b = bounds[size_t(segment)], len = bounds[size_t(segment) + 1] - b;
    const std::vector<int64_t> cut = even_split(len, chunks, 4);
    return Chunk{b + cut[size_t(c)], cut[size_t(c) + 1] - cut[size_t(c)]};
  };
  auto slot = [&](int item) {
    return at(inbox, int64_t(item % (1 + lookahead)) * chunk_capacity, dtype);
  };
  std::vector<uint64_t> tickets(size_t(items), 0);
  auto post_item = [&](int item) {
    const int step = item / chunks, c = item % chunks;
    const Chunk out = chunk_of(wrap(rank - step - 1, size), c);
    const Chunk in = chunk_of(wrap(rank - step - 2, size), c);
    Message m[2];
    int count = 0;
    if (out.length > 0)
      m[count++] = {Message::kSend, right, at(data, out.begin, dtype), size_t(out.length * esize)};
    if (in.length > 0)
      m[count++] = {Message::kRecv, left, slot(item), size_t(in.length * esize)};
    tickets[size_t(item)] = t.post({m, size_t(count)});
  };

  for (int item = 0; item < lookahead && item < items; ++item) post_item(item);
  for (int item = 0; item < items; ++item) {
    if (item + lookahead < items) post_item(item + lookahead);
    const int step = item / chunks, c = item % chunks;
    const Chunk in = chunk_of(wrap(rank - step - 2, size), c);
    if (in.length > 0)
      t.reduce(at(data, in.begin, dtype), slot(item), in.length, dtype,
               step == size - 2 ? scale : 1.0f, tickets[size_t(item)]);
  }
}

void ring_all_gather(Transport& t, void* data, const std::vector<int64_t>& bounds, DType dtype) {
  const int size = t.size(), rank = t.rank();
  const int64_t esize = int64_t(dtype_size(dtype));
  const int left = wrap(rank - 1, size), right = wrap(rank + 1, size);
  for (int step = 0; step + 1 < size; ++step) {
    const int out = wrap(rank - step, size), in = wrap(rank - step - 1, size);
    Message m[2];
    int count = 0;
    if (const int64_t len = bounds[size_t(out) + 1] - bounds[size_t(out)]; len > 0)
      m[count++] = {Message::kSend, right, at(data, bounds[size_t(out)], dtype),
                    size_t(len * esize)};
    if (const int64_t len = bounds[size_t(in) + 1] - bounds[size_t(in)]; len > 0)
      m[count++] = {Message::kRecv, left, at(data, bounds[size_t(in)], dtype),
                    size_t(len * esize)};
    t.post({m, size_t(count)});
  }
}

void allreduce_ring(Transport& t, void* data, int64_t n, DType dtype, ReduceOp op,
                    size_t chunk_bytes) {
  const int size = t.size();
  if (size == 1 || n == 0) return;
  // Segments start at multiples of 4 elements: aligned for 128-bit loads.
  const std::vector<int64_t> bounds = even_split(n, size, 4);
  const float scale = op == ReduceOp::kAverage ? 1.0f / float(size) : 1.0f;
  ring_reduce_scatter(t, data, bounds, dtype, scale, chunk_bytes);
  ring_all_gather(t, data, bounds, dtype);
}

}  // namespace anvil::parallel::algorithms
