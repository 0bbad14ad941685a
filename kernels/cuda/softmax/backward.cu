// Softmax cross-entropy backward: dlogits[i, j] = (probs[i, j] - q[i, j]) *
// dloss[i] with q the (smoothed) target, one thread per element, grid-stride
// (at most 65536 blocks). Computed in float32; a bfloat16 dlogits (autocast's
// logits) is stored rounded once, by backward_bf16_kernel.
#include "kernels/cuda/softmax/rung.cuh"
#include "kernels/element.h"

namespace anvil::cuda {
namespace softmax_kernels {

constexpr int kBackwardThreads = 256;

template <class T>
__device__ __forceinline__ void backward_elements(int64_t N, int64_t C,
                                                  const float* __restrict__ probs,
                                                  const int64_t* __restrict__ labels,
                                                  float smoothing,
                                                  const float* __restrict__ dloss,
                                                  T* __restrict__ dlogits) {
  const int64_t total = N * C, stride = int64_t{gridDim.x} * blockDim.x;
  const float per_class = smoothing / float(C), on_label = 1.0f - smoothing;
  for (int64_t k = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; k < total; k += stride) {
    const int64_t i = k / C, j = k - i * C;
    const float target = (j == labels[i] ? on_label : 0.0f) + per_class;
    dlogits[k] = store<T>((probs[k] - target) * dloss[i]);
  }
}

// One kernel per dlogits type, each with a name of its own for the audits.
__global__ void __launch_bounds__(kBackwardThreads)
    backward_kernel(int64_t N, int64_t C, const float* __restrict__ probs,
                    const int64_t* __restrict__ labels, float smoothing,
                    const float* __restrict__ dloss, float* __restrict__ dlogits) {
  backward_elements(N, C, probs, labels, smoothing, dloss, dlogits);
}
__global__ void __launch_bounds__(kBackwardThreads)
    backward_bf16_kernel(int64_t N, int64_t C, const float* __restrict__ probs,
                         const int64_t* __restrict__ labels, float smoothing,
                         const float* __restrict__ dloss, bfloat16* __restrict__ dlogits) {
  backward_elements(N, C, probs, labels, smoothing, dloss, dlogits);
}
inline auto backward_for(float*) { return backward_kernel; }
inline auto backward_for(bfloat16*) { return backward_bf16_kernel; }

}  // namespace softmax_kernels

template <class T>
void softmax_cross_entropy_backward(int64_t N, int64_t C, const float* probs,
                                    const int64_t* labels, float label_smoothing,
                                    const float* dloss, T* dlogits, cudaStream_t stream) {
  using namespace softmax_kernels;
  softmax_rungs::check_shape("softmax_cross_entropy_backward", N, C);
  if (N == 0) return;
  const int64_t blocks = (N * C + kBackwardThreads - 1) / kBackwardThreads;
  launch(backward_for(dlogits), static_cast<unsigned>(blocks < 65536 ? blocks : 65536),
         dim3(kBackwardThreads), 0, stream, N, C, probs, labels, label_smoothing, dloss, dlogits);
}
template void softmax_cross_entropy_backward(int64_t, int64_t, const float*, const int64_t*, float,
                                             const float*, float*, cudaStream_t);
template void softmax_cross_entropy_backward(int64_t, int64_t, const float*, const int64_t*, float,
                                             const float*, bfloat16*, cudaStream_t);

}  // namespace anvil::cuda
