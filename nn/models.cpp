#include "nn/models.h"

#include <stdexcept>

#include <fmt/format.h>

#include "nn/init.h"

namespace anvil::models {
namespace {

// Weights are the parameters of 2 or more dimensions (conv and linear);
// BatchNorm's scale and every bias are 1-D.
void init_weights(nn::Module& model, Init init, Generator* gen, bool zero_biases) {
  if (init == Init::Default) return;
  for (auto& [name, t] : model.named_parameters()) {
    if (t.dim() < 2) {
      // BatchNorm's scale stays 1 and its shift 0 (their defaults) either way.
      if (zero_biases && name.ends_with("bias")) nn::init::zeros_(t);
      continue;
    }
    if (init == Init::Seed)
      nn::init::normal_(t, 0.0, 0.01, gen);
    else
      nn::init::kaiming_normal_(t, false, gen);
  }
}

// resnet_block1..4, global_avg_pool and fc, shared by both ResNet-18 stems.
// As in d2l's resnet_block: the first block keeps the stem's width and
// resolution, each later one starts with a strided Residual whose 1x1 conv
// reshapes the shortcut.
void add_resnet_stages(nn::Sequential& net, const ResNetConfig& c, Generator* gen) {
  int64_t in = c.widths[0];
  for (size_t b = 0; b < 4; ++b) {
    const int64_t out = c.widths[b];
    const bool first = b == 0;
    auto block = std::make_shared<nn::Sequential>();
    block->add(std::make_shared<nn::Residual>(in, out, !first, first ? 1 : 2, gen))
        .add(std::make_shared<nn::Residual>(out, out, false, 1, gen));
    net.add(fmt::format("resnet_block{}", b + 1), block);
    in = out;
  }
  net.add("global_avg_pool", std::make_shared<nn::AdaptiveAvgPool2d>(1));
  auto fc = std::make_shared<nn::Sequential>();
  fc->add(std::make_shared<nn::Flatten>())
      .add(std::make_shared<nn::Linear>(c.widths[3], c.num_classes, true, gen));
  net.add("fc", fc);
}

void check_config(const char* model, const ResNetConfig& c) {
  bool ok = c.in_channels > 0 && c.num_classes > 0;
  for (int64_t w : c.widths) ok = ok && w > 0;
  if (!ok)
    throw std::invalid_argument(fmt::format(
        "{}: widths, in_channels and num_classes must be positive (widths [{}], in_channels {}, "
        "num_classes {})",
        model, fmt::join(c.widths, ", "), c.in_channels, c.num_classes));
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
  init_weights(*net, init, gen, /*zero_biases=*/true);
  return net;
}

std::shared_ptr<nn::Sequential> resnet18(const ResNetConfig& config, Init init, Generator* gen) {
  check_config("resnet18", config);
  auto net = std::make_shared<nn::Sequential>();
  // 3x3 stem without max pooling: 28x28 inputs are too small for the 7x7/2 + pool stem.
  net->add(std::make_shared<nn::Conv2d>(config.in_channels, config.widths[0], 3, 1, 1, true, gen))
      .add(std::make_shared<nn::BatchNorm2d>(config.widths[0]))
      .add(std::make_shared<nn::ReLU>());
  add_resnet_stages(*net, config, gen);
  init_weights(*net, init, gen, /*zero_biases=*/init != Init::Seed);
  return net;
}

std::shared_ptr<nn::Sequential> resnet18_96(const ResNetConfig& config, Init init,
                                            Generator* gen) {
  check_config("resnet18_96", config);
  auto net = std::make_shared<nn::Sequential>();
  net->add(std::make_shared<nn::Conv2d>(config.in_channels, config.widths[0], 7, 2, 3, true, gen))
      .add(std::make_shared<nn::BatchNorm2d>(config.widths[0]))
      .add(std::make_shared<nn::ReLU>())
      .add(std::make_shared<nn::MaxPool2d>(3, 2, 1));
  add_resnet_stages(*net, config, gen);
  init_weights(*net, init, gen, /*zero_biases=*/init != Init::Seed);
  return net;
}

std::shared_ptr<nn::Module> create(const std::string& name, Init init, Generator* gen) {
  if (name == "lenet") return lenet(init, gen);
  if (name == "resnet18") return resnet18({}, init, gen);
  if (name == "resnet18-96") return resnet18_96({}, init, gen);
  throw std::invalid_argument(
      fmt::format("unknown model '{}' (known: lenet, resnet18, resnet18-96)", name));
}

}  // namespace anvil::models
