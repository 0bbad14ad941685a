// The optimizer's kernels: SGD over many tensors in one launch, and many
// tensors zeroed in one launch (multi-tensor apply, multi_tensor.cuh). The
// element update is kernels/sgd.h's, the CPU kernel's too.
//
// Thread -> data mapping: a block owns one chunk of kChunk consecutive
// elements of one tensor and walks it kBlock elements at a time, one per
// thread, so a warp's loads of param, grad and momentum_buf and its stores
// of param and momentum_buf are each one coalesced 128-byte segment; every
// array is streamed through memory once (the update is bandwidth-bound).
// Whether a tensor is at its first step (its buffer set, not read) is its
// entry's, the same for all threads of a block: no divergence. The
// learning rate is a kernel argument, or read from device memory
// (lr_device), so that a step captured in a CUDA graph follows a schedule:
// the value is read when the graph runs, not when it was captured.
#include <stdexcept>
#include <string>

#include "kernels/cuda/cuda_compat.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/multi_tensor.cuh"
#include "kernels/sgd.h"

namespace anvil::cuda {

namespace sgd_kernels {

constexpr int kBlock = 256;
constexpr int64_t kChunk = 16 * kBlock;
// Tensors per launch: ResNet-18's 76 parameters (its convolutions have
// biases) in one, the table 6.5 KB of kernel parameters (CUDA 12.1 and
// later take 32764 bytes; multi_tensor.cuh).
constexpr int kSgdTensors = 128;
constexpr int kZeroTensors = 256;

using SgdTable = multi_tensor::Table<SgdEntry, kSgdTensors>;
static_assert(sizeof(SgdTable) <= 8192, "kernel parameters stay far under CUDA's 32764 bytes");

using ZeroTable = multi_tensor::Table<FloatRange, kZeroTensors>;
static_assert(sizeof(ZeroTable) <= 8192, "kernel parameters stay far under CUDA's 32764 bytes");

template <SgdMode kMode, bool kNesterov>
__device__ __forceinline__ void update_chunk(const SgdEntry& e, int64_t begin, int64_t end,
                                             float lr, float momentum, float weight_decay) {
  for (int64_t i = begin + threadIdx.x; i < end; i += kBlock) {
    const float p = sgd_element<kMode, kNesterov>(e.param[i], e.grad[i], e.momentum_buf, i, lr,
                                                  momentum, weight_decay);
    e.param[i] = p;
    if (e.param_copy) e.param_copy[i] = bfloat16(p);  // the same for every thread: no divergence
  }
}

template <bool kMomentum, bool kNesterov>
__global__ void __launch_bounds__(kBlock)
    sgd_multi_tensor(const __grid_constant__ SgdTable table, const float* lr_device, float lr,
                     float momentum, float weight_decay) {
  const int t = multi_tensor::entry_of(table, static_cast<int>(blockIdx.x));
  const SgdEntry& e = table.entries[t];
  const int64_t begin = static_cast<int64_t>(static_cast<int>(blockIdx.x) - table.block_start[t]) * kChunk;
  const int64_t end = begin + kChunk < e.n ? begin + kChunk : e.n;
  const float rate = lr_device ? *lr_device : lr;
  if constexpr (!kMomentum)
    update_chunk<SgdMode::kPlain, false>(e, begin, end, rate, momentum, weight_decay);
  else if (e.first_step)
    update_chunk<SgdMode::kFirstStep, kNesterov>(e, begin, end, rate, momentum, weight_decay);
  else
    update_chunk<SgdMode::kMomentum, kNesterov>(e, begin, end, rate, momentum, weight_decay);
}

__global__ void __launch_bounds__(kBlock) zero_multi_tensor(const __grid_constant__ ZeroTable table) {
  const int t = multi_tensor::entry_of(table, static_cast<int>(blockIdx.x));
  const FloatRange& e = table.entries[t];
  const int64_t begin = static_cast<int64_t>(static_cast<int>(blockIdx.x) - table.block_start[t]) * kChunk;
  const int64_t end = begin + kChunk < e.n ? begin + kChunk : e.n;
  for (int64_t i = begin + threadIdx.x; i < end; i += kBlock) e.data[i] = 0.0f;
}

}  // namespace sgd_kernels

void sgd_update(const SgdEntry* tensors, size_t count, const float* lr_device, float lr,
                float momentum, float weight_decay, bool nesterov, cudaStream_t stream) {
  using namespace sgd_kernels;
  for (size_t i = 0; i < count; ++i)
    if (momentum != 0.0f && tensors[i].n > 0 && tensors[i].momentum_buf == nullptr)
      throw std::invalid_argument("cuda::sgd_update: momentum != 0 needs a momentum buffer (tensor " +
                                  std::to_string(i) + ")");
  multi_tensor::for_each_table<kSgdTensors>(tensors, count, kChunk, [&](const SgdTable& table,
                                                                       unsigned blocks) {
    auto go = [&](auto kernel) {
      launch(kernel, dim3(blocks), dim3(kBlock), 0, stream, table, lr_device, lr, momentum,
             weight_decay);
    };
    if (momentum == 0.0f) go(sgd_multi_tensor<false, false>);  // nesterov without momentum is plain
    else if (nesterov) go(sgd_multi_tensor<true, true>);
    else go(sgd_multi_tensor<true, false>);
  });
}

void sgd_update(int64_t n, float* param, const float* grad, float* momentum_buf, float lr,
                float momentum, float weight_decay, bool nesterov, bool first_step,
                cudaStream_t stream, bfloat16* param_copy) {
  if (n < 0) throw std::invalid_argument("cuda::sgd_update: negative size " + std::to_string(n));
  const SgdEntry e{param, grad, momentum_buf, param_copy, n, first_step};
  sgd_update(&e, 1, nullptr, lr, momentum, weight_decay, nesterov, stream);
}

void zero_floats(const FloatRange* ranges, size_t count, cudaStream_t stream) {
  using namespace sgd_kernels;
  multi_tensor::for_each_table<kZeroTensors>(ranges, count, kChunk,
                                             [&](const ZeroTable& table, unsigned blocks) {
                                               launch(zero_multi_tensor, dim3(blocks), dim3(kBlock),
                                                      0, stream, table);
                                             });
}

}  // namespace anvil::cuda
