#include "parallel/stages.h"

#include <algorithm>
#include <limits>
#include <map>
#include <stdexcept>

#include <fmt/format.h>

#include "core/autocast.h"
#include "core/autograd.h"
#include "nn/layers.h"

namespace anvil::parallel {
namespace {

// A layer's type name for the header: "Conv2d" from "Conv2d(1, 20, kernel_size=3)".
std::string kind_of(const nn::Module& m) {
  const std::string d = m.describe();
  return d.substr(0, d.find('('));
}

// The Sequentials of `m` opened, depth first, names joined by dots.
void open_layers(const nn::Sequential& seq, const std::string& prefix,
                 std::vector<PipelineLayer>& out) {
  for (size_t i = 0; i < seq.size(); ++i) {
    const std::string name = prefix + seq.name(i);
    if (auto* inner = dynamic_cast<const nn::Sequential*>(seq.layer(i).get())) {
      open_layers(*inner, name + ".", out);
      continue;
    }
    PipelineLayer layer;
    layer.name = name;
    layer.module = seq.layer(i);
    layer.kind = kind_of(*layer.module);
    out.push_back(std::move(layer));
  }
}

int64_t conv_flops(const nn::Conv2d& c, int64_t outputs) {
  return 2 * c.in_channels * c.kernel_size * c.kernel_size * outputs + (c.bias.defined() ? outputs : 0);
}

// Forward FLOPs for one example: `in` and `out` its input and output elements.
int64_t forward_flops(const nn::Module& m, int64_t in, int64_t out) {
  if (auto* c = dynamic_cast<const nn::Conv2d*>(&m)) return conv_flops(*c, out);
  if (auto* l = dynamic_cast<const nn::Linear*>(&m))
    return 2 * l->in_features * l->out_features + (l->bias.defined() ? l->out_features : 0);
  if (auto* r = dynamic_cast<const nn::Residual*>(&m)) {
    // Every convolution of the block has the block's output shape; then two
    // BatchNorms, two ReLUs and the addition, one operation per element each.
    int64_t f = conv_flops(*r->conv1, out) + conv_flops(*r->conv2, out) + 5 * out;
    if (r->conv3) f += conv_flops(*r->conv3, out);
    return f;
  }
  if (dynamic_cast<const nn::Flatten*>(&m)) return 0;
  // Pooling reads each input once; ReLU, BatchNorm and the rest touch each element.
  if (dynamic_cast<const nn::AvgPool2d*>(&m) || dynamic_cast<const nn::MaxPool2d*>(&m) ||
      dynamic_cast<const nn::AdaptiveAvgPool2d*>(&m))
    return in;
  return out;
}

std::string mflop(int64_t flops) { return fmt::format("{:.3g} MFLOP", double(flops) / 1e6); }

}  // namespace

std::vector<PipelineLayer> pipeline_layers(nn::Module& model, const Shape& example, bool amp) {
  auto* seq = dynamic_cast<nn::Sequential*>(&model);
  if (!seq)
    throw std::invalid_argument(fmt::format(
        "pipeline: the model is a {}, not a Sequential: its layers cannot be cut into stages",
        model.describe()));
  std::vector<PipelineLayer> layers;
  open_layers(*seq, "", layers);
  for (const Tensor& p : model.parameters())
    if (!p.device().is_cpu())
      throw std::invalid_argument("pipeline_layers: the model must be on the CPU");
  const bool was_training = model.is_training();
  model.eval();
  NoGradGuard no_grad;
  AutocastGuard autocast(DeviceType::CPU, amp);
  Shape shape = {1};
  shape.insert(shape.end(), example.begin(), example.end());
  Tensor x = Tensor::zeros(shape);
  for (PipelineLayer& layer : layers) {
    const Tensor y = layer.module->forward(x);
    layer.flops = forward_flops(*layer.module, x.numel(), y.numel());
    layer.output = Shape(y.shape().begin() + 1, y.shape().end());
    layer.dtype = y.dtype();
    x = y;
  }
  model.train(was_training);
  return layers;
}

std::vector<PipelineLayer> with_modules_of(std::vector<PipelineLayer> layers,
                                           const nn::Module& model) {
  const auto* seq = dynamic_cast<const nn::Sequential*>(&model);
  if (!seq)
    throw std::invalid_argument(fmt::format("pipeline: the model is a {}, not a Sequential",
                                            model.describe()));
  std::vector<PipelineLayer> theirs;
  open_layers(*seq, "", theirs);
  std::map<std::string, std::shared_ptr<nn::Module>> by_name;
  for (PipelineLayer& l : theirs) by_name[l.name] = l.module;
  for (PipelineLayer& l : layers) {
    auto it = by_name.find(l.name);
    if (it == by_name.end())
      throw std::invalid_argument(fmt::format("pipeline: the model has no layer {}", l.name));
    l.module = it->second;
  }
  return layers;
}

std::vector<size_t> balance_stages(const std::vector<int64_t>& costs, int stages,
                                   const std::vector<bool>& starts) {
  const size_t n = costs.size();
  if (stages < 1 || size_t(stages) > n)
    throw std::invalid_argument(fmt::format(
        "pipeline: {} stages of a model of {} layers: every stage needs at least one layer",
        stages, n));
  if (!starts.empty() && starts.size() != n)
    throw std::invalid_argument(fmt::format(
        "pipeline: {} layers may begin a stage or not, for {} layers", starts.size(), n));
  auto may_start = [&](size_t i) { return i == 0 || starts.empty() || starts[i]; };
  std::vector<int64_t> prefix(n + 1, 0);
  for (size_t i = 0; i < n; ++i) prefix[i + 1] = prefix[i] + costs[i];
  // best[s][i]: the least largest total of the first i layers in s stages;
  // cut[s][i]: where its last stage begins (the earliest of the best).
  const int64_t kNone = std::numeric_limits<int64_t>::max();
  const size_t S = size_t(stages);
  std::vector<std::vector<int64_t>> best(S + 1, std::vector<int64_t>(n + 1, kNone));
  std::vector<std::vector<size_t>> cut(S + 1, std::vector<size_t>(n + 1, 0));
  best[0][0] = 0;
  for (size_t s = 1; s <= S; ++s)
    for (size_t i = s; i <= n; ++i)
      for (size_t j = s - 1; j < i; ++j) {
        if (best[s - 1][j] == kNone || !may_start(j)) continue;
        const int64_t worst = std::max(best[s - 1][j], prefix[i] - prefix[j]);
        if (worst < best[s][i]) {
          best[s][i] = worst;
          cut[s][i] = j;
        }
      }
  if (best[S][n] == kNone)
    throw std::invalid_argument(fmt::format(
        "pipeline: {} stages of a model of {} layers, of which {} may begin a stage (the others "
        "take a split input)",
        stages, n, std::count(starts.begin(), starts.end(), true) + (starts.empty() ? n : 0)));
  std::vector<size_t> bounds(S + 1);
  bounds[S] = n;
  for (size_t s = S; s > 0; --s) bounds[s - 1] = cut[s][bounds[s]];
  return bounds;
}

Stage::Stage(const std::vector<PipelineLayer>& layers, size_t begin, size_t end) {
  for (size_t i = begin; i < end; ++i) {
    register_module(layers[i].name, layers[i].module);
    layers_.push_back(layers[i].module);
  }
}

Tensor Stage::forward(const Tensor& x) {
  Tensor h = x;
  for (auto& l : layers_) h = l->forward(h);
  return h;
}

std::vector<std::string> describe_stages(const std::vector<PipelineLayer>& layers,
                                         const std::vector<size_t>& bounds) {
  int64_t total = 0;
  for (const PipelineLayer& l : layers) total += l.flops;
  std::vector<std::string> out;
  for (size_t s = 0; s + 1 < bounds.size(); ++s) {
    const size_t first = bounds[s], last = bounds[s + 1] - 1;
    int64_t flops = 0;
    for (size_t i = first; i <= last; ++i) flops += layers[i].flops;
    std::string line = fmt::format(
        "stage {}: layers {}..{} ({} {} .. {} {}), {} per image ({:.1f}%)", s, first, last,
        layers[first].kind, layers[first].name, layers[last].kind, layers[last].name,
        mflop(flops), total ? 100.0 * double(flops) / double(total) : 0.0);
    if (s + 2 < bounds.size())
      line += fmt::format(", sends {} {} per image", dtype_name(layers[last].dtype),
                          shape_str(layers[last].output));
    out.push_back(line);
  }
  return out;
}

}  // namespace anvil::parallel
