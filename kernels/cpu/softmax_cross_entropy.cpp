// Fused softmax + cross-entropy over rows of logits[N, C].
// Numerically stable: each row is shifted by its max before exp, and the
// normaliser is accumulated in double, so loss = log(sum exp(x - max)) +
// max - x[label] loses no precision even for large logits. Rows are
// independent, so OpenMP splits rows when the batch is large enough.
// count_correct, beside them, scores a batch's predictions for the epoch's
// accuracy.
#include <cmath>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/parallel_util.h"

namespace anvil::cpu {

void softmax_cross_entropy_forward(int64_t N, int64_t C, const float* logits,
                                   const int64_t* labels, float* loss, float* probs) {
#pragma omp parallel for schedule(static) if (N * C >= detail::kMinParallel)
  for (int64_t i = 0; i < N; ++i) {
    const float* x = logits + i * C;
    float* pr = probs + i * C;
    float mx = x[0];
    for (int64_t j = 1; j < C; ++j) mx = x[j] > mx ? x[j] : mx;
    double total = 0.0;
    for (int64_t j = 0; j < C; ++j) {
      const float e = std::exp(x[j] - mx);
      pr[j] = e;
      total += e;
    }
    const float inv = static_cast<float>(1.0 / total);
    for (int64_t j = 0; j < C; ++j) pr[j] *= inv;
    loss[i] = static_cast<float>(std::log(total) + static_cast<double>(mx) -
                                 static_cast<double>(x[labels[i]]));
  }
}

void softmax_cross_entropy_backward(int64_t N, int64_t C, const float* probs,
                                    const int64_t* labels, const float* dloss, float* dlogits) {
#pragma omp parallel for schedule(static) if (N * C >= detail::kMinParallel)
  for (int64_t i = 0; i < N; ++i) {
    const float g = dloss[i];
    const float* pr = probs + i * C;
    float* d = dlogits + i * C;
    for (int64_t j = 0; j < C; ++j) d[j] = pr[j] * g;
    d[labels[i]] = (pr[labels[i]] - 1.0f) * g;
  }
}

int64_t count_correct(int64_t N, int64_t C, const float* logits, const int64_t* labels) {
  int64_t correct = 0;
  for (int64_t i = 0; i < N; ++i) {
    const float* x = logits + i * C;
    int64_t best = 0;
    for (int64_t j = 1; j < C; ++j) best = x[j] > x[best] ? j : best;
    correct += best == labels[i];
  }
  return correct;
}

}  // namespace anvil::cpu
