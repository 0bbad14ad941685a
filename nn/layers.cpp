#include "nn/layers.h"

#include <cmath>
#include <stdexcept>

#include <fmt/format.h>

#include "core/autograd.h"
#include "nn/init.h"

namespace anvil::nn {

Sequential::Sequential(std::vector<std::shared_ptr<Module>> layers) {
  for (auto& l : layers) add(std::move(l));
}

Sequential& Sequential::add(std::shared_ptr<Module> layer) {
  return add(std::to_string(layers_.size()), std::move(layer));
}

Sequential& Sequential::add(const std::string& name, std::shared_ptr<Module> layer) {
  register_module(name, layer);
  layers_.push_back(std::move(layer));
  names_.push_back(name);
  return *this;
}

Tensor Sequential::forward(const Tensor& x) {
  Tensor h = x;
  for (size_t i = 0; i < layers_.size(); ++i) {
    auto* bn = dynamic_cast<BatchNorm2d*>(layers_[i].get());
    if (bn && i + 1 < layers_.size() && dynamic_cast<ReLU*>(layers_[i + 1].get())) {
      h = bn->forward_relu(h);
      ++i;  // the ReLU ran in BatchNorm's pass
      continue;
    }
    h = layers_[i]->forward(h);
  }
  return h;
}

static void default_init(Tensor& weight, Tensor* bias, Generator* gen) {
  double bound = 1.0 / std::sqrt(double(init::fan_in(weight)));
  init::uniform_(weight, -bound, bound, gen);
  if (bias) init::uniform_(*bias, -bound, bound, gen);
}

Conv2d::Conv2d(int64_t in, int64_t out, int64_t k, int64_t stride_, int64_t padding_,
               bool with_bias, Generator* gen)
    : in_channels(in), out_channels(out), kernel_size(k), stride(stride_), padding(padding_) {
  weight = Tensor::empty({out, in, k, k});
  if (with_bias) bias = Tensor::empty({out});
  default_init(weight, with_bias ? &bias : nullptr, gen);
  register_parameter("weight", &weight);
  register_parameter("bias", &bias);
}

Tensor Conv2d::forward(const Tensor& x) { return conv2d(x, weight, bias, stride, padding); }

std::string Conv2d::describe() const {
  std::string s = fmt::format("Conv2d({}, {}, kernel_size=({}, {}), stride=({}, {})", in_channels,
                              out_channels, kernel_size, kernel_size, stride, stride);
  if (padding) s += fmt::format(", padding=({}, {})", padding, padding);
  if (!bias.defined()) s += ", bias=False";
  return s + ")";
}

Linear::Linear(int64_t in, int64_t out, bool with_bias, Generator* gen)
    : in_features(in), out_features(out) {
  weight = Tensor::empty({out, in});
  if (with_bias) bias = Tensor::empty({out});
  default_init(weight, with_bias ? &bias : nullptr, gen);
  register_parameter("weight", &weight);
  register_parameter("bias", &bias);
}

Tensor Linear::forward(const Tensor& x) { return linear(x, weight, bias); }

std::string Linear::describe() const {
  return fmt::format("Linear(in_features={}, out_features={}, bias={})", in_features,
                     out_features, bias.defined() ? "True" : "False");
}

BatchNorm2d::BatchNorm2d(int64_t n, double eps_, double momentum_)
    : num_features(n), eps(eps_), momentum(momentum_) {
  weight = Tensor::ones({n});
  bias = Tensor::zeros({n});
  running_mean = Tensor::zeros({n});
  running_var = Tensor::ones({n});
  num_batches_tracked = Tensor::zeros({}, DType::Int64);
  register_parameter("weight", &weight);
  register_parameter("bias", &bias);
  register_buffer("running_mean", &running_mean);
  register_buffer("running_var", &running_var);
  register_buffer("num_batches_tracked", &num_batches_tracked);
}

Tensor BatchNorm2d::forward(const Tensor& x) { return normalize(x, false, Tensor()); }

Tensor BatchNorm2d::forward_relu(const Tensor& x) { return normalize(x, true, Tensor()); }

Tensor BatchNorm2d::forward_add_relu(const Tensor& x, const Tensor& residual) {
  return normalize(x, true, residual);
}

Tensor BatchNorm2d::normalize(const Tensor& x, bool fused_relu, const Tensor& residual) {
  // Counted on the buffer's own device: reading it back would make every
  // training-mode BatchNorm wait for the GPU.
  if (training_) add_int64_(num_batches_tracked, 1);
  if (training_ && sync != nullptr)
    if (Tensor y = sync->forward(*this, x); y.defined()) {
      if (residual.defined()) y = add(y, residual);
      return fused_relu ? relu(y) : y;
    }
  if (residual.defined())
    return batch_norm_add_relu(x, residual, weight, bias, running_mean, running_var, training_,
                               momentum, eps);
  return (fused_relu ? batch_norm_relu : batch_norm)(x, weight, bias, running_mean, running_var,
                                                     training_, momentum, eps);
}

std::string BatchNorm2d::describe() const {
  return fmt::format("BatchNorm2d({}, eps={}, momentum={}, affine=True, track_running_stats=True)",
                     num_features, eps, momentum);
}

MaxPool2d::MaxPool2d(int64_t k, int64_t s, int64_t p)
    : kernel(k), stride(s <= 0 ? k : s), padding(p) {}

std::string MaxPool2d::describe() const {
  return fmt::format("MaxPool2d(kernel_size={}, stride={}, padding={}, dilation=1, ceil_mode=False)",
                     kernel, stride, padding);
}

AvgPool2d::AvgPool2d(int64_t k, int64_t s, int64_t p)
    : kernel(k), stride(s <= 0 ? k : s), padding(p) {}

std::string AvgPool2d::describe() const {
  return fmt::format("AvgPool2d(kernel_size={}, stride={}, padding={})", kernel, stride, padding);
}

AdaptiveAvgPool2d::AdaptiveAvgPool2d(int64_t output_size) {
  if (output_size != 1)
    throw std::invalid_argument(fmt::format(
        "AdaptiveAvgPool2d: only output_size=1 is supported, got {}", output_size));
}

Residual::Residual(int64_t in, int64_t out, bool use_1x1conv, int64_t stride, Generator* gen)
    : conv1(std::make_shared<Conv2d>(in, out, 3, stride, 1, true, gen)),
      conv2(std::make_shared<Conv2d>(out, out, 3, 1, 1, true, gen)),
      conv3(use_1x1conv ? std::make_shared<Conv2d>(in, out, 1, stride, 0, true, gen) : nullptr),
      bn1(std::make_shared<BatchNorm2d>(out)),
      bn2(std::make_shared<BatchNorm2d>(out)) {
  if (!use_1x1conv && (in != out || stride != 1))
    throw std::invalid_argument(fmt::format(
        "Residual({}, {}, stride {}): an identity shortcut needs equal channels and stride 1; "
        "use the 1x1 conv shortcut",
        in, out, stride));
  register_module("conv1", conv1);
  register_module("conv2", conv2);
  if (conv3) register_module("conv3", conv3);
  register_module("bn1", bn1);
  register_module("bn2", bn2);
}

Tensor Residual::forward(const Tensor& x) {
  Tensor y = bn1->forward_relu((*conv1)(x));
  return bn2->forward_add_relu((*conv2)(y), conv3 ? (*conv3)(x) : x);
}

}  // namespace anvil::nn
