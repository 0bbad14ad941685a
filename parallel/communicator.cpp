// The Communicator: argument checks, the agreement every rank reaches before
// data moves, and the dispatch to the algorithms (collectives.h).
//
// Before each collective every rank posts what it is about to do (CallInfo)
// on the host channel and reads every other rank's. Ranks that disagree (a
// different collective, count, dtype, root or call number) all stop there
// with the same message naming both sides; a rank that never posts is named
// by the others when their deadline passes. Only then does data move, so a
// mismatch can never turn into a hang or a corrupted buffer on the wire.
#include "parallel/communicator.h"

#include <fmt/format.h>

#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <future>
#include <mutex>
#include <thread>
#include <cstring>
#include <stdexcept>
#include <string>

#include "parallel/collectives.h"
#include "parallel/transport.h"

namespace anvil::parallel {

// ---- names, options ----

Algorithm parse_algorithm(std::string_view name) {
  if (name == "ring") return Algorithm::kRing;
  if (name == "naive") return Algorithm::kNaive;
  if (name == "native") return Algorithm::kNative;
  throw std::invalid_argument(
      fmt::format("unknown all-reduce algorithm '{}' (choose ring, naive or native)", name));
}

std::string_view algorithm_name(Algorithm algorithm) {
  switch (algorithm) {
    case Algorithm::kRing: return "ring";
    case Algorithm::kNaive: return "naive";
    case Algorithm::kNative: return "native";
  }
  return "?";
}

std::string_view collective_name(Collective c) {
  switch (c) {
    case Collective::kAllreduce: return "allreduce";
    case Collective::kBroadcast: return "broadcast";
    case Collective::kScatter: return "scatter";
    case Collective::kReduceScatter: return "reduce_scatter";
    case Collective::kAllGather: return "all_gather";
    case Collective::kBarrier: return "barrier";
  }
  return "?";
}

std::chrono::milliseconds default_timeout() {
  const char* env = std::getenv("ANVIL_COMM_TIMEOUT");
  if (env == nullptr || *env == '\0') return std::chrono::minutes(5);
  char* end = nullptr;
  const double seconds = std::strtod(env, &end);
  if (end == env || *end != '\0' || !(seconds > 0) || !std::isfinite(seconds))
    throw std::invalid_argument(fmt::format(
        "ANVIL_COMM_TIMEOUT='{}': expected a positive number of seconds", env));
  return std::chrono::milliseconds(std::max<int64_t>(1, int64_t(seconds * 1000.0)));
}

bool comm_debug() {
  const char* env = std::getenv("ANVIL_COMM_DEBUG");
  if (env == nullptr || *env == '\0' || std::string_view(env) == "OFF") return false;
  if (std::string_view(env) == "INFO") return true;
  throw std::invalid_argument(
      fmt::format("ANVIL_COMM_DEBUG='{}': expected INFO (print every collective) or OFF", env));
}

std::string timeout_text(std::chrono::milliseconds t) {
  return fmt::format("{:g} s", double(t.count()) / 1000.0);
}

std::string Transport::error_prefix() const {
  return fmt::format("rank {} ({}, {}): {}: ", rank_, name(), device_.str(),
                     context_.empty() ? std::string("communicator") : context_);
}

void* Transport::scratch(size_t bytes) {
  held_.push_back(Tensor::empty({int64_t(std::max<size_t>(bytes, 1))}, DType::UInt8, device_));
  return held_.back().raw_data();
}

std::unique_ptr<InFlight> Transport::end_later() {
  end();  // a transport that does the work on the host: nothing is left for later
  struct Done final : InFlight {
    void wait() override {}
  };
  return std::make_unique<Done>();
}

int64_t CallInfo::numel() const { return ndim < 0 ? 0 : shape_numel(tensor_shape()); }

int mpi_rank_from_environment() {
  for (const char* name : {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"})
    if (const char* v = std::getenv(name); v && *v) return std::atoi(v);
  return -1;
}

std::string broadcast_text(Communicator& comm, const std::string& text, int root) {
  Tensor length =
      Tensor::from_vector(std::vector<int64_t>{int64_t(text.size())}, {1}, comm.device());
  comm.broadcast(length, root);
  comm.synchronize();
  const int64_t n = length.to_int_vector()[0];
  Tensor bytes = comm.rank() == root
                     ? Tensor::from_host(text.data(), {n}, DType::UInt8, comm.device())
                     : Tensor::empty({n}, DType::UInt8, comm.device());
  comm.broadcast(bytes, root);
  comm.synchronize();
  const Tensor host = bytes.to(Device::cpu());
  return std::string(static_cast<const char*>(host.raw_data()), size_t(n));
}

// ---- the agreement ----

namespace {

std::string op_name(ReduceOp op) { return op == ReduceOp::kSum ? "sum" : "average"; }

// "allreduce #3 (ring, sum) of float32 [1000]"
std::string describe(const CallInfo& c) {
  std::string s = fmt::format("{} #{}", collective_name(c.collective), c.seq);
  switch (c.collective) {
    case Collective::kAllreduce:
      s += fmt::format(" ({}, {})", algorithm_name(c.algorithm), op_name(c.op));
      break;
    case Collective::kReduceScatter: s += fmt::format(" ({})", op_name(c.op)); break;
    case Collective::kBroadcast:
    case Collective::kScatter: s += fmt::format(" from rank {}", c.root); break;
    default: break;
  }
  if (c.ndim >= 0) s += fmt::format(" of {} {}", dtype_name(c.dtype), shape_str(c.tensor_shape()));
  return s;
}

// Whether two ranks' calls are compatible; `ref` is the rank the others are
// compared with (rank 0, or the root of a rooted collective).
bool compatible(const CallInfo& ref, const CallInfo& other) {
  if (ref.seq != other.seq || ref.collective != other.collective) return false;
  auto same_tensor = [&] {
    return ref.dtype == other.dtype && ref.ndim == other.ndim &&
           std::equal(ref.shape, ref.shape + std::max(ref.ndim, 0), other.shape);
  };
  switch (ref.collective) {
    case Collective::kAllreduce:
      return ref.algorithm == other.algorithm && ref.op == other.op && same_tensor();
    case Collective::kReduceScatter: return ref.op == other.op && same_tensor();
    case Collective::kBroadcast: return ref.root == other.root && same_tensor();
    case Collective::kScatter: return ref.root == other.root;
    case Collective::kAllGather:
      return ref.dtype == other.dtype && ref.ndim == other.ndim &&
             std::equal(ref.shape + 1, ref.shape + std::max(ref.ndim, 1), other.shape + 1);
    case Collective::kBarrier: return true;
  }
  return false;
}

CallInfo tensor_call(Collective collective, const Tensor& t) {
  CallInfo c;
  c.collective = collective;
  c.dtype = t.dtype();
  if (t.dim() > CallInfo::kMaxDims)
    throw std::invalid_argument(fmt::format("{}: tensors of more than {} dimensions are not "
                                            "supported (got {})",
                                            collective_name(collective), CallInfo::kMaxDims,
                                            shape_str(t.shape())));
  c.ndim = int32_t(t.dim());
  for (int64_t d = 0; d < t.dim(); ++d) c.shape[d] = t.size(d);
  return c;
}

// Whether the collective's schedule depends on the chunk size.
bool cut_in_chunks(const CallInfo& c) {
  return (c.collective == Collective::kAllreduce && c.algorithm == Algorithm::kRing) ||
         c.collective == Collective::kBroadcast || c.collective == Collective::kReduceScatter;
}

}  // namespace

std::vector<CallInfo> Communicator::agree(CallInfo mine) {
  mine.seq = ++seq_;
  if (cut_in_chunks(mine)) mine.chunk_bytes = chunk_bytes_.load();
  const std::string what = describe(mine);
  transport_->set_context(what);
  if (debug_) {
    debug_call_ = what;
    debug_bytes_ = size_t(mine.numel()) * dtype_size(mine.dtype);
  }
  std::vector<CallInfo> all =
      transport_->channel().exchange(mine, options_.timeout, transport_->error_prefix());
  // Rooted collectives compare with the root (whose tensor defines the
  // call), the others with rank 0; the first rank that differs is named.
  int ref = 0;
  if ((mine.collective == Collective::kBroadcast || mine.collective == Collective::kScatter) &&
      mine.root >= 0 && mine.root < size() && all[size_t(mine.root)].seq == mine.seq)
    ref = mine.root;
  for (int j = 0; j < size(); ++j) {
    if (compatible(all[size_t(ref)], all[size_t(j)])) continue;
    throw CommError(fmt::format("rank {} ({}, {}): ranks disagree on collective #{}: rank {} "
                                "asked for {}, rank {} asked for {}",
                                rank(), backend(), device().str(), mine.seq, ref,
                                describe(all[size_t(ref)]), j, describe(all[size_t(j)])));
  }
  for (int j = 0; j < size(); ++j) {
    if (all[size_t(j)].chunk_bytes == all[size_t(ref)].chunk_bytes) continue;
    throw CommError(fmt::format(
        "rank {} ({}, {}): ranks disagree on collective #{} ({}): rank {} cuts it in chunks of "
        "{} bytes, rank {} in chunks of {} bytes (CommOptions::chunk_bytes must be the same "
        "on every rank)",
        rank(), backend(), device().str(), mine.seq, describe(mine), ref,
        all[size_t(ref)].chunk_bytes, j, all[size_t(j)].chunk_bytes));
  }
  return all;
}

// ---- the communicator ----

// The thread that does a host-synchronous transport's work (MPI), so that
// allreduce_async returns while it runs. Tasks run one at a time, in order.
class Communicator::CommThread {
 public:
  CommThread() : worker_([this] { loop(); }) {}
  ~CommThread() {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    changed_.notify_all();
    worker_.join();
  }
  std::shared_future<void> post(std::function<void()> task) {
    std::packaged_task<void()> job(std::move(task));
    std::shared_future<void> done = job.get_future().share();
    {
      std::lock_guard lock(mutex_);
      queue_.push_back(std::move(job));
    }
    changed_.notify_all();
    return done;
  }
  bool is_current() const { return std::this_thread::get_id() == worker_.get_id(); }

 private:
  void loop() {
    for (;;) {
      std::packaged_task<void()> job;
      {
        std::unique_lock lock(mutex_);
        changed_.wait(lock, [&] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;
        job = std::move(queue_.front());
        queue_.pop_front();
      }
      job();  // an exception lands in the job's future
    }
  }
  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<std::packaged_task<void()>> queue_;
  bool stop_ = false;
  std::thread worker_;  // last: starts once the rest is ready
};

Communicator::Communicator(std::unique_ptr<Transport> transport, CommOptions options)
    : transport_(std::move(transport)),
      options_(options),
      debug_(comm_debug()),
      chunk_bytes_(options.chunk_bytes) {
  transport_->set_timeout(options_.timeout);
  transport_->set_failure_handler([this](const std::string& why) { fail(why); });
  if (transport_->host_synchronous()) thread_ = std::make_unique<CommThread>();
}

std::string Communicator::failure() const {
  std::lock_guard lock(failure_mutex_);
  return failure_;
}

bool Communicator::fail(const std::string& why) {
  {
    std::lock_guard lock(failure_mutex_);
    if (!failure_.empty()) return false;
    failure_ = why;
  }
  transport_->abort();
  transport_->channel().report_failure(why);
  return true;
}

Communicator::~Communicator() {
  if (!transport_) return;
  transport_->quiesce();  // no thread of the transport calls fail() from here on
  auto close = [&] {
    if (failure().empty()) {
      try {
        transport_->set_context("closing the communicator");
        transport_->synchronize();
        return;
      } catch (const std::exception&) {
        // The error was the last collective's to report; all that is left is to let go.
      }
    }
    transport_->abort();
  };
  if (thread_) {
    thread_->post(close).wait();
    thread_.reset();
  } else {
    close();
  }
}

int Communicator::rank() const { return transport_->rank(); }
int Communicator::size() const { return transport_->size(); }
Device Communicator::device() const { return transport_->device(); }
std::string_view Communicator::backend() const { return transport_->name(); }

CommOptions Communicator::options() const {
  CommOptions o = options_;
  o.chunk_bytes = chunk_bytes_.load();
  return o;
}

void Communicator::on_comm_thread(std::function<void()> body) {
  if (thread_ && !thread_->is_current()) thread_->post(std::move(body)).get();
  else body();
}

template <typename Check, typename Body>
void Communicator::run(const char* name, Check&& check, Body&& body) {
  check();  // on the caller's thread: an argument error involves no other rank
  on_comm_thread([&] {
    if (const std::string first = failure(); !first.empty())
      throw CommError(fmt::format("rank {} ({}, {}): {}: the communicator failed earlier and "
                                  "can no longer be used; the first error was: {}",
                                  rank(), backend(), device().str(), name, first));
    transport_->set_timeout(options_.timeout);
    const auto start = std::chrono::steady_clock::now();
    debug_call_.clear();
    try {
      body();
    } catch (const std::exception& e) {
      fail(e.what());
      throw;
    }
    if (debug_ && !debug_call_.empty()) {
      const double ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
              .count();
      const std::string line = fmt::format(
          "anvil comm: rank {} ({}, {}): {}: {} bytes, {:.3f} ms {}\n", rank(), backend(),
          device().str(), debug_call_, debug_bytes_, ms,
          transport_->host_synchronous() ? "(done)" : "(issued; the device finishes later)");
      std::fputs(line.c_str(), stderr);
    }
  });
}

namespace {

// The checks every tensor argument gets: defined, on the transport's device,
// of a dtype the collective moves.
void check_tensor(const Transport& t, const char* collective, const char* what,
                  const Tensor& tensor, bool numeric_only) {
  const std::string who = fmt::format("rank {} ({}, {}): {}", t.rank(), t.name(),
                                      t.device().str(), collective);
  if (!tensor.defined()) throw std::invalid_argument(who + ": " + what + " is undefined");
  if (tensor.device() != t.device()) {
    throw std::invalid_argument(fmt::format(
        "{}: {} is on {}, but this communicator moves tensors on {}{}", who, what,
        tensor.device().str(), t.device().str(),
        t.name() == "mpi" ? " (Debian's OpenMPI is not CUDA-aware: use the NCCL backend for "
                            "GPU tensors)"
                          : ""));
  }
  if (numeric_only && tensor.dtype() != DType::Float32 && tensor.dtype() != DType::Int64)
    throw std::invalid_argument(fmt::format("{}: {} is {}; reductions take float32 or int64",
                                            who, what, dtype_name(tensor.dtype())));
}

void check_rank(const Transport& t, const char* collective, const char* what, int r) {
  if (r < 0 || r >= t.size())
    throw std::invalid_argument(fmt::format("rank {} ({}, {}): {}: {} {} is not a rank of a "
                                            "communicator of {}",
                                            t.rank(), t.name(), t.device().str(), collective,
                                            what, r, t.size()));
}

// Rows per rank when `rows` are split as torch.tensor_split(rows, n) does:
// the first rows % n ranks get one more.
std::vector<int64_t> split_rows(int64_t rows, int n) {
  std::vector<int64_t> counts(static_cast<size_t>(n));
  for (int j = 0; j < n; ++j) counts[size_t(j)] = rows / n + (j < rows % n ? 1 : 0);
  return counts;
}

// Where each rank's rows start, in units of `row` (elements or bytes); n+1 entries.
std::vector<int64_t> offsets_of(const std::vector<int64_t>& rows, int64_t row) {
  std::vector<int64_t> offsets(rows.size() + 1, 0);
  for (size_t j = 0; j < rows.size(); ++j) offsets[j + 1] = offsets[j] + rows[j] * row;
  return offsets;
}

int64_t row_elements(const Shape& shape) {
  int64_t r = 1;
  for (size_t d = 1; d < shape.size(); ++d) r *= shape[d];
  return r;
}

}  // namespace

namespace {
void check_allreduce(const Transport& t, const Tensor& tensor, ReduceOp op) {
  check_tensor(t, "allreduce", "the tensor", tensor, true);
  if (op == ReduceOp::kAverage && tensor.dtype() != DType::Float32)
    throw std::invalid_argument(fmt::format(
        "rank {}: allreduce: the average of {} is not defined here: sum, then divide", t.rank(),
        dtype_name(tensor.dtype())));
}
}  // namespace

std::unique_ptr<InFlight> Communicator::allreduce_body(const Tensor& tensor, ReduceOp op,
                                                       Algorithm algorithm, bool later) {
  CallInfo mine = tensor_call(Collective::kAllreduce, tensor);
  mine.algorithm = algorithm;
  mine.op = op;
  agree(mine);
  Transport& t = *transport_;
  t.begin();
  switch (algorithm) {
    case Algorithm::kNaive:
      algorithms::allreduce_naive(t, tensor.raw_data(), tensor.numel(), tensor.dtype(), op);
      break;
    case Algorithm::kRing:
      algorithms::allreduce_ring(t, tensor.raw_data(), tensor.numel(), tensor.dtype(), op,
                                 chunk_bytes_.load());
      break;
    case Algorithm::kNative:
      if (size() > 1 && tensor.numel() > 0)
        t.native_allreduce(tensor.raw_data(), tensor.numel(), tensor.dtype(), op);
      break;
  }
  if (later) return t.end_later();
  t.end();
  return nullptr;
}

void Communicator::allreduce(const Tensor& tensor, ReduceOp op, Algorithm algorithm) {
  run(
      "allreduce", [&] { check_allreduce(*transport_, tensor, op); },
      [&] { allreduce_body(tensor, op, algorithm, false); });
}

std::shared_ptr<Work> Communicator::allreduce_async(const Tensor& tensor, ReduceOp op,
                                                    Algorithm algorithm) {
  if (thread_) {
    // Over MPI the whole collective runs on the communicator's thread.
    check_allreduce(*transport_, tensor, op);
    struct ThreadWork final : Work {
      std::shared_future<void> done;
      Tensor tensor;  // kept alive while the thread works on it
      void wait() override { done.get(); }
    };
    auto work = std::make_shared<ThreadWork>();
    work->tensor = tensor;
    work->done = thread_->post([this, tensor, op, algorithm] {
      run("allreduce", [] {}, [&] { allreduce_body(tensor, op, algorithm, false); });
    });
    return work;
  }
  // On a GPU it is in flight on the communicator's streams once issued.
  struct StreamWork final : Work {
    std::unique_ptr<InFlight> in_flight;
    Tensor tensor;
    void wait() override { in_flight->wait(); }
  };
  auto work = std::make_shared<StreamWork>();
  work->tensor = tensor;
  run(
      "allreduce", [&] { check_allreduce(*transport_, tensor, op); },
      [&] { work->in_flight = allreduce_body(tensor, op, algorithm, true); });
  return work;
}

void Communicator::broadcast(const Tensor& tensor, int root) {
  run(
      "broadcast",
      [&] {
        check_tensor(*transport_, "broadcast", "the tensor", tensor, false);
        check_rank(*transport_, "broadcast", "root", root);
      },
      [&] {
        CallInfo mine = tensor_call(Collective::kBroadcast, tensor);
        mine.root = root;
        agree(mine);
        transport_->begin();
        algorithms::chain_broadcast(*transport_, tensor.raw_data(), tensor.nbytes(), root,
                                    chunk_bytes_.load());
        transport_->end();
      });
}

Tensor Communicator::scatter(const Tensor& input, int root) {
  Tensor output;
  run(
      "scatter",
      [&] {
        check_rank(*transport_, "scatter", "root", root);
        if (rank() != root) return;
        check_tensor(*transport_, "scatter", "the input", input, false);
        if (input.dim() == 0)
          throw std::invalid_argument(fmt::format(
              "rank {}: scatter: the input must have a first dimension to split", rank()));
      },
      [&] {
        CallInfo mine;
        mine.collective = Collective::kScatter;
        if (rank() == root) mine = tensor_call(Collective::kScatter, input);
        mine.root = root;
        const CallInfo from_root = agree(mine)[size_t(root)];
        Shape shape = from_root.tensor_shape();
        const std::vector<int64_t> rows = split_rows(shape[0], size());
        const std::vector<int64_t> offsets =
            offsets_of(rows, row_elements(shape) * int64_t(dtype_size(from_root.dtype)));
        shape[0] = rows[size_t(rank())];
        output = Tensor::empty(shape, from_root.dtype, device());
        transport_->begin();
        algorithms::scatter(*transport_, rank() == root ? input.raw_data() : nullptr,
                            output.raw_data(), offsets, root);
        transport_->end();
      });
  return output;
}

Tensor Communicator::reduce_scatter(const Tensor& input, ReduceOp op) {
  Tensor output;
  run(
      "reduce_scatter",
      [&] {
        check_tensor(*transport_, "reduce_scatter", "the input", input, true);
        if (input.dim() == 0)
          throw std::invalid_argument(fmt::format(
              "rank {}: reduce_scatter: the input must have a first dimension to split", rank()));
        if (op == ReduceOp::kAverage && input.dtype() != DType::Float32)
          throw std::invalid_argument(fmt::format(
              "rank {}: reduce_scatter: the average of {} is not defined here: sum, then divide",
              rank(), dtype_name(input.dtype())));
      },
      [&] {
        CallInfo mine = tensor_call(Collective::kReduceScatter, input);
        mine.op = op;
        agree(mine);
        const std::vector<int64_t> rows = split_rows(input.size(0), size());
        const std::vector<int64_t> bounds = offsets_of(rows, row_elements(input.shape()));
        Shape shape = input.shape();
        shape[0] = rows[size_t(rank())];
        output = Tensor::empty(shape, input.dtype(), device());  // this rank's rows, no more
        transport_->begin();
        // The ring works on a copy (every segment but ours ends partial),
        // scratch that goes back to the allocator at end().
        void* work = transport_->scratch(input.nbytes());
        if (input.nbytes() > 0) transport_->copy(work, input.raw_data(), input.nbytes(), 0);
        algorithms::ring_reduce_scatter(*transport_, work, bounds, input.dtype(),
                                        op == ReduceOp::kAverage ? 1.0f / float(size()) : 1.0f,
                                        chunk_bytes_.load());
        const size_t esize = dtype_size(input.dtype());
        if (output.nbytes() > 0)
          transport_->copy(output.raw_data(),
                           static_cast<const char*>(work) + size_t(bounds[size_t(rank())]) * esize,
                           output.nbytes(), 0);
        transport_->end();
      });
  return output;
}

Tensor Communicator::all_gather(const Tensor& shard) {
  Tensor output;
  run(
      "all_gather",
      [&] {
        check_tensor(*transport_, "all_gather", "the shard", shard, false);
        if (shard.dim() == 0)
          throw std::invalid_argument(fmt::format(
              "rank {}: all_gather: the shard must have a first dimension to concatenate along",
              rank()));
      },
      [&] {
        const std::vector<CallInfo> all = agree(tensor_call(Collective::kAllGather, shard));
        std::vector<int64_t> rows;
        for (const CallInfo& c : all) rows.push_back(c.shape[0]);
        const std::vector<int64_t> bounds = offsets_of(rows, row_elements(shard.shape()));
        Shape shape = shard.shape();
        shape[0] = offsets_of(rows, 1).back();
        output = Tensor::empty(shape, shard.dtype(), device());
        transport_->begin();
        const int64_t esize = int64_t(dtype_size(shard.dtype()));
        if (shard.nbytes() > 0)
          transport_->copy(static_cast<char*>(output.raw_data()) + bounds[size_t(rank())] * esize,
                           shard.raw_data(), shard.nbytes(), 0);
        algorithms::ring_all_gather(*transport_, output.raw_data(), bounds, shard.dtype());
        transport_->end();
      });
  return output;
}

void Communicator::barrier() {
  run(
      "barrier", [] {},
      [&] {
        transport_->set_context(fmt::format("barrier #{}", seq_ + 1));
        transport_->synchronize();
        CallInfo mine;
        mine.collective = Collective::kBarrier;
        agree(mine);
      });
}

namespace {
// One grouped post of up to two messages, bracketed as a collective is.
void exchange(Transport& t, std::initializer_list<Message> messages) {
  std::vector<Message> nonempty;
  for (const Message& m : messages)
    if (m.bytes > 0) nonempty.push_back(m);
  t.begin();
  t.post(nonempty);
  t.end();
}
}  // namespace

void Communicator::send(const Tensor& tensor, int peer) {
  run(
      "send",
      [&] {
        check_tensor(*transport_, "send", "the tensor", tensor, false);
        check_rank(*transport_, "send", "peer", peer);
      },
      [&] {
        transport_->set_context(fmt::format("send of {} {} to rank {}",
                                            dtype_name(tensor.dtype()), shape_str(tensor.shape()),
                                            peer));
        exchange(*transport_, {{Message::kSend, peer, tensor.raw_data(), tensor.nbytes()}});
      });
}

void Communicator::recv(const Tensor& tensor, int peer) {
  run(
      "recv",
      [&] {
        check_tensor(*transport_, "recv", "the tensor", tensor, false);
        check_rank(*transport_, "recv", "peer", peer);
      },
      [&] {
        transport_->set_context(fmt::format("receive of {} {} from rank {}",
                                            dtype_name(tensor.dtype()), shape_str(tensor.shape()),
                                            peer));
        exchange(*transport_, {{Message::kRecv, peer, tensor.raw_data(), tensor.nbytes()}});
      });
}

void Communicator::sendrecv(const Tensor& send_tensor, int to, const Tensor& recv_tensor,
                            int from) {
  run(
      "sendrecv",
      [&] {
        check_tensor(*transport_, "sendrecv", "the tensor to send", send_tensor, false);
        check_tensor(*transport_, "sendrecv", "the tensor to receive", recv_tensor, false);
        check_rank(*transport_, "sendrecv", "destination", to);
        check_rank(*transport_, "sendrecv", "source", from);
      },
      [&] {
        transport_->set_context(fmt::format("sendrecv to rank {} and from rank {}", to, from));
        exchange(*transport_,
                 {{Message::kSend, to, send_tensor.raw_data(), send_tensor.nbytes()},
                  {Message::kRecv, from, recv_tensor.raw_data(), recv_tensor.nbytes()}});
      });
}

void Communicator::abort(const std::string& why) {
  on_comm_thread([&] { fail(why); });
}

void Communicator::synchronize() {
  run(
      "synchronize", [] {},
      [&] {
        // Named after the latest call, which is the one still in flight if any is.
        const std::string last = transport_->context();
        if (last.empty()) transport_->set_context("synchronize");
        else if (!last.starts_with("waiting for ")) transport_->set_context("waiting for " + last);
        transport_->synchronize();
      });
}

}  // namespace anvil::parallel
