// SGD parameter update, PyTorch semantics (dampening 0), fused into one pass:
//   g = grad + weight_decay * p
//   if momentum != 0: buf = first_step ? g : momentum * buf + g
//                     g = nesterov ? g + momentum * buf : buf
//   p -= lr * g
//   param_copy = bf16(p), when given (autocast's copy, core/autocast.h)
//
// Thread -> data mapping: one thread per parameter element, in a grid-stride
// loop over [0, n) with 64-bit indices (as elementwise.cu). A warp handles 32
// consecutive elements, so its reads of param, grad and momentum_buf and its
// writes of param and momentum_buf are each one coalesced 128-byte segment;
// each array is streamed through memory exactly once, which is the point of
// fusing the update (it is purely bandwidth-bound).
//
// The hyper-parameter branches depend only on kernel arguments, so every
// thread of the grid takes the same path (no divergence); they are turned
// into template parameters so each rung compiles to a straight-line loop.
// With first_step the old buffer is never read (an uninitialised buffer
// cannot leak NaN into the parameters), and with momentum == 0 the buffer is
// not touched at all (it may be null).
#include <stdexcept>
#include <string>

#include "kernels/cuda/cuda_compat.h"
#include "kernels/cuda/cuda_kernels.h"

namespace anvil::cuda {

namespace sgd_kernels {

constexpr int kBlock = 256;
constexpr int64_t kMaxBlocks = 2048;

enum class Mode { kPlain, kFirstStep, kMomentum };

template <Mode kMode, bool kNesterov>
__global__ void __launch_bounds__(kBlock) sgd_kernel(int64_t n, float* __restrict__ param, const float* __restrict__ grad,
                           float* __restrict__ buf, bfloat16* __restrict__ copy, float lr,
                           float momentum, float weight_decay) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    const float p = param[i];
    float g = grad[i] + weight_decay * p;
    if constexpr (kMode == Mode::kFirstStep) {
      buf[i] = g;
      if constexpr (kNesterov) g = g + momentum * g;
    } else if constexpr (kMode == Mode::kMomentum) {
      const float b = momentum * buf[i] + g;
      buf[i] = b;
      g = kNesterov ? g + momentum * b : b;
    }
    const float updated = p - lr * g;
    param[i] = updated;
    if (copy) copy[i] = bfloat16(updated);  // the same for every thread: no divergence
  }
}

}  // namespace sgd_kernels

void sgd_update(int64_t n, float* param, const float* grad, float* momentum_buf, float lr,
                float momentum, float weight_decay, bool nesterov, bool first_step,
                cudaStream_t stream, bfloat16* param_copy) {
  using namespace sgd_kernels;
  if (n < 0) throw std::invalid_argument("cuda::sgd_update: negative size " + std::to_string(n));
  if (n == 0) return;
  if (momentum != 0.0f && momentum_buf == nullptr)
    throw std::invalid_argument("cuda::sgd_update: momentum != 0 needs a momentum buffer");
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  const dim3 grid(static_cast<unsigned>(blocks < kMaxBlocks ? blocks : kMaxBlocks));
  auto go = [&](auto kernel) {
    launch(kernel, grid, dim3(kBlock), 0, stream, n, param, grad, momentum_buf, param_copy, lr,
           momentum, weight_decay);
  };
  if (momentum == 0.0f)
    go(sgd_kernel<Mode::kPlain, false>);  // nesterov without momentum is a plain step
  else if (first_step)
    go(nesterov ? sgd_kernel<Mode::kFirstStep, true> : sgd_kernel<Mode::kFirstStep, false>);
  else
    go(nesterov ? sgd_kernel<Mode::kMomentum, true> : sgd_kernel<Mode::kMomentum, false>);
}

}  // namespace anvil::cuda
