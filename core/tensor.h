// Tensor: a shape, a dtype and a device over ref-counted storage, plus the
// autograd state (requires_grad, grad, grad_fn). Copying a Tensor copies a
// handle, as in PyTorch: both names see the same data and the same grad.
//
// Every tensor anvil makes is contiguous (row-major); reshape and narrowing
// along dim 0 are views that share storage.
#pragma once
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <iosfwd>
#include <memory>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/dtype.h"
#include "core/storage.h"

namespace anvil {

using Shape = std::vector<int64_t>;
std::string shape_str(const Shape& shape);  // "[2, 3]"
int64_t shape_numel(const Shape& shape);

class Generator;
struct Node;
struct TensorImpl;

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  // ---- creation ----
  static Tensor empty(const Shape& shape, DType dtype = DType::Float32,
                      Device device = Device::cpu());
  static Tensor zeros(const Shape& shape, DType dtype = DType::Float32,
                      Device device = Device::cpu());
  static Tensor ones(const Shape& shape, DType dtype = DType::Float32,
                     Device device = Device::cpu());
  static Tensor full(const Shape& shape, double value, DType dtype = DType::Float32,
                     Device device = Device::cpu());
  static Tensor arange(int64_t n, DType dtype = DType::Float32, Device device = Device::cpu());
  // Standard normal / uniform [0,1) samples from gen (the global generator when null).
  static Tensor randn(const Shape& shape, Generator* gen = nullptr,
                      Device device = Device::cpu());
  static Tensor rand(const Shape& shape, Generator* gen = nullptr, Device device = Device::cpu());
  // Copies bytes from a host buffer holding shape_numel(shape) elements of dtype.
  static Tensor from_host(const void* data, const Shape& shape, DType dtype,
                          Device device = Device::cpu());
  static Tensor from_vector(const std::vector<float>& values, const Shape& shape,
                            Device device = Device::cpu());
  static Tensor from_vector(const std::vector<int64_t>& values, const Shape& shape,
                            Device device = Device::cpu());

  // ---- properties ----
  bool defined() const { return impl_ != nullptr; }
  const Shape& shape() const;
  Shape strides() const;  // contiguous strides, in elements
  int64_t dim() const { return int64_t(shape().size()); }
  int64_t size(int64_t d) const;  // negative d counts from the end
  int64_t numel() const;
  DType dtype() const;
  Device device() const;
  size_t nbytes() const { return size_t(numel()) * dtype_size(dtype()); }

  // Raw element pointer (host or device memory, depending on device()).
  void* raw_data() const;
  template <typename T> T* data() const {
    check_dtype(dtype_of<T>());
    return static_cast<T*>(raw_data());
  }

  // ---- views and copies ----
  // View with a new shape (one dimension may be -1). Differentiable.
  Tensor reshape(const Shape& shape) const;
  Tensor view(const Shape& shape) const { return reshape(shape); }
  // Collapses dims [start_dim, end) into one. Differentiable.
  Tensor flatten(int64_t start_dim = 0) const;
  // Rows [start, start+length) along dim 0, sharing storage (not differentiable).
  Tensor narrow(int64_t start, int64_t length) const;
  Tensor clone() const;             // fresh storage, same device, no autograd history
  void copy_(const Tensor& src);    // element copy, shapes and dtypes must match
  // Same tensor when already on device, else a copy there.
  Tensor to(Device device) const;
  // The elements in another dtype (a copy; this tensor when already in it).
  // Between float32 and bfloat16 it is differentiable.
  Tensor to(DType dtype) const;
  // A copy in page-locked host memory (this tensor must be on the CPU), from
  // which host-to-device copies run asynchronously (core/stream.h). Throws
  // when there is no CUDA device, as PyTorch does.
  Tensor pin_memory() const;
  bool is_pinned() const;
  // Host copy of the elements as double / as a vector.
  double item() const;
  std::vector<float> to_vector() const;
  std::vector<int64_t> to_int_vector() const;
  std::string repr() const;  // like PyTorch's repr

  // ---- autograd ----
  bool requires_grad() const;
  // Only on leaves (tensors without grad_fn). Returns *this for chaining.
  Tensor& set_requires_grad(bool on = true);
  bool is_leaf() const;
  Tensor grad() const;  // undefined until a backward reaches this leaf
  void set_grad(const Tensor& grad) const;
  void zero_grad() const;  // drops the gradient (PyTorch's set_to_none)
  Tensor detach() const;    // same storage, no history
  const std::shared_ptr<Node>& grad_fn() const;
  void set_grad_fn(std::shared_ptr<Node> fn) const;
  // Leaves only: `hook` runs once a backward pass has delivered every
  // gradient this leaf gets from it and .grad holds their sum (PyTorch's
  // register_post_accumulate_grad_hook); data-parallel training starts
  // reducing a bucket of gradients there, while backward goes on. Hooks stay
  // until clear_post_accumulate_grad_hooks().
  void register_post_accumulate_grad_hook(std::function<void(const Tensor&)> hook) const;
  void clear_post_accumulate_grad_hooks() const;
  // Backpropagates from this scalar (or with an explicit gradient of this shape).
  void backward(const Tensor& gradient = Tensor()) const;

  const std::shared_ptr<TensorImpl>& impl() const { return impl_; }
  bool same(const Tensor& other) const { return impl_ == other.impl_; }

 private:
  void check_defined() const;
  void check_dtype(DType expected) const;
  std::shared_ptr<TensorImpl> impl_;
};

std::ostream& operator<<(std::ostream& os, const Tensor& t);

struct TensorImpl {
  std::shared_ptr<Storage> storage;
  int64_t offset = 0;  // elements
  Shape shape;
  DType dtype = DType::Float32;
  bool requires_grad = false;
  Tensor grad;
  std::shared_ptr<Node> grad_fn;
  std::vector<std::function<void(const Tensor&)>> post_accumulate_grad_hooks;
};

// Throws "<op>: expected all tensors on the same device, found X and Y".
void check_same_device(const char* op, std::initializer_list<const Tensor*> tensors);

}  // namespace anvil
