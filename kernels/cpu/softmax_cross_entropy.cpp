// Fused softmax + cross-entropy over rows of logits[N, C].
// Numerically stable: each row is shifted by its max before exp, and the
// normaliser is accumulated in double, so loss = log(sum exp(x - max)) +
// max - x[label] loses no precision even for large logits. Rows are
// independent, so OpenMP splits rows when the batch is large enough.
//
// Label smoothing e (PyTorch's CrossEntropyLoss(label_smoothing=e)) trains
// against the target q = (1 - e) * onehot(label) + e / C rather than the
// one-hot row, so the loss is -sum_j q_j log p_j, which with q summing to 1
// and log p_j = x_j - max - log(total) is
//   loss = log(total) + (1 - e) (max - x[label]) + (e / C) sum_j (max - x_j),
// and its gradient p - q. e = 0 is the plain cross-entropy.
// count_correct, beside them, scores a batch's predictions for the epoch's
// accuracy. Each reads bfloat16 logits (autocast's) as stored, widening each
// element as it is read, and computes in float32 as for float32 logits; the
// backward stores a bfloat16 dlogits rounded once. So the loss stays a
// float32 island (autocast's policy) without a conversion pass either way.
#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/parallel_util.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/element.h"

namespace anvil::cpu {

template <class T>
void softmax_cross_entropy_forward(int64_t N, int64_t C, const T* logits,
                                   const int64_t* labels, float label_smoothing, float* loss,
                                   float* probs) {
  const double on_label = 1.0 - double(label_smoothing), per_class = double(label_smoothing) / C;
#pragma omp parallel for schedule(static) if (N * C >= detail::kMinParallel)
  for (int64_t i = 0; i < N; ++i) {
    const T* x = logits + i * C;
    float* pr = probs + i * C;
    float mx = load(x[0]);
    for (int64_t j = 1; j < C; ++j) mx = load(x[j]) > mx ? load(x[j]) : mx;
    double total = 0.0, gap_sum = 0.0;
    for (int64_t j = 0; j < C; ++j) {
      const float e = std::exp(load(x[j]) - mx);
      pr[j] = e;
      total += e;
      gap_sum += double(mx) - double(load(x[j]));
    }
    const float inv = static_cast<float>(1.0 / total);
    for (int64_t j = 0; j < C; ++j) pr[j] *= inv;
    const double label_gap = double(mx) - double(load(x[labels[i]]));
    loss[i] = static_cast<float>(std::log(total) + on_label * label_gap + per_class * gap_sum);
  }
}

template <class T>
void softmax_cross_entropy_backward(int64_t N, int64_t C, const float* probs,
                                    const int64_t* labels, float label_smoothing,
                                    const float* dloss, T* dlogits) {
  // The label's target whole, as the CUDA kernel forms it: with one class it
  // is exactly 1 and the gradient exactly 0.
  const float per_class = label_smoothing / float(C),
              label_target = (1.0f - label_smoothing) + per_class;
#pragma omp parallel for schedule(static) if (N * C >= detail::kMinParallel)
  for (int64_t i = 0; i < N; ++i) {
    const float g = dloss[i];
    const float* pr = probs + i * C;
    T* d = dlogits + i * C;
    for (int64_t j = 0; j < C; ++j) d[j] = store<T>((pr[j] - per_class) * g);
    d[labels[i]] = store<T>((pr[labels[i]] - label_target) * g);
  }
}

#define ANVIL_SOFTMAX_CE(T)                                                                    \
  template void softmax_cross_entropy_forward(int64_t, int64_t, const T*, const int64_t*,      \
                                              float, float*, float*);                          \
  template void softmax_cross_entropy_backward(int64_t, int64_t, const float*, const int64_t*, \
                                               float, const float*, T*);
ANVIL_SOFTMAX_CE(float)
ANVIL_SOFTMAX_CE(bfloat16)
#undef ANVIL_SOFTMAX_CE

template <class T>
int64_t count_correct(int64_t N, int64_t C, const T* logits, const int64_t* labels) {
  int64_t correct = 0;
  for (int64_t i = 0; i < N; ++i) {
    const T* x = logits + i * C;
    int64_t best = 0;
    for (int64_t j = 1; j < C; ++j) best = load(x[j]) > load(x[best]) ? j : best;
    correct += best == labels[i];
  }
  return correct;
}
template int64_t count_correct(int64_t, int64_t, const float*, const int64_t*);
template int64_t count_correct(int64_t, int64_t, const bfloat16*, const int64_t*);

// ---- CpuBackend (cpu_backend.h) ----

void CpuBackend::softmax_cross_entropy_forward(const Tensor& logits, const Tensor& labels,
                                               float label_smoothing, const Tensor& loss,
                                               const Tensor& probs) {
  visit_float_dtype(logits.dtype(), "softmax_cross_entropy_forward", [&](auto t) {
    using T = decltype(t);
    cpu::softmax_cross_entropy_forward(logits.size(0), logits.size(1), logits.data<T>(),
                                       int64s(labels), label_smoothing, floats(loss),
                                       floats(probs));
  });
}
void CpuBackend::softmax_cross_entropy_backward(const Tensor& probs, const Tensor& labels,
                                                float label_smoothing, const Tensor& dloss,
                                                const Tensor& dlogits) {
  visit_float_dtype(dlogits.dtype(), "softmax_cross_entropy_backward", [&](auto t) {
    using T = decltype(t);
    cpu::softmax_cross_entropy_backward(probs.size(0), probs.size(1), floats(probs),
                                        int64s(labels), label_smoothing, floats(dloss),
                                        dlogits.data<T>());
  });
}
void CpuBackend::count_correct(const Tensor& logits, const Tensor& labels,
                               const Tensor& counter) {
  visit_float_dtype(logits.dtype(), "count_correct", [&](auto t) {
    using T = decltype(t);
    *counter.data<int64_t>() +=
        cpu::count_correct(logits.size(0), logits.size(1), logits.data<T>(), int64s(labels));
  });
}
void CpuBackend::check_labels(const Tensor& labels, int64_t classes) {
  const int64_t* p = int64s(labels);
  for (int64_t i = 0; i < labels.numel(); ++i)
    if (p[i] < 0 || p[i] >= classes)
      throw std::invalid_argument(label_error(p[i], classes, i, labels.numel()));
}

}  // namespace anvil::cpu
