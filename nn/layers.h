// The layers of torch.nn that LeNet and ResNet-18 are built from. Parameter
// and buffer names and shapes match PyTorch's, so state dicts interchange.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "core/ops.h"
#include "core/random.h"
#include "nn/module.h"

namespace anvil::nn {

class Sequential : public Module {
 public:
  Sequential() = default;
  explicit Sequential(std::vector<std::shared_ptr<Module>> layers);
  // Appends a layer named by its index ("0", "1", ...).
  Sequential& add(std::shared_ptr<Module> layer);
  // Appends a layer under a given name, as PyTorch's add_module: the d2l
  // ResNet appends "resnet_block1" ... "fc" after its indexed stem.
  Sequential& add(const std::string& name, std::shared_ptr<Module> layer);
  // A BatchNorm2d followed by a ReLU runs as one pass
  // (BatchNorm2d::forward_relu); every other layer as itself.
  Tensor forward(const Tensor& x) override;
  std::string describe() const override { return "Sequential"; }
  size_t size() const { return layers_.size(); }
  Module& operator[](size_t i) const { return *layers_.at(i); }
  const std::shared_ptr<Module>& layer(size_t i) const { return layers_.at(i); }
  const std::string& name(size_t i) const { return names_.at(i); }  // "0", "resnet_block1"

 private:
  std::vector<std::shared_ptr<Module>> layers_;
  std::vector<std::string> names_;
};

// Default initialisation as PyTorch's: weights and biases uniform in
// ±1/sqrt(fan_in) (kaiming_uniform with a=sqrt(5)).
class Conv2d : public Module {
 public:
  Conv2d(int64_t in_channels, int64_t out_channels, int64_t kernel_size, int64_t stride = 1,
         int64_t padding = 0, bool bias = true, Generator* gen = nullptr);
  Tensor forward(const Tensor& x) override;
  std::string describe() const override;
  Tensor weight, bias;
  int64_t in_channels, out_channels, kernel_size, stride, padding;
};

class Linear : public Module {
 public:
  Linear(int64_t in_features, int64_t out_features, bool bias = true, Generator* gen = nullptr);
  Tensor forward(const Tensor& x) override;
  std::string describe() const override;
  Tensor weight, bias;
  int64_t in_features, out_features;
};

class BatchNorm2d;

// Batch statistics over several replicas' batches together (PyTorch's
// SyncBatchNorm): a BatchNorm2d given one asks it in training mode
// (parallel/data_parallel.h implements it over a Communicator).
class BatchNormSync {
 public:
  virtual ~BatchNormSync() = default;
  // bn's output for x with the statistics of every replica's batch, its
  // running statistics updated with them; or an undefined Tensor to let bn
  // use x's own statistics (outside a training step, say).
  virtual Tensor forward(BatchNorm2d& bn, const Tensor& x) = 0;
};

class BatchNorm2d : public Module {
 public:
  explicit BatchNorm2d(int64_t num_features, double eps = 1e-5, double momentum = 0.1);
  Tensor forward(const Tensor& x) override;
  // relu(forward(x)), in one pass over x (batch_norm_relu): what a ReLU
  // after this layer fuses into (Sequential, Residual). With a sync, the
  // synced forward, then relu().
  Tensor forward_relu(const Tensor& x);
  // relu(forward(x) + residual), in one pass over x and the residual
  // (batch_norm_add_relu): a residual block's end. With a sync, the synced
  // forward, then add() and relu().
  Tensor forward_add_relu(const Tensor& x, const Tensor& residual);
  std::string describe() const override;
  Tensor weight, bias, running_mean, running_var, num_batches_tracked;
  int64_t num_features;
  double eps, momentum;
  BatchNormSync* sync = nullptr;  // not owned; null: this replica's statistics only

 private:
  Tensor normalize(const Tensor& x, bool relu, const Tensor& residual);
};

class ReLU : public Module {
 public:
  Tensor forward(const Tensor& x) override { return relu(x); }
  std::string describe() const override { return "ReLU()"; }
};

class SiLU : public Module {
 public:
  Tensor forward(const Tensor& x) override { return silu(x); }
  std::string describe() const override { return "SiLU()"; }
};

class MaxPool2d : public Module {
 public:
  explicit MaxPool2d(int64_t kernel_size, int64_t stride = -1, int64_t padding = 0);
  Tensor forward(const Tensor& x) override { return max_pool2d(x, kernel, stride, padding); }
  std::string describe() const override;
  int64_t kernel, stride, padding;
};

class AvgPool2d : public Module {
 public:
  explicit AvgPool2d(int64_t kernel_size, int64_t stride = -1, int64_t padding = 0);
  Tensor forward(const Tensor& x) override { return avg_pool2d(x, kernel, stride, padding); }
  std::string describe() const override;
  int64_t kernel, stride, padding;
};

// Only output size 1 (global average pooling) is supported.
class AdaptiveAvgPool2d : public Module {
 public:
  explicit AdaptiveAvgPool2d(int64_t output_size = 1);
  Tensor forward(const Tensor& x) override { return global_avg_pool2d(x); }
  std::string describe() const override { return "AdaptiveAvgPool2d(output_size=(1, 1))"; }
};

class Flatten : public Module {
 public:
  Tensor forward(const Tensor& x) override { return x.flatten(1); }
  std::string describe() const override { return "Flatten(start_dim=1, end_dim=-1)"; }
};

// d2l's residual block (d2l.Residual, as the seed documents use it):
//   y = relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x))
// conv1 is 3x3 with the block's stride, conv2 3x3; the shortcut is x itself,
// or with use_1x1conv the 1x1 conv3 (same stride) when the shape changes.
// Children are registered conv1, conv2, conv3, bn1, bn2 (d2l's order, which
// fixes the state-dict order); the convs keep their biases as in d2l.
class Residual : public Module {
 public:
  Residual(int64_t in_channels, int64_t out_channels, bool use_1x1conv = false,
           int64_t stride = 1, Generator* gen = nullptr);
  Tensor forward(const Tensor& x) override;
  std::string describe() const override { return "Residual"; }
  std::shared_ptr<Conv2d> conv1, conv2, conv3;  // conv3 null without use_1x1conv
  std::shared_ptr<BatchNorm2d> bn1, bn2;
};

}  // namespace anvil::nn
