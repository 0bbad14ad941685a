// Tensor (channel) parallel, Megatron-LM's way (docs/parallel.md, "Tensor
// parallel"): layers split over the ranks of a tensor-parallel group in
// pairs, the first by its output units or channels (column-parallel: rank r
// computes outputs [r out/N, (r+1) out/N) of every example), the second by
// its inputs (row-parallel: rank r applies its columns of the weight to
// those outputs), so that the layers between them, which act on each unit
// or channel alone (ReLU, pooling, BatchNorm: each channel's statistics are
// its own), run on each rank's part, and a pair needs one all-reduce
// forward (of the second layer's partial sums) and one backward (of the
// first layer's input gradient). A column-parallel layer whose output is
// needed whole (it is not followed by a row-parallel one) all-gathers its
// channels. Every other layer runs whole on every rank, on the same data
// (replicated), so its gradients are the same on every rank and need no
// communication.
//
// Which layers split is the model's choice (tensor_parallel_plan):
//   LeNet      Linear 7 (column) and Linear 9 (row), the ReLU 8 between;
//              the convolutions whole.
//   ResNet-18  in each of the 8 residual blocks, conv1 (column) and conv2
//              (row), bn1 and the ReLU between on each rank's channels;
//              the shortcut's 1x1 conv3 column-parallel with its channels
//              all-gathered before the addition (it cannot pair: its
//              output meets conv2's, which is whole); the stem, bn2, the
//              additions, the pooling and fc whole.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "nn/layers.h"
#include "parallel/communicator.h"

namespace anvil::parallel {

// Megatron's f: the identity forward; backward, the gradient all-reduced
// (summed) over `comm`. Before a column-parallel layer, whose every rank
// sends back the part of its input's gradient that its outputs give.
Tensor copy_to_tensor_parallel(Communicator& comm, const Tensor& x);
// Megatron's g: forward, x all-reduced (summed) over `comm`; backward, the
// identity. After a row-parallel layer, whose ranks each have a partial sum.
Tensor reduce_from_tensor_parallel(Communicator& comm, const Tensor& x);
// Every rank's channels (dim 1) gathered: rank r's [B, c, ...] are channels
// [r c, (r+1) c) of the [B, N c, ...] that every rank gets. Backward, this
// rank's channels of the gradient (which every rank has whole and the same:
// the layers after it run whole).
Tensor gather_channels(Communicator& comm, const Tensor& x);

// Elements [start, start + length) of t along dim, as a new tensor on t's
// device (no autograd).
Tensor slice_along(const Tensor& t, int64_t dim, int64_t start, int64_t length);
// Every rank's part along dim (parts of one shape), put side by side in rank
// order: slice_along's inverse over the group. A collective of comm.
Tensor gather_along(Communicator& comm, const Tensor& part, int64_t dim);

// A module of the split model that holds parts of the whole model's tensors.
class TensorParallelModule : public nn::Module {
 public:
  // Its state-dict keys (its own names, as in the whole layer's state dict)
  // that hold this rank's part, and the dimension they are split along; every
  // other tensor it holds is whole.
  virtual std::vector<std::pair<std::string, int64_t>> split_tensors() const = 0;
};

// A Linear or a Conv2d split over the ranks of a group.
//   kColumn          rank r's rows of the weight and the bias (output units
//                    or channels); input through Megatron's f.
//   kColumnGathered  the same, its output channels then all-gathered.
//   kRow             rank r's columns of the weight (input units or
//                    channels), the partial sums summed by Megatron's g
//                    (in the activations' dtype: bfloat16 under autocast,
//                    half the bytes), then the whole bias added.
class SplitLayer final : public TensorParallelModule {
 public:
  enum class Kind : uint8_t { kColumn, kColumnGathered, kRow };
  // `full` is an nn::Linear or nn::Conv2d whose outputs (column) or inputs
  // (row) divide by the group's size; std::invalid_argument otherwise.
  SplitLayer(Communicator& comm, const nn::Module& full, Kind kind);
  Tensor forward(const Tensor& x) override;
  // A column-parallel forward of an input already through
  // copy_to_tensor_parallel (a residual block's conv1 and conv3 share one f).
  Tensor forward_copied(const Tensor& x);
  std::string describe() const override;
  std::vector<std::pair<std::string, int64_t>> split_tensors() const override;
  Kind kind() const { return kind_; }
  Tensor weight, bias;

 private:
  Tensor apply(const Tensor& x, const Tensor& b) const;  // the linear map or convolution
  Communicator& comm_;
  Kind kind_;
  bool conv_;
  int64_t in_, out_, kernel_ = 1, stride_ = 1, padding_ = 0;
};

// nn::Residual with conv1 and conv2 a pair, bn1 on this rank's channels and
// conv3 column-parallel with its channels gathered (see above); bn2 is the
// whole block's own module. Children under the block's names, so that its
// state dict has the block's keys.
class TensorParallelResidual final : public TensorParallelModule {
 public:
  TensorParallelResidual(Communicator& comm, const nn::Residual& full);
  Tensor forward(const Tensor& x) override;
  std::string describe() const override { return "TensorParallelResidual"; }
  std::vector<std::pair<std::string, int64_t>> split_tensors() const override;

 private:
  Communicator& comm_;
  std::shared_ptr<SplitLayer> conv1_, conv2_, conv3_;  // conv3_ null for an identity shortcut
  std::shared_ptr<nn::BatchNorm2d> bn1_, bn2_;
};

// Which layers of a model split (the model's choice, above).
struct TensorParallelPlan {
  // (column, row) pairs of Linear layers, by their index in the model's
  // Sequential; the layers between act on each unit alone.
  std::vector<std::pair<size_t, size_t>> linear_pairs = {};
  // Residual blocks split inside, by name ("resnet_block2.0").
  std::vector<std::string> residual_blocks = {};
};
// For the run's header: "Linear 7 split by its output units, Linear 9 by
// its inputs (...); the other layers run whole on each".
std::string describe_plan(const TensorParallelPlan& plan);
// The plan of --model `model` ("lenet", "resnet18", "resnet18-96");
// std::invalid_argument naming the models that have one, otherwise.
TensorParallelPlan tensor_parallel_plan(const std::string& model);

// `model` with the plan's layers split over `comm` (their parts copied from
// the model's weights, buffers included) and every other layer shared with
// it (the same modules), under the model's names: its state dict has the
// model's keys, the split ones holding this rank's part. Checks the plan
// against the model: a pair that is not a Linear and the Linear after it
// that takes its outputs, a block that is not a Residual, sizes that do not
// divide by the group's size (std::invalid_argument, naming them).
std::shared_ptr<nn::Sequential> split_tensor_parallel(Communicator& comm,
                                                      const nn::Sequential& model,
                                                      const TensorParallelPlan& plan);

// Which of a pipeline's layers (pipeline_layers' names) may begin a stage:
// not those whose input is split, between a pair's column-parallel layer and
// its row-parallel one (what crosses from stage to stage is whole). For
// balance_stages.
std::vector<bool> stage_starts(const std::vector<std::string>& layer_names,
                               const nn::Sequential& model, const TensorParallelPlan& plan);

// The split model's keys that hold this rank's part, and the dimension each
// is split along (the layers' split_tensors(), under the model's names).
std::map<std::string, int64_t> split_tensors(const nn::Sequential& split);

// Every tensor of `split` into `model`'s whole one of the same key: the
// parts gathered over `comm` (a collective), the whole ones copied (those
// shared with the model are the same already), so that one rank can save
// the model as one file.
void gather_tensor_parallel(Communicator& comm, const nn::Sequential& split,
                            nn::Sequential& model);

// Momentum buffers (SGD's, one per parameter, undefined before its first
// step) between the split model's parameters and the whole model's, in
// each one's parameter order: gathered over `comm` (a collective), or this
// rank's parts of the whole ones.
std::vector<Tensor> gather_momentum(Communicator& comm, const nn::Sequential& split,
                                    const std::vector<Tensor>& split_momentum,
                                    const nn::Module& model);
std::vector<Tensor> shard_momentum(const nn::Sequential& split, const nn::Module& model,
                                   const std::vector<Tensor>& model_momentum, int rank);

}  // namespace anvil::parallel
