// BatchNorm rung 01, one block per channel (gridDim.x = C),
// kBlock = 256 threads. A channel's M = N*HW values are N runs of HW
// contiguous floats, CHW apart. Thread t takes the channel's elements t, t +
// 256, t + 512, ... (in the channel's own n-major order), so a warp reads 32
// consecutive floats of a run (coalesced whenever HW >= 32). Each thread keeps
// a private partial sum in a register, then the block adds the 256 partials
// with a shared-memory tree (8 halving steps, a __syncthreads after each). A
// channel is owned by one block, so the per-channel results (save_*,
// running_*, dgamma, dbeta) are written by its thread 0 and no cross-block
// step is needed.
//   forward:  pass 1 sum -> mean; pass 2 sum of (x - mean)^2 ->
//             variance (not E[x^2] - E[x]^2, which cancels badly
//             when |mean| >> std); pass 3 writes
//             y = (x - mean) * gamma*invstd + beta.
//   backward: pass 1 sums dy and dy * (x - mean) together;
//             pass 2 writes dx = k*dy + u*(x - mean) + v with
//             k = gamma*invstd, u = -k*invstd*sum(dy*xhat)/M,
//             v = -k*sum(dy)/M.
// Sums are in float: a few hundred values per thread and a tree
// of depth 8 round to around 1e-6 relative. But C blocks leave
// an H100's 132 SMs mostly idle (ResNet-18's stage 1: 64 blocks
// each making 3 passes over 200,704 values at batch 256, one
// load in flight per thread).
//   build/sim/bench_cuda_kernels bn 1
#include <stdexcept>

#include "kernels/cuda/batch_norm/rung.cuh"

namespace anvil::cuda {
namespace batch_norm_kernels {

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

__global__ void __launch_bounds__(kBlock)
    forward_train_kernel(int64_t N, int64_t C, int64_t HW, const float* __restrict__ x,
                         const float* __restrict__ gamma, const float* __restrict__ beta, float eps,
                         float momentum, float* __restrict__ running_mean,
                         float* __restrict__ running_var, float* __restrict__ save_mean,
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

__global__ void __launch_bounds__(kBlock)
    backward_train_kernel(int64_t N, int64_t C, int64_t HW, const float* __restrict__ x,
                          const float* __restrict__ gamma, const float* __restrict__ save_mean,
                          const float* __restrict__ save_invstd, const float* __restrict__ dy,
                          float* __restrict__ dx, float* __restrict__ dgamma,
                          float* __restrict__ dbeta) {
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

namespace {

void forward(const batch_norm_rungs::Forward& f, cudaStream_t stream) {
  if (f.relu || f.residual)
    throw std::invalid_argument("cuda::batch_norm_forward_train: rung 1 has no fused ReLU (rung 2 has)");
  launch(forward_train_kernel, dim3(static_cast<unsigned>(f.C)), dim3(kBlock), 0, stream, f.N,
         f.C, f.HW, f.x, f.gamma, f.beta, f.eps, f.momentum, f.running_mean, f.running_var,
         f.save_mean, f.save_invstd, f.y);
}

void backward(const batch_norm_rungs::Backward& b, cudaStream_t stream) {
  if (b.relu_y || b.dresidual)
    throw std::invalid_argument("cuda::batch_norm_backward_train: rung 1 has no fused ReLU (rung 2 has)");
  launch(backward_train_kernel, dim3(static_cast<unsigned>(b.C)), dim3(kBlock), 0, stream, b.N,
         b.C, b.HW, b.x, b.gamma, b.save_mean, b.save_invstd, b.dy, b.dx, b.dgamma, b.dbeta);
}

size_t workspace(int64_t, int64_t, int64_t) { return 0; }

}  // namespace
}  // namespace batch_norm_kernels

const batch_norm_rungs::Rung batch_norm_rungs::kBlockPerChannel = {
    "block per channel", batch_norm_kernels::forward, batch_norm_kernels::backward,
    batch_norm_kernels::workspace};

}  // namespace anvil::cuda
