// Parameter initialisers (in place, outside autograd), as torch.nn.init.
#pragma once
#include "core/random.h"
#include "core/tensor.h"

namespace anvil::nn::init {

void normal_(Tensor& t, double mean = 0.0, double std = 1.0, Generator* gen = nullptr);
void uniform_(Tensor& t, double low, double high, Generator* gen = nullptr);
void zeros_(Tensor& t);
void ones_(Tensor& t);
// He initialisation for ReLU networks: N(0, 2/fan) with fan = fan_in (or
// fan_out when fan_out_mode, as PyTorch's mode='fan_out' for ResNets).
void kaiming_normal_(Tensor& t, bool fan_out_mode = false, Generator* gen = nullptr);
// Fan-in of a weight: dim 1 times the receptive field (dims 2..).
int64_t fan_in(const Tensor& weight);

}  // namespace anvil::nn::init
