// Model zoo. Each model is the nn.Sequential (or module tree) that the seed
// documents write in PyTorch, so checkpoints carry the same tensor names.
#pragma once
#include <memory>
#include <string>

#include "core/random.h"
#include "nn/layers.h"

namespace anvil::models {

enum class Init {
  Seed,     // the seed documents' N(0, 0.01) weights, zero biases
  Kaiming,  // He-normal weights for ReLU networks, zero biases
  Default,  // PyTorch's default layer init
};

// LeNet of the seed documents (d2l multi-GPU chapter), for 1x28x28 inputs:
//   0 Conv2d(1, 20, 3)  1 ReLU  2 AvgPool2d(2, 2)
//   3 Conv2d(20, 50, 5) 4 ReLU  5 AvgPool2d(2, 2)
//   6 Flatten (800)     7 Linear(800, 128)  8 ReLU  9 Linear(128, 10)
std::shared_ptr<nn::Sequential> lenet(Init init = Init::Seed, Generator* gen = nullptr);

// Builds a model by its --model name; throws naming the known models.
std::shared_ptr<nn::Module> create(const std::string& name, Init init = Init::Seed,
                                   Generator* gen = nullptr);

}  // namespace anvil::models
