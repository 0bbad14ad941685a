// Define-by-run autograd. Each differentiable op that sees an input needing
// a gradient records a Node on its output: the edges to its inputs and a
// backward function that maps the output's gradient to one gradient per
// input. backward() walks the graph from a scalar in reverse topological
// order, sums gradients that meet at a node, accumulates into leaves' .grad
// and frees each node's saved tensors once it has run.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace anvil {

// Where a gradient flows: into another node, or into a leaf tensor's .grad.
struct Edge {
  std::shared_ptr<Node> node;
  std::shared_ptr<TensorImpl> leaf;
  bool active() const { return node || leaf; }
};

using BackwardFn = std::function<std::vector<Tensor>(const Tensor& grad_output)>;

struct Node {
  std::string name;               // e.g. "Conv2dBackward"
  std::vector<Edge> next;         // one per input, inactive when no grad is needed
  BackwardFn backward;            // captures the saved tensors; reset after use
  Shape output_shape;             // for checking incoming gradients
  DType output_dtype = DType::Float32;
};

// Is gradient recording on (not inside a NoGradGuard)?
bool grad_mode_enabled();

class NoGradGuard {
 public:
  NoGradGuard();
  ~NoGradGuard();
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool previous_;
};

// True when grad mode is on and any input requires a gradient.
bool any_requires_grad(std::initializer_list<const Tensor*> inputs);

// Attaches a node to `output` whose backward is `fn`; inputs that are
// undefined or need no gradient get inactive edges (fn may return an
// undefined tensor for them). Call only when any_requires_grad(inputs).
void record(const Tensor& output, const char* name, std::initializer_list<const Tensor*> inputs,
            BackwardFn fn);

// Runs backpropagation from root with d(root) = gradient (ones for a scalar
// root when gradient is undefined).
void run_backward(const Tensor& root, const Tensor& gradient);

}  // namespace anvil
