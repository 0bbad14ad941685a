#include "nn/models.h"

#include <stdexcept>

#include <fmt/format.h>

#include "nn/init.h"

namespace anvil::models {
namespace {

void init_weights(nn::Module& model, Init init, Generator* gen) {
  if (init == Init::Default) return;
  for (auto& [name, t] : model.named_parameters()) {
    bool is_bias = name.ends_with("bias");
    if (t.dim() < 2) {
      // BatchNorm scale stays 1; biases (and BatchNorm shifts) start at 0.
      if (is_bias) nn::init::zeros_(t);
      continue;
    }
    if (init == Init::Seed)
      nn::init::normal_(t, 0.0, 0.01, gen);
    else
      nn::init::kaiming_normal_(t, false, gen);
  }
}

}  // namespace

std::shared_ptr<nn::Sequential> lenet(Init init, Generator* gen) {
  auto net = std::make_shared<nn::Sequential>();
  net->add(std::make_shared<nn::Conv2d>(1, 20, 3, 1, 0, true, gen))
      .add(std::make_shared<nn::ReLU>())
      .add(std::make_shared<nn::AvgPool2d>(2, 2))
      .add(std::make_shared<nn::Conv2d>(20, 50, 5, 1, 0, true, gen))
      .add(std::make_shared<nn::ReLU>())
      .add(std::make_shared<nn::AvgPool2d>(2, 2))
      .add(std::make_shared<nn::Flatten>())
      .add(std::make_shared<nn::Linear>(800, 128, true, gen))
      .add(std::make_shared<nn::ReLU>())
      .add(std::make_shared<nn::Linear>(128, 10, true, gen));
  init_weights(*net, init, gen);
  return net;
}

std::shared_ptr<nn::Module> create(const std::string& name, Init init, Generator* gen) {
  if (name == "lenet") return lenet(init, gen);
  throw std::invalid_argument(fmt::format("unknown model '{}' (known: lenet)", name));
}

}  // namespace anvil::models
