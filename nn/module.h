// Module: a layer or model with named parameters, buffers and children, in
// the manner of torch.nn.Module. Names nest with dots ("0.weight",
// "layer1.0.bn1.running_mean") so a state dict lines up with PyTorch's.
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace anvil::nn {

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

class Module {
 public:
  virtual ~Module() = default;
  Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  virtual Tensor forward(const Tensor& x) = 0;
  Tensor operator()(const Tensor& x) { return forward(x); }
  // Short description for printing, e.g. "Conv2d(1, 20, kernel_size=3)".
  virtual std::string describe() const = 0;

  NamedTensors named_parameters() const;
  NamedTensors named_buffers() const;
  // Parameters and buffers, each module's own first, then its children's,
  // in registration order (as PyTorch's state_dict()).
  NamedTensors state_dict() const;
  std::vector<Tensor> parameters() const;
  int64_t num_parameters() const;

  void train(bool on = true);
  void eval() { train(false); }
  bool is_training() const { return training_; }
  // This module and every descendant, depth first, each once, this one first
  // (PyTorch's modules()); e.g. to find the BatchNorm layers with dynamic_cast.
  std::vector<Module*> modules();
  // Moves every parameter and buffer to device (parameters stay leaves
  // that require grad). Build optimizers after moving, as in PyTorch.
  void to(Device device);
  void zero_grad();
  // Multi-line description of the module tree, like print(model) in PyTorch.
  std::string repr() const;

 protected:
  // The slot stays owned by the subclass (a member Tensor); the module keeps
  // its address so that to() can replace the tensor in place.
  void register_parameter(std::string name, Tensor* slot);
  void register_buffer(std::string name, Tensor* slot);
  void register_module(std::string name, std::shared_ptr<Module> child);

  bool training_ = true;

 private:
  void collect(const std::string& prefix, bool params, bool buffers, NamedTensors& out) const;
  void repr_into(std::string& out, const std::string& indent) const;
  std::vector<std::pair<std::string, Tensor*>> params_;
  std::vector<std::pair<std::string, Tensor*>> buffers_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
};

}  // namespace anvil::nn
