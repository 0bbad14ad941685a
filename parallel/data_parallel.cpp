#include "parallel/data_parallel.h"

#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>

#include "core/autograd.h"
#include "core/backend.h"
#include "core/profile.h"
#include "parallel/fingerprint.h"
#include "parallel/sync_batch_norm.h"

namespace anvil::parallel {

struct DataParallel::Bucket {
  std::vector<size_t> params;    // indices into params_
  std::vector<int64_t> offsets;  // where each one's gradient starts in `flat`
  // The bucket's gradients, end to end, then one number per parameter: 1 on
  // a rank that has its gradient, 0 on one that has none. Summed, it says
  // whether any rank has it. In the options' grad_dtype (counts up to 256
  // ranks are exact in bfloat16).
  Tensor flat;
  int64_t counts = 0;            // where those flags start in `flat`
  uint64_t fingerprint = 0;      // its parameters' names and shapes, hashed
  size_t ready = 0;              // gradients final so far in this backward
  std::shared_ptr<Work> work;    // its all-reduce, once launched
};

namespace {

// Rank 0's values of all `tensors` on every rank, in one broadcast per dtype
// (copied end to end into one buffer and back) rather than one per tensor.
void broadcast_together(Communicator& comm, const std::vector<Tensor>& tensors,
                        Algorithm algorithm) {
  NoGradGuard no_grad;
  for (DType dtype : {DType::Float32, DType::Int64, DType::UInt8, DType::BFloat16}) {
    int64_t total = 0;
    for (const Tensor& t : tensors)
      if (t.dtype() == dtype) total += t.numel();
    if (total == 0) continue;
    Tensor flat = Tensor::empty({total}, dtype, comm.device());
    int64_t offset = 0;
    for (const Tensor& t : tensors) {
      if (t.dtype() != dtype) continue;
      flat.narrow(offset, t.numel()).copy_(t.reshape({t.numel()}));
      offset += t.numel();
    }
    comm.broadcast(flat, 0, algorithm);
    offset = 0;
    for (const Tensor& t : tensors) {
      if (t.dtype() != dtype) continue;
      Tensor dst = t;
      dst.copy_(flat.narrow(offset, t.numel()).reshape(t.shape()));
      offset += t.numel();
    }
  }
}

// dst = src, converted when their dtypes differ (a float32 gradient and a
// bfloat16 bucket).
void put(const Tensor& src, const Tensor& dst) {
  if (src.dtype() == dst.dtype()) {
    Tensor d = dst;
    d.copy_(src);
  } else {
    backend_for(dst.device()).convert(src, dst);
  }
}

std::vector<Tensor> buffers_of(const nn::Module& model) {
  std::vector<Tensor> out;
  for (auto& [name, b] : model.named_buffers()) out.push_back(b);
  return out;
}

}  // namespace

DataParallel::DataParallel(Communicator& comm, nn::Module& model, DataParallelOptions options)
    : comm_(comm), model_(model), options_(options), params_(model.parameters()) {
  const nn::NamedTensors named = model.named_parameters();
  for (const auto& [name, p] : named)
    if (p.device() != comm.device())
      throw std::invalid_argument(fmt::format(
          "DataParallel: parameter '{}' is on {}, but rank {}'s communicator moves tensors on {}",
          name, p.device().str(), comm.rank(), comm.device().str()));
  if (options_.grad_dtype != DType::Float32 && options_.grad_dtype != DType::BFloat16)
    throw std::invalid_argument(fmt::format(
        "DataParallel: rank {}: gradients are reduced in float32 or bfloat16, not {} "
        "(DataParallelOptions::grad_dtype)",
        comm.rank(), dtype_name(options_.grad_dtype)));
  // One rank: its gradients are already the batch's; no buckets, no hooks.
  if (comm.size() == 1) return;
  check_grad_dtype();
  // Buckets in the reverse order of the parameters: backward finishes the
  // last layers first, so their bucket can go while it works on the rest.
  bucket_of_.resize(params_.size());
  size_t bytes = 0;
  for (size_t k = params_.size(); k-- > 0;) {
    const size_t size = params_[k].nbytes();
    if (bucket_params_.empty() || (bytes > 0 && bytes + size > options_.bucket_bytes)) {
      bucket_params_.emplace_back();
      bytes = 0;
    }
    bucket_params_.back().push_back(k);
    bucket_of_[k] = bucket_params_.size() - 1;
    bytes += size;
  }
  for (const auto& members : bucket_params_) {
    auto b = std::make_unique<Bucket>();
    b->params = members;
    int64_t numel = 0;
    for (size_t k : members) {
      b->offsets.push_back(numel);
      numel += params_[k].numel();
      b->fingerprint = fingerprint_of(b->fingerprint, named[k].first);
      for (int64_t d : params_[k].shape()) b->fingerprint = fingerprint_of(b->fingerprint, d);
    }
    b->counts = numel;
    b->flat =
        Tensor::zeros({numel + int64_t(members.size())}, options_.grad_dtype, comm.device());
    buckets_.push_back(std::move(b));
  }
  if (options_.overlap)
    for (size_t k = 0; k < params_.size(); ++k)
      params_[k].register_post_accumulate_grad_hook([this, k](const Tensor&) { on_gradient(k); });
  if (options_.sync_batch_norm)
    for (nn::Module* m : model.modules())
      if (auto* bn = dynamic_cast<nn::BatchNorm2d*>(m)) {
        bn->sync = this;
        synced_.push_back(bn);
      }
  broadcast_state();
}

DataParallel::~DataParallel() {
  if (options_.overlap && comm_.size() > 1)
    for (const Tensor& p : params_) p.clear_post_accumulate_grad_hooks();
  for (nn::BatchNorm2d* bn : synced_) bn->sync = nullptr;
}

Tensor DataParallel::forward(nn::BatchNorm2d& bn, const Tensor& x) {
  if (!bn_open_ || comm_.size() == 1) return Tensor();  // evaluation, recalibration: this rank's batch alone
  if (x.size(0) == 0)
    throw std::invalid_argument(fmt::format(
        "DataParallel: rank {} has no example of this micro-batch of {}: with sync_batch_norm "
        "every rank needs part of every micro-batch (a smaller last batch, or a larger global "
        "batch)",
        comm_.rank(), bn_global_));
  const int64_t per_example = x.numel() / x.size(0) / x.size(1);  // H * W
  const int64_t layer = std::find(synced_.begin(), synced_.end(), &bn) - synced_.begin();
  const uint64_t fingerprint = fingerprint_of(fingerprint_of(0, layer), int64_t(bn_forwards_));
  return sync_batch_norm(comm_, x, bn.weight, bn.bias, bn.running_mean, bn.running_var,
                         bn.momentum, bn.eps, bn_global_ * per_example, fingerprint);
}

void DataParallel::check_grad_dtype() {
  // Every rank's choice, gathered (an all-gather exchanges its shapes anyway,
  // so a mismatch is caught here, before the first step, and named).
  const Tensor mine = Tensor::from_vector(
      std::vector<int64_t>{int64_t(options_.grad_dtype)}, {1}, comm_.device());
  const std::vector<int64_t> all = comm_.all_gather(mine).to_int_vector();
  for (size_t j = 1; j < all.size(); ++j)
    if (all[j] != all[0])
      throw std::invalid_argument(fmt::format(
          "DataParallel: rank {}: ranks reduce gradients in different dtypes: rank 0 in {}, rank "
          "{} in {} (DataParallelOptions::grad_dtype, anvil-train --grad-dtype): every rank must "
          "use the same",
          comm_.rank(), dtype_name(DType(all[0])), j, dtype_name(DType(all[j]))));
}

void broadcast_state(Communicator& comm, const nn::Module& model, optim::SGD* optimizer,
                     Algorithm algorithm) {
  NoGradGuard no_grad;
  const std::vector<Tensor> params = model.parameters();
  std::vector<Tensor> state = params;
  for (const Tensor& b : buffers_of(model)) state.push_back(b);
  broadcast_together(comm, state, algorithm);
  if (optimizer == nullptr) return;
  optimizer->cast_cache().clear();  // the weights changed under any bfloat16 copies
  // Which parameters have a momentum buffer is rank 0's to say, then its values.
  std::vector<Tensor> momentum = optimizer->momentum_buffers();
  std::vector<int64_t> has(momentum.size());
  for (size_t k = 0; k < momentum.size(); ++k) has[k] = momentum[k].defined();
  Tensor mask = Tensor::from_vector(has, {int64_t(has.size())}, comm.device());
  comm.broadcast(mask, 0, algorithm);
  comm.synchronize();
  has = mask.to_int_vector();
  std::vector<Tensor> defined;
  for (size_t k = 0; k < momentum.size(); ++k) {
    if (!has[k]) {
      momentum[k] = Tensor();
      continue;
    }
    if (!momentum[k].defined())
      momentum[k] = Tensor::zeros(params[k].shape(), DType::Float32, comm.device());
    defined.push_back(momentum[k]);
  }
  broadcast_together(comm, defined, algorithm);
  optimizer->load_momentum_buffers(momentum);
}

void sum_totals(Communicator& comm, const Tensor& loss_sum, const Tensor& correct,
                int64_t& examples) {
  Tensor count = Tensor::from_vector(std::vector<int64_t>{examples}, {1}, comm.device());
  comm.allreduce(loss_sum);
  comm.allreduce(correct);
  comm.allreduce(count);
  comm.synchronize();
  examples = count.to_int_vector()[0];
}

void DataParallel::broadcast_state(optim::SGD* optimizer) {
  if (comm_.size() == 1) return;  // rank 0's state is this rank's
  parallel::broadcast_state(comm_, model_, optimizer, broadcast_algorithm());
}

void DataParallel::begin_forward(int64_t, int64_t global_examples) {
  bn_global_ = global_examples;
  bn_open_ = true;
  ++bn_forwards_;
}

void DataParallel::begin_step(int64_t examples, int64_t global_examples) {
  begin_forward(examples, global_examples);
  in_step_ = true;
  reduce_step_ = sync_;  // inside no_sync(): gradients only accumulate
  next_bucket_ = 0;
  final_.assign(params_.size(), false);
  for (auto& b : buckets_) {
    b->ready = 0;
    b->work.reset();
  }
}

void DataParallel::on_gradient(size_t param) {
  if (!in_step_ || !reduce_step_) return;  // outside a training step (a test), or no_sync()
  // A second gradient in one step would land after its bucket was copied
  // for the all-reduce and be lost: refused, rather than dropped.
  if (final_[param]) {
    std::string name;
    for (const auto& [n, p] : model_.named_parameters())
      if (p.same(params_[param])) name = n;
    throw std::logic_error(fmt::format(
        "DataParallel: rank {}: parameter '{}' got a second gradient in one training step (a "
        "second backward() between begin_step and after_backward); its gradients are reduced "
        "once per step: call backward() once per step",
        comm_.rank(), name));
  }
  final_[param] = true;
  ++buckets_[bucket_of_[param]]->ready;
  // Buckets start in index order on every rank, whatever order backward
  // finishes them in (a weight before its bias, a shortcut before the
  // convolutions ahead of it), so that every rank's collectives meet: a full
  // bucket waits for the ones before it, then goes with every full one after.
  while (next_bucket_ < buckets_.size() &&
         buckets_[next_bucket_]->ready == buckets_[next_bucket_]->params.size())
    launch(*buckets_[next_bucket_++]);
}

void DataParallel::launch(Bucket& b) {
  NoGradGuard no_grad;
  profile::Scope scope(profile::Family::AllReduce, "all-reduce: bucket", true);
  Backend& backend = backend_for(b.flat.device());
  Tensor counts = b.flat.narrow(b.counts, int64_t(b.params.size()));
  backend.fill(counts, 1.0);
  for (size_t i = 0; i < b.params.size(); ++i) {
    const Tensor& p = params_[b.params[i]];
    Tensor slot = b.flat.narrow(b.offsets[i], p.numel());
    const Tensor g = p.grad();
    if (g.defined()) {
      // Into bfloat16, rounded to nearest even: the one rounding of this
      // rank's own gradient.
      put(g.reshape({p.numel()}), slot);
    } else {  // a parameter this rank's batch did not reach
      backend.fill(slot, 0.0);
      Tensor count = counts.narrow(int64_t(i), 1);
      backend.fill(count, 0.0);
    }
  }
  b.work = comm_.allreduce_async(b.flat, ReduceOp::kSum, options_.algorithm, b.fingerprint);
}

void DataParallel::after_backward() {
  bn_open_ = false;
  if (comm_.size() == 1 || !reduce_step_) {  // one rank, or inside no_sync()
    in_step_ = false;
    return;
  }
  NoGradGuard no_grad;
  // The wait for the reductions, as the profiler's all-reduce (core/profile.h).
  profile::Scope scope(profile::Family::AllReduce, "all-reduce: wait", true);
  // The rest, in order: all of them without overlap or on a rank with no
  // example; from the first with a gradient that never came otherwise.
  while (next_bucket_ < buckets_.size()) launch(*buckets_[next_bucket_++]);
  for (auto& b : buckets_) {
    b->work->wait();
    b->work.reset();
    // How many ranks have each gradient, read (a wait on the host) only where
    // this rank has none: a parameter no rank's batch reached stays without
    // one, as on one device, so SGD leaves it alone.
    std::vector<float> counts;
    for (size_t i = 0; i < b->params.size() && counts.empty(); ++i)
      if (!params_[b->params[i]].grad().defined())
        counts = b->flat.narrow(b->counts, int64_t(b->params.size())).to_vector();
    for (size_t i = 0; i < b->params.size(); ++i) {
      const Tensor& p = params_[b->params[i]];
      Tensor g = p.grad();
      if (!g.defined()) {
        if (counts[i] == 0) continue;
        g = Tensor::empty(p.shape(), DType::Float32, p.device());
        p.set_grad(g);
      }
      put(b->flat.narrow(b->offsets[i], p.numel()).reshape(p.shape()), g);
    }
  }
  in_step_ = false;
  // Every rank keeps rank 0's buffers (BatchNorm's running statistics).
  broadcast_together(comm_, buffers_of(model_), broadcast_algorithm());
}

void DataParallel::sum_totals(const Tensor& loss_sum, const Tensor& correct, int64_t& examples) {
  if (comm_.size() == 1) return;  // the totals are already the whole batch's
  parallel::sum_totals(comm_, loss_sum, correct, examples);
}

}  // namespace anvil::parallel
