// Batch normalisation over x[N, C, HW] per channel (training forward, eval
// forward, training backward), the same semantics as kernels/cpu/batch_norm.cpp
// (PyTorch's): the batch mean and biased variance normalise; save_mean and
// save_invstd = 1/sqrt(var + eps) are kept for the backward; the running
// statistics move towards the batch mean and the unbiased variance
// (M/(M-1), M = N*HW; with M == 1 the biased value) with `momentum`.
//
// Training forward and backward: ONE BLOCK PER CHANNEL (gridDim.x = C),
// kBlock = 256 threads. A channel's M = N*HW values are N runs of HW
// contiguous floats, CHW apart. Thread t takes the channel's elements
// t, t + 256, t + 512, ... (in the channel's own n-major order), so a warp
// reads 32 consecutive floats of a run (coalesced whenever HW >= 32; for
// small HW the warp's reads are spread over a few runs). Each thread keeps a
// private partial sum in a register, then the block adds the 256 partials
// with a shared-memory tree (8 halving steps, a __syncthreads after each).
// The order of every addition depends only on the shapes, never on timing,
// so results are deterministic run to run (no atomics). A channel is owned
// by one block, so the per-channel results (save_*, running_*, dgamma,
// dbeta) are written by its thread 0 and no cross-block step is needed.
//
//   forward:  pass 1 sum -> mean; pass 2 sum of (x - mean)^2 -> variance
//             (two passes, not E[x^2] - E[x]^2, which cancels badly when
//             |mean| >> std); pass 3 writes y = (x - mean) * gamma*invstd + beta.
//   backward: pass 1 sums dy and dy * (x - mean) together (two trees side by
//             side); pass 2 writes dx = k*dy + u*(x - mean) + v with
//             k = gamma*invstd, u = -k*invstd*sum(dy*xhat)/M, v = -k*sum(dy)/M.
// Sums are accumulated in float (the CPU uses double): with a few hundred
// values per thread and a tree of depth 8 the rounding stays around 1e-6
// relative, far below what training notices.
//
// Eval forward is elementwise: a grid-stride loop over all N*C*HW elements
// (coalesced as in elementwise.cu), each thread computing its channel's scale
// from running_var (the per-channel values stay in cache).
//
// One block per channel uses few blocks when C is small (C = 6 fills 6 SMs);
// splitting a channel over several blocks would need a second reduction
// step or atomics. For the layer sizes of small CNNs (C >= 16, M in the
// thousands) it is bandwidth-bound either way.
#include <stdexcept>
#include <string>

#include "kernels/cuda/cuda_compat.h"
#include "kernels/cuda/cuda_kernels.h"

namespace anvil::cuda {

namespace batch_norm_kernels {

constexpr int kBlock = 256;  // a power of two: the tree halves it
constexpr int64_t kMaxBlocks = 2048;

// Walks the calling thread's elements of channel c: the channel's m-th value
// (m = n*HW + i) sits at n*CHW + c*HW + i. Stepping m by blockDim.x moves n
// by dn and i by di (with one carry at most), so the loop needs no division.
struct ChannelWalk {
  int64_t m, i, off;       // position in the channel, in the run, in memory
  int64_t M, HW, CHW, dn, di;
  __device__ ChannelWalk(int64_t N, int64_t C, int64_t HW_, int64_t c)
      : M(N * HW_), HW(HW_), CHW(C * HW_) {
    const int64_t step = blockDim.x;
    m = threadIdx.x;
    dn = HW > 0 ? step / HW : 0;
    di = HW > 0 ? step % HW : 0;
    const int64_t n0 = HW > 0 ? m / HW : 0;
    i = HW > 0 ? m % HW : 0;
    off = n0 * CHW + c * HW + i;
  }
  __device__ bool more() const { return m < M; }
  __device__ void next() {
    m += blockDim.x;
    i += di;
    off += dn * CHW + di;
    if (i >= HW) {
      i -= HW;
      off += CHW - HW;
    }
  }
};

// The sum of every thread's v, returned to all threads. buf: kBlock floats
// of shared memory, free again when this returns.
__device__ __forceinline__ float block_sum(float v, float* buf) {
  const int t = threadIdx.x;
  buf[t] = v;
  __syncthreads();
  for (int s = kBlock / 2; s > 0; s >>= 1) {
    if (t < s) buf[t] += buf[t + s];
    __syncthreads();
  }
  const float total = buf[0];
  __syncthreads();  // everyone has read buf[0] before buf is reused
  return total;
}

// Two sums at once (one barrier per step for both trees).
__device__ __forceinline__ void block_sum2(float& a, float& b, float* buf_a, float* buf_b) {
  const int t = threadIdx.x;
  buf_a[t] = a;
  buf_b[t] = b;
  __syncthreads();
  for (int s = kBlock / 2; s > 0; s >>= 1) {
    if (t < s) {
      buf_a[t] += buf_a[t + s];
      buf_b[t] += buf_b[t + s];
    }
    __syncthreads();
  }
  a = buf_a[0];
  b = buf_b[0];
  __syncthreads();
}

__global__ void forward_train_kernel(int64_t N, int64_t C, int64_t HW,
                                     const float* __restrict__ x, const float* __restrict__ gamma,
                                     const float* __restrict__ beta, float eps, float momentum,
                                     float* __restrict__ running_mean,
                                     float* __restrict__ running_var,
                                     float* __restrict__ save_mean,
                                     float* __restrict__ save_invstd, float* __restrict__ y) {
  __shared__ float buf[kBlock];
  const int64_t c = blockIdx.x;
  const int64_t M = N * HW;
  const float Mf = static_cast<float>(M);

  float part = 0.0f;
  for (ChannelWalk e(N, C, HW, c); e.more(); e.next()) part += x[e.off];
  const float sum = block_sum(part, buf);
  const float mean = M > 0 ? sum / Mf : 0.0f;

  part = 0.0f;
  for (ChannelWalk e(N, C, HW, c); e.more(); e.next()) {
    const float d = x[e.off] - mean;
    part += d * d;
  }
  const float ss = block_sum(part, buf);
  const float var = M > 0 ? ss / Mf : 0.0f;
  const float invstd = 1.0f / sqrtf(var + eps);

  if (threadIdx.x == 0) {
    save_mean[c] = mean;
    save_invstd[c] = invstd;
    if (running_mean) running_mean[c] = (1.0f - momentum) * running_mean[c] + momentum * mean;
    if (running_var) {
      const float unbiased = M > 1 ? ss / static_cast<float>(M - 1) : var;
      running_var[c] = (1.0f - momentum) * running_var[c] + momentum * unbiased;
    }
  }

  const float a = gamma[c] * invstd, b = beta[c];
  for (ChannelWalk e(N, C, HW, c); e.more(); e.next()) y[e.off] = (x[e.off] - mean) * a + b;
}

__global__ void backward_train_kernel(int64_t N, int64_t C, int64_t HW,
                                      const float* __restrict__ x,
                                      const float* __restrict__ gamma,
                                      const float* __restrict__ save_mean,
                                      const float* __restrict__ save_invstd,
                                      const float* __restrict__ dy, float* __restrict__ dx,
                                      float* __restrict__ dgamma, float* __restrict__ dbeta) {
  __shared__ float buf_dy[kBlock];
  __shared__ float buf_dyx[kBlock];
  const int64_t c = blockIdx.x;
  const int64_t M = N * HW;
  const float mean = save_mean[c], invstd = save_invstd[c];

  float sdy = 0.0f, sdyx = 0.0f;  // sum(dy), sum(dy * (x - mean))
  for (ChannelWalk e(N, C, HW, c); e.more(); e.next()) {
    const float g = dy[e.off];
    sdy += g;
    sdyx += g * (x[e.off] - mean);
  }
  block_sum2(sdy, sdyx, buf_dy, buf_dyx);
  const float sdyxhat = sdyx * invstd;  // sum(dy * xhat)
  if (threadIdx.x == 0) {
    dbeta[c] = sdy;
    dgamma[c] = sdyxhat;
  }
  if (M == 0) return;  // the same for every thread of the block

  const float Mf = static_cast<float>(M);
  const float k = gamma[c] * invstd;
  const float u = -k * invstd * sdyxhat / Mf;
  const float v = -k * sdy / Mf;
  for (ChannelWalk e(N, C, HW, c); e.more(); e.next())
    dx[e.off] = k * dy[e.off] + u * (x[e.off] - mean) + v;
}

// Flat grid-stride loop; Index is int when every index fits in 31 bits.
template <typename Index>
__global__ void forward_eval_kernel(Index total, Index C, Index HW, const float* __restrict__ x,
                                    const float* __restrict__ gamma,
                                    const float* __restrict__ beta,
                                    const float* __restrict__ running_mean,
                                    const float* __restrict__ running_var, float eps,
                                    float* __restrict__ y) {
  const Index stride = static_cast<Index>(gridDim.x) * static_cast<Index>(blockDim.x);
  for (Index i = static_cast<Index>(blockIdx.x) * static_cast<Index>(blockDim.x) +
                 static_cast<Index>(threadIdx.x);
       i < total; i += stride) {
    const Index c = (i / HW) % C;
    const float a = gamma[c] / sqrtf(running_var[c] + eps);
    y[i] = (x[i] - running_mean[c]) * a + beta[c];
  }
}

void check_sizes(int64_t N, int64_t C, int64_t HW, const char* who) {
  if (N < 0 || C < 0 || HW < 0)
    throw std::invalid_argument(std::string("cuda::") + who + ": negative size " +
                                std::to_string(N) + "x" + std::to_string(C) + "x" +
                                std::to_string(HW));
  if (C > INT32_MAX)
    throw std::invalid_argument(std::string("cuda::") + who + ": more than 2^31-1 channels");
}

}  // namespace batch_norm_kernels

using namespace batch_norm_kernels;

void batch_norm_forward_train(int64_t N, int64_t C, int64_t HW, const float* x,
                              const float* gamma, const float* beta, float eps, float momentum,
                              float* running_mean, float* running_var, float* save_mean,
                              float* save_invstd, float* y, cudaStream_t stream) {
  check_sizes(N, C, HW, "batch_norm_forward_train");
  if (C == 0) return;
  launch(forward_train_kernel, dim3(static_cast<unsigned>(C)), dim3(kBlock), 0, stream, N, C, HW,
         x, gamma, beta, eps, momentum, running_mean, running_var, save_mean, save_invstd, y);
}

void batch_norm_forward_eval(int64_t N, int64_t C, int64_t HW, const float* x,
                             const float* gamma, const float* beta, const float* running_mean,
                             const float* running_var, float eps, float* y,
                             cudaStream_t stream) {
  check_sizes(N, C, HW, "batch_norm_forward_eval");
  const int64_t total = N * C * HW;
  if (total == 0) return;
  const int64_t blocks = (total + kBlock - 1) / kBlock;
  const dim3 grid(static_cast<unsigned>(blocks < kMaxBlocks ? blocks : kMaxBlocks));
  if (total <= INT32_MAX - kMaxBlocks * kBlock)  // i + stride stays below 2^31
    launch(forward_eval_kernel<int>, grid, dim3(kBlock), 0, stream, static_cast<int>(total),
           static_cast<int>(C), static_cast<int>(HW), x, gamma, beta, running_mean, running_var,
           eps, y);
  else
    launch(forward_eval_kernel<int64_t>, grid, dim3(kBlock), 0, stream, total, C, HW, x, gamma,
           beta, running_mean, running_var, eps, y);
}

void batch_norm_backward_train(int64_t N, int64_t C, int64_t HW, const float* x,
                               const float* gamma, const float* save_mean,
                               const float* save_invstd, const float* dy, float* dx,
                               float* dgamma, float* dbeta, cudaStream_t stream) {
  check_sizes(N, C, HW, "batch_norm_backward_train");
  if (C == 0) return;
  launch(backward_train_kernel, dim3(static_cast<unsigned>(C)), dim3(kBlock), 0, stream, N, C,
         HW, x, gamma, save_mean, save_invstd, dy, dx, dgamma, dbeta);
}

}  // namespace anvil::cuda
