#include "parallel/tensor_parallel.h"

#include <set>
#include <stdexcept>

#include <fmt/format.h>

#include "core/autograd.h"
#include "core/ops.h"

namespace anvil::parallel {
namespace {

// The product of shape[begin, end).
int64_t extent(const Shape& shape, size_t begin, size_t end) {
  int64_t n = 1;
  for (size_t i = begin; i < end; ++i) n *= shape[i];
  return n;
}

void check_dim(const char* what, const Tensor& t, int64_t dim) {
  if (dim < 0 || dim >= t.dim())
    throw std::invalid_argument(
        fmt::format("{}: dim {} of a tensor of shape {}", what, dim, shape_str(t.shape())));
}

void put(const Tensor& dst, const Tensor& src) {
  NoGradGuard no_grad;
  Tensor d = dst.detach();
  d.copy_(src.to(dst.device()));
}

// A new leaf that requires grad, holding `t`'s elements.
Tensor parameter(Tensor t) {
  t.set_requires_grad(true);
  return t;
}

// bn's channels [first, first + count): its scale, shift and running
// statistics sliced, its count of batches copied.
std::shared_ptr<nn::BatchNorm2d> split_batch_norm(const nn::BatchNorm2d& bn, int64_t first,
                                                  int64_t count) {
  auto part = std::make_shared<nn::BatchNorm2d>(count, bn.eps, bn.momentum);
  part->weight = parameter(slice_along(bn.weight, 0, first, count));
  part->bias = parameter(slice_along(bn.bias, 0, first, count));
  part->running_mean = slice_along(bn.running_mean, 0, first, count);
  part->running_var = slice_along(bn.running_var, 0, first, count);
  part->num_batches_tracked = bn.num_batches_tracked.detach().clone();
  return part;
}

}  // namespace

Tensor copy_to_tensor_parallel(Communicator& comm, const Tensor& x) {
  Tensor out = x.detach();
  if (any_requires_grad({&x}))
    record(out, "CopyToTensorParallelBackward", {&x}, [&comm](const Tensor& grad) {
      Tensor sum = grad.clone();
      comm.allreduce(sum);
      return std::vector<Tensor>{sum};
    });
  return out;
}

Tensor reduce_from_tensor_parallel(Communicator& comm, const Tensor& x) {
  Tensor out = x.detach().clone();
  comm.allreduce(out);
  if (any_requires_grad({&x}))
    record(out, "ReduceFromTensorParallelBackward", {&x},
           [](const Tensor& grad) { return std::vector<Tensor>{grad}; });
  return out;
}

Tensor gather_channels(Communicator& comm, const Tensor& x) {
  Tensor out = gather_along(comm, x, 1);
  if (any_requires_grad({&x}))
    record(out, "GatherChannelsBackward", {&x}, [&comm, c = x.size(1)](const Tensor& grad) {
      return std::vector<Tensor>{slice_along(grad, 1, comm.rank() * c, c)};
    });
  return out;
}

Tensor slice_along(const Tensor& t, int64_t dim, int64_t start, int64_t length) {
  check_dim("slice_along", t, dim);
  const Shape& s = t.shape();
  if (start < 0 || length < 0 || start + length > s[size_t(dim)])
    throw std::invalid_argument(fmt::format("slice_along: [{}, {}) of dim {} of {}", start,
                                            start + length, dim, shape_str(s)));
  const int64_t unit = extent(s, size_t(dim) + 1, s.size());
  Shape shape = s;
  shape[size_t(dim)] = length;
  Tensor out = Tensor::empty(shape, t.dtype(), t.device());
  copy_rows_(t, start * unit, s[size_t(dim)] * unit, out, 0, length * unit,
             extent(s, 0, size_t(dim)), length * unit);
  return out;
}

Tensor gather_along(Communicator& comm, const Tensor& part, int64_t dim) {
  check_dim("gather_along", part, dim);
  const int64_t n = comm.size();
  const Tensor all = comm.all_gather(part.detach());  // rank r's part at r * numel
  Shape shape = part.shape();
  shape[size_t(dim)] *= n;
  const int64_t rows = extent(part.shape(), 0, size_t(dim));
  const int64_t width = part.numel() / std::max<int64_t>(rows, 1);
  Tensor out = Tensor::empty(shape, part.dtype(), part.device());
  for (int64_t r = 0; r < n; ++r)
    copy_rows_(all, r * part.numel(), width, out, r * width, n * width, rows, width);
  return out;
}

// ---------------------------------------------------------------- split layers

SplitLayer::SplitLayer(Communicator& comm, const nn::Module& full, Kind kind)
    : comm_(comm), kind_(kind) {
  const auto* linear = dynamic_cast<const nn::Linear*>(&full);
  const auto* conv = dynamic_cast<const nn::Conv2d*>(&full);
  if (!linear && !conv)
    throw std::invalid_argument(fmt::format(
        "tensor parallel: {} is not a Linear or a Conv2d, which split", full.describe()));
  conv_ = conv != nullptr;
  in_ = conv ? conv->in_channels : linear->in_features;
  out_ = conv ? conv->out_channels : linear->out_features;
  if (conv) kernel_ = conv->kernel_size, stride_ = conv->stride, padding_ = conv->padding;
  const Tensor& w = conv ? conv->weight : linear->weight;
  const Tensor& b = conv ? conv->bias : linear->bias;
  const bool row = kind == Kind::kRow;
  const int64_t units = row ? in_ : out_, n = comm.size();
  if (units % n != 0)
    throw std::invalid_argument(fmt::format(
        "tensor parallel: the {} {} {} of {} do not split over {} ranks", units,
        row ? "input" : "output", conv ? "channels" : "units", full.describe(), n));
  const int64_t part = units / n;
  weight = parameter(slice_along(w, row ? 1 : 0, part * comm.rank(), part));
  if (b.defined())
    bias = parameter(row ? b.detach().clone() : slice_along(b, 0, part * comm.rank(), part));
  register_parameter("weight", &weight);
  register_parameter("bias", &bias);
}

Tensor SplitLayer::apply(const Tensor& x, const Tensor& b) const {
  return conv_ ? conv2d(x, weight, b, stride_, padding_) : linear(x, weight, b);
}

Tensor SplitLayer::forward(const Tensor& x) {
  if (kind_ != Kind::kRow) return forward_copied(copy_to_tensor_parallel(comm_, x));
  const Tensor y = reduce_from_tensor_parallel(comm_, apply(x, Tensor()));
  if (!bias.defined()) return y;
  // Under autocast y is bfloat16 and the bias float32: the output keeps y's
  // dtype, as the whole layer's would.
  const Tensor z = add(y, bias);
  return z.dtype() == y.dtype() ? z : z.to(y.dtype());
}

Tensor SplitLayer::forward_copied(const Tensor& x) {
  if (kind_ == Kind::kRow)
    throw std::logic_error("SplitLayer::forward_copied: a row-parallel layer");
  const Tensor y = apply(x, bias);
  return kind_ == Kind::kColumnGathered ? gather_channels(comm_, y) : y;
}

std::string SplitLayer::describe() const {
  const bool row = kind_ == Kind::kRow;
  const std::string in = row ? fmt::format("{} of {}", weight.size(1), in_) : std::to_string(in_);
  const std::string out = row ? std::to_string(out_) : fmt::format("{} of {}", weight.size(0), out_);
  const char* name = row ? "RowParallel" : "ColumnParallel";
  const char* gathered = kind_ == Kind::kColumnGathered ? ", gathered" : "";
  if (!conv_)
    return fmt::format("{}Linear(in_features={}, out_features={}{})", name, in, out, gathered);
  return fmt::format("{}Conv2d({}, {}, kernel_size=({}, {}), stride=({}, {}), padding=({}, {}){})",
                     name, in, out, kernel_, kernel_, stride_, stride_, padding_, padding_,
                     gathered);
}

std::vector<std::pair<std::string, int64_t>> SplitLayer::split_tensors() const {
  if (kind_ == Kind::kRow) return {{"weight", 1}};
  std::vector<std::pair<std::string, int64_t>> out = {{"weight", 0}};
  if (bias.defined()) out.emplace_back("bias", 0);
  return out;
}

TensorParallelResidual::TensorParallelResidual(Communicator& comm, const nn::Residual& full)
    : comm_(comm),
      conv1_(std::make_shared<SplitLayer>(comm, *full.conv1, SplitLayer::Kind::kColumn)),
      conv2_(std::make_shared<SplitLayer>(comm, *full.conv2, SplitLayer::Kind::kRow)),
      bn2_(full.bn2) {
  if (full.conv3)
    conv3_ = std::make_shared<SplitLayer>(comm, *full.conv3, SplitLayer::Kind::kColumnGathered);
  const int64_t channels = conv1_->weight.size(0);
  bn1_ = split_batch_norm(*full.bn1, channels * comm.rank(), channels);
  register_module("conv1", conv1_);
  register_module("conv2", conv2_);
  if (conv3_) register_module("conv3", conv3_);
  register_module("bn1", bn1_);
  register_module("bn2", bn2_);
}

Tensor TensorParallelResidual::forward(const Tensor& x) {
  const Tensor copied = copy_to_tensor_parallel(comm_, x);  // one f for conv1 and conv3
  Tensor y = bn1_->forward_relu(conv1_->forward_copied(copied));  // as nn::Residual's
  return bn2_->forward_add_relu((*conv2_)(y), conv3_ ? conv3_->forward_copied(copied) : x);
}

std::vector<std::pair<std::string, int64_t>> TensorParallelResidual::split_tensors() const {
  std::vector<std::pair<std::string, int64_t>> out;
  auto add_all = [&out](const std::string& prefix, const TensorParallelModule& m) {
    for (auto& [key, dim] : m.split_tensors()) out.emplace_back(prefix + key, dim);
  };
  add_all("conv1.", *conv1_);
  add_all("conv2.", *conv2_);
  if (conv3_) add_all("conv3.", *conv3_);
  for (const char* key : {"weight", "bias", "running_mean", "running_var"})
    out.emplace_back(std::string("bn1.") + key, 0);
  return out;
}

// ---------------------------------------------------------------- the model's plan

TensorParallelPlan tensor_parallel_plan(const std::string& model) {
  if (model == "lenet") return {.linear_pairs = {{7, 9}}};
  if (model == "resnet18" || model == "resnet18-96") {
    TensorParallelPlan plan;
    for (int b = 1; b <= 4; ++b)
      for (int i = 0; i < 2; ++i) plan.residual_blocks.push_back(fmt::format("resnet_block{}.{}", b, i));
    return plan;
  }
  throw std::invalid_argument(fmt::format(
      "tensor parallel: model '{}' has no plan of the layers to split (lenet, resnet18 and "
      "resnet18-96 have)",
      model));
}

std::string describe_plan(const TensorParallelPlan& plan) {
  std::vector<std::string> parts;
  for (auto [column, row] : plan.linear_pairs)
    parts.push_back(fmt::format(
        "Linear {} split by its output units, Linear {} by its inputs (column-parallel, then "
        "row-parallel: one all-reduce forward and one backward per micro-batch)",
        column, row));
  if (!plan.residual_blocks.empty())
    parts.push_back(fmt::format(
        "in each of {} residual blocks conv1 split by its output channels, conv2 by its inputs "
        "(one all-reduce forward and one backward per micro-batch), bn1 on each rank's "
        "channels, the 1x1 shortcut conv3 by its output channels, all-gathered before the "
        "addition",
        plan.residual_blocks.size()));
  parts.push_back("the other layers run whole on each");
  return fmt::format("{}", fmt::join(parts, "; "));
}

namespace {

using LinearKinds = std::map<size_t, SplitLayer::Kind>;

std::shared_ptr<nn::Sequential> split_sequential(Communicator& comm, const nn::Sequential& seq,
                                                 const std::string& prefix,
                                                 const LinearKinds& linear,
                                                 const std::set<std::string>& blocks,
                                                 std::set<std::string>& found) {
  auto out = std::make_shared<nn::Sequential>();
  for (size_t i = 0; i < seq.size(); ++i) {
    const std::string& name = seq.name(i);
    const std::string key = prefix + name;
    if (auto it = linear.find(i); prefix.empty() && it != linear.end()) {
      out->add(name, std::make_shared<SplitLayer>(comm, seq[i], it->second));
    } else if (blocks.contains(key)) {
      const auto* block = dynamic_cast<const nn::Residual*>(&seq[i]);
      if (!block)
        throw std::invalid_argument(
            fmt::format("tensor parallel: layer {} is a {}, not a Residual", key, seq[i].describe()));
      out->add(name, std::make_shared<TensorParallelResidual>(comm, *block));
      found.insert(key);
    } else if (const auto* inner = dynamic_cast<const nn::Sequential*>(seq.layer(i).get())) {
      out->add(name, split_sequential(comm, *inner, key + ".", linear, blocks, found));
    } else {
      out->add(name, seq.layer(i));
    }
  }
  return out;
}

void collect_split(const nn::Module& m, const std::string& prefix,
                   std::map<std::string, int64_t>& out) {
  if (const auto* seq = dynamic_cast<const nn::Sequential*>(&m)) {
    for (size_t i = 0; i < seq->size(); ++i) collect_split((*seq)[i], prefix + seq->name(i) + ".", out);
  } else if (const auto* split = dynamic_cast<const TensorParallelModule*>(&m)) {
    for (auto& [key, dim] : split->split_tensors()) out[prefix + key] = dim;
  }
}

}  // namespace

std::shared_ptr<nn::Sequential> split_tensor_parallel(Communicator& comm,
                                                      const nn::Sequential& model,
                                                      const TensorParallelPlan& plan) {
  LinearKinds linear;
  for (auto [column, row] : plan.linear_pairs) {
    const bool inside = column < row && row < model.size();
    auto* a = inside ? dynamic_cast<const nn::Linear*>(&model[column]) : nullptr;
    auto* b = inside ? dynamic_cast<const nn::Linear*>(&model[row]) : nullptr;
    if (!a || !b || a->out_features != b->in_features)
      throw std::invalid_argument(fmt::format(
          "tensor parallel: layers {} and {} are not a Linear and the Linear after it that "
          "takes its outputs",
          column, row));
    linear[column] = SplitLayer::Kind::kColumn;
    linear[row] = SplitLayer::Kind::kRow;
  }
  const std::set<std::string> blocks(plan.residual_blocks.begin(), plan.residual_blocks.end());
  std::set<std::string> found;
  auto out = split_sequential(comm, model, "", linear, blocks, found);
  for (const std::string& b : blocks)
    if (!found.contains(b))
      throw std::invalid_argument(fmt::format("tensor parallel: the model has no layer {}", b));
  return out;
}

std::vector<bool> stage_starts(const std::vector<std::string>& layer_names,
                               const nn::Sequential& model, const TensorParallelPlan& plan) {
  std::set<std::string> inside;  // the layers after a column-parallel one, to its row
  for (auto [column, row] : plan.linear_pairs)
    for (size_t i = column + 1; i <= row && i < model.size(); ++i) inside.insert(model.name(i));
  std::vector<bool> out;
  for (const std::string& name : layer_names) out.push_back(!inside.contains(name));
  return out;
}

std::map<std::string, int64_t> split_tensors(const nn::Sequential& split) {
  std::map<std::string, int64_t> out;
  collect_split(split, "", out);
  return out;
}

void gather_tensor_parallel(Communicator& comm, const nn::Sequential& split,
                            nn::Sequential& model) {
  NoGradGuard no_grad;
  const std::map<std::string, int64_t> dims = split_tensors(split);
  std::map<std::string, Tensor> whole;
  for (auto& [key, t] : model.state_dict()) whole[key] = t;
  for (auto& [key, t] : split.state_dict()) {
    const Tensor& dst = whole.at(key);
    if (auto it = dims.find(key); it != dims.end()) put(dst, gather_along(comm, t, it->second));
    else if (t.raw_data() != dst.raw_data()) put(dst, t);
  }
}

namespace {

// Each name's place in `named`.
std::map<std::string, size_t> places(const nn::NamedTensors& named) {
  std::map<std::string, size_t> out;
  for (size_t i = 0; i < named.size(); ++i) out[named[i].first] = i;
  return out;
}

}  // namespace

std::vector<Tensor> gather_momentum(Communicator& comm, const nn::Sequential& split,
                                    const std::vector<Tensor>& split_momentum,
                                    const nn::Module& model) {
  NoGradGuard no_grad;
  const std::map<std::string, int64_t> dims = split_tensors(split);
  const std::map<std::string, size_t> index = places(split.named_parameters());
  const nn::NamedTensors params = model.named_parameters();
  std::vector<Tensor> out(params.size());
  for (size_t j = 0; j < params.size(); ++j) {
    const Tensor& m = split_momentum.at(index.at(params[j].first));
    if (!m.defined()) continue;  // the same on every rank of the group: they train alike
    auto it = dims.find(params[j].first);
    out[j] = it == dims.end() ? m : gather_along(comm, m, it->second);
  }
  return out;
}

std::vector<Tensor> shard_momentum(const nn::Sequential& split, const nn::Module& model,
                                   const std::vector<Tensor>& model_momentum, int rank) {
  const std::map<std::string, int64_t> dims = split_tensors(split);
  const std::map<std::string, size_t> index = places(model.named_parameters());
  const nn::NamedTensors parts = split.named_parameters();
  std::vector<Tensor> out(parts.size());
  for (size_t i = 0; i < parts.size(); ++i) {
    const Tensor& m = model_momentum.at(index.at(parts[i].first));
    if (!m.defined()) continue;
    auto it = dims.find(parts[i].first);
    if (it == dims.end()) {
      out[i] = m.detach().clone();
      continue;
    }
    const int64_t part = parts[i].second.size(it->second);
    out[i] = slice_along(m, it->second, part * rank, part);
  }
  return out;
}

}  // namespace anvil::parallel
