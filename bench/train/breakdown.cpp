// bench_train's per-layer breakdown (breakdown.h).
#include "bench/train/breakdown.h"

#include <cctype>
#include <chrono>
#include <memory>
#include <sstream>
#include <unordered_set>
#include <utility>

#include "core/autograd.h"
#include "core/ops.h"

namespace anvil::bench {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// The op kind of an autograd node or a PyTorch op name, so both frameworks'
// backward times can be summed per kind: "Conv2dBackward" and
// "ConvolutionBackward0" are both "conv". train_torch.py has the same table.
std::string op_kind(const std::string& name) {
  std::string n;
  for (char c : name) n += char(std::tolower(static_cast<unsigned char>(c)));
  // Linear's weight transpose in PyTorch; a substring test would match anything.
  if (n == "tbackward0") return "reshape";
  // First match wins: "addmm" before "add", "batchnorm" before nothing else
  // that it contains. PyTorch's adaptive_avg_pool2d to 1x1 runs as a mean.
  static const std::pair<const char*, const char*> table[] = {
      {"conv", "conv"},         {"batchnorm", "batch_norm"}, {"batch_norm", "batch_norm"},
      {"relu", "relu"},         {"threshold", "relu"},       {"pool", "pool"},
      {"mean", "pool"},         {"addmm", "linear"},         {"linear", "linear"},
      {"mm", "linear"},         {"crossentropy", "loss"},    {"cross_entropy", "loss"},
      {"softmax", "loss"},      {"nll", "loss"},             {"add", "add"},
      {"view", "reshape"},      {"reshape", "reshape"},      {"flatten", "reshape"}};
  for (auto [key, kind] : table)
    if (n.find(key) != std::string::npos) return kind;
  return "other";
}

// Replaces node->backward with a version that adds its run time to *slot and
// to its op kind's total.
void time_node(Node* node, double* slot, std::map<std::string, double>& by_kind) {
  BackwardFn inner = std::move(node->backward);
  double* kind_slot = &by_kind[op_kind(node->name)];
  node->backward = [inner = std::move(inner), slot, kind_slot](const Tensor& g) {
    auto t0 = Clock::now();
    std::vector<Tensor> r = inner(g);
    const double s = seconds_since(t0);
    *slot += s;
    *kind_slot += s;
    return r;
  };
}

// Every node reachable from `from` without passing through `stop`, each once.
std::vector<Node*> nodes_between(Node* from, Node* stop, std::unordered_set<Node*>& seen) {
  std::vector<Node*> out, stack;
  if (from && from != stop && seen.insert(from).second) stack.push_back(from);
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    out.push_back(n);
    for (const Edge& e : n->next) {
      Node* m = e.node.get();
      if (m && m != stop && seen.insert(m).second) stack.push_back(m);
    }
  }
  return out;
}

std::string short_name(const std::string& describe) {
  return describe.substr(0, describe.find('('));
}

// The names of the top-level children as PyTorch's named_children() gives
// them ("0", "1", ..., "resnet_block1", "fc"), read off repr(), whose
// top-level entries are the lines "  (name): ...".
std::vector<std::string> child_names(const nn::Sequential& net) {
  std::vector<std::string> names;
  std::istringstream lines(net.repr());
  std::string line;
  while (std::getline(lines, line)) {
    if (line.rfind("  (", 0) != 0) continue;
    const size_t close = line.find("): ");
    if (close != std::string::npos) names.push_back(line.substr(3, close - 3));
  }
  return names;
}

}  // namespace


Breakdown breakdown(nn::Sequential& net, optim::SGD& opt, const Tensor& x, const Tensor& y,
                    int iters) {
  Breakdown b;
  b.iterations = iters;
  const size_t n = net.size();
  b.layers.resize(n);
  const std::vector<std::string> names = child_names(net);
  for (size_t i = 0; i < n; ++i) {
    const std::string type = short_name(net[i].describe());
    // Named children (ResNet's stages) by name, indexed layers by type.
    const bool named = i < names.size() && names.size() == n && names[i] != std::to_string(i);
    b.layers[i].name = named ? names[i] : type;
  }
  for (int it = 0; it < iters; ++it) {
    // Only each layer's autograd node is kept, not its output: holding on to
    // outputs the graph does not save would change what the step allocates.
    std::vector<std::shared_ptr<Node>> node_of(n);
    Tensor h = x;
    for (size_t i = 0; i < n; ++i) {
      auto t0 = Clock::now();
      h = net[i](h);
      b.layers[i].forward += seconds_since(t0);
      node_of[i] = h.grad_fn();
    }
    auto t0 = Clock::now();
    Tensor loss = cross_entropy(h, y);
    b.loss_forward += seconds_since(t0);
    h = Tensor();

    // Attribute each node to the layer whose forward recorded it: walking back
    // from layer i's node until layer i-1's.
    std::unordered_set<Node*> seen;
    for (Node* node : nodes_between(loss.grad_fn().get(), node_of[n - 1].get(), seen))
      time_node(node, &b.loss_backward, b.backward_by_kind);
    for (size_t i = n; i-- > 0;) {
      Node* stop = i > 0 ? node_of[i - 1].get() : nullptr;
      auto nodes = nodes_between(node_of[i].get(), stop, seen);
      if (it == 0) b.layers[i].nodes = int(nodes.size());
      for (Node* node : nodes) time_node(node, &b.layers[i].backward, b.backward_by_kind);
    }
    node_of.clear();

    t0 = Clock::now();
    opt.zero_grad();
    b.zero_grad += seconds_since(t0);
    t0 = Clock::now();
    loss.backward();
    b.backward_total += seconds_since(t0);
    t0 = Clock::now();
    opt.step();
    loss.item();
    b.step += seconds_since(t0);
  }
  return b;
}

}  // namespace anvil::bench
