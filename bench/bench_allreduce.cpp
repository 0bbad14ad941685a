// bench_allreduce: all-reduce bandwidth in the form of nccl-tests'
// all_reduce_perf, for anvil's ring, the seeds' naive all-reduce and the
// backend's own (MPI_Allreduce or ncclAllReduce), measured in one run; with
// --ops, also broadcast, all-gather and reduce-scatter (ring against the
// backend's MPI_Bcast / ncclBroadcast, MPI_Allgather / ncclAllGather,
// MPI_Reduce_scatter_block / ncclReduceScatter), one table each.
//
//   mpirun -np 4 --oversubscribe bench_allreduce            # MPI: one CPU rank per process
//   bench_allreduce --backend nccl --gpus 2                 # NCCL: one thread per GPU
//   bench_allreduce --min-bytes 1M --max-bytes 64M --json allreduce.json
//   bench_allreduce --ops allreduce,broadcast,allgather,reducescatter
//
// For each size (from --min-bytes to --max-bytes, doubling) it first checks
// every algorithm once on integer-valued data whose result is exact (the
// #wrong column counts elements that differ from the host's reference), then
// times them: --repeats rounds, each round every algorithm in turn for the
// same number of iterations (chosen from a trial so a round takes ~0.1 s),
// so the algorithms are measured close together on a machine whose load
// changes. A round's time is the slowest rank's; the figure is the median round.
//
// The figures are nccl-tests': algbw = size / time; busbw = algbw * factor,
// the bandwidth each rank's link must carry, which makes runs on different
// rank counts comparable, and which for a good algorithm tends to the link
// bandwidth: 2(n-1)/n for all-reduce, (n-1)/n for all-gather and
// reduce-scatter (whose size is the gathered tensor, and the input), 1 for
// broadcast. The last column is ring busbw / native busbw.
// --dtype float32,bf16 measures each collective in each dtype, one table
// each: sizes are bytes as in nccl-tests (a bfloat16 row holds twice the
// elements of the float32 row of the same size), so busbw compares what the
// links carry; the same gradient (element count) in bfloat16 is the
// float32 row of twice the size. bfloat16 sums are added in float32
// (Communicator::allreduce).
// --unchecked adds each algorithm without the per-call check of every
// rank's call ("ring/unchecked", ...): the check's cost, side by side.
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <fstream>
#include <iostream>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "core/device.h"
#include "core/tensor.h"
#include "parallel/communicator.h"

namespace par = anvil::parallel;
using anvil::DType;
using anvil::Tensor;
using Clock = std::chrono::steady_clock;

namespace {

struct Options {
  std::string backend = "auto";
  int gpus = 0;
  std::string min_bytes = "4K", max_bytes = "64M";
  std::vector<std::string> algorithms = {"ring", "naive", "native"};
  std::vector<std::string> ops = {"allreduce"};
  std::vector<std::string> dtypes = {"float32"};
  int repeats = 5;
  double round_seconds = 0.1;
  size_t chunk_bytes = size_t(1) << 20;
  bool unchecked = false;  // each algorithm also without the per-call check
  std::string json;
};

size_t parse_bytes(const std::string& text, const char* flag) {
  size_t pos = 0;
  double v = 0;
  try {
    v = std::stod(text, &pos);
  } catch (const std::exception&) {
    throw std::invalid_argument(fmt::format("{} '{}': expected a size such as 4K or 64M", flag, text));
  }
  const std::string unit = text.substr(pos);
  const double scale = unit.empty() || unit == "B" ? 1
                       : unit == "K"               ? 1024.0
                       : unit == "M"               ? 1048576.0
                       : unit == "G"               ? 1073741824.0
                                                   : -1;
  if (scale < 0 || v * scale < 4)
    throw std::invalid_argument(fmt::format("{} '{}': expected a size of at least 4 bytes such "
                                            "as 4K or 64M", flag, text));
  return size_t(v * scale);
}

std::string human(size_t bytes) {
  if (bytes >= (size_t(1) << 20)) return fmt::format("{} MiB", bytes >> 20);
  if (bytes >= 1024) return fmt::format("{} KiB", bytes >> 10);
  return fmt::format("{} B", bytes);
}

DType parse_dtype(const std::string& name) {
  if (name == "float32") return DType::Float32;
  if (name == "bf16") return DType::BFloat16;
  throw std::invalid_argument(fmt::format("--dtype '{}': expected float32 or bf16", name));
}

// The collectives measured, with nccl-tests' bus-bandwidth factor for n
// ranks: what each rank's link carries relative to the message size.
enum class Op { kAllReduce, kBroadcast, kAllGather, kReduceScatter };
const char* op_name(Op op) {
  switch (op) {
    case Op::kAllReduce: return "allreduce";
    case Op::kBroadcast: return "broadcast";
    case Op::kAllGather: return "allgather";
    case Op::kReduceScatter: return "reducescatter";
  }
  return "?";
}
Op parse_op(const std::string& name) {
  for (Op op : {Op::kAllReduce, Op::kBroadcast, Op::kAllGather, Op::kReduceScatter})
    if (name == op_name(op)) return op;
  throw std::invalid_argument(fmt::format(
      "--ops '{}': expected allreduce, broadcast, allgather or reducescatter", name));
}
double bus_factor(Op op, int n) {
  switch (op) {
    case Op::kAllReduce: return 2.0 * (n - 1) / n;
    case Op::kBroadcast: return 1.0;
    default: return double(n - 1) / n;  // all-gather, reduce-scatter
  }
}
// What the buffer of `bytes` is: the all-reduce's and broadcast's tensor, the
// all-gather's output, the reduce-scatter's input (nccl-tests' size), so
// its element count divides by the rank count for the last two.
int64_t count_of(Op op, size_t bytes, int n, DType dtype) {
  const int64_t count = int64_t(bytes / anvil::dtype_size(dtype));
  if (op == Op::kAllGather || op == Op::kReduceScatter) return std::max<int64_t>(n, count / n * n);
  return count;
}

struct Row {
  Op op = Op::kAllReduce;
  DType dtype = DType::Float32;
  size_t bytes = 0;
  int64_t count = 0;
  std::string algorithm;
  double seconds = 0;  // per call, slowest rank, median round
  int64_t wrong = 0;
};

// The slowest rank's value (each rank passes its own).
double slowest(par::Communicator& c, double mine) {
  Tensor t = Tensor::from_vector(std::vector<int64_t>{int64_t(mine * 1e9)}, {1}, c.device());
  Tensor all = c.all_gather(t);
  c.synchronize();
  const std::vector<int64_t> v = all.to_int_vector();
  return double(*std::max_element(v.begin(), v.end())) / 1e9;
}

// A small integer of rank r at element i: sums of them are exact (in
// bfloat16 too, up to 256 in magnitude: 36 ranks).
float value(int rank, int64_t i) { return float((i + 3 * rank) % 7 - 3); }

// Elements that differ from the host's reference after one call on small integers.
int64_t check(par::Communicator& c, Op op, int64_t count, par::Algorithm algo, DType dtype) {
  const int n = c.size(), me = c.rank();
  std::vector<float> mine, want;
  Tensor got;
  auto tensor = [&](const std::vector<float>& v) {
    return Tensor::from_vector(v, {int64_t(v.size())}, c.device()).to(dtype);
  };
  switch (op) {
    case Op::kAllReduce: {
      for (int64_t i = 0; i < count; ++i) {
        mine.push_back(value(me, i));
        float sum = 0;
        for (int r = 0; r < n; ++r) sum += value(r, i);
        want.push_back(sum);
      }
      got = tensor(mine);
      c.allreduce(got, par::ReduceOp::kSum, algo);
      break;
    }
    case Op::kBroadcast: {
      for (int64_t i = 0; i < count; ++i) {
        mine.push_back(me == 0 ? value(0, i) : 0.0f);
        want.push_back(value(0, i));
      }
      got = tensor(mine);
      c.broadcast(got, 0, algo);
      break;
    }
    case Op::kAllGather: {
      const int64_t shard = count / n;
      for (int64_t i = 0; i < shard; ++i) mine.push_back(value(me, i));
      for (int r = 0; r < n; ++r)
        for (int64_t i = 0; i < shard; ++i) want.push_back(value(r, i));
      got = c.all_gather(tensor(mine), algo);
      break;
    }
    case Op::kReduceScatter: {
      const int64_t shard = count / n;
      for (int64_t i = 0; i < count; ++i) mine.push_back(value(me, i));
      for (int64_t i = me * shard; i < (me + 1) * shard; ++i) {
        float sum = 0;
        for (int r = 0; r < n; ++r) sum += value(r, i);
        want.push_back(sum);
      }
      got = c.reduce_scatter(tensor(mine), par::ReduceOp::kSum, algo);
      break;
    }
  }
  c.synchronize();
  const std::vector<float> v = got.to_vector();
  int64_t wrong = std::abs(int64_t(v.size()) - int64_t(want.size()));
  for (size_t i = 0; i < std::min(v.size(), want.size()); ++i) wrong += v[i] != want[i];
  return wrong;
}

// An algorithm, with or without the per-call agreement (CommOptions::check_calls).
struct Variant {
  par::Algorithm algorithm;
  bool checked = true;
  std::string name() const {
    return std::string(par::algorithm_name(algorithm)) + (checked ? "" : "/unchecked");
  }
};

// The buffers of one size: the all-reduce's and broadcast's tensor, the
// all-gather's shard, the reduce-scatter's input.
double time_iterations(par::Communicator& c, Op op, const Tensor& buffer, const Variant& v,
                       int64_t iterations) {
  const par::Algorithm algo = v.algorithm;
  c.set_check_calls(v.checked);
  c.barrier();
  const auto start = Clock::now();
  for (int64_t i = 0; i < iterations; ++i) {
    switch (op) {
      case Op::kAllReduce: c.allreduce(buffer, par::ReduceOp::kSum, algo); break;
      case Op::kBroadcast: c.broadcast(buffer, 0, algo); break;
      case Op::kAllGather: c.all_gather(buffer, algo); break;
      case Op::kReduceScatter: c.reduce_scatter(buffer, par::ReduceOp::kSum, algo); break;
    }
  }
  c.synchronize();
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  c.set_check_calls(true);
  return slowest(c, seconds);
}

// Every rank runs this; the rows are complete on every rank.
std::vector<Row> run(par::Communicator& c, const Options& o) {
  c.set_chunk_bytes(o.chunk_bytes);
  std::vector<Row> rows;
  for (const std::string& op_text : o.ops) {
    const Op op = parse_op(op_text);
    // Naive is an all-reduce only; the others have ring and native.
    std::vector<Variant> algos;
    for (bool checked : {true, false}) {
      if (!checked && !o.unchecked) break;
      for (const auto& name : o.algorithms) {
        const par::Algorithm a = par::parse_algorithm(name);
        if (a != par::Algorithm::kNaive || op == Op::kAllReduce) algos.push_back({a, checked});
      }
    }
    if (algos.empty()) continue;
    for (const std::string& dtype_text : o.dtypes)
    for (size_t bytes = parse_bytes(o.min_bytes, "--min-bytes");
         bytes <= parse_bytes(o.max_bytes, "--max-bytes"); bytes *= 2) {
      const DType dtype = parse_dtype(dtype_text);
      const int64_t count = count_of(op, bytes, c.size(), dtype);
      const Tensor buffer = Tensor::zeros(
          {op == Op::kAllGather ? count / c.size() : count}, dtype, c.device());
      // A trial run of each algorithm sets the iteration count (the same on
      // every rank: the slowest rank's time decides).
      double trial = 0;
      for (const Variant& a : algos)
        trial = std::max(trial, time_iterations(c, op, buffer, a, 2) / 2);
      const int64_t iterations =
          std::clamp<int64_t>(int64_t(o.round_seconds / std::max(trial, 1e-9)), 3, 2000);
      std::vector<std::vector<double>> rounds(algos.size());
      for (int r = 0; r < o.repeats; ++r)
        for (size_t a = 0; a < algos.size(); ++a)
          rounds[a].push_back(time_iterations(c, op, buffer, algos[a], iterations) /
                              double(iterations));
      for (size_t a = 0; a < algos.size(); ++a) {
        std::sort(rounds[a].begin(), rounds[a].end());
        Row row;
        row.op = op;
        row.dtype = dtype;
        row.bytes = size_t(count) * anvil::dtype_size(dtype);
        row.count = count;
        row.algorithm = algos[a].name();
        row.seconds = rounds[a][rounds[a].size() / 2];
        row.wrong = check(c, op, count, algos[a].algorithm, dtype);
        rows.push_back(row);
      }
    }
  }
  return rows;
}

// One table per collective; the all-reduce's first.
void report_table(const std::vector<Row>& rows, const Options& o, int ranks, Op op,
                  const std::string& backend, const std::string& device, bool first) {
  const double factor = bus_factor(op, ranks);
  const std::string type = rows.front().dtype == DType::BFloat16
                               ? "bfloat16 (sums added in float32)"
                               : "float32";
  std::vector<std::string> names;
  for (const Row& r : rows)
    if (std::find(names.begin(), names.end(), r.algorithm) == names.end()) names.push_back(r.algorithm);
  if (op == Op::kAllReduce) {
    fmt::print("# bench_allreduce: {} ranks, backend {}, {}; {} sum, in place; ring chunks of {}\n",
               ranks, backend, device, type, human(o.chunk_bytes));
    fmt::print("# time: per all-reduce, slowest rank, median of {} rounds; busbw = algbw * 2(n-1)/n\n",
               o.repeats);
  } else {
    if (first)
      fmt::print("# bench_allreduce: {} ranks, backend {}, {}; ring chunks of {}\n", ranks,
                 backend, device, human(o.chunk_bytes));
    const char* what = op == Op::kBroadcast   ? "from rank 0, in place; size: the tensor; busbw = algbw * 1"
                       : op == Op::kAllGather ? "size: the gathered tensor (n shards); busbw = algbw * (n-1)/n"
                                              : "sum; size: the input (n shards); busbw = algbw * (n-1)/n";
    fmt::print("# {}: {} {}; time: per call, slowest rank, median of {} rounds\n", op_name(op),
               type, what, o.repeats);
  }
  std::string head = fmt::format("{:>10} {:>10}", "size", "count");
  for (const auto& n : names) head += fmt::format(" | {:>7} {:>10} {:>8} {:>8} {:>6}", n, "time(us)", "algbw", "busbw", "#wrong");
  const bool ratio = std::count(names.begin(), names.end(), "ring") && std::count(names.begin(), names.end(), "native");
  if (ratio) head += " | ring/native";
  fmt::print("{}\n", head);
  for (size_t i = 0; i < rows.size(); i += names.size()) {
    std::string line = fmt::format("{:>10} {:>10}", human(rows[i].bytes), rows[i].count);
    double ring_bus = 0, native_bus = 0;
    for (size_t k = 0; k < names.size(); ++k) {
      const Row& r = rows[i + k];
      const double algbw = double(r.bytes) / r.seconds / 1e9;
      const double busbw = algbw * factor;
      if (r.algorithm == "ring") ring_bus = busbw;
      if (r.algorithm == "native") native_bus = busbw;
      line += fmt::format(" | {:>7} {:>10.1f} {:>8.2f} {:>8.2f} {:>6}", "", r.seconds * 1e6, algbw,
                          busbw, r.wrong);
    }
    if (ratio) line += fmt::format(" | {:>10.2f}x", native_bus > 0 ? ring_bus / native_bus : 0.0);
    fmt::print("{}\n", line);
  }
}

void report(const std::vector<Row>& rows, const Options& o, int ranks, const std::string& backend,
            const std::string& device) {
  bool first = true;
  for (Op op : {Op::kAllReduce, Op::kBroadcast, Op::kAllGather, Op::kReduceScatter})
    for (DType dtype : {DType::Float32, DType::BFloat16}) {
      std::vector<Row> mine;
      for (const Row& r : rows)
        if (r.op == op && r.dtype == dtype) mine.push_back(r);
      if (mine.empty()) continue;
      report_table(mine, o, ranks, op, backend, device, first);
      first = false;
    }
  if (o.json.empty()) return;
  nlohmann::json out = nlohmann::json::array();
  for (const Row& r : rows) {
    const double algbw = double(r.bytes) / r.seconds / 1e9;
    out.push_back({{"backend", backend}, {"device", device}, {"ranks", ranks},
                   {"op", op_name(r.op)}, {"dtype", std::string(anvil::dtype_name(r.dtype))},
                   {"algorithm", r.algorithm}, {"bytes", r.bytes}, {"count", r.count},
                   {"time_us", r.seconds * 1e6}, {"algbw_GBps", algbw},
                   {"busbw_GBps", algbw * bus_factor(r.op, ranks)},
                   {"chunk_bytes", o.chunk_bytes}, {"wrong", r.wrong}});
  }
  std::ofstream(o.json) << out.dump(1) << "\n";
  fmt::print("# wrote {}\n", o.json);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"bench_allreduce: all-reduce (and broadcast, all-gather, reduce-scatter) bus bandwidth (nccl-tests' form), ring vs naive vs native"};
  Options o;
  app.add_option("--backend", o.backend, "mpi (CPU ranks, under mpirun), nccl (one thread per GPU), or auto")
      ->check(CLI::IsMember({"auto", "mpi", "nccl"}));
  app.add_option("--gpus", o.gpus, "NCCL: how many GPUs (default: all)");
  app.add_option("--min-bytes", o.min_bytes, "smallest size (4K, 1M, ...)");
  app.add_option("--max-bytes", o.max_bytes, "largest size");
  app.add_option("--algorithms", o.algorithms, "which algorithms: ring, naive (all-reduce only), native")->delimiter(',');
  app.add_option("--ops", o.ops, "which collectives, one table each: allreduce (the default), broadcast, allgather, reducescatter")->delimiter(',');
  app.add_option("--dtype", o.dtypes, "which dtypes, one table each: float32 (the default), bf16 (moved as bfloat16, summed in float32)")->delimiter(',');
  app.add_option("--repeats", o.repeats, "timed rounds per size (the median is reported)")
      ->check(CLI::Range(1, 1000));
  app.add_option("--round-seconds", o.round_seconds, "about how long each algorithm's round lasts")
      ->check(CLI::PositiveNumber);
  app.add_option("--chunk-bytes", o.chunk_bytes, "the ring's chunk (0: whole segments, the textbook ring)");
  app.add_flag("--unchecked", o.unchecked, "also time each algorithm without the per-call check of every rank's call (ANVIL_COMM_CHECK=OFF)");
  app.add_option("--json", o.json, "also write one object per algorithm and size to FILE");
  CLI11_PARSE(app, argc, argv);

  try {
    for (const auto& name : o.algorithms) par::parse_algorithm(name);
    for (const auto& name : o.ops) parse_op(name);
    for (const auto& name : o.dtypes) parse_dtype(name);
    parse_bytes(o.min_bytes, "--min-bytes");
    parse_bytes(o.max_bytes, "--max-bytes");
    std::string backend = o.backend;
    if (backend == "auto")
      backend = par::mpi_size() > 1 || anvil::device_count() == 0 || !par::nccl_missing_reason().empty()
                    ? "mpi" : "nccl";
    if (backend == "mpi") {
      if (!par::mpi_missing_reason().empty()) throw std::runtime_error(par::mpi_missing_reason());
      auto comm = par::mpi_world();
      const std::vector<Row> rows = run(*comm, o);
      if (comm->rank() == 0) report(rows, o, comm->size(), "mpi", "cpu");
      return 0;
    }
    if (!par::nccl_missing_reason().empty()) throw std::runtime_error(par::nccl_missing_reason());
    const int gpus = o.gpus > 0 ? o.gpus : anvil::device_count();
    if (gpus < 1 || gpus > anvil::device_count())
      throw std::invalid_argument(fmt::format("--gpus {}: this machine has {} GPU(s)", gpus,
                                              anvil::device_count()));
    const par::NcclId id = par::nccl_unique_id();
    std::vector<std::vector<Row>> results(static_cast<size_t>(gpus));
    std::vector<std::string> errors(static_cast<size_t>(gpus));
    std::vector<std::thread> threads;
    for (int r = 0; r < gpus; ++r)
      threads.emplace_back([&, r] {
        try {
          auto comm = par::nccl_communicator(id, r, gpus, anvil::Device::cuda(r));
          results[size_t(r)] = run(*comm, o);
        } catch (const std::exception& e) {
          errors[size_t(r)] = e.what();
        }
      });
    for (auto& t : threads) t.join();
    for (const auto& e : errors)
      if (!e.empty()) throw std::runtime_error(e);
    const auto props = anvil::device_properties(anvil::Device::cuda(0));
    report(results[0], o, gpus, "nccl", props.name);
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "bench_allreduce: " << e.what() << "\n";
    return 1;
  }
}
