#include "core/autograd.h"

#include <stdexcept>
#include <unordered_map>
#include <unordered_set>

#include <fmt/format.h>

#include "core/backend.h"

namespace anvil {
namespace {
thread_local bool g_grad_mode = true;

// dst += g, without ever writing into a tensor another name may still hold:
// the first gradient is stored as is (gradients flowing backward are fresh
// tensors or aliases of one), later ones make a new sum. g has dst's dtype
// (check_grad); bfloat16 gradients are added by the bfloat16 add kernel
// (loaded into float, rounded once), with no float32 copy.
void accumulate(Tensor& dst, const Tensor& g) {
  if (!dst.defined()) {
    dst = g;
    return;
  }
  Tensor sum = Tensor::empty(dst.shape(), dst.dtype(), dst.device());
  backend_for(dst.device()).add(dst, g, sum);  // float32 or bfloat16
  dst = sum;
}

// The leaf's .grad is final for this backward pass: its hooks run.
void run_post_accumulate_hooks(const std::shared_ptr<TensorImpl>& leaf) {
  if (leaf->post_accumulate_grad_hooks.empty()) return;
  const Tensor t(leaf);
  for (const auto& hook : leaf->post_accumulate_grad_hooks) hook(t);
}

void check_grad(const Node& node, size_t input, const Tensor& g, const Edge& edge) {
  const Shape& expected = edge.leaf ? edge.leaf->shape : edge.node->output_shape;
  if (g.shape() != expected)
    throw std::logic_error(fmt::format("{}: gradient for input {} has shape {}, expected {}",
                                       node.name, input, shape_str(g.shape()),
                                       shape_str(expected)));
  const DType dtype = edge.leaf ? edge.leaf->dtype : edge.node->output_dtype;
  if (g.dtype() != dtype)
    throw std::logic_error(fmt::format("{}: gradient for input {} is {}, expected {}", node.name,
                                       input, dtype_name(g.dtype()), dtype_name(dtype)));
}
}  // namespace

bool grad_mode_enabled() { return g_grad_mode; }

NoGradGuard::NoGradGuard() : previous_(g_grad_mode) { g_grad_mode = false; }
NoGradGuard::~NoGradGuard() { g_grad_mode = previous_; }

bool any_requires_grad(std::initializer_list<const Tensor*> inputs) {
  if (!g_grad_mode) return false;
  for (const Tensor* t : inputs)
    if (t && t->defined() && t->requires_grad()) return true;
  return false;
}

void record(const Tensor& output, const char* name, std::initializer_list<const Tensor*> inputs,
            BackwardFn fn) {
  auto node = std::make_shared<Node>();
  node->name = name;
  node->output_shape = output.shape();
  node->output_dtype = output.dtype();
  node->backward = std::move(fn);
  for (const Tensor* t : inputs) {
    Edge e;
    if (t && t->defined() && t->requires_grad()) {
      if (t->grad_fn())
        e.node = t->grad_fn();
      else
        e.leaf = t->impl();
    }
    node->next.push_back(std::move(e));
  }
  output.set_grad_fn(std::move(node));
}

void run_backward(const Tensor& root, const Tensor& gradient) {
  if (!root.requires_grad())
    throw std::logic_error(
        "backward: the tensor does not require grad and has no grad_fn (was it computed under "
        "NoGradGuard, or from tensors without requires_grad?)");
  Tensor seed = gradient;
  if (!seed.defined()) {
    if (root.numel() != 1)
      throw std::invalid_argument(fmt::format(
          "backward: gradient can be implicitly created only for scalar outputs, got shape {}",
          shape_str(root.shape())));
    seed = Tensor::ones(root.shape(), root.dtype(), root.device());
  } else if (seed.shape() != root.shape()) {
    throw std::invalid_argument(fmt::format("backward: gradient shape {} does not match {}",
                                            shape_str(seed.shape()), shape_str(root.shape())));
  }
  NoGradGuard no_grad;  // backward computations are not recorded

  if (root.is_leaf()) {
    Tensor g = root.grad();
    accumulate(g, seed.clone());
    root.set_grad(g);
    run_post_accumulate_hooks(root.impl());
    return;
  }

  // Count, for each node reachable from the root, how many edges lead into
  // it; a node runs once all of its consumers have delivered their gradient.
  // Leaves are counted too: once every edge into a leaf has delivered, its
  // .grad is final and its post-accumulate hooks run.
  std::unordered_map<Node*, int> pending;
  std::unordered_map<TensorImpl*, int> leaf_pending;
  std::vector<Node*> stack{root.grad_fn().get()};
  pending[root.grad_fn().get()] = 0;
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    for (const Edge& e : n->next) {
      if (e.leaf) ++leaf_pending[e.leaf.get()];
      if (!e.node) continue;
      auto [it, inserted] = pending.try_emplace(e.node.get(), 0);
      ++it->second;
      if (inserted) stack.push_back(e.node.get());
    }
  }

  std::unordered_map<Node*, Tensor> grads;
  std::unordered_set<TensorImpl*> delivered;  // leaves that got a gradient in this pass
  grads[root.grad_fn().get()] = seed;
  std::vector<Node*> ready{root.grad_fn().get()};
  while (!ready.empty()) {
    Node* n = ready.back();
    ready.pop_back();
    Tensor g = std::move(grads[n]);
    grads.erase(n);
    if (!n->backward)
      throw std::logic_error(fmt::format(
          "backward through {} a second time: its saved tensors were already freed", n->name));
    std::vector<Tensor> input_grads = n->backward(g);
    n->backward = nullptr;  // frees the saved tensors
    for (size_t i = 0; i < n->next.size(); ++i) {
      const Edge& e = n->next[i];
      if (!e.active()) continue;
      if (i < input_grads.size() && input_grads[i].defined()) {
        check_grad(*n, i, input_grads[i], e);
        if (e.leaf) {
          // A leaf's .grad must not alias a gradient that flows elsewhere.
          Tensor& dst = e.leaf->grad;
          if (dst.defined())
            accumulate(dst, input_grads[i]);
          else
            dst = input_grads[i].clone();
          delivered.insert(e.leaf.get());
        } else {
          accumulate(grads[e.node.get()], input_grads[i]);
        }
      }
      // Every edge into the leaf has run (with a gradient or without): if
      // this pass gave it any, its .grad is final.
      if (e.leaf && --leaf_pending[e.leaf.get()] == 0 && delivered.count(e.leaf.get()))
        run_post_accumulate_hooks(e.leaf);
      if (e.node && --pending[e.node.get()] == 0) {
        if (grads.count(e.node.get())) {
          ready.push_back(e.node.get());
        } else {
          // No gradient reached this node: its inputs get none either.
          e.node->backward = nullptr;
        }
      }
    }
  }
}

}  // namespace anvil
