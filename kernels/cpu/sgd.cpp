// SGD parameter update (PyTorch semantics, dampening 0) over a list of
// tensors in one pass: kernels/sgd.h's element update (the CUDA kernel's
// too), applied chunk by chunk, the chunks of every tensor shared out
// among the threads of one OpenMP region (a multi-tensor update: one
// region for all of a model's parameters, not one per parameter). Weight
// decay, momentum buffer and step are applied per element, so the
// parameter, gradient and buffer are each streamed through memory once.
// The branches on the hyper-parameters are hoisted out of the loops, so
// each chunk is a plain vectorisable loop. Under autocast the step also
// writes the parameter's bfloat16 copy (core/autocast.h's CastCache) in
// the same pass.
#include <algorithm>
#include <vector>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/parallel_util.h"
#include "kernels/sgd_entries.h"

namespace anvil::cpu {

namespace {

constexpr int64_t kChunk = 16384;  // elements a thread takes at a time

template <SgdMode kMode, bool kNesterov, bool kCopy>
void update_range(const SgdEntry& e, int64_t begin, int64_t end, float lr, float momentum,
                  float weight_decay) {
  float* param = e.param;
  const float* grad = e.grad;
  float* buf = e.momentum_buf;
  bfloat16* copy = e.param_copy;
#pragma omp simd
  for (int64_t i = begin; i < end; ++i) {
    const float p =
        sgd_element<kMode, kNesterov>(param[i], grad[i], buf, i, lr, momentum, weight_decay);
    param[i] = p;
    if constexpr (kCopy) copy[i] = bfloat16(p);
  }
}

template <bool kCopy>
void update_chunk(const SgdEntry& e, int64_t begin, int64_t end, float lr, float momentum,
                  float weight_decay, bool nesterov) {
  auto go = [&](auto range) { range(e, begin, end, lr, momentum, weight_decay); };
  if (momentum == 0.0f) go(update_range<SgdMode::kPlain, false, kCopy>);
  else if (e.first_step && nesterov) go(update_range<SgdMode::kFirstStep, true, kCopy>);
  else if (e.first_step) go(update_range<SgdMode::kFirstStep, false, kCopy>);
  else if (nesterov) go(update_range<SgdMode::kMomentum, true, kCopy>);
  else go(update_range<SgdMode::kMomentum, false, kCopy>);
}

}  // namespace

void sgd_update(const SgdEntry* tensors, size_t count, float lr, float momentum,
                float weight_decay, bool nesterov) {
  struct Chunk {
    const SgdEntry* entry;
    int64_t begin, end;
  };
  std::vector<Chunk> chunks;
  int64_t total = 0;
  for (size_t t = 0; t < count; ++t) {
    for (int64_t b = 0; b < tensors[t].n; b += kChunk)
      chunks.push_back({&tensors[t], b, std::min(b + kChunk, tensors[t].n)});
    total += tensors[t].n;
  }
  const auto n = static_cast<int64_t>(chunks.size());
#pragma omp parallel for schedule(static) if (total >= detail::kMinParallel)
  for (int64_t c = 0; c < n; ++c) {
    const Chunk& k = chunks[size_t(c)];
    if (k.entry->param_copy)
      update_chunk<true>(*k.entry, k.begin, k.end, lr, momentum, weight_decay, nesterov);
    else
      update_chunk<false>(*k.entry, k.begin, k.end, lr, momentum, weight_decay, nesterov);
  }
}

void sgd_update(int64_t n, float* param, const float* grad, float* momentum_buf, float lr,
                float momentum, float weight_decay, bool nesterov, bool first_step,
                bfloat16* param_copy) {
  const SgdEntry e{param, grad, momentum_buf, param_copy, n, first_step};
  sgd_update(&e, 1, lr, momentum, weight_decay, nesterov);
}

// ---- CpuBackend (cpu_backend.h) ----

void CpuBackend::sgd_step(std::span<const SgdTensors> tensors, const SgdHyper& h) {
  const std::vector<SgdEntry> entries = sgd_entries(tensors);
  const float lr = h.lr_on_device.defined() ? *h.lr_on_device.data<float>() : h.lr;
  sgd_update(entries.data(), entries.size(), lr, h.momentum, h.weight_decay, h.nesterov);
}

void CpuBackend::zero_tensors(std::span<const Tensor> tensors) {
  for (const Tensor& t : tensors) fill(t, 0.0);
}

}  // namespace anvil::cpu
