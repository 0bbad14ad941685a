// Tensor (channel) parallel, Megatron-LM's way (docs/parallel.md, "Tensor
// parallel"): a pair of consecutive linear layers split over the ranks of a
// tensor-parallel group, the first by its output units (column-parallel:
// rank r computes units [r out/N, (r+1) out/N) of every example), the second
// by its inputs (row-parallel: rank r multiplies those units by its columns
// of the weight), so that the layer between them (a ReLU) runs on each
// rank's units alone and the pair needs one all-reduce forward (of the
// second layer's partial outputs) and one backward (of the first layer's
// input gradient). Every other layer runs on every rank of the group, on the
// same data (replicated), so its gradients are the same on every rank and
// need no communication.
//
// Which layers pair up is the model's choice: LeNet's 7 (Linear(800, 128))
// and 9 (Linear(128, 10)), with the ReLU 8 between them (lenet_tensor_pairs).
#pragma once
#include <memory>
#include <utility>
#include <vector>

#include "nn/layers.h"
#include "parallel/communicator.h"

namespace anvil::parallel {

// Megatron's f: the identity forward; backward, the gradient all-reduced
// (summed) over `comm`. Before a column-parallel layer, whose every rank
// sends back the part of its input's gradient that its units give.
Tensor copy_to_tensor_parallel(Communicator& comm, const Tensor& x);
// Megatron's g: forward, x all-reduced (summed) over `comm`; backward, the
// identity. After a row-parallel layer, whose ranks each have a partial sum.
Tensor reduce_from_tensor_parallel(Communicator& comm, const Tensor& x);

// A Linear split over the ranks of `comm`: this rank's part of its weight
// (and bias), leaves of their own, copied from the whole layer's.
class SplitLinear : public nn::Module {
 public:
  // Every rank's part into `full`'s weight and bias (a collective of comm).
  virtual void gather_into(nn::Linear& full) const = 0;
  Tensor weight, bias;

 protected:
  SplitLinear(Communicator& comm, const nn::Linear& full, const char* split_units);
  Communicator& comm_;
  int64_t in_, out_;
};

// Rank r's rows [r out/N, (r+1) out/N) of the weight and bias: its forward
// gives those output units, [B, out/N].
class ColumnParallelLinear final : public SplitLinear {
 public:
  ColumnParallelLinear(Communicator& comm, const nn::Linear& full);
  Tensor forward(const Tensor& x) override;
  std::string describe() const override;
  void gather_into(nn::Linear& full) const override;
};

// Rank r's columns [r in/N, (r+1) in/N) of the weight, and all of the bias:
// its forward takes those input units [B, in/N] and gives the whole output,
// the partial products summed over the ranks, then the bias added.
class RowParallelLinear final : public SplitLinear {
 public:
  RowParallelLinear(Communicator& comm, const nn::Linear& full);
  Tensor forward(const Tensor& x) override;
  std::string describe() const override;
  void gather_into(nn::Linear& full) const override;
};

// The model's (column, row) pairs of layer indices: LeNet's {7, 9}. Throws
// std::invalid_argument for a model without any.
std::vector<std::pair<size_t, size_t>> lenet_tensor_pairs();

// `model` with each pair's layers split over `comm` (their shards copied
// from the model's weights) and every other layer shared with it (the same
// modules), under the model's names: its state dict has the model's keys,
// the split ones holding this rank's part. Checks that each pair is two
// Linear layers whose shapes divide by the group's size (std::invalid_argument).
std::shared_ptr<nn::Sequential> split_tensor_parallel(
    Communicator& comm, const nn::Sequential& model,
    const std::vector<std::pair<size_t, size_t>>& pairs);

// The split layers' shards of `split` back into `model`'s whole weights, so
// that one rank can save the model as one file: a collective of comm.
void gather_tensor_parallel(const nn::Sequential& split, nn::Sequential& model);

}  // namespace anvil::parallel
