// Softmax cross-entropy rung 01, one thread per row: the three steps as
// three loops over the row (128 rows per block). Simple, but neighbouring
// threads read addresses C floats apart (uncoalesced), a thread does C serial
// steps per loop, and N threads may not fill the GPU.
//   build/sim/bench_cuda_kernels softmax 1
#include "kernels/cuda/softmax/rung.cuh"

namespace anvil::cuda {
namespace softmax_kernels {

constexpr int kRowsPerBlock1 = 128;  // threads (= rows) per block

__global__ void __launch_bounds__(kRowsPerBlock1) forward_thread_per_row(int64_t N, int64_t C, const float* __restrict__ logits,
                                       const int64_t* __restrict__ labels, float smoothing,
                                       float* __restrict__ loss, float* __restrict__ probs) {
  const int64_t row = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (row >= N) return;
  const float* x = logits + row * C;
  float* p = probs + row * C;
  float m = x[0];
  for (int64_t j = 1; j < C; ++j) m = fmax2(m, x[j]);
  float s = 0.0f, gap_sum = 0.0f;
  for (int64_t j = 0; j < C; ++j) {
    const float e = expf(x[j] - m);
    p[j] = e;
    s += e;
    gap_sum += m - x[j];
  }
  const float inv = 1.0f / s;
  for (int64_t j = 0; j < C; ++j) p[j] *= inv;
  const int64_t label = labels[row];
  loss[row] =
      row_loss(s, label_in_row(label, C) ? m - x[label] : nanf(""), gap_sum, smoothing, C);
}

}  // namespace softmax_kernels

void softmax_rungs::thread_per_row(const Args& a, cudaStream_t stream) {
  using namespace softmax_kernels;
  launch(forward_thread_per_row, grid_for(a.N, kRowsPerBlock1), dim3(kRowsPerBlock1), 0, stream,
         a.N, a.C, a.logits, a.labels, a.smoothing, a.loss, a.probs);
}

}  // namespace anvil::cuda
