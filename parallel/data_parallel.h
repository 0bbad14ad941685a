// Data-parallel training: one replica of the model per rank (a GPU, or an
// MPI process), each fed its shard of every batch, kept identical by
// reducing their gradients after every backward, as PyTorch's
// DistributedDataParallel does (docs/parallel.md, "Data-parallel training").
//
//   auto comm = parallel::mpi_world();                 // or nccl_communicator(...)
//   parallel::DataParallel replicas(*comm, model, {});  // rank 0's weights everywhere
//   train_loader.set_shard(comm->rank(), comm->size());
//   train::EpochOptions o;  o.replicas = &replicas;
//   train::train_epoch(model, optimizer, train_loader, device, o);
//
// Gradients are reduced in buckets of about `bucket_bytes`, filled in the
// reverse order of the parameters (about the order backward finishes them),
// and reduced in that order on every rank, as DDP's reducer does. With
// overlap, a bucket is copied into its flat buffer and its all-reduce
// started once its last gradient is final (a post-accumulate hook on each
// parameter) and every bucket before it has started, while backward goes on
// with the layers below; without, every bucket is reduced after backward. Each rank backpropagates its share
// of the batch's mean loss (train_epoch), so that the sum over the ranks is
// the whole batch's mean gradient even when the shards differ in size.
//
// Over a group of one rank (one_rank_group) it does nothing at all: no
// buffers, hooks, copies or collectives, so a run on one device costs what
// it would without it.
//
// Gradients in bfloat16 (DataParallelOptions::grad_dtype): each rank's
// gradient is rounded once to bfloat16, and the ring's n-1 steps round each
// partial sum once more, so a reduced gradient is within about
// (1 + (n-1)) * 2^-8 * sum_r |g_r| of the float32 sum (docs/parallel.md,
// "Gradients in bfloat16").
//
// A parameter that no rank's batch reaches keeps no gradient, as on one
// device (SGD then leaves it alone); one backward per step (a second is
// refused: its gradients would arrive after their bucket was sent).
//
// BatchNorm: each replica normalises with its own batch's statistics (as
// DataParallel and DDP do); after every step the running statistics (every
// buffer) are rank 0's on every rank, as DDP's broadcast_buffers keeps them.
#pragma once
#include <cstddef>
#include <memory>
#include <utility>
#include <vector>

#include "nn/layers.h"
#include "nn/module.h"
#include "nn/optim.h"
#include "nn/train.h"
#include "parallel/communicator.h"

namespace anvil::parallel {

struct DataParallelOptions {
  Algorithm algorithm = Algorithm::kRing;
  size_t bucket_bytes = size_t(25) << 20;  // PyTorch DDP's bucket_cap_mb = 25
  bool overlap = true;                      // reduce each bucket during backward
  // BatchNorm layers normalise with the statistics of the whole batch, every
  // rank's part together (SyncBatchNorm; parallel/sync_batch_norm.h): the
  // replicas then compute what one device would. Every rank's part of every
  // batch must be non-empty.
  bool sync_batch_norm = false;
  // The dtype gradients travel in: float32, or bfloat16 for half the bytes
  // on the wire (PyTorch DDP's bf16_compress_hook). With bfloat16 each
  // bucket's float32 gradients are rounded into a bfloat16 buffer, summed by
  // the all-reduce in float32 arithmetic (Communicator::allreduce), and
  // widened back into the float32 .grad; the buckets, their order and their
  // fingerprints stay as they are. Every rank must use the same (the
  // constructor checks, naming the ranks).
  DType grad_dtype = DType::Float32;
};

// Rank 0's parameters and buffers of `model`, and (when given, over
// model.parameters()) its SGD momentum buffers, on every rank of `comm`: a
// collective, one broadcast per dtype. DataParallel's broadcast_state, and a
// pipeline's start, where every rank holds the whole model.
void broadcast_state(Communicator& comm, const nn::Module& model, optim::SGD* optimizer,
                     Algorithm algorithm = Algorithm::kRing);
// The broadcasts of a run whose gradients are all-reduced by `allreduce`:
// the transport's own with native, else anvil's ring (naive has none).
inline Algorithm broadcast_algorithm(Algorithm allreduce) {
  return allreduce == Algorithm::kNative ? Algorithm::kNative : Algorithm::kRing;
}

// An epoch's running totals summed over the ranks of `comm`, in place
// (train::Replicas::sum_totals): loss_sum (float32 scalar) and correct
// (int64 scalar) on comm's device, examples on the host.
void sum_totals(Communicator& comm, const Tensor& loss_sum, const Tensor& correct,
                int64_t& examples);

class DataParallel final : public train::Replicas, public nn::BatchNormSync {
 public:
  // Gives every rank rank 0's parameters and buffers (a collective: every
  // rank constructs its DataParallel at the same point).
  DataParallel(Communicator& comm, nn::Module& model, DataParallelOptions options);
  ~DataParallel() override;  // takes its hooks off the parameters
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  Communicator& comm() { return comm_; }
  const DataParallelOptions& options() const { return options_; }
  // How the parameters were grouped: each bucket's parameter indices (into
  // model.parameters()), in the order they are reduced.
  const std::vector<std::vector<size_t>>& buckets() const { return bucket_params_; }

  // Rank 0's parameters, buffers and (when given) SGD momentum buffers on
  // every rank: at the start of a run, and after rank 0 alone has read a
  // checkpoint.
  void broadcast_state(optim::SGD* optimizer = nullptr);

  // Gradient accumulation, as DDP's no_sync(): while the returned scope
  // lives, steps (begin_step .. after_backward) reduce nothing and each
  // rank's gradients accumulate in .grad; the first synced step after it
  // reduces the sum of them all. Every rank must skip the same steps.
  class NoSync {
   public:
    explicit NoSync(DataParallel& dp) : dp_(&dp) { dp.sync_ = false; }
    ~NoSync() {
      if (dp_) dp_->sync_ = true;
    }
    NoSync(NoSync&& other) noexcept : dp_(std::exchange(other.dp_, nullptr)) {}
    NoSync(const NoSync&) = delete;
    NoSync& operator=(const NoSync&) = delete;
    NoSync& operator=(NoSync&&) = delete;

   private:
    DataParallel* dp_;
  };
  [[nodiscard]] NoSync no_sync() { return NoSync(*this); }

  // train::Replicas
  void begin_step(int64_t examples, int64_t global_examples) override;
  void begin_forward(int64_t examples, int64_t global_examples) override;
  void after_backward() override;
  void set_no_sync(bool no_sync) override { sync_ = !no_sync; }
  void sum_totals(const Tensor& loss_sum, const Tensor& correct, int64_t& examples) override;
  bool capturable() const override { return comm_.size() == 1; }  // one rank does nothing
  // nn::BatchNormSync (with sync_batch_norm): after begin_step or
  // begin_forward, until after_backward, over that micro-batch's global
  // count. Its collectives' fingerprints name the layer and the forward (the
  // how-many-th begin_step or begin_forward of the run), so that ranks that
  // would pair different layers or micro-batches are refused at once.
  Tensor forward(nn::BatchNorm2d& bn, const Tensor& x) override;

 private:
  struct Bucket;
  // Throws, on every rank, when the ranks' grad_dtype differ.
  void check_grad_dtype();
  void on_gradient(size_t param);  // a parameter's gradient is final
  void launch(Bucket& bucket);     // copy into the flat buffer, start its all-reduce
  Algorithm broadcast_algorithm() const { return parallel::broadcast_algorithm(options_.algorithm); }

  Communicator& comm_;
  nn::Module& model_;
  DataParallelOptions options_;
  std::vector<Tensor> params_;
  std::vector<std::vector<size_t>> bucket_params_;
  std::vector<std::unique_ptr<Bucket>> buckets_;
  std::vector<size_t> bucket_of_;  // parameter -> bucket
  size_t next_bucket_ = 0;         // buckets [0, next_bucket_) started in this step
  std::vector<bool> final_;        // parameter -> its gradient came in this step
  bool in_step_ = false;  // between begin_step and after_backward
  // SyncBN's forward: the global count of the micro-batch it normalises,
  // from begin_step or begin_forward until after_backward, and how many
  // forwards were opened so far.
  int64_t bn_global_ = 0;
  bool bn_open_ = false;
  uint64_t bn_forwards_ = 0;
  bool sync_ = true;          // false inside no_sync()
  bool reduce_step_ = false;  // this step's gradients are reduced (sync_ at begin_step)
  std::vector<nn::BatchNorm2d*> synced_;
};

}  // namespace anvil::parallel
