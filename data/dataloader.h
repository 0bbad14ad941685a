// Mini-batches of an ImageSet, prepared by a background thread.
//
//   auto set = std::make_shared<const ImageSet>(load_mnist_split(dir, true));
//   DataLoader loader(set, 64, /*shuffle=*/true, /*drop_last=*/false, /*seed=*/1);
//   Batch batch;
//   for (int e = 0; e < epochs; ++e) {
//     loader.start_epoch();            // epoch 0, 1, 2, ...
//     while (loader.next(batch)) train_step(batch);
//   }
//
// A worker thread fills up to two batches ahead while the caller works on the
// current one. next() swaps the ready batch into the caller's Batch, and the
// caller's previous buffers go back to the worker for reuse, so once every
// buffer has grown to full size an epoch allocates nothing.
//
// Shuffling is reproducible everywhere: epoch e visits the examples in the
// order shuffled_order(count, seed, e), a Fisher-Yates shuffle driven by a
// std::mt19937_64 seeded from (seed, e) (no std::shuffle or std::*_distribution,
// whose results differ between standard libraries).
//
// One thread uses a DataLoader; only the transform runs on the worker thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "data/idx.h"

namespace anvil::data {

struct Batch {
  int64_t size = 0;  // examples in this batch (the last one may be smaller)
  int64_t channels = 1, rows = 0, cols = 0;
  std::vector<float> images;     // size * channels * rows * cols, NCHW, pixel / 255 in [0, 1]
  std::vector<int64_t> labels;   // size
  std::vector<int64_t> indices;  // size: each example's position in the ImageSet
  uint64_t epoch = 0;            // the epoch this batch belongs to
  int64_t index = 0;             // batch number within the epoch, 0 .. num_batches()-1
  // With a shard (DataLoader::set_shard): the whole batch the ranks share,
  // and where this rank's part starts in it. Without one: size and 0.
  int64_t global_size = 0;
  int64_t offset = 0;
};

// Optional per-batch hook, run on the worker thread after the batch is filled
// (all fields set) and before next() hands it out. It may change the batch in
// place (augmentation, normalisation); for reproducible randomness derive an
// RNG from batch.epoch and batch.index. It must not call the DataLoader. An
// exception it throws is rethrown by next().
using BatchTransform = std::function<void(Batch&)>;

class DataLoader {
 public:
  // Shares ownership of the set.
  // Throws std::invalid_argument for a null or inconsistent set or batch_size < 1.
  DataLoader(std::shared_ptr<const ImageSet> set, int64_t batch_size, bool shuffle, bool drop_last,
             uint64_t seed, BatchTransform transform = {});
  // Does not own the set: the caller keeps it alive (and unchanged) for the
  // loader's lifetime. Temporaries are refused at compile time.
  DataLoader(const ImageSet& set, int64_t batch_size, bool shuffle, bool drop_last, uint64_t seed,
             BatchTransform transform = {});
  DataLoader(ImageSet&& set, int64_t batch_size, bool shuffle, bool drop_last, uint64_t seed,
             BatchTransform transform = {}) = delete;

  // Stops the worker and waits for it; fine in the middle of an epoch.
  ~DataLoader();
  DataLoader(DataLoader&&) noexcept;
  DataLoader& operator=(DataLoader&&) noexcept;
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  // ceil(count / batch_size), or floor(count / batch_size) with drop_last.
  int64_t num_batches() const;
  int64_t batch_size() const;
  int64_t num_examples() const;

  // Starts the next epoch (0 for the first call, then 1, 2, ...), abandoning
  // whatever is left of the current one.
  void start_epoch();
  // Starts epoch `epoch` (e.g. to resume a run); later start_epoch() calls
  // continue from epoch + 1.
  void start_epoch(uint64_t epoch);
  // The epoch most recently started.
  uint64_t epoch() const;

  // Makes this loader one of `ranks` that share every batch (data-parallel
  // training): batch b is still the same examples as without a shard, in
  // the same order, and this loader yields only rank `rank`'s part of it,
  // split as torch.tensor_split splits (the first size % ranks ranks get one
  // example more; a part may be empty). Examples keep their index, so
  // augmentation draws (keyed by example) are those of a one-rank run. Call
  // before an epoch starts; throws std::invalid_argument for a bad rank.
  void set_shard(int rank, int ranks);
  int shard_rank() const;
  int shard_count() const;

  // Moves the next batch of the current epoch into `out` (its old buffers are
  // recycled) and returns true, or returns false once the epoch is exhausted.
  // Rethrows an exception thrown while preparing the batch (again on every
  // call, until the next start_epoch()).
  // Throws std::logic_error if no epoch has been started.
  bool next(Batch& out);

  // The order in which a shuffling loader visits `count` examples in `epoch`.
  static std::vector<int64_t> shuffled_order(int64_t count, uint64_t seed, uint64_t epoch);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace anvil::data
