// The Communicator: its thread, its failure, and the collectives' front
// ends, each of which reads check (the arguments, on the caller's thread) ->
// agree (agreement.cpp: every rank's call the same) -> begin -> the
// algorithm (collectives.h) -> end. Names, options and the environment are
// in comm_options.cpp, the transport's shared parts in transport.cpp.
#include "parallel/communicator.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <future>
#include <mutex>
#include <set>
#include <thread>
#include <cstring>
#include <stdexcept>
#include <string>

#include "data/shard.h"
#include "parallel/collectives.h"
#include "parallel/transport.h"

namespace anvil::parallel {

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
      chunk_bytes_(options.chunk_bytes),
      check_calls_(options.check_calls) {
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
  transport_->channel().report_failure(transport_->world_rank(transport_->rank()), why);
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
uint64_t Communicator::bytes_sent() const { return transport_->bytes_sent(); }
Device Communicator::device() const { return transport_->device(); }
std::string_view Communicator::backend() const { return transport_->name(); }

CommOptions Communicator::options() const {
  CommOptions o = options_;
  o.chunk_bytes = chunk_bytes_.load();
  o.check_calls = check_calls_.load();
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
      transport_->throw_error(fmt::format("{}: {}: the communicator failed earlier and can no "
                                          "longer be used; the first error was: {}",
                                          transport_->identity(), name, first));
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
          "anvil comm: {}: {}: {} bytes, {:.3f} ms {}\n", transport_->identity(), debug_call_,
          debug_bytes_, ms,
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
  const std::string who = fmt::format("{}: {}", t.identity(), collective);
  if (!tensor.defined()) throw std::invalid_argument(who + ": " + what + " is undefined");
  if (tensor.device() != t.device()) {
    throw std::invalid_argument(fmt::format(
        "{}: {} is on {}, but this communicator moves tensors on {}{}", who, what,
        tensor.device().str(), t.device().str(),
        t.name() == "mpi" ? " (Debian's OpenMPI is not CUDA-aware: use the NCCL backend for "
                            "GPU tensors)"
                          : ""));
  }
  if (numeric_only && tensor.dtype() != DType::Float32 && tensor.dtype() != DType::Int64 &&
      tensor.dtype() != DType::BFloat16)
    throw std::invalid_argument(fmt::format(
        "{}: {} is {}; reductions take float32, bfloat16 (added in float32) or int64", who, what,
        dtype_name(tensor.dtype())));
}

// Naive is the seeds' all-reduce; the other collectives have ring and native.
void check_algorithm(const Transport& t, const char* collective, Algorithm algorithm) {
  if (algorithm == Algorithm::kNaive)
    throw std::invalid_argument(fmt::format("{}: {}: there is no naive {}: ring (anvil's own) "
                                            "or native (the backend's)",
                                            t.identity(), collective, collective));
}

void check_rank(const Transport& t, const char* collective, const char* what, int r) {
  if (r < 0 || r >= t.size())
    throw std::invalid_argument(fmt::format("{}: {}: {} {} is not a rank of a communicator of {}",
                                            t.identity(), collective, what, r, t.size()));
}

// A point-to-point peer: a rank of the communicator, and not this one (but
// sendrecv's ring of one, which sends to itself and receives from itself).
void check_peer(const Transport& t, const char* call, const char* what, int r, bool sending,
                bool ring_of_one) {
  check_rank(t, call, what, r);
  if (r != t.rank() || ring_of_one) return;
  const char* verb = sending ? "send to" : "receive from";
  throw std::invalid_argument(
      t.size() == 1
          ? fmt::format("{}: {}: {} {} is this rank: a group of one rank has no other rank to {}",
                        t.identity(), call, what, r, verb)
          : fmt::format("{}: {}: {} {} is this rank, which does not {} itself (sendrecv to and "
                        "from itself copies)",
                        t.identity(), call, what, r, verb));
}

// Rows per rank, as the data loader shares a batch (data/shard.h).
std::vector<int64_t> split_rows(int64_t rows, int n) {
  std::vector<int64_t> counts(static_cast<size_t>(n));
  for (int j = 0; j < n; ++j) counts[size_t(j)] = data::shard_rows(rows, n, j);
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
  if (op == ReduceOp::kAverage && tensor.dtype() == DType::Int64)
    throw std::invalid_argument(fmt::format(
        "rank {}: allreduce: the average of {} is not defined here: sum, then divide", t.rank(),
        dtype_name(tensor.dtype())));
}
}  // namespace

std::unique_ptr<InFlight> Communicator::allreduce_body(const Tensor& tensor, ReduceOp op,
                                                       Algorithm algorithm, uint64_t fingerprint,
                                                       bool later) {
  CallInfo mine = CallInfo::of(Collective::kAllreduce, tensor);
  mine.algorithm = algorithm;
  mine.op = op;
  mine.fingerprint = fingerprint;
  mine.chunk_bytes = chunk_bytes_.load();  // read once: agreed on, then used
  const size_t chunk_bytes = size_t(mine.chunk_bytes);
  agree(mine);
  Transport& t = *transport_;
  t.begin();
  t.hold(tensor);
  switch (algorithm) {
    case Algorithm::kNaive:
      algorithms::allreduce_naive(t, tensor.raw_data(), tensor.numel(), tensor.dtype(), op);
      break;
    case Algorithm::kRing:
      algorithms::allreduce_ring(t, tensor.raw_data(), tensor.numel(), tensor.dtype(), op,
                                 chunk_bytes);
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

void Communicator::allreduce(const Tensor& tensor, ReduceOp op, Algorithm algorithm,
                             uint64_t fingerprint) {
  run(
      "allreduce", [&] { check_allreduce(*transport_, tensor, op); },
      [&] { allreduce_body(tensor, op, algorithm, fingerprint, false); });
}

std::shared_ptr<Work> Communicator::allreduce_async(const Tensor& tensor, ReduceOp op,
                                                    Algorithm algorithm, uint64_t fingerprint) {
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
    work->done = thread_->post([this, tensor, op, algorithm, fingerprint] {
      run("allreduce", [] {},
          [&] { allreduce_body(tensor, op, algorithm, fingerprint, false); });
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
      [&] { work->in_flight = allreduce_body(tensor, op, algorithm, fingerprint, true); });
  return work;
}

void Communicator::broadcast(const Tensor& tensor, int root, Algorithm algorithm) {
  run(
      "broadcast",
      [&] {
        check_tensor(*transport_, "broadcast", "the tensor", tensor, false);
        check_rank(*transport_, "broadcast", "root", root);
        check_algorithm(*transport_, "broadcast", algorithm);
      },
      [&] {
        CallInfo mine = CallInfo::of(Collective::kBroadcast, tensor);
        mine.root = root;
        mine.algorithm = algorithm;
        mine.chunk_bytes = chunk_bytes_.load();  // read once: agreed on, then used
        const size_t chunk_bytes = size_t(mine.chunk_bytes);
        agree(mine);
        transport_->begin();
        transport_->hold(tensor);
        if (algorithm == Algorithm::kNative) {
          if (size() > 1 && tensor.nbytes() > 0)
            transport_->native_broadcast(tensor.raw_data(), tensor.nbytes(), root);
        } else {
          algorithms::chain_broadcast(*transport_, tensor.raw_data(), tensor.nbytes(), root,
                                      chunk_bytes);
        }
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
        if (rank() == root) mine = CallInfo::of(Collective::kScatter, input);
        mine.root = root;
        const CallInfo from_root = agree(mine)[size_t(root)];
        Shape shape = from_root.tensor_shape();
        const std::vector<int64_t> rows = split_rows(shape[0], size());
        const std::vector<int64_t> offsets =
            offsets_of(rows, row_elements(shape) * int64_t(dtype_size(from_root.dtype)));
        shape[0] = rows[size_t(rank())];
        output = Tensor::empty(shape, from_root.dtype, device());
        transport_->begin();
        if (input.defined()) transport_->hold(input);
        transport_->hold(output);
        algorithms::scatter(*transport_, rank() == root ? input.raw_data() : nullptr,
                            output.raw_data(), offsets, root);
        transport_->end();
      });
  return output;
}

Tensor Communicator::reduce_scatter(const Tensor& input, ReduceOp op, Algorithm algorithm) {
  Tensor output;
  run(
      "reduce_scatter",
      [&] {
        check_tensor(*transport_, "reduce_scatter", "the input", input, true);
        if (input.dim() == 0)
          throw std::invalid_argument(fmt::format(
              "rank {}: reduce_scatter: the input must have a first dimension to split", rank()));
        if (op == ReduceOp::kAverage && input.dtype() == DType::Int64)
          throw std::invalid_argument(fmt::format(
              "rank {}: reduce_scatter: the average of {} is not defined here: sum, then divide",
              rank(), dtype_name(input.dtype())));
        check_algorithm(*transport_, "reduce_scatter", algorithm);
        if (algorithm == Algorithm::kNative && input.size(0) % size() != 0)
          throw std::invalid_argument(fmt::format(
              "{}: reduce_scatter (native): {} rows do not split evenly over {} ranks; the "
              "backend's reduce-scatter gives every rank the same count (the ring splits "
              "unevenly)",
              transport_->identity(), input.size(0), size()));
      },
      [&] {
        CallInfo mine = CallInfo::of(Collective::kReduceScatter, input);
        mine.op = op;
        mine.algorithm = algorithm;
        mine.chunk_bytes = chunk_bytes_.load();  // read once: agreed on, then used
        const size_t chunk_bytes = size_t(mine.chunk_bytes);
        agree(mine);
        const std::vector<int64_t> rows = split_rows(input.size(0), size());
        const std::vector<int64_t> bounds = offsets_of(rows, row_elements(input.shape()));
        Shape shape = input.shape();
        shape[0] = rows[size_t(rank())];
        output = Tensor::empty(shape, input.dtype(), device());  // this rank's rows, no more
        transport_->begin();
        transport_->hold(input);
        transport_->hold(output);
        if (algorithm == Algorithm::kNative) {
          // Equal blocks, one per rank, straight from the input into this rank's own.
          if (output.numel() > 0)
            transport_->native_reduce_scatter(input.raw_data(), output.raw_data(),
                                              output.numel(), input.dtype(), op);
          transport_->end();
          return;
        }
        // The ring works on a copy (every segment but ours ends partial),
        // scratch that goes back to the allocator at end().
        void* work = transport_->scratch(input.nbytes());
        if (input.nbytes() > 0) transport_->copy(work, input.raw_data(), input.nbytes(), 0);
        algorithms::ring_reduce_scatter(*transport_, work, bounds, input.dtype(),
                                        op == ReduceOp::kAverage ? 1.0f / float(size()) : 1.0f,
                                        chunk_bytes);
        const size_t esize = dtype_size(input.dtype());
        if (output.nbytes() > 0)
          transport_->copy(output.raw_data(),
                           static_cast<const char*>(work) + size_t(bounds[size_t(rank())]) * esize,
                           output.nbytes(), 0);
        transport_->end();
      });
  return output;
}

Tensor Communicator::all_gather(const Tensor& shard, Algorithm algorithm) {
  Tensor output;
  run(
      "all_gather",
      [&] {
        check_tensor(*transport_, "all_gather", "the shard", shard, false);
        if (shard.dim() == 0)
          throw std::invalid_argument(fmt::format(
              "rank {}: all_gather: the shard must have a first dimension to concatenate along",
              rank()));
        check_algorithm(*transport_, "all_gather", algorithm);
      },
      [&] {
        CallInfo mine = CallInfo::of(Collective::kAllGather, shard);
        mine.algorithm = algorithm;
        const std::vector<CallInfo> all = agree(mine);
        std::vector<int64_t> rows;
        for (const CallInfo& c : all) rows.push_back(c.shape[0]);
        const std::vector<int64_t> bounds = offsets_of(rows, row_elements(shard.shape()));
        Shape shape = shard.shape();
        shape[0] = offsets_of(rows, 1).back();
        output = Tensor::empty(shape, shard.dtype(), device());
        transport_->begin();
        transport_->hold(shard);
        transport_->hold(output);
        const int64_t esize = int64_t(dtype_size(shard.dtype()));
        if (algorithm == Algorithm::kNative) {
          if (output.nbytes() > 0)
            transport_->native_all_gather(shard.raw_data(), output.raw_data(),
                                          offsets_of(rows, row_elements(shape) * esize));
          transport_->end();
          return;
        }
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

void Communicator::point_to_point(const char* name, const Tensor* out, int to, const Tensor* in,
                                  int from) {
  run(
      name,
      [&] {
        const bool ring_of_one = out && in && to == rank() && from == rank();
        if (out) {
          check_tensor(*transport_, name, in ? "the tensor to send" : "the tensor", *out, false);
          check_peer(*transport_, name, in ? "destination" : "peer", to, true, ring_of_one);
        }
        if (in) {
          check_tensor(*transport_, name, out ? "the tensor to receive" : "the tensor", *in, false);
          check_peer(*transport_, name, out ? "source" : "peer", from, false, ring_of_one);
        }
      },
      [&] {
        std::string what;
        if (out)
          what = fmt::format("send of {} {} to {}", dtype_name(out->dtype()),
                             shape_str(out->shape()), transport_->peer_name(to));
        if (in)
          what += fmt::format("{}receive of {} {} from {}", what.empty() ? "" : " and ",
                              dtype_name(in->dtype()), shape_str(in->shape()),
                              transport_->peer_name(from));
        transport_->set_context(what);
        debug_call_ = what;
        debug_bytes_ = (out ? out->nbytes() : 0) + (in ? in->nbytes() : 0);
        // This rank's side with each peer (one, or two in a ring).
        std::vector<int> peers;
        std::vector<PeerCall> sides;
        auto side = [&](int peer) -> PeerCall& {
          for (size_t i = 0; i < peers.size(); ++i)
            if (peers[i] == peer) return sides[i];
          peers.push_back(peer);
          return sides.emplace_back();
        };
        if (out) side(to).send = CallInfo::of(Collective::kSend, *out);
        if (in) side(from).recv = CallInfo::of(Collective::kRecv, *in);
        agree_with_peers(std::move(peers), std::move(sides));
        std::vector<Message> messages;
        if (out && out->nbytes() > 0)
          messages.push_back({Message::kSend, to, out->raw_data(), out->nbytes()});
        if (in && in->nbytes() > 0)
          messages.push_back({Message::kRecv, from, in->raw_data(), in->nbytes()});
        transport_->begin();
        if (out) transport_->hold(*out);
        if (in) transport_->hold(*in);
        transport_->post(messages);
        transport_->end();
      });
}

void Communicator::send(const Tensor& tensor, int peer) {
  point_to_point("send", &tensor, peer, nullptr, -1);
}

void Communicator::recv(const Tensor& tensor, int peer) {
  point_to_point("recv", nullptr, -1, &tensor, peer);
}

void Communicator::sendrecv(const Tensor& send_tensor, int to, const Tensor& recv_tensor,
                            int from) {
  point_to_point("sendrecv", &send_tensor, to, &recv_tensor, from);
}

std::unique_ptr<Communicator> Communicator::split(int color, int key, const std::string& name) {
  std::unique_ptr<Communicator> group;
  run(
      "split",
      [&] {
        if (color < 0 && color != kNoColor)
          throw std::invalid_argument(fmt::format(
              "{}: split: color {} is negative: a group's color is 0 or more, and kNoColor "
              "({}) joins no group",
              transport_->identity(), color, kNoColor));
      },
      [&] {
        CallInfo mine;
        mine.collective = Collective::kSplit;
        mine.color = color;
        mine.key = key;
        // Every rank's color and key: the agreement's answer.
        const std::vector<CallInfo> all = agree(mine);
        Transport::Place place;
        if (color != kNoColor) {
          std::vector<int> members;  // in rank order, so the stable sort breaks ties by rank
          std::set<int> colors;
          for (int j = 0; j < size(); ++j) {
            if (all[size_t(j)].color >= 0) colors.insert(all[size_t(j)].color);
            if (all[size_t(j)].color == color) members.push_back(j);
          }
          std::stable_sort(members.begin(), members.end(), [&](int a, int b) {
            return all[size_t(a)].key < all[size_t(b)].key;
          });
          place.size = int(members.size());
          place.rank = int(std::find(members.begin(), members.end(), rank()) - members.begin());
          for (int m : members) place.world.push_back(transport_->world_rank(m));
          place.label = fmt::format("{}group {} of {}", name.empty() ? "" : name + " ",
                                    std::distance(colors.begin(), colors.find(color)),
                                    colors.size());
        }
        std::unique_ptr<Transport> t = transport_->split(color, key, place);
        if (t) group = std::make_unique<Communicator>(std::move(t), options());
      });
  return group;
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
