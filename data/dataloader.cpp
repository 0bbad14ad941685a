#include "data/dataloader.h"

#include <algorithm>
#include <array>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>

#include "data/shard.h"

namespace anvil::data {

namespace {

// Batches prepared ahead of the caller.
constexpr int kPrefetchDepth = 2;

constexpr std::array<float, 256> make_scale_table() {
  std::array<float, 256> t{};
  for (int i = 0; i < 256; ++i) t[i] = static_cast<float>(i) / 255.0f;
  return t;
}
constexpr std::array<float, 256> kPixelScale = make_scale_table();

uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t epoch_seed(uint64_t seed, uint64_t epoch) {
  uint64_t s = seed;
  uint64_t a = splitmix64(s);
  uint64_t t = a ^ epoch;
  splitmix64(t);
  return splitmix64(t);
}

// Uniform in [0, n), n >= 1, without modulo bias; fully specified, unlike
// std::uniform_int_distribution.
uint64_t uniform_below(std::mt19937_64& rng, uint64_t n) {
  const uint64_t threshold = (0 - n) % n;  // 2^64 mod n
  for (;;) {
    const uint64_t r = rng();
    if (r >= threshold) return r % n;
  }
}

// Writes the visiting order into `order` (reusing its capacity).
void make_order(std::vector<int64_t>& order, int64_t count, bool shuffle, uint64_t seed, uint64_t epoch) {
  order.resize(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) order[i] = i;
  if (!shuffle) return;
  std::mt19937_64 rng(epoch_seed(seed, epoch));
  for (int64_t i = count - 1; i > 0; --i) {
    const auto j = static_cast<int64_t>(uniform_below(rng, static_cast<uint64_t>(i) + 1));
    std::swap(order[i], order[j]);
  }
}

void validate(const ImageSet* set, int64_t batch_size) {
  if (!set) throw std::invalid_argument("DataLoader: null ImageSet");
  if (batch_size < 1)
    throw std::invalid_argument("DataLoader: batch_size must be >= 1, got " + std::to_string(batch_size));
  if (set->count < 0 || set->rows < 0 || set->cols < 0 ||
      (set->count > 0 && (set->rows == 0 || set->cols == 0)))
    throw std::invalid_argument("DataLoader: ImageSet has invalid shape");
  if (set->pixels.size() != static_cast<size_t>(set->count * set->rows * set->cols) ||
      set->labels.size() != static_cast<size_t>(set->count))
    throw std::invalid_argument("DataLoader: ImageSet pixels/labels sizes do not match count x rows x cols");
}

}  // namespace

struct DataLoader::Impl {
  Impl(std::shared_ptr<const ImageSet> s, int64_t bs, bool shuf, bool drop, uint64_t sd, BatchTransform tf)
      : set(std::move(s)), batch_size(bs), shuffle(shuf), seed(sd), transform(std::move(tf)) {
    validate(set.get(), batch_size);
    num_batches = drop ? set->count / batch_size : (set->count + batch_size - 1) / batch_size;
    worker = std::thread([this] { run(); });
  }

  ~Impl() {
    {
      std::lock_guard<std::mutex> lk(mu);
      stop = true;
    }
    worker_cv.notify_all();
    worker.join();
  }

  void run() {
    std::unique_lock<std::mutex> lk(mu);
    for (;;) {
      worker_cv.wait(lk, [&] {
        return stop || (active && !error && produced < num_batches && produced - consumed < kPrefetchDepth);
      });
      if (stop) return;
      const int64_t b = produced;
      Batch& slot = slots[b % kPrefetchDepth];
      busy = true;
      lk.unlock();
      // The consumer touches only slots below `produced`, and start_epoch()
      // waits for !busy before changing `order`: no lock needed here.
      std::exception_ptr err;
      try {
        fill(slot, b);
        if (transform) transform(slot);
      } catch (...) {
        err = std::current_exception();
      }
      lk.lock();
      busy = false;
      if (err)
        error = err;
      else
        ++produced;
      consumer_cv.notify_all();
    }
  }

  void fill(Batch& out, int64_t b) const {
    const ImageSet& s = *set;
    const int64_t global_begin = b * batch_size;
    const int64_t global_n = std::min(batch_size, s.count - global_begin);
    // This rank's part: torch.tensor_split's split of the global batch.
    const int64_t part_begin = shard_first_row(global_n, shards, shard_rank);
    const int64_t n = shard_rows(global_n, shards, shard_rank);
    const int64_t begin = global_begin + part_begin;
    const int64_t pix = s.rows * s.cols;
    out.size = n;
    out.global_size = global_n;
    out.offset = part_begin;
    out.channels = 1;
    out.rows = s.rows;
    out.cols = s.cols;
    out.epoch = epoch;
    out.index = b;
    out.images.resize(static_cast<size_t>(n * pix));
    out.labels.resize(static_cast<size_t>(n));
    out.indices.resize(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      const int64_t idx = order[begin + i];
      out.indices[i] = idx;
      out.labels[i] = s.labels[idx];
      const uint8_t* src = s.pixels.data() + idx * pix;
      float* dst = out.images.data() + i * pix;
      for (int64_t k = 0; k < pix; ++k) dst[k] = kPixelScale[src[k]];
    }
  }

  void start_epoch(uint64_t e) {
    std::unique_lock<std::mutex> lk(mu);
    active = false;
    consumer_cv.wait(lk, [&] { return !busy; });
    make_order(order, set->count, shuffle, seed, e);
    epoch = e;
    next_epoch = e + 1;
    produced = consumed = 0;
    error = nullptr;
    started = active = true;
    lk.unlock();
    worker_cv.notify_all();
  }

  bool next(Batch& out) {
    std::unique_lock<std::mutex> lk(mu);
    if (!started) throw std::logic_error("DataLoader::next() called before start_epoch()");
    if (consumed >= num_batches) return false;
    consumer_cv.wait(lk, [&] { return produced > consumed || error; });
    if (produced > consumed) {
      std::swap(out, slots[consumed % kPrefetchDepth]);
      ++consumed;
      lk.unlock();
      worker_cv.notify_all();
      return true;
    }
    std::rethrow_exception(error);
  }

  // Fixed at construction.
  const std::shared_ptr<const ImageSet> set;
  const int64_t batch_size;
  const bool shuffle;
  const uint64_t seed;
  const BatchTransform transform;
  int64_t num_batches = 0;
  int shard_rank = 0, shards = 1;  // set before the first epoch (set_shard)

  // Guarded by mu (slots[i] belongs to the worker while it fills it).
  std::mutex mu;
  std::condition_variable worker_cv, consumer_cv;
  std::array<Batch, kPrefetchDepth> slots;
  std::vector<int64_t> order;
  uint64_t epoch = 0, next_epoch = 0;
  int64_t produced = 0, consumed = 0;
  bool started = false, active = false, busy = false, stop = false;
  std::exception_ptr error;

  std::thread worker;  // last: starts after everything above is constructed
};

DataLoader::DataLoader(std::shared_ptr<const ImageSet> set, int64_t batch_size, bool shuffle, bool drop_last,
                       uint64_t seed, BatchTransform transform)
    : impl_(std::make_unique<Impl>(std::move(set), batch_size, shuffle, drop_last, seed, std::move(transform))) {}

DataLoader::DataLoader(const ImageSet& set, int64_t batch_size, bool shuffle, bool drop_last, uint64_t seed,
                       BatchTransform transform)
    : DataLoader(std::shared_ptr<const ImageSet>(&set, [](const ImageSet*) {}), batch_size, shuffle, drop_last,
                 seed, std::move(transform)) {}

DataLoader::~DataLoader() = default;
DataLoader::DataLoader(DataLoader&&) noexcept = default;
DataLoader& DataLoader::operator=(DataLoader&&) noexcept = default;

namespace {
template <typename T>
T& checked(const std::unique_ptr<T>& p) {
  if (!p) throw std::logic_error("DataLoader: use of a moved-from loader");
  return *p;
}
}  // namespace

int64_t DataLoader::num_batches() const { return checked(impl_).num_batches; }
int64_t DataLoader::batch_size() const { return checked(impl_).batch_size; }
int64_t DataLoader::num_examples() const { return checked(impl_).set->count; }

void DataLoader::start_epoch() {
  Impl& im = checked(impl_);
  uint64_t e;
  {
    std::lock_guard<std::mutex> lk(im.mu);
    e = im.next_epoch;
  }
  im.start_epoch(e);
}

void DataLoader::start_epoch(uint64_t epoch) { checked(impl_).start_epoch(epoch); }

uint64_t DataLoader::epoch() const {
  Impl& im = checked(impl_);
  std::lock_guard<std::mutex> lk(im.mu);
  return im.epoch;
}

bool DataLoader::next(Batch& out) { return checked(impl_).next(out); }

void DataLoader::set_shard(int rank, int ranks) {
  Impl& im = checked(impl_);
  if (ranks < 1 || rank < 0 || rank >= ranks)
    throw std::invalid_argument("DataLoader::set_shard: rank " + std::to_string(rank) + " of " +
                                std::to_string(ranks) + " ranks");
  std::unique_lock<std::mutex> lk(im.mu);
  if (im.started)
    throw std::logic_error("DataLoader::set_shard: call it before the first epoch starts");
  im.shard_rank = rank;
  im.shards = ranks;
}

int DataLoader::shard_rank() const { return checked(impl_).shard_rank; }
int DataLoader::shard_count() const { return checked(impl_).shards; }

std::vector<int64_t> DataLoader::shuffled_order(int64_t count, uint64_t seed, uint64_t epoch) {
  if (count < 0) throw std::invalid_argument("DataLoader::shuffled_order: negative count");
  std::vector<int64_t> order;
  make_order(order, count, true, seed, epoch);
  return order;
}

}  // namespace anvil::data
