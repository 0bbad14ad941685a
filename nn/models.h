// Model zoo. Each model is the nn.Sequential (or module tree) that the seed
// documents write in PyTorch, so checkpoints carry the same tensor names.
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <string>

#include "core/random.h"
#include "nn/layers.h"

namespace anvil::models {

enum class Init {
  // The seed documents' init: N(0, 0.01) for every conv and linear weight.
  // LeNet's biases start at 0 (seed 004's from-scratch LeNet, b = zeros);
  // ResNet's conv/linear biases and BatchNorm keep PyTorch's defaults, since
  // the seeds' init_weights(m) only redraws m.weight.
  Seed,
  Kaiming,  // He-normal (fan-in) weights for ReLU networks, zero biases
  Default,  // PyTorch's default layer init
};

// LeNet of the seed documents (d2l multi-GPU chapter), for 1x28x28 inputs:
//   0 Conv2d(1, 20, 3)  1 ReLU  2 AvgPool2d(2, 2)
//   3 Conv2d(20, 50, 5) 4 ReLU  5 AvgPool2d(2, 2)
//   6 Flatten (800)     7 Linear(800, 128)  8 ReLU  9 Linear(128, 10)
std::shared_ptr<nn::Sequential> lenet(Init init = Init::Seed, Generator* gen = nullptr);

// Sizes of the ResNet-18 variants. The defaults are the seeds' models
// (Fashion-MNIST: 1 channel, 10 classes); narrower stage widths keep tests
// and their golden files small without changing the structure or names.
struct ResNetConfig {
  std::array<int64_t, 4> widths = {64, 128, 256, 512};  // resnet_block1..4; the stem has widths[0]
  int64_t in_channels = 1;
  int64_t num_classes = 10;
};

// d2l's "slightly modified ResNet-18" (seeds 002/004), for 28x28 inputs:
//   0 Conv2d(in, 64, 3, stride 1, pad 1)  1 BatchNorm2d(64)  2 ReLU
//   resnet_block1  Residual(64, 64), Residual(64, 64)
//   resnet_block2  Residual(64, 128, 1x1 conv, stride 2), Residual(128, 128)
//   resnet_block3  ... 256,  resnet_block4  ... 512 (each as resnet_block2)
//   global_avg_pool AdaptiveAvgPool2d(1)   fc  Sequential(Flatten, Linear(512, classes))
// Keys: "0.weight" ... "resnet_block2.0.conv3.weight" ... "fc.1.bias".
std::shared_ptr<nn::Sequential> resnet18(const ResNetConfig& config = {}, Init init = Init::Seed,
                                         Generator* gen = nullptr);

// Seed 000's ResNet-18 for inputs resized to 96x96: the same module tree and
// keys, but the stem is the original ResNet's
//   0 Conv2d(in, 64, 7, stride 2, pad 3)  1 BatchNorm2d  2 ReLU  3 MaxPool2d(3, 2, 1)
// so only "0.weight" differs in shape ([64, in, 7, 7]).
std::shared_ptr<nn::Sequential> resnet18_96(const ResNetConfig& config = {},
                                            Init init = Init::Seed, Generator* gen = nullptr);

// Builds a model by its --model name ("lenet", "resnet18", "resnet18-96"; the
// ResNets with the default ResNetConfig); throws naming the known models.
std::shared_ptr<nn::Module> create(const std::string& name, Init init = Init::Seed,
                                   Generator* gen = nullptr);

}  // namespace anvil::models
