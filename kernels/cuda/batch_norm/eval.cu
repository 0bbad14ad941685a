// Eval forward is elementwise: a grid-stride loop over all N*C*HW elements
// (coalesced as in elementwise.cu), each thread computing its channel's scale
// from running_var (the per-channel values stay in cache); with relu, ReLU
// (core/pointwise.h) in the same pass (the same for every thread).
#include "kernels/cuda/batch_norm/rung.cuh"
#include "kernels/element.h"
#include "core/pointwise.h"

namespace anvil::cuda {
namespace batch_norm_kernels {

// Flat grid-stride loop; Index is int when every index fits in 31 bits.
// T: float or bfloat16 (kernels/element.h).
template <typename Index, typename T>
__global__ void __launch_bounds__(kBlock)
    forward_eval_kernel(Index total, Index C, Index HW, const T* __restrict__ x,
                        const float* __restrict__ gamma, const float* __restrict__ beta,
                        const float* __restrict__ running_mean,
                        const float* __restrict__ running_var, float eps, T* __restrict__ y,
                        bool relu) {
  const Index stride = static_cast<Index>(gridDim.x) * static_cast<Index>(blockDim.x);
  for (Index i = static_cast<Index>(blockIdx.x) * static_cast<Index>(blockDim.x) +
                 static_cast<Index>(threadIdx.x);
       i < total; i += stride) {
    const Index c = (i / HW) % C;
    const float a = gamma[c] / sqrtf(running_var[c] + eps);
    const float v = (load(x[i]) - running_mean[c]) * a + beta[c];
    y[i] = store<T>(relu ? Relu::forward(v) : v);
  }
}

}  // namespace batch_norm_kernels

template <class T>
void batch_norm_forward_eval(int64_t N, int64_t C, int64_t HW, const T* x, const float* gamma,
                             const float* beta, const float* running_mean,
                             const float* running_var, float eps, T* y, cudaStream_t stream,
                             bool relu) {
  using namespace batch_norm_kernels;
  batch_norm_rungs::check_sizes(N, C, HW, "batch_norm_forward_eval");
  const int64_t total = N * C * HW;
  if (total == 0) return;
  const int64_t blocks = (total + kBlock - 1) / kBlock;
  const dim3 grid(static_cast<unsigned>(blocks < kMaxBlocks ? blocks : kMaxBlocks));
  if (total <= INT32_MAX - kMaxBlocks * kBlock)  // i + stride stays below 2^31
    launch(forward_eval_kernel<int, T>, grid, dim3(kBlock), 0, stream, static_cast<int>(total),
           static_cast<int>(C), static_cast<int>(HW), x, gamma, beta, running_mean, running_var,
           eps, y, relu);
  else
    launch(forward_eval_kernel<int64_t, T>, grid, dim3(kBlock), 0, stream, total, C, HW, x, gamma,
           beta, running_mean, running_var, eps, y, relu);
}

template void batch_norm_forward_eval<float>(int64_t, int64_t, int64_t, const float*,
                                             const float*, const float*, const float*,
                                             const float*, float, float*, cudaStream_t, bool);
template void batch_norm_forward_eval<bfloat16>(int64_t, int64_t, int64_t, const bfloat16*,
                                                const float*, const float*, const float*,
                                                const float*, float, bfloat16*, cudaStream_t,
                                                bool);

}  // namespace anvil::cuda
