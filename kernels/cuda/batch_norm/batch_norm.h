// Batch normalisation over x[N, C, HW] per channel (training forward, eval
// forward, training backward), the same semantics as kernels/cpu/batch_norm.cpp
// (PyTorch's): the batch mean and biased variance normalise; save_mean and
// save_invstd = 1/sqrt(var + eps) are kept for the backward; the running
// statistics move towards the batch mean and the unbiased variance
// (M/(M-1), M = N*HW; with M == 1 the biased value) with `momentum`.
// Every kernel is launched with 256 threads (__launch_bounds__).
//
// Training forward and backward come in a ladder of two rungs; both are
// deterministic: every addition happens in an order fixed by the shape,
// never by timing (no atomics).
//   01_block_per_channel.cu  one 256-thread block per channel, tree sums
//   02_split.cu    (ships)   several blocks per channel, a fixed-order fold
// eval.cu (no ladder) is the eval forward, elementwise.
// x, y, dy and dx may be bfloat16 (autocast's activations, kernels/element.h)
// for rung 02 and eval: loaded into float, computed as for float, stored
// rounded; statistics, parameters and workspace stay float.
// Run one rung alone (checked against the CPU, then timed):
//   build/sim/bench_cuda_kernels bn 1
#pragma once
#include <cstddef>
#include <cstdint>

#include "core/bfloat16.h"
#include "kernels/cuda/runtime.h"

namespace anvil::cuda {

// As cpu::batch_norm_*, over x[N, C, HW] per channel; running_* may be null.
// Rung 02 needs batch_norm_workspace_floats of workspace (forward and
// backward alike; 0 for rung 01).
constexpr int kBatchNormRungs = 2;
constexpr int kBestBatchNorm = 2;
size_t batch_norm_workspace_floats(int rung, int64_t N, int64_t C, int64_t HW);
// T = float or bfloat16 (rung 02 and eval only; rung 01 refuses bfloat16).
// relu: y = ReLU of the normalised x in the same pass (BatchNorm and ReLU
// fused; rung 02 and eval only); residual, when not null (with relu, rung
// 02): y = relu(bn(x) + residual), each rounded to T as the separate ops.
template <class T>
void batch_norm_forward_train(int rung, int64_t N, int64_t C, int64_t HW, const T* x,
                              const float* gamma, const float* beta, float eps, float momentum,
                              float* running_mean, float* running_var, float* save_mean,
                              float* save_invstd, T* y, float* workspace, cudaStream_t stream,
                              bool relu = false, const T* residual = nullptr);
template <class T>
void batch_norm_forward_eval(int64_t N, int64_t C, int64_t HW, const T* x, const float* gamma,
                             const float* beta, const float* running_mean,
                             const float* running_var, float eps, T* y, cudaStream_t stream,
                             bool relu = false);
// relu_y, when not null, is the output of the forward with relu: the
// gradient is ReLU's backward of dy, taken as dy is loaded (BatchNorm's and
// ReLU's backward fused; rung 02 only); dresidual, when not null (with
// relu_y), receives it.
template <class T>
void batch_norm_backward_train(int rung, int64_t N, int64_t C, int64_t HW, const T* x,
                               const float* gamma, const float* save_mean,
                               const float* save_invstd, const T* dy, T* dx, float* dgamma,
                               float* dbeta, float* workspace, cudaStream_t stream,
                               const T* relu_y = nullptr, T* dresidual = nullptr);

// The training rungs' launchers (sizes checked, C > 0).
namespace batch_norm_rungs {
template <class T>
struct ForwardOf {
  int64_t N, C, HW;
  const T* x;
  const float *gamma, *beta;
  float eps, momentum;
  float *running_mean, *running_var, *save_mean, *save_invstd;
  T* y;
  float* workspace;
  bool relu = false;
  const T* residual = nullptr;  // added before ReLU (rung 02)
};
template <class T>
struct BackwardOf {
  int64_t N, C, HW;
  const T* x;
  const float *gamma, *save_mean, *save_invstd;
  const T* dy;
  T* dx;
  float *dgamma, *dbeta, *workspace;
  const T* relu_y = nullptr;
  T* dresidual = nullptr;  // the masked gradient, where wanted (rung 02)
};
using Forward = ForwardOf<float>;
using Backward = BackwardOf<float>;
struct Rung {
  const char* name;
  void (*forward)(const Forward&, cudaStream_t);
  void (*backward)(const Backward&, cudaStream_t);
  size_t (*workspace)(int64_t N, int64_t C, int64_t HW);
  // The same on bfloat16 activations; null where the rung has none.
  void (*forward_bf16)(const ForwardOf<bfloat16>&, cudaStream_t) = nullptr;
  void (*backward_bf16)(const BackwardOf<bfloat16>&, cudaStream_t) = nullptr;
};
extern const Rung kBlockPerChannel, kSplit;
inline constexpr const Rung* kRungs[kBatchNormRungs] = {&kBlockPerChannel, &kSplit};
// Throws std::invalid_argument naming `who` for a negative size or C >= 2^31.
void check_sizes(int64_t N, int64_t C, int64_t HW, const char* who);
}  // namespace batch_norm_rungs

}  // namespace anvil::cuda
