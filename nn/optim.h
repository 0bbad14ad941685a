// Optimizers over a list of parameters, as torch.optim.
#pragma once
#include <vector>

#include "core/autocast.h"
#include "core/tensor.h"

namespace anvil::optim {

struct SGDOptions {
  double lr = 0.1;
  double momentum = 0.0;
  double weight_decay = 0.0;
  bool nesterov = false;
};

// Stochastic gradient descent with PyTorch's semantics (dampening 0): one
// multi-tensor kernel applies weight decay, momentum and the step to every
// parameter at once (sgd_step_, core/ops.h: one launch on a GPU, as
// PyTorch's SGD with fused=True).
class SGD {
 public:
  SGD(std::vector<Tensor> params, SGDOptions options);
  // Skips parameters without a gradient. A parameter with a bfloat16 copy in
  // cast_cache() gets it rewritten from the updated float32 weights by the
  // same kernel, so the cache stays valid across steps.
  void step();
  // Drops the gradients (PyTorch's set_to_none, no device work), or with
  // set_to_none false sets every one to zero in place, all in one launch.
  void zero_grad(bool set_to_none = true);
  double lr() const { return options_.lr; }
  void set_lr(double lr);
  // For a step captured in a CUDA graph (train_epoch's): from now on the
  // update's kernel reads the learning rate from a float on the parameters'
  // device when it runs, and set_lr() rewrites that float where the rate
  // changes (a copy from the host queued in the stream's order: no kernel,
  // no wait), so that every replay of the graph takes its own step's rate.
  // The parameters must all be on one device.
  void keep_lr_on_device();
  const SGDOptions& options() const { return options_; }

  // The momentum buffer of each parameter, in parameter order: undefined
  // until that parameter's first step (or with momentum 0). For checkpoints.
  const std::vector<Tensor>& momentum_buffers() const { return momentum_; }
  // Restores buffers saved from momentum_buffers(): one entry per parameter,
  // each undefined or of its parameter's shape (copied to its device), so
  // that the next step continues exactly where the saved run left off.
  // Throws std::invalid_argument, changing nothing, when they do not fit.
  void load_momentum_buffers(const std::vector<Tensor>& buffers);

  // The bfloat16 copies of the parameters that autocast reads (give it to
  // AutocastGuard): made at a parameter's first use under autocast, then
  // refreshed by every step(). Whoever writes the parameters otherwise (a
  // checkpoint's load) clears it.
  CastCache& cast_cache() { return cast_cache_; }

 private:
  std::vector<Tensor> params_;
  std::vector<Tensor> momentum_;  // undefined until the first step of each parameter
  SGDOptions options_;
  CastCache cast_cache_;
  Tensor lr_on_device_;  // keep_lr_on_device(): the rate as the kernels read it
  float lr_written_ = 0;  // the value last written there
};

}  // namespace anvil::optim
