#include "nn/optim.h"

#include <span>
#include <stdexcept>
#include <vector>

#include <fmt/format.h>

#include "core/ops.h"

namespace anvil::optim {
namespace {

// f(run) for each run of consecutive items on one device: one update per
// device (one launch each on a GPU).
template <class T, class DeviceOf, class F>
void by_device(std::span<const T> items, DeviceOf device_of, F f) {
  while (!items.empty()) {
    size_t n = 1;
    while (n < items.size() && device_of(items[n]) == device_of(items[0])) ++n;
    f(items.first(n));
    items = items.subspan(n);
  }
}

}  // namespace

SGD::SGD(std::vector<Tensor> params, SGDOptions options)
    : params_(std::move(params)), momentum_(params_.size()), options_(options) {
  if (options.lr < 0) throw std::invalid_argument(fmt::format("SGD: invalid lr {}", options.lr));
  if (options.momentum < 0)
    throw std::invalid_argument(fmt::format("SGD: invalid momentum {}", options.momentum));
  if (options.weight_decay < 0)
    throw std::invalid_argument(
        fmt::format("SGD: invalid weight_decay {}", options.weight_decay));
  if (options.nesterov && options.momentum <= 0)
    throw std::invalid_argument("SGD: nesterov requires a positive momentum");
  for (size_t i = 0; i < params_.size(); ++i)
    if (!params_[i].is_leaf() || !params_[i].requires_grad())
      throw std::invalid_argument(
          fmt::format("SGD: parameter {} is not a leaf tensor that requires grad", i));
    else if (params_[i].dtype() != DType::Float32)
      throw std::invalid_argument(fmt::format(
          "SGD: parameter {} is {}; SGD updates float32 parameters (under autocast the "
          "weights stay float32 and ops read their bfloat16 copies)",
          i, dtype_name(params_[i].dtype())));
}

void SGD::step() {
  std::vector<SgdTensors> tensors;
  tensors.reserve(params_.size());
  for (size_t i = 0; i < params_.size(); ++i) {
    const Tensor& p = params_[i];
    Tensor g = p.grad();
    if (!g.defined()) continue;
    if (g.dtype() != DType::Float32 || g.shape() != p.shape())
      throw std::invalid_argument(fmt::format(
          "SGD: the gradient of parameter {} is {} {}, the parameter float32 {}", i,
          dtype_name(g.dtype()), shape_str(g.shape()), shape_str(p.shape())));
    bool first = false;
    if (options_.momentum != 0 && !momentum_[i].defined()) {
      momentum_[i] = Tensor::empty(p.shape(), DType::Float32, p.device());
      first = true;
    }
    tensors.push_back({p, g, momentum_[i], cast_cache_.find(p), first});
  }
  SgdHyper h{float(options_.lr), float(options_.momentum), float(options_.weight_decay),
             options_.nesterov, lr_on_device_};
  by_device(std::span<const SgdTensors>(tensors), [](const SgdTensors& t) { return t.param.device(); },
            [&](std::span<const SgdTensors> run) { sgd_step_(run, h); });
}

void SGD::set_lr(double lr) {
  options_.lr = lr;
  if (!lr_on_device_.defined() || float(lr) == lr_written_) return;
  lr_written_ = float(lr);
  lr_on_device_.copy_(Tensor::full({}, double(lr_written_), DType::Float32));
}

void SGD::keep_lr_on_device() {
  if (lr_on_device_.defined() || params_.empty()) return;
  const Device device = params_[0].device();
  for (size_t i = 1; i < params_.size(); ++i)
    if (params_[i].device() != device)
      throw std::invalid_argument(fmt::format(
          "SGD: keep_lr_on_device needs every parameter on one device; parameter {} is on {}, "
          "parameter 0 on {}",
          i, params_[i].device().str(), device.str()));
  lr_written_ = float(options_.lr);
  lr_on_device_ = Tensor::full({}, double(lr_written_), DType::Float32, device);
}

void SGD::load_momentum_buffers(const std::vector<Tensor>& buffers) {
  if (buffers.size() != params_.size())
    throw std::invalid_argument(fmt::format("SGD: {} momentum buffers for {} parameters",
                                            buffers.size(), params_.size()));
  for (size_t i = 0; i < buffers.size(); ++i) {
    const Tensor& b = buffers[i];
    if (b.defined() && (b.shape() != params_[i].shape() || b.dtype() != DType::Float32))
      throw std::invalid_argument(fmt::format(
          "SGD: momentum buffer {} is {} {}, its parameter is float32 {}", i,
          dtype_name(b.dtype()), shape_str(b.shape()), shape_str(params_[i].shape())));
  }
  for (size_t i = 0; i < buffers.size(); ++i) {
    if (!buffers[i].defined()) {
      momentum_[i] = Tensor();
      continue;
    }
    // A copy of our own on the parameter's device: the step updates it in place.
    momentum_[i] = buffers[i].detach().to(params_[i].device()).clone();
  }
}

void SGD::zero_grad(bool set_to_none) {
  if (set_to_none) {
    for (auto& p : params_) p.zero_grad();
    return;
  }
  std::vector<Tensor> grads;
  for (auto& p : params_)
    if (Tensor g = p.grad(); g.defined()) grads.push_back(g);
  by_device(std::span<const Tensor>(grads), [](const Tensor& t) { return t.device(); },
            [](std::span<const Tensor> run) { zero_(run); });
}

}  // namespace anvil::optim
