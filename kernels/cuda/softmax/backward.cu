// Softmax cross-entropy backward: dlogits[i, j] = (probs[i, j] - q[i, j]) *
// dloss[i] with q the (smoothed) target, one thread per element, grid-stride
// (at most 65536 blocks).
#include "kernels/cuda/softmax/rung.cuh"

namespace anvil::cuda {
namespace softmax_kernels {

constexpr int kBackwardThreads = 256;

__global__ void __launch_bounds__(kBackwardThreads) backward_kernel(int64_t N, int64_t C, const float* __restrict__ probs,
                                const int64_t* __restrict__ labels, float smoothing,
                                const float* __restrict__ dloss, float* __restrict__ dlogits) {
  const int64_t total = N * C, stride = int64_t{gridDim.x} * blockDim.x;
  const float per_class = smoothing / float(C), on_label = 1.0f - smoothing;
  for (int64_t k = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; k < total; k += stride) {
    const int64_t i = k / C, j = k - i * C;
    const float target = (j == labels[i] ? on_label : 0.0f) + per_class;
    dlogits[k] = (probs[k] - target) * dloss[i];
  }
}

}  // namespace softmax_kernels

void softmax_cross_entropy_backward(int64_t N, int64_t C, const float* probs,
                                    const int64_t* labels, float label_smoothing,
                                    const float* dloss, float* dlogits, cudaStream_t stream) {
  using namespace softmax_kernels;
  softmax_rungs::check_shape("softmax_cross_entropy_backward", N, C);
  if (N == 0) return;
  const int64_t blocks = (N * C + kBackwardThreads - 1) / kBackwardThreads;
  launch(backward_kernel, static_cast<unsigned>(blocks < 65536 ? blocks : 65536),
         dim3(kBackwardThreads),
         0, stream, N, C, probs, labels, label_smoothing, dloss, dlogits);
}

}  // namespace anvil::cuda
