// The collectives' test scenarios, written once for every backend: each one
// runs on one rank's Communicator and returns what it got next to what it
// should have got (computed independently on the host, in double, from the
// data every rank generates). The MPI tests run a scenario on each process
// (test_collectives_mpi.cpp), the NCCL tests on one thread per GPU
// (test_collectives_nccl.cpp); either checks the outcomes with Catch2 on its
// main thread, since Catch2's assertions are not thread-safe.
#pragma once
#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "parallel/communicator.h"

namespace parallel_test {

using anvil::DType;
using anvil::Shape;
using anvil::Tensor;
using anvil::parallel::Algorithm;
using anvil::parallel::Communicator;
using anvil::parallel::ReduceOp;

// One comparison: `got` against `want`, element by element, within `tol`
// (0: bitwise equal as the stored type), or, when `bound` is given, within
// bound[i] of want[i] (an error bound derived element by element).
struct Outcome {
  std::string what;
  std::vector<double> got, want;
  double tol = 0;
  std::vector<double> bound = {};
};
using Outcomes = std::vector<Outcome>;
using Scenario = std::function<Outcomes(Communicator&)>;

// Sizes every collective is tried with: empty, one element, odd, not
// divisible by any rank count up to 5, and several MiB (where the build is
// fast enough: not under the sanitizers, where the simulator's kernels run
// 10x slower; the release and simulator builds cover it).
inline std::vector<int64_t> sizes() {
  std::vector<int64_t> s = {0, 1, 7, 1001};
#if !defined(__SANITIZE_THREAD__) && !defined(__SANITIZE_ADDRESS__)
  s.push_back((int64_t(3) << 20) / 4 + 13);  // 3 MiB of float32 and 13 elements
#endif
  return s;
}

// Index-addressable pseudo-random numbers: any rank can make any rank's data.
inline uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
// Small integers: their sums are exact in float32 in any order.
inline float exact_value(int rank, int64_t i) {
  return float(int64_t(mix(uint64_t(rank) << 40 ^ uint64_t(i)) % 17) - 8);
}
inline float random_value(int rank, int64_t i, uint64_t seed) {
  return float(double(mix(seed ^ uint64_t(rank) << 44 ^ uint64_t(i)) >> 11) * 0x1.0p-53 * 2.0 -
               1.0);
}
inline int64_t int_value(int rank, int64_t i) {
  return int64_t(mix(uint64_t(rank) << 40 ^ uint64_t(i) ^ 0x55) % (uint64_t(1) << 58)) -
         (int64_t(1) << 57);
}

inline std::vector<float> make(int rank, int64_t n, bool exact, uint64_t seed = 1) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    v[size_t(i)] = exact ? exact_value(rank, i) : random_value(rank, i, seed);
  return v;
}

inline Tensor on(const Communicator& c, const std::vector<float>& v, Shape shape = {}) {
  if (shape.empty()) shape = {int64_t(v.size())};
  return Tensor::from_vector(v, shape, c.device());
}

inline std::vector<double> host(Communicator& c, const Tensor& t) {
  c.synchronize();  // within the deadline, before a blocking copy
  std::vector<double> out;
  if (t.dtype() == DType::Int64) {
    for (int64_t x : t.to_int_vector()) out.push_back(double(x));
  } else {
    for (float x : t.to_vector()) out.push_back(x);
  }
  return out;
}

// Root's vectors on every rank, bit for bit (their bytes, broadcast as text).
inline std::vector<std::vector<double>> broadcast_vectors(Communicator& c,
                                                          const std::vector<std::vector<double>>& v,
                                                          int root) {
  std::string text;
  if (c.rank() == root) {
    for (const std::vector<double>& x : v) {
      const uint64_t n = x.size();
      text.append(reinterpret_cast<const char*>(&n), sizeof n);
      text.append(reinterpret_cast<const char*>(x.data()), n * sizeof(double));
    }
  }
  text = anvil::parallel::broadcast_text(c, text, root);
  std::vector<std::vector<double>> out;
  for (size_t at = 0; at < text.size();) {
    uint64_t n = 0;
    std::memcpy(&n, text.data() + at, sizeof n);
    at += sizeof n;
    std::vector<double>& x = out.emplace_back(n);
    std::memcpy(x.data(), text.data() + at, n * sizeof(double));
    at += n * sizeof(double);
  }
  return out;
}

// ---- the scenarios ----

// Every algorithm, every size: integer-valued floats (exact whatever the
// order of the sums), random floats against a double-precision sum, the
// average, int64 sums (values near 2^57, so 32 bits would not do), and the
// ring with tiny chunks (a long pipeline) and with none (the textbook ring).
inline Outcomes allreduce_scenario(Communicator& c) {
  Outcomes out;
  const int n = c.size();
  const size_t chunk = c.options().chunk_bytes;
  for (Algorithm algo : {Algorithm::kRing, Algorithm::kNaive, Algorithm::kNative}) {
    for (int64_t count : sizes()) {
      const std::string tag = fmt::format("{} of {} on {} ranks", anvil::parallel::algorithm_name(algo),
                                          count, n);
      {
        Tensor t = on(c, make(c.rank(), count, true));
        c.allreduce(t, ReduceOp::kSum, algo);
        std::vector<double> want(size_t(count), 0.0);
        for (int r = 0; r < n; ++r)
          for (int64_t i = 0; i < count; ++i) want[size_t(i)] += exact_value(r, i);
        out.push_back({"exact sum, " + tag, host(c, t), want, 0});
      }
      {
        Tensor t = on(c, make(c.rank(), count, false));
        c.allreduce(t, ReduceOp::kAverage, algo);
        std::vector<double> want(size_t(count), 0.0);
        for (int r = 0; r < n; ++r)
          for (int64_t i = 0; i < count; ++i) want[size_t(i)] += random_value(r, i, 1) / n;
        out.push_back({"random average, " + tag, host(c, t), want, 1e-6});
      }
      if (count <= 1001) {
        std::vector<int64_t> mine(static_cast<size_t>(count));
        std::vector<double> want(size_t(count), 0.0);
        for (int64_t i = 0; i < count; ++i) mine[size_t(i)] = int_value(c.rank(), i);
        Tensor t = Tensor::from_vector(mine, {count}, c.device());
        c.allreduce(t, ReduceOp::kSum, algo);
        std::vector<int64_t> got = (c.synchronize(), t.to_int_vector());
        std::vector<double> got_exact, want_exact;
        for (int64_t i = 0; i < count; ++i) {
          int64_t sum = 0;
          for (int r = 0; r < n; ++r) sum += int_value(r, i);
          // Compared through the low and high 32 bits: doubles hold them exactly.
          got_exact.push_back(double(uint32_t(got[size_t(i)])));
          got_exact.push_back(double(got[size_t(i)] >> 32));
          want_exact.push_back(double(uint32_t(sum)));
          want_exact.push_back(double(sum >> 32));
        }
        out.push_back({"int64 sum, " + tag, got_exact, want_exact, 0});
      }
    }
  }
  for (size_t bytes : {size_t(64), size_t(0)}) {
    c.set_chunk_bytes(bytes);
    const int64_t count = 4099;
    Tensor t = on(c, make(c.rank(), count, true));
    c.allreduce(t, ReduceOp::kSum, Algorithm::kRing);
    std::vector<double> want(size_t(count), 0.0);
    for (int r = 0; r < n; ++r)
      for (int64_t i = 0; i < count; ++i) want[size_t(i)] += exact_value(r, i);
    out.push_back({fmt::format("ring with {}-byte chunks on {} ranks", bytes, n), host(c, t),
                   want, 0});
  }
  c.set_chunk_bytes(chunk);
  return out;
}

// The ring's result is the same bits on every rank and from run to run: two
// runs over the same random data, then every rank's result gathered.
inline Outcomes ring_determinism_scenario(Communicator& c) {
  const int64_t count = 10007;
  Tensor a = on(c, make(c.rank(), count, false, 7));
  Tensor b = on(c, make(c.rank(), count, false, 7));
  c.allreduce(a, ReduceOp::kSum, Algorithm::kRing);
  c.allreduce(b, ReduceOp::kSum, Algorithm::kRing);
  Tensor everyone = c.all_gather(a.reshape({1, count}));
  const std::vector<double> mine = host(c, a);
  Outcomes out{{"ring: run 1 == run 2", mine, host(c, b), 0}};
  const std::vector<double> all = host(c, everyone);
  for (int r = 0; r < c.size(); ++r)
    out.push_back({fmt::format("ring: rank {} == rank {}", c.rank(), r), mine,
                   std::vector<double>(all.begin() + r * count, all.begin() + (r + 1) * count),
                   0});
  return out;
}

inline Outcomes broadcast_scenario(Communicator& c) {
  Outcomes out;
  const size_t chunk = c.options().chunk_bytes;
  for (size_t bytes : {chunk, size_t(128)}) {
    c.set_chunk_bytes(bytes);
    for (int root = 0; root < c.size(); ++root) {
      for (int64_t count : sizes()) {
        if (bytes == 128 && count > 1001) continue;
        Tensor t = on(c, make(c.rank(), count, false, 3));
        c.broadcast(t, root);
        const std::vector<float> want = make(root, count, false, 3);
        out.push_back({fmt::format("broadcast of {} from rank {} in {}-byte chunks", count, root,
                                   bytes),
                       host(c, t), std::vector<double>(want.begin(), want.end()), 0});
      }
    }
  }
  c.set_chunk_bytes(chunk);
  return out;
}

// Rows split as torch.tensor_split: the first rows % n ranks get one more.
inline int64_t first_row(int64_t rows, int n, int r) {
  int64_t first = 0;
  for (int j = 0; j < r; ++j) first += rows / n + (j < rows % n ? 1 : 0);
  return first;
}

inline Outcomes scatter_scenario(Communicator& c) {
  Outcomes out;
  const int n = c.size();
  for (int root = 0; root < n; ++root) {
    for (int64_t rows : {int64_t(0), int64_t(1), int64_t(n - 1), int64_t(2 * n + 1), int64_t(255)}) {
      const int64_t cols = 3;
      const std::vector<float> all = make(root, rows * cols, true);
      Tensor input = c.rank() == root ? on(c, all, {rows, cols}) : Tensor();
      Tensor part = c.scatter(input, root);
      const int64_t first = first_row(rows, n, c.rank());
      const int64_t mine = first_row(rows, n, c.rank() + 1) - first;
      std::vector<double> want(all.begin() + first * cols, all.begin() + (first + mine) * cols);
      const bool shape_ok = part.shape() == Shape{mine, cols};
      out.push_back({fmt::format("scatter of {} rows from rank {}: shape", rows, root),
                     {double(shape_ok)}, {1.0}, 0});
      out.push_back({fmt::format("scatter of {} rows from rank {}", rows, root), host(c, part),
                     want, 0});
    }
  }
  return out;
}

// Row counts below, at and above the rank count; the last also cut in
// 1 KiB chunks, so that each step of the ring moves several.
inline Outcomes reduce_scatter_scenario(Communicator& c) {
  Outcomes out;
  const int n = c.size();
  const size_t chunk = c.options().chunk_bytes;
  const std::vector<std::pair<int64_t, size_t>> cases = {
      {1, chunk}, {n, chunk}, {3 * n + 2, chunk}, {1000, chunk}, {1000, 1024}};
  for (const auto& [rows, bytes] : cases) {
    c.set_chunk_bytes(bytes);
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAverage}) {
      const int64_t cols = 5;
      Tensor input = on(c, make(c.rank(), rows * cols, true), {rows, cols});
      Tensor part = c.reduce_scatter(input, op);
      const int64_t first = first_row(rows, n, c.rank());
      const int64_t mine = first_row(rows, n, c.rank() + 1) - first;
      std::vector<double> want(size_t(mine * cols), 0.0);
      for (int r = 0; r < n; ++r)
        for (int64_t i = 0; i < mine * cols; ++i)
          want[size_t(i)] += exact_value(r, first * cols + i);
      if (op == ReduceOp::kAverage)
        for (double& w : want) w /= n;
      out.push_back({fmt::format("reduce_scatter ({}) of {} rows in {}-byte chunks",
                                 op == ReduceOp::kSum ? "sum" : "average", rows, bytes),
                     host(c, part), want, op == ReduceOp::kSum ? 0 : 1e-6});
      // Its own storage, of its own size: not a view into a larger buffer.
      const bool own = part.impl()->offset == 0 &&
                       (mine == 0 || part.impl()->storage->bytes() == part.nbytes());
      out.push_back({fmt::format("reduce_scatter of {} rows returns {} rows in storage of their "
                                 "own size (storage of {} bytes)",
                                 rows, mine, part.impl()->storage->bytes()),
                     {double(own), double(part.shape() == Shape{mine, cols})}, {1.0, 1.0}, 0});
      out.push_back({fmt::format("reduce_scatter of {} rows leaves its input alone", rows),
                     host(c, input),
                     [&] {
                       const std::vector<float> v = make(c.rank(), rows * cols, true);
                       return std::vector<double>(v.begin(), v.end());
                     }(),
                     0});
    }
  }
  c.set_chunk_bytes(chunk);
  return out;
}

// Shards of different lengths (rank r has r+1 rows, or none at all).
inline Outcomes all_gather_scenario(Communicator& c) {
  Outcomes out;
  const int n = c.size();
  for (bool with_empty : {false, true}) {
    auto rows_of = [&](int r) { return with_empty && r == n - 1 ? int64_t(0) : int64_t(r + 1); };
    const int64_t cols = 4;
    Tensor shard = on(c, make(c.rank(), rows_of(c.rank()) * cols, false, 5),
                      {rows_of(c.rank()), cols});
    Tensor all = c.all_gather(shard);
    std::vector<double> want;
    for (int r = 0; r < n; ++r)
      for (float v : make(r, rows_of(r) * cols, false, 5)) want.push_back(v);
    out.push_back({fmt::format("all_gather{}", with_empty ? " with an empty shard" : ""),
                   host(c, all), want, 0});
  }
  return out;
}

// Point to point round the ring, then a barrier.
inline Outcomes sendrecv_scenario(Communicator& c) {
  const int n = c.size(), r = c.rank();
  const int64_t count = 777;
  Tensor mine = on(c, make(r, count, false, 9));
  Tensor from_left = on(c, std::vector<float>(size_t(count), 0.0f));
  c.sendrecv(mine, (r + 1) % n, from_left, (r + n - 1) % n);
  c.barrier();
  const std::vector<float> want = make((r + n - 1) % n, count, false, 9);
  return {{"sendrecv round the ring", host(c, from_left),
           std::vector<double>(want.begin(), want.end()), 0}};
}

// Several all-reduces in flight at once (as gradient buckets are during
// backward), a synchronous call behind them, then the waits.
inline Outcomes async_scenario(Communicator& c) {
  const int n = c.size();
  const std::vector<int64_t> counts = {5, 3000, 1, 777};
  std::vector<Tensor> tensors;
  std::vector<std::shared_ptr<anvil::parallel::Work>> works;
  for (size_t k = 0; k < counts.size(); ++k) {
    tensors.push_back(on(c, make(c.rank() + int(k), counts[k], true)));
    works.push_back(c.allreduce_async(tensors.back(), ReduceOp::kSum,
                                      k % 2 ? Algorithm::kNaive : Algorithm::kRing));
  }
  Tensor last = on(c, make(c.rank(), 10, true));
  c.allreduce(last);
  for (auto& w : works) w->wait();
  Outcomes out;
  for (size_t k = 0; k < counts.size(); ++k) {
    std::vector<double> want(static_cast<size_t>(counts[k]), 0.0);
    for (int r = 0; r < n; ++r)
      for (int64_t i = 0; i < counts[k]; ++i) want[size_t(i)] += exact_value(r + int(k), i);
    out.push_back({fmt::format("async all-reduce {} of {}", k, counts[k]), host(c, tensors[k]),
                   want, 0});
  }
  std::vector<double> want(10, 0.0);
  for (int r = 0; r < n; ++r)
    for (int64_t i = 0; i < 10; ++i) want[size_t(i)] += exact_value(r, i);
  out.push_back({"a synchronous all-reduce behind them", host(c, last), want, 0});
  return out;
}

// int64 values as doubles that hold them exactly: the low and high 32 bits.
inline std::vector<double> exact_int64(const std::vector<int64_t>& v) {
  std::vector<double> out;
  for (int64_t x : v) {
    out.push_back(double(uint32_t(x)));
    out.push_back(double(x >> 32));
  }
  return out;
}

// The backend's own broadcast, all-gather and reduce-scatter
// (Algorithm::kNative) against anvil's ring on the same data: the same bits
// for broadcast and all-gather (bytes are moved, nothing computed), the same
// sums of small integers and int64 for reduce-scatter, its average within
// float rounding. Ragged sizes: every count for broadcast, shards of
// different lengths (one of them empty) for all-gather; the native
// reduce-scatter gives every rank the same count, so rows that do not
// divide by the rank count are refused before anything moves (and the
// communicator goes on), as is a naive broadcast, all-gather or reduce-scatter.
inline Outcomes native_scenario(Communicator& c) {
  Outcomes out;
  const int n = c.size();
  const Algorithm native = Algorithm::kNative;
  for (int root : {0, n - 1}) {
    for (int64_t count : sizes()) {
      Tensor ring = on(c, make(c.rank(), count, false, 11));
      Tensor own = on(c, make(c.rank(), count, false, 11));
      c.broadcast(ring, root);
      c.broadcast(own, root, native);
      out.push_back({fmt::format("native broadcast of {} from rank {} == ring", count, root),
                     host(c, own), host(c, ring), 0});
    }
  }
  struct Shards {
    const char* what;
    std::function<int64_t(int)> rows;
  };
  const std::vector<Shards> shards = {
      {"equal shards", [](int) { return int64_t(3); }},
      {"equal shards of 2000 rows", [](int) { return int64_t(2000); }},
      {"shards of r+1 rows", [](int r) { return int64_t(r + 1); }},
      {"shards with an empty one", [n](int r) { return r == n - 1 ? int64_t(0) : int64_t(r + 1); }},
      {"empty shards", [](int) { return int64_t(0); }}};
  for (const Shards& sh : shards) {
    const int64_t cols = 5, rows = sh.rows(c.rank());
    Tensor shard = on(c, make(c.rank(), rows * cols, false, 13), {rows, cols});
    Tensor ring = c.all_gather(shard);
    Tensor own = c.all_gather(shard, native);
    out.push_back({fmt::format("native all_gather of {} == ring", sh.what), host(c, own),
                   host(c, ring), 0});
    out.push_back({fmt::format("native all_gather of {}: shape", sh.what),
                   {double(own.shape() == ring.shape())}, {1.0}, 0});
  }
  for (int64_t rows : {int64_t(n), int64_t(3 * n), int64_t(200 * n)}) {
    const int64_t cols = 5;
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAverage}) {
      Tensor input = on(c, make(c.rank(), rows * cols, true), {rows, cols});
      Tensor ring = c.reduce_scatter(input, op);
      Tensor own = c.reduce_scatter(input, op, native);
      const char* name = op == ReduceOp::kSum ? "sum" : "average";
      out.push_back({fmt::format("native reduce_scatter ({}) of {} rows == ring", name, rows),
                     host(c, own), host(c, ring), op == ReduceOp::kSum ? 0 : 1e-6});
      out.push_back({fmt::format("native reduce_scatter ({}) of {} rows: shape", name, rows),
                     {double(own.shape() == ring.shape())}, {1.0}, 0});
    }
    std::vector<int64_t> mine(static_cast<size_t>(rows * cols));
    for (int64_t i = 0; i < rows * cols; ++i) mine[size_t(i)] = int_value(c.rank(), i);
    Tensor input = Tensor::from_vector(mine, {rows, cols}, c.device());
    Tensor ring = c.reduce_scatter(input);
    Tensor own = c.reduce_scatter(input, ReduceOp::kSum, native);
    c.synchronize();
    out.push_back({fmt::format("native reduce_scatter of {} int64 rows == ring", rows),
                   exact_int64(own.to_int_vector()), exact_int64(ring.to_int_vector()), 0});
  }
  // Refused on the caller's thread, on every rank alike: nothing moved.
  auto refusal = [&](const std::function<void()>& call) {
    try {
      call();
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("(accepted)");
  };
  if (n > 1) {
    const std::string uneven = refusal([&] {
      c.reduce_scatter(on(c, make(c.rank(), (n + 1) * 2, true), {n + 1, 2}), ReduceOp::kSum,
                       native);
    });
    out.push_back({"native reduce_scatter of rows that do not divide is refused: " + uneven,
                   {double(uneven.find(fmt::format("reduce_scatter (native): {} rows do not "
                                                   "split evenly over {} ranks",
                                                   n + 1, n)) != std::string::npos)},
                   {1.0},
                   0});
  }
  const Tensor t = on(c, make(c.rank(), 4, true), {2, 2});
  for (const auto& [what, call] : std::vector<std::pair<std::string, std::function<void()>>>{
           {"broadcast", [&] { c.broadcast(t, 0, Algorithm::kNaive); }},
           {"all_gather", [&] { c.all_gather(t, Algorithm::kNaive); }},
           {"reduce_scatter", [&] { c.reduce_scatter(t, ReduceOp::kSum, Algorithm::kNaive); }}}) {
    const std::string error = refusal(call);
    out.push_back({"a naive " + what + " is refused: " + error,
                   {double(error.find("there is no naive " + what) != std::string::npos)},
                   {1.0},
                   0});
  }
  // Still usable after the refusals.
  Tensor after = on(c, make(c.rank(), 7, true));
  c.broadcast(after, 0, native);
  const std::vector<float> want = make(0, 7, true);
  out.push_back({"a native broadcast after the refusals", host(c, after),
                 std::vector<double>(want.begin(), want.end()), 0});
  return out;
}

inline std::vector<std::pair<std::string, Scenario>> all_scenarios() {
  return {{"allreduce", allreduce_scenario},       {"ring determinism", ring_determinism_scenario},
          {"broadcast", broadcast_scenario},       {"scatter", scatter_scenario},
          {"reduce_scatter", reduce_scatter_scenario}, {"all_gather", all_gather_scenario},
          {"sendrecv", sendrecv_scenario},         {"async", async_scenario}};
}

// The first element where got and want differ by more than the tolerance
// (as float32, for tol 0), or -1.
inline int64_t first_mismatch(const Outcome& o) {
  if (o.got.size() != o.want.size()) return 0;
  if (!o.bound.empty() && o.bound.size() != o.got.size()) return 0;
  for (size_t i = 0; i < o.got.size(); ++i) {
    const bool ok = !o.bound.empty() ? std::fabs(o.got[i] - o.want[i]) <= o.bound[i]
                    : o.tol == 0 ? o.got[i] == o.want[i]
                               : std::fabs(o.got[i] - o.want[i]) <= o.tol * (1 + std::fabs(o.want[i]));
    if (!ok) return int64_t(i);
  }
  return -1;
}

// Catch2 checks of one rank's outcomes (on the test's main thread).
inline void require_outcomes(const Outcomes& outcomes, int rank) {
  for (const Outcome& o : outcomes) {
    INFO("rank " << rank << ": " << o.what);
    REQUIRE(o.got.size() == o.want.size());
    const int64_t bad = first_mismatch(o);
    const std::string where =
        bad < 0 ? std::string()
                : fmt::format("element {}: got {}, want {}{}", bad, o.got[size_t(bad)],
                              o.want[size_t(bad)],
                              size_t(bad) < o.bound.size()
                                  ? fmt::format(" (error {:.3g}, bound {:.3g})",
                                                std::fabs(o.got[size_t(bad)] - o.want[size_t(bad)]),
                                                o.bound[size_t(bad)])
                                  : std::string());
    INFO(where);
    REQUIRE(bad == -1);
  }
}

}  // namespace parallel_test
