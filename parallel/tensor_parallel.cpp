#include "parallel/tensor_parallel.h"

#include <map>
#include <stdexcept>
#include <string_view>

#include <fmt/format.h>

#include "core/autograd.h"
#include "core/ops.h"

namespace anvil::parallel {
namespace {

// Rows [first, first + rows) and columns [col, col + cols) of a 2-D tensor
// (or elements [first, first + rows) of a 1-D one), as a new leaf on the
// tensor's device that requires grad.
Tensor shard_of(const Tensor& full, int64_t first, int64_t rows, int64_t col = 0,
                int64_t cols = -1) {
  const std::vector<float> v = full.detach().to(Device::cpu()).to_vector();
  const int64_t width = full.dim() == 2 ? full.size(1) : 1;
  if (cols < 0) cols = width;
  std::vector<float> out;
  for (int64_t r = first; r < first + rows; ++r)
    for (int64_t c = col; c < col + cols; ++c) out.push_back(v[size_t(r * width + c)]);
  Shape shape = full.dim() == 2 ? Shape{rows, cols} : Shape{rows};
  Tensor t = Tensor::from_vector(out, shape, full.device());
  t.set_requires_grad(true);
  return t;
}

void put(const Tensor& dst, const Tensor& src) {
  NoGradGuard no_grad;
  Tensor d = dst.detach();
  d.copy_(src.to(dst.device()));
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

SplitLinear::SplitLinear(Communicator& comm, const nn::Linear& full, const char* split_units)
    : comm_(comm), in_(full.in_features), out_(full.out_features) {
  const int64_t units = std::string_view(split_units) == "output" ? out_ : in_;
  if (units % comm.size() != 0)
    throw std::invalid_argument(fmt::format(
        "tensor parallel: the {} {} units of {} do not split over {} ranks", units, split_units,
        full.describe(), comm.size()));
}

ColumnParallelLinear::ColumnParallelLinear(Communicator& comm, const nn::Linear& full)
    : SplitLinear(comm, full, "output") {
  const int64_t rows = out_ / comm.size(), first = rows * comm.rank();
  weight = shard_of(full.weight, first, rows);
  register_parameter("weight", &weight);
  if (full.bias.defined()) {
    bias = shard_of(full.bias, first, rows);
    register_parameter("bias", &bias);
  }
}

Tensor ColumnParallelLinear::forward(const Tensor& x) {
  return linear(copy_to_tensor_parallel(comm_, x), weight, bias);
}

std::string ColumnParallelLinear::describe() const {
  return fmt::format("ColumnParallelLinear(in_features={}, out_features={} of {})", in_, weight.size(0),
                     out_);
}

void ColumnParallelLinear::gather_into(nn::Linear& full) const {
  put(full.weight, comm_.all_gather(weight.detach()));
  if (bias.defined()) put(full.bias, comm_.all_gather(bias.detach()));
}

RowParallelLinear::RowParallelLinear(Communicator& comm, const nn::Linear& full)
    : SplitLinear(comm, full, "input") {
  const int64_t cols = in_ / comm.size();
  weight = shard_of(full.weight, 0, out_, cols * comm.rank(), cols);
  register_parameter("weight", &weight);
  if (full.bias.defined()) {
    bias = shard_of(full.bias, 0, out_);
    register_parameter("bias", &bias);
  }
}

Tensor RowParallelLinear::forward(const Tensor& x) {
  const Tensor y = reduce_from_tensor_parallel(comm_, linear(x, weight));
  return bias.defined() ? add(y, bias) : y;
}

std::string RowParallelLinear::describe() const {
  return fmt::format("RowParallelLinear(in_features={} of {}, out_features={})", weight.size(1),
                     in_, out_);
}

void RowParallelLinear::gather_into(nn::Linear& full) const {
  // Each rank's [out, in/N] as one row of the gather, then its columns put in place.
  const int64_t cols = weight.size(1), n = comm_.size();
  const Tensor rows = comm_.all_gather(weight.detach().reshape({1, out_ * cols}));
  comm_.synchronize();
  const std::vector<float> g = rows.to(Device::cpu()).to_vector();
  std::vector<float> whole(size_t(out_ * in_));
  for (int64_t r = 0; r < n; ++r)
    for (int64_t o = 0; o < out_; ++o)
      for (int64_t c = 0; c < cols; ++c)
        whole[size_t(o * in_ + r * cols + c)] = g[size_t((r * out_ + o) * cols + c)];
  put(full.weight, Tensor::from_vector(whole, {out_, in_}));
  if (bias.defined()) put(full.bias, bias);  // the same on every rank
}

std::vector<std::pair<size_t, size_t>> lenet_tensor_pairs() { return {{7, 9}}; }

std::shared_ptr<nn::Sequential> split_tensor_parallel(
    Communicator& comm, const nn::Sequential& model,
    const std::vector<std::pair<size_t, size_t>>& pairs) {
  std::map<size_t, bool> split;  // layer -> column (true) or row (false)
  for (auto [column, row] : pairs) {
    const bool inside = column < row && row < model.size();
    auto* a = inside ? dynamic_cast<const nn::Linear*>(&model[column]) : nullptr;
    auto* b = inside ? dynamic_cast<const nn::Linear*>(&model[row]) : nullptr;
    if (!a || !b || a->out_features != b->in_features)
      throw std::invalid_argument(fmt::format(
          "tensor parallel: layers {} and {} are not a Linear and the Linear after it that "
          "takes its outputs",
          column, row));
    split[column] = true;
    split[row] = false;
  }
  auto out = std::make_shared<nn::Sequential>();
  for (size_t i = 0; i < model.size(); ++i) {
    auto it = split.find(i);
    if (it == split.end()) {
      out->add(model.name(i), model.layer(i));
      continue;
    }
    const auto& linear = dynamic_cast<const nn::Linear&>(model[i]);
    if (it->second) out->add(model.name(i), std::make_shared<ColumnParallelLinear>(comm, linear));
    else out->add(model.name(i), std::make_shared<RowParallelLinear>(comm, linear));
  }
  return out;
}

void gather_tensor_parallel(const nn::Sequential& split, nn::Sequential& model) {
  for (size_t i = 0; i < split.size(); ++i)
    if (auto* layer = dynamic_cast<const SplitLinear*>(&split[i]))
      layer->gather_into(dynamic_cast<nn::Linear&>(model[i]));
}

}  // namespace anvil::parallel
