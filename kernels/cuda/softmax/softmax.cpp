// The softmax cross-entropy forward's entry point: checks, then the rung's
// launcher (softmax.h lists the rungs).
#include <cstdint>
#include <stdexcept>
#include <string>

#include "kernels/cuda/softmax/softmax.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/element.h"

namespace anvil::cuda {

void softmax_rungs::check_shape(const char* fn, int64_t N, int64_t C) {
  if (N < 0 || C < 1)
    throw std::invalid_argument(std::string("cuda::") + fn + ": shape " + std::to_string(N) +
                                "x" + std::to_string(C) + " (needs N >= 0, C >= 1)");
}

unsigned softmax_rungs::grid_for(int64_t rows, int64_t rows_per_block) {
  const int64_t b = (rows + rows_per_block - 1) / rows_per_block;
  if (b > INT32_MAX)
    throw std::invalid_argument("cuda::softmax_cross_entropy_forward: N = " +
                                std::to_string(rows) + " needs more than 2^31-1 blocks");
  return static_cast<unsigned>(b);
}

void softmax_cross_entropy_forward(int number, int64_t N, int64_t C, const float* logits,
                                   const int64_t* labels, float label_smoothing, float* loss,
                                   float* probs, cudaStream_t stream) {
  if (number < 1 || number > kSoftmaxRungs)
    throw std::invalid_argument("cuda::softmax_cross_entropy_forward: no rung " +
                                std::to_string(number) + " (there are 1 to " +
                                std::to_string(kSoftmaxRungs) + ")");
  softmax_rungs::check_shape("softmax_cross_entropy_forward", N, C);
  if (N == 0) return;
  softmax_rungs::kRungs[number - 1].launch(
      {N, C, logits, labels, label_smoothing, loss, probs}, stream);
}

// ---- CudaBackend (cuda_backend.h) ----

void CudaBackend::softmax_cross_entropy_forward(const Tensor& logits, const Tensor& labels,
                                                float label_smoothing, const Tensor& loss,
                                                const Tensor& probs) {
  activate();
  if (logits.dtype() == DType::BFloat16)
    cuda::softmax_cross_entropy_forward(logits.size(0), logits.size(1), logits.data<bfloat16>(),
                                        int64s(labels), label_smoothing, floats(loss),
                                        floats(probs), stream_);
  else
    cuda::softmax_cross_entropy_forward(kBestSoftmax, logits.size(0), logits.size(1),
                                        floats(logits), int64s(labels), label_smoothing,
                                        floats(loss), floats(probs), stream_);
}
void CudaBackend::softmax_cross_entropy_backward(const Tensor& probs, const Tensor& labels,
                                                 float label_smoothing, const Tensor& dloss,
                                                 const Tensor& dlogits) {
  activate();
  visit_float_dtype(dlogits.dtype(), "softmax_cross_entropy_backward", [&](auto t) {
    using T = decltype(t);
    cuda::softmax_cross_entropy_backward(probs.size(0), probs.size(1), floats(probs),
                                         int64s(labels), label_smoothing, floats(dloss),
                                         dlogits.data<T>(), stream_);
  });
}
void CudaBackend::count_correct(const Tensor& logits, const Tensor& labels,
                                const Tensor& counter) {
  activate();
  visit_float_dtype(logits.dtype(), "count_correct", [&](auto t) {
    using T = decltype(t);
    cuda::count_correct(logits.size(0), logits.size(1), logits.data<T>(), int64s(labels),
                        static_cast<int64_t*>(counter.raw_data()), stream_);
  });
}

}  // namespace anvil::cuda
