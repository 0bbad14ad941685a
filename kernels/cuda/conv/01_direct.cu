// Convolution rung 01, naive direct. One thread per output element, computing
// it straight from the definition with bounds checks: forward, one thread per
// y element looping over c, r, s; backward-data, one thread per dx element
// gathering every (k, r, s) whose output position (p, q) read this pixel (its
// h + ph - r must be a multiple of the stride and land inside P); backward-
// weight, one thread per dw element looping over n, p, q. No shared memory and
// no atomics (each thread owns its output), so it is deterministic, but every
// thread reads its inputs from global memory on its own: the same x and w
// values are fetched again by many threads, and for backward-weight a few
// hundred threads each walk the whole batch.
//   build/sim/bench_cuda_kernels conv 1
#include "kernels/cuda/conv/rung.cuh"

namespace anvil::cuda {
namespace conv_kernels {

__global__ void __launch_bounds__(kThreads)
    forward_naive(Geo g, const float* __restrict__ x, const float* __restrict__ w,
                  const float* __restrict__ bias, float* __restrict__ y) {
  const int64_t i = global_index();
  if (i >= int64_t(g.N) * g.K * g.PQ()) return;
  const int q = int(i % g.Q), p = int(i / g.Q % g.P), k = int(i / g.PQ() % g.K);
  const int n = int(i / (int64_t(g.K) * g.PQ()));
  float acc = 0.0f;
  for (int c = 0; c < g.C; ++c)
    for (int r = 0; r < g.R; ++r)
      for (int s = 0; s < g.S; ++s)
        acc += w[((int64_t(k) * g.C + c) * g.R + r) * g.S + s] * x_at(g, x, n, c, p, q, r, s);
  y[i] = bias ? acc + bias[k] : acc;
}

__global__ void __launch_bounds__(kThreads)
    backward_data_naive(Geo g, const float* __restrict__ dy, const float* __restrict__ w,
                        float* __restrict__ dx) {
  const int64_t i = global_index();
  if (i >= int64_t(g.N) * g.C * g.H * g.W) return;
  const int wi = int(i % g.W), h = int(i / g.W % g.H), c = int(i / (int64_t(g.H) * g.W) % g.C);
  const int n = int(i / (int64_t(g.C) * g.H * g.W));
  float acc = 0.0f;
  for (int k = 0; k < g.K; ++k)
    for (int r = 0; r < g.R; ++r)
      for (int s = 0; s < g.S; ++s)
        acc += w[((int64_t(k) * g.C + c) * g.R + r) * g.S + s] * dy_tap(g, dy, n, k, h, wi, r, s);
  dx[i] = acc;
}

__global__ void __launch_bounds__(kThreads)
    backward_weight_naive(Geo g, const float* __restrict__ x, const float* __restrict__ dy,
                          float* __restrict__ dw) {
  const int64_t i = global_index();
  if (i >= int64_t(g.K) * g.C * g.RS()) return;
  const int s = int(i % g.S), r = int(i / g.S % g.R), c = int(i / g.RS() % g.C);
  const int k = int(i / (int64_t(g.C) * g.RS()));
  float acc = 0.0f;
  for (int n = 0; n < g.N; ++n)
    for (int p = 0; p < g.P; ++p)
      for (int q = 0; q < g.Q; ++q)
        acc += dy[((int64_t(n) * g.K + k) * g.P + p) * g.Q + q] * x_at(g, x, n, c, p, q, r, s);
  dw[i] = acc;
}

namespace {

void forward(const Conv2dShape& s, const float* x, const float* w, const float* bias, float* y,
             float*, cudaStream_t stream) {
  launch_1d(forward_naive, s.N * s.K * s.P * s.Q, stream, geo(s), x, w, bias, y);
}

void backward_data(const Conv2dShape& s, const float* dy, const float* w, float* dx, float*,
                   cudaStream_t stream) {
  launch_1d(backward_data_naive, s.N * s.C * s.H * s.W, stream, geo(s), dy, w, dx);
}

void backward_weight(const Conv2dShape& s, const float* x, const float* dy, float* dw, float*,
                     cudaStream_t stream) {
  launch_1d(backward_weight_naive, s.K * s.C * s.R * s.S, stream, geo(s), x, dy, dw);
}

}  // namespace
}  // namespace conv_kernels

const conv_rungs::Rung conv_rungs::kDirect = {"direct", conv_kernels::no_workspace,
                                              conv_kernels::forward, conv_kernels::backward_data,
                                              conv_kernels::backward_weight};

}  // namespace anvil::cuda
