// Internal to parallel/: the collectives' algorithms, written once over a
// Transport (parallel/transport.h) for every backend. Buffers are the
// transport's memory (device memory for NCCL, host memory for MPI); counts
// are elements of `dtype`. The Communicator (communicator.cpp) checks the
// arguments, brackets each call with begin()/end() and names it for errors.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/dtype.h"
#include "parallel/transport.h"

namespace anvil::parallel::algorithms {

// Boundaries b[0] = 0 <= b[1] <= ... <= b[parts] = n splitting [0, n) into
// `parts` near-equal ranges, each inner boundary rounded down to a multiple
// of `align` (so that chunks of an aligned buffer stay aligned for vector
// loads).
std::vector<int64_t> even_split(int64_t n, int parts, int64_t align = 1);

// ---- all-reduce, in place over n elements (allreduce.cpp) ----
// Variant 1, the seeds' way: rank 0 receives every rank's buffer, adds them
// in rank order and sends the sum back. Rank 0's links carry (n-1) buffers
// each way while the others idle: the time grows with the rank count.
void allreduce_naive(Transport& t, void* data, int64_t n, DType dtype, ReduceOp op);
// Variants 2 and 3, the ring: reduce-scatter then all-gather, n-1 steps each,
// every rank sending one segment to its right neighbour and receiving one
// from its left at every step. chunk_bytes 0 moves whole segments (variant
// 2, the textbook ring); otherwise each step moves its segment in chunks and
// the transfer of one chunk overlaps the reduction of the one before (3).
void allreduce_ring(Transport& t, void* data, int64_t n, DType dtype, ReduceOp op,
                    size_t chunk_bytes);

// ---- the ring's two halves, over segments (bounds: size()+1 element offsets) ----
// After it, rank r's segment r holds the sum over all ranks, times `scale`;
// the other segments hold partial sums (the buffer is the algorithm's scratch).
void ring_reduce_scatter(Transport& t, void* data, const std::vector<int64_t>& bounds,
                         DType dtype, float scale, size_t chunk_bytes);
// Before it, rank r's segment r holds its part; after it, every segment
// holds its owner's part on every rank.
void ring_all_gather(Transport& t, void* data, const std::vector<int64_t>& bounds, DType dtype);

// ---- broadcast, scatter (collectives.cpp) ----
// Root's bytes down the chain root, root+1, ..., in chunks: each rank
// forwards chunk c while it receives chunk c+1.
void chain_broadcast(Transport& t, void* data, size_t bytes, int root, size_t chunk_bytes);
// Root sends rank j the bytes [offsets[j], offsets[j+1]) of `input` into its
// `output`; root copies its own part.
void scatter(Transport& t, const void* input, void* output, const std::vector<int64_t>& offsets,
             int root);

}  // namespace anvil::parallel::algorithms
