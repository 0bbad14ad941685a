#include "core/tensor.h"

#include <cstring>
#include <sstream>
#include <stdexcept>

#include <fmt/format.h>

#include "core/autograd.h"
#include "core/backend.h"
#include "core/cpu_check.h"
#include "core/random.h"

namespace anvil {

std::string shape_str(const Shape& shape) { return fmt::format("[{}]", fmt::join(shape, ", ")); }

int64_t shape_numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

namespace {

// Every program that uses tensors links this file: the CPU is checked
// against the build as it loads (core/cpu_check.h).
[[maybe_unused]] const bool cpu_checked = detail::cpu_matches_build();

std::shared_ptr<TensorImpl> make_impl(const Shape& shape, DType dtype, Device device) {
  for (int64_t d : shape)
    if (d < 0) throw std::invalid_argument("negative dimension in shape " + shape_str(shape));
  auto impl = std::make_shared<TensorImpl>();
  impl->shape = shape;
  impl->dtype = dtype;
  impl->storage = std::make_shared<Storage>(size_t(shape_numel(shape)) * dtype_size(dtype), device);
  return impl;
}

// A new impl over the same storage (a view): no autograd state.
std::shared_ptr<TensorImpl> alias(const TensorImpl& src, const Shape& shape, int64_t offset) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = src.storage;
  impl->offset = offset;
  impl->shape = shape;
  impl->dtype = src.dtype;
  return impl;
}

}  // namespace

void Tensor::check_defined() const {
  if (!impl_) throw std::logic_error("operation on an undefined tensor");
}

void Tensor::check_dtype(DType expected) const {
  check_defined();
  if (impl_->dtype != expected)
    throw std::invalid_argument(fmt::format("tensor has dtype {}, expected {}",
                                            dtype_name(impl_->dtype), dtype_name(expected)));
}

// ---- creation ----

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  return Tensor(make_impl(shape, dtype, device));
}

Tensor Tensor::full(const Shape& shape, double value, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  backend_for(device).fill(t, value);
  return t;
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device) {
  return full(shape, 0.0, dtype, device);
}

Tensor Tensor::ones(const Shape& shape, DType dtype, Device device) {
  return full(shape, 1.0, dtype, device);
}

Tensor Tensor::arange(int64_t n, DType dtype, Device device) {
  Tensor host = empty({n}, dtype, Device::cpu());
  for (int64_t i = 0; i < n; ++i) {
    switch (dtype) {
      case DType::Float32: host.data<float>()[i] = float(i); break;
      case DType::Int64: host.data<int64_t>()[i] = i; break;
      case DType::UInt8: host.data<uint8_t>()[i] = uint8_t(i); break;
      case DType::BFloat16: host.data<bfloat16>()[i] = bfloat16(float(i)); break;
    }
  }
  return host.to(device);
}

Tensor Tensor::randn(const Shape& shape, Generator* gen, Device device) {
  Generator& g = gen ? *gen : default_generator();
  Tensor host = empty(shape, DType::Float32, Device::cpu());
  float* p = host.data<float>();
  for (int64_t i = 0; i < host.numel(); ++i) p[i] = g.normal();
  return host.to(device);
}

Tensor Tensor::rand(const Shape& shape, Generator* gen, Device device) {
  Generator& g = gen ? *gen : default_generator();
  Tensor host = empty(shape, DType::Float32, Device::cpu());
  float* p = host.data<float>();
  for (int64_t i = 0; i < host.numel(); ++i) p[i] = g.uniform();
  return host.to(device);
}

Tensor Tensor::from_host(const void* data, const Shape& shape, DType dtype, Device device) {
  Tensor host = empty(shape, dtype, Device::cpu());
  if (host.nbytes()) std::memcpy(host.raw_data(), data, host.nbytes());
  return host.to(device);
}

template <typename T>
static Tensor from_values(const std::vector<T>& values, const Shape& shape, Device device) {
  if (int64_t(values.size()) != shape_numel(shape))
    throw std::invalid_argument(fmt::format("from_vector: {} values do not fill shape {}",
                                            values.size(), shape_str(shape)));
  return Tensor::from_host(values.data(), shape, dtype_of<T>(), device);
}

Tensor Tensor::from_vector(const std::vector<float>& values, const Shape& shape, Device device) {
  return from_values(values, shape, device);
}

Tensor Tensor::from_vector(const std::vector<int64_t>& values, const Shape& shape,
                           Device device) {
  return from_values(values, shape, device);
}

// ---- properties ----

const Shape& Tensor::shape() const {
  check_defined();
  return impl_->shape;
}

Shape Tensor::strides() const {
  const Shape& s = shape();
  Shape st(s.size());
  int64_t acc = 1;
  for (size_t i = s.size(); i-- > 0;) {
    st[i] = acc;
    acc *= s[i];
  }
  return st;
}

int64_t Tensor::size(int64_t d) const {
  int64_t n = dim();
  int64_t i = d < 0 ? d + n : d;
  if (i < 0 || i >= n)
    throw std::out_of_range(
        fmt::format("dimension {} out of range for tensor of shape {}", d, shape_str(shape())));
  return impl_->shape[size_t(i)];
}

int64_t Tensor::numel() const { return shape_numel(shape()); }

DType Tensor::dtype() const {
  check_defined();
  return impl_->dtype;
}

Device Tensor::device() const {
  check_defined();
  return impl_->storage->device();
}

void* Tensor::raw_data() const {
  check_defined();
  return static_cast<char*>(impl_->storage->data()) + impl_->offset * int64_t(dtype_size(impl_->dtype));
}

// ---- views and copies ----

Tensor Tensor::reshape(const Shape& new_shape) const {
  Shape s = new_shape;
  int64_t known = 1, infer = -1;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == -1) {
      if (infer >= 0) throw std::invalid_argument("reshape: only one dimension can be -1");
      infer = int64_t(i);
    } else if (s[i] < 0) {
      throw std::invalid_argument(
          fmt::format("reshape: invalid dimension {} in {}", s[i], shape_str(new_shape)));
    } else {
      known *= s[i];
    }
  }
  if (infer >= 0) {
    if (known == 0)
      throw std::invalid_argument(fmt::format(
          "reshape: cannot infer the -1 dimension of {} for {} elements", shape_str(new_shape),
          numel()));
    s[size_t(infer)] = numel() / known;
  }
  if (shape_numel(s) != numel())
    throw std::invalid_argument(fmt::format("reshape: cannot view shape {} ({} elements) as {}",
                                            shape_str(shape()), numel(), shape_str(new_shape)));
  Tensor out(alias(*impl_, s, impl_->offset));
  if (any_requires_grad({this})) {
    Shape in_shape = shape();
    record(out, "ReshapeBackward", {this},
           [in_shape](const Tensor& g) { return std::vector<Tensor>{g.reshape(in_shape)}; });
  }
  return out;
}

Tensor Tensor::flatten(int64_t start_dim) const {
  const Shape& s = shape();
  if (start_dim < 0) start_dim += dim();
  if (start_dim < 0 || (start_dim >= dim() && dim() > 0))
    throw std::out_of_range(fmt::format("flatten: start_dim {} out of range for shape {}",
                                        start_dim, shape_str(s)));
  Shape out(s.begin(), s.begin() + start_dim);
  int64_t rest = 1;
  for (size_t i = size_t(start_dim); i < s.size(); ++i) rest *= s[i];
  out.push_back(rest);
  return reshape(out);
}

Tensor Tensor::narrow(int64_t start, int64_t length) const {
  if (dim() == 0) throw std::invalid_argument("narrow: tensor has no dimensions");
  int64_t rows = size(0);
  if (start < 0 || length < 0 || start + length > rows)
    throw std::out_of_range(fmt::format("narrow: rows [{}, {}) out of range for shape {}", start,
                                        start + length, shape_str(shape())));
  Shape s = shape();
  s[0] = length;
  int64_t row = rows ? numel() / rows : 0;
  return Tensor(alias(*impl_, s, impl_->offset + start * row));
}

Tensor Tensor::clone() const {
  Tensor out = empty(shape(), dtype(), device());
  backend_for(device()).copy(*this, out);
  return out;
}

void Tensor::copy_(const Tensor& src) {
  if (src.shape() != shape() || src.dtype() != dtype())
    throw std::invalid_argument(fmt::format("copy_: source {} {} does not match destination {} {}",
                                            dtype_name(src.dtype()), shape_str(src.shape()),
                                            dtype_name(dtype()), shape_str(shape())));
  // A copy involving a GPU is done by the GPU's backend.
  Device d = device().is_cpu() ? src.device() : device();
  backend_for(d).copy(src, *this);
}

Tensor Tensor::to(Device target) const {
  if (device() == target) return *this;
  Tensor out = empty(shape(), dtype(), target);
  out.copy_(*this);
  return out;
}

Tensor Tensor::pin_memory() const {
  check_defined();
  if (!device().is_cpu())
    throw std::invalid_argument(
        fmt::format("pin_memory: the tensor is on {}, only CPU tensors can be pinned",
                    device().str()));
  if (is_pinned()) return *this;
  auto impl = std::make_shared<TensorImpl>();
  impl->shape = shape();
  impl->dtype = dtype();
  impl->storage = std::make_shared<Storage>(nbytes(), Storage::Pinned{});
  Tensor out(std::move(impl));
  if (nbytes() > 0) std::memcpy(out.raw_data(), raw_data(), nbytes());
  return out;
}

bool Tensor::is_pinned() const { return defined() && impl_->storage->pinned(); }

Tensor Tensor::to(DType target) const {
  if (dtype() == target) return *this;
  Tensor out = empty(shape(), target, device());
  backend_for(device()).convert(*this, out);
  // Between float dtypes the cast is differentiable, as in PyTorch: the
  // gradient goes back converted to the source dtype.
  auto is_float = [](DType t) { return t == DType::Float32 || t == DType::BFloat16; };
  if (is_float(dtype()) && is_float(target) && any_requires_grad({this})) {
    const DType source = dtype();
    record(out, "ToCopyBackward", {this}, [source](const Tensor& g) {
      return std::vector<Tensor>{g.to(source)};
    });
  }
  return out;
}

double Tensor::item() const {
  if (numel() != 1)
    throw std::invalid_argument(fmt::format(
        "item: a tensor with {} elements (shape {}) cannot be converted to a scalar", numel(),
        shape_str(shape())));
  Tensor host = to(Device::cpu());
  switch (dtype()) {
    case DType::Float32: return host.data<float>()[0];
    case DType::Int64: return double(host.data<int64_t>()[0]);
    case DType::UInt8: return host.data<uint8_t>()[0];
    case DType::BFloat16: return host.data<bfloat16>()[0].to_float();
  }
  return 0;
}

std::vector<float> Tensor::to_vector() const {
  Tensor host = to(DType::Float32).to(Device::cpu());
  const float* p = host.data<float>();
  return std::vector<float>(p, p + numel());
}

std::vector<int64_t> Tensor::to_int_vector() const {
  Tensor host = to(DType::Int64).to(Device::cpu());
  const int64_t* p = host.data<int64_t>();
  return std::vector<int64_t>(p, p + numel());
}

// ---- autograd ----

bool Tensor::requires_grad() const {
  check_defined();
  return impl_->requires_grad || impl_->grad_fn != nullptr;
}

Tensor& Tensor::set_requires_grad(bool on) {
  check_defined();
  if (impl_->grad_fn)
    throw std::logic_error("set_requires_grad: only leaf tensors can change requires_grad");
  if (on && dtype() != DType::Float32 && dtype() != DType::BFloat16)
    throw std::invalid_argument(fmt::format(
        "set_requires_grad: only float tensors (float32, bfloat16) can require gradients, not {}",
        dtype_name(dtype())));
  impl_->requires_grad = on;
  return *this;
}

bool Tensor::is_leaf() const {
  check_defined();
  return impl_->grad_fn == nullptr;
}

Tensor Tensor::grad() const {
  check_defined();
  return impl_->grad;
}

void Tensor::set_grad(const Tensor& grad) const {
  check_defined();
  impl_->grad = grad;
}

void Tensor::zero_grad() const {
  check_defined();
  impl_->grad = Tensor();
}

Tensor Tensor::detach() const {
  check_defined();
  return Tensor(alias(*impl_, impl_->shape, impl_->offset));
}

const std::shared_ptr<Node>& Tensor::grad_fn() const {
  check_defined();
  return impl_->grad_fn;
}

void Tensor::set_grad_fn(std::shared_ptr<Node> fn) const {
  check_defined();
  impl_->grad_fn = std::move(fn);
}

void Tensor::register_post_accumulate_grad_hook(std::function<void(const Tensor&)> hook) const {
  check_defined();
  if (impl_->grad_fn)
    throw std::logic_error(
        "register_post_accumulate_grad_hook: only leaf tensors accumulate gradients");
  impl_->post_accumulate_grad_hooks.push_back(std::move(hook));
}

void Tensor::clear_post_accumulate_grad_hooks() const {
  check_defined();
  impl_->post_accumulate_grad_hooks.clear();
}

void Tensor::backward(const Tensor& gradient) const { run_backward(*this, gradient); }

void check_same_device(const char* op, std::initializer_list<const Tensor*> tensors) {
  const Tensor* first = nullptr;
  for (const Tensor* t : tensors) {
    if (!t || !t->defined()) continue;
    if (!first) {
      first = t;
    } else if (t->device() != first->device()) {
      throw std::invalid_argument(
          fmt::format("{}: expected all tensors on the same device, found {} and {}", op,
                      first->device().str(), t->device().str()));
    }
  }
}

}  // namespace anvil
