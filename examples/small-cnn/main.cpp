// small-cnn: a model of its own, made of anvil's layers, trained for one
// epoch on Fashion-MNIST with anvil's loader, optimizer and training step;
// it prints the test accuracy and saves the weights as safetensors. It uses
// only the installed headers and anvil::anvil (docs/library.md walks
// through it).
//
//   small-cnn [--data-dir DIR] [--limit-train N] [--limit-test N] [--epochs E] [--save FILE]
#include <iostream>
#include <memory>
#include <string>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <anvil/core/device.h>
#include <anvil/core/random.h>
#include <anvil/data/dataloader.h>
#include <anvil/data/idx.h>
#include <anvil/nn/layers.h>
#include <anvil/nn/optim.h>
#include <anvil/nn/safetensors.h>
#include <anvil/nn/train.h>

using namespace anvil;

// Two convolution blocks (conv, batch norm, ReLU, 2x2 max pool) and a
// linear classifier: 28x28 -> 14x14 -> 7x7 -> 10 logits. A Module names its
// children, and through them its parameters ("block1.0.weight", ...), the
// names its state dict and its safetensors file carry.
class SmallCnn : public nn::Module {
 public:
  SmallCnn() {
    block1 = conv_block(1, 8);
    block2 = conv_block(8, 16);
    classifier = std::make_shared<nn::Linear>(16 * 7 * 7, 10);
    register_module("block1", block1);
    register_module("block2", block2);
    register_module("classifier", classifier);
  }

  Tensor forward(const Tensor& x) override {
    Tensor h = (*block2)((*block1)(x));
    return (*classifier)(h.flatten(1));
  }
  std::string describe() const override { return "SmallCnn"; }

 private:
  static std::shared_ptr<nn::Sequential> conv_block(int64_t in, int64_t out) {
    auto block = std::make_shared<nn::Sequential>();
    block->add(std::make_shared<nn::Conv2d>(in, out, 3, /*stride=*/1, /*padding=*/1));
    block->add(std::make_shared<nn::BatchNorm2d>(out));
    block->add(std::make_shared<nn::ReLU>());
    block->add(std::make_shared<nn::MaxPool2d>(2));
    return block;
  }

  std::shared_ptr<nn::Sequential> block1, block2;
  std::shared_ptr<nn::Linear> classifier;
};

int main(int argc, char** argv) {
  std::string data_dir = "/usr/share/datasets/fashion-mnist", save = "small-cnn.safetensors";
  int64_t limit_train = 0, limit_test = 0;
  int epochs = 1;
  CLI::App app{"small-cnn: a model of its own trained with anvil on Fashion-MNIST"};
  app.add_option("--data-dir", data_dir, "Directory with the Fashion-MNIST IDX files")->capture_default_str();
  app.add_option("--limit-train", limit_train, "Use only the first N training images (0 = all)")->check(CLI::NonNegativeNumber);
  app.add_option("--limit-test", limit_test, "Use only the first N test images (0 = all)")->check(CLI::NonNegativeNumber);
  app.add_option("--epochs", epochs, "Epochs to train")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--save", save, "Where to write the trained weights (safetensors)")->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  try {
    manual_seed(0);  // the same initial weights every run
    // The GPU when there is a real one; simulated GPUs are for testing kernels.
    const Device device = devices_are_simulated() ? Device::cpu() : try_gpu(0);

    auto train_set = std::make_shared<const data::ImageSet>(data::load_mnist_split(data_dir, true, limit_train));
    auto test_set = std::make_shared<const data::ImageSet>(data::load_mnist_split(data_dir, false, limit_test));
    data::DataLoader train_loader(train_set, 128, /*shuffle=*/true, /*drop_last=*/false, /*seed=*/0);
    data::DataLoader test_loader(test_set, 256, /*shuffle=*/false, /*drop_last=*/false, /*seed=*/0);

    SmallCnn model;
    model.to(device);  // before the optimizer takes the parameters, as in PyTorch
    optim::SGD optimizer(model.parameters(), {.lr = 0.05, .momentum = 0.9, .nesterov = true});
    std::cout << fmt::format("SmallCnn, {} parameters, on {}: {} training / {} test images\n",
                             model.num_parameters(), device.str(), train_set->count, test_set->count);

    for (int epoch = 1; epoch <= epochs; ++epoch) {
      const train::EpochStats train = train::train_epoch(model, optimizer, train_loader, device);
      const train::EpochStats test = train::evaluate(model, test_loader, device);
      std::cout << fmt::format("epoch {}: train loss {:.4f}, train acc {:.4f}, test acc {:.4f} ({:.1f} s)\n",
                               epoch, train.loss, train.accuracy, test.accuracy, train.seconds);
    }
    nn::save_safetensors(save, model.state_dict());
    std::cout << "saved " << save << '\n';
  } catch (const std::exception& e) {
    // anvil's errors name the file or tensor and what is wrong.
    std::cerr << "small-cnn: error: " << e.what() << '\n';
    return 1;
  }
  return 0;
}
