// BatchNorm in training mode with the statistics of every rank's batch
// together (PyTorch's SyncBatchNorm), for data-parallel training with
// --sync-bn: each rank's replica then normalises as one device would with
// the whole batch.
#pragma once
#include <cstdint>

#include "core/tensor.h"
#include "parallel/communicator.h"

namespace anvil::parallel {

// y = (x - mean) / sqrt(var + eps) * gamma + beta over x [N, C] or
// [N, C, H, W], where mean and var (biased) are per channel over all ranks'
// x: `count` is the number of values per channel over all ranks. Two
// all-reduces in the forward (the sums, then the squared deviations from the
// global mean: two passes, as the variance of values far from zero needs),
// and two in the backward (the sums of dy and of dy * xhat over all ranks,
// which dx needs). running_mean and running_var get the global statistics
// (momentum, unbiased variance), identical on every rank. The gradients of
// gamma and beta are this rank's part: the data-parallel all-reduce adds
// them up with the other parameters'. Every rank calls it at the same point.
// `fingerprint` says which call this is (a layer of a micro-batch; 0:
// unsaid): the four all-reduces carry it, each marked with its place, so
// that ranks whose calls would pair with another layer's or another
// micro-batch's of the same shape are refused at the agreement.
Tensor sync_batch_norm(Communicator& comm, const Tensor& x, const Tensor& gamma, const Tensor& beta,
                       const Tensor& running_mean, const Tensor& running_var, double momentum,
                       double eps, int64_t count, uint64_t fingerprint = 0);

}  // namespace anvil::parallel
