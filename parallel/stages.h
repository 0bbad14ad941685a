// A model cut into pipeline stages (docs/parallel.md, "Pipeline parallel"):
// its layers in order, each with a cost, cut into consecutive runs whose
// costs balance, each run a module of its own that keeps the model's names.
//
// The layers are those of a Sequential model, each nested Sequential opened
// into its own (LeNet's 10; ResNet-18's stem, its 8 residual blocks, the
// pooling, Flatten and Linear: 14). The cost of a layer is its forward
// FLOPs per example: 2 per multiply-add of a convolution or a linear layer,
// 1 per output element of everything else (ReLU, BatchNorm, pooling, a
// block's addition). A layer's backward costs about twice its forward for
// the convolutions and linear layers that dominate, so the forward's
// balance is the whole step's.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "nn/module.h"

namespace anvil::parallel {

struct PipelineLayer {
  std::string name;  // its name in the model: "0", "resnet_block1.0", "fc.1"
  std::shared_ptr<nn::Module> module;
  std::string kind;  // "Conv2d", "Residual", ... for the run's header
  int64_t flops = 0;  // forward, per example
  Shape output;       // its output for one example, without the batch dimension
  DType dtype = DType::Float32;  // of its output (bfloat16 for a conv under autocast)
};

// The layers of `model` (a Sequential), with their costs and outputs from a
// forward of one zero example of shape `example` ([C, H, W]) on the CPU,
// where the model must be: in eval mode and without gradients (the model's
// mode is restored; BatchNorm's running statistics are not touched), under
// bfloat16 autocast when `amp` (the dtypes a stage then sends). Throws
// std::invalid_argument for a model that is not a Sequential.
std::vector<PipelineLayer> pipeline_layers(nn::Module& model, const Shape& example, bool amp);

// `layers` with each module replaced by the layer of the same name in
// `model` (a Sequential, opened as pipeline_layers opens it): the layers of
// another copy of the model they were listed from, such as its split for
// tensor parallelism. std::invalid_argument naming a layer `model` lacks.
std::vector<PipelineLayer> with_modules_of(std::vector<PipelineLayer> layers,
                                           const nn::Module& model);

// `costs` cut into `stages` consecutive non-empty runs whose largest total
// is the least possible (ties: the earliest cut): stages + 1 bounds, from 0
// to costs.size(), stage s holding [bounds[s], bounds[s + 1]). A stage may
// begin only at a layer i with starts[i] (every layer when `starts` is
// empty; tensor parallelism forbids the layers whose input is split). Throws
// std::invalid_argument when stages < 1, there are fewer costs, or too few
// layers may begin a stage.
std::vector<size_t> balance_stages(const std::vector<int64_t>& costs, int stages,
                                   const std::vector<bool>& starts = {});

// Layers [begin, end) of a model as one module, each registered under its
// name in the model, so that the stage's parameters, buffers and state dict
// carry the model's keys ("3.weight", "resnet_block2.0.conv1.weight").
class Stage final : public nn::Module {
 public:
  Stage(const std::vector<PipelineLayer>& layers, size_t begin, size_t end);
  Tensor forward(const Tensor& x) override;
  std::string describe() const override { return "Stage"; }

 private:
  std::vector<std::shared_ptr<nn::Module>> layers_;
};

// The cut for the run's header, one line per stage: its layers, its share
// of the FLOPs and what it sends on per example, e.g.
//   "stage 0: layers 0-2 (Conv2d 0 .. AvgPool2d 2), 0.26 MFLOP per image (5.8%), sends float32 [20, 13, 13]"
std::vector<std::string> describe_stages(const std::vector<PipelineLayer>& layers,
                                         const std::vector<size_t>& bounds);

}  // namespace anvil::parallel
