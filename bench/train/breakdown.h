// bench_train's per-layer breakdown of one training step: each top-level
// child's forward timed by calling the children one by one, each child's
// backward by wrapping the backward functions of the autograd nodes that
// child recorded, and the same node timings summed per op kind.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "nn/layers.h"
#include "nn/optim.h"

namespace anvil::bench {

struct LayerTimes {
  std::string name;
  double forward = 0, backward = 0;  // seconds, summed over iterations
  int nodes = 0;                     // autograd nodes per iteration
};

struct Breakdown {
  std::vector<LayerTimes> layers;
  std::map<std::string, double> backward_by_kind;  // seconds, summed over iterations
  double loss_forward = 0, loss_backward = 0, zero_grad = 0, backward_total = 0, step = 0;
  int iterations = 0;
};

// `iters` steps of net (a Sequential whose children are the rows) on (x, y)
// with cross-entropy and opt, each part timed.
Breakdown breakdown(nn::Sequential& net, optim::SGD& opt, const Tensor& x, const Tensor& y,
                    int iters);

}  // namespace anvil::bench
