// Softmax cross-entropy rung 02, one block of 256 threads per row. Each
// step is a strided loop (thread t takes elements t, t+256, ...: a warp reads
// 32 consecutive floats) followed by a shared-memory tree (max, then sum)
// with a __syncthreads per halving. Good for long rows; for short rows most
// threads idle and the 8 barriers per tree dominate.
//   build/sim/bench_cuda_kernels softmax 2
#include "kernels/cuda/softmax/rung.cuh"

namespace anvil::cuda {
namespace softmax_kernels {

constexpr int kThreads2 = 256;  // threads per row

__global__ void __launch_bounds__(kThreads2) forward_block_per_row(int64_t C, const float* __restrict__ logits,
                                      const int64_t* __restrict__ labels, float smoothing,
                                      float* __restrict__ loss, float* __restrict__ probs) {
  __shared__ float red[kThreads2];
  __shared__ float red_x[kThreads2];  // the gaps' sum, reduced beside the exps'
  const int t = threadIdx.x;
  const int64_t row = blockIdx.x;
  const float* x = logits + row * C;
  float* p = probs + row * C;

  float m = x[0];  // a real element: threads with no element of their own stay neutral
  for (int64_t j = t; j < C; j += kThreads2) m = fmax2(m, x[j]);
  red[t] = m;
  __syncthreads();
  for (int s = kThreads2 / 2; s > 0; s /= 2) {
    if (t < s) red[t] = fmax2(red[t], red[t + s]);
    __syncthreads();
  }
  m = red[0];
  __syncthreads();  // every thread has read red[0] before the sum reuses red

  float sum = 0.0f, gap_sum = 0.0f;
  for (int64_t j = t; j < C; j += kThreads2) {
    const float e = expf(x[j] - m);
    p[j] = e;
    sum += e;
    gap_sum += m - x[j];
  }
  red[t] = sum;
  red_x[t] = gap_sum;
  __syncthreads();
  for (int s = kThreads2 / 2; s > 0; s /= 2) {
    if (t < s) {
      red[t] += red[t + s];
      red_x[t] += red_x[t + s];
    }
    __syncthreads();
  }
  sum = red[0];
  const float inv = 1.0f / sum;
  for (int64_t j = t; j < C; j += kThreads2) p[j] *= inv;  // this thread's own writes
  if (t == 0) {
    const int64_t label = labels[row];
    loss[row] = row_loss(sum, label_in_row(label, C) ? m - x[label] : nanf(""), red_x[0],
                         smoothing, C);
  }
}

}  // namespace softmax_kernels

void softmax_rungs::block_per_row(const Args& a, cudaStream_t stream) {
  using namespace softmax_kernels;
  launch(forward_block_per_row, grid_for(a.N, 1), dim3(kThreads2), 0, stream, a.C, a.logits,
         a.labels, a.smoothing, a.loss, a.probs);
}

}  // namespace anvil::cuda
