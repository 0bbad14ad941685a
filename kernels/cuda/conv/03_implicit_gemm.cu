// Convolution rung 03, implicit GEMM. The same register-blocked GEMM
// (tile::register_blocked, gemm/tile.cuh: 256 threads, a 64x64 output tile,
// 4x4 outputs per thread in registers, 16-deep K steps through shared memory),
// but the operands are index functions: when a block stages its 16x64 tile of
// the column matrix (or of dy, for backward-data) into shared memory, each
// thread computes the image coordinates of its elements and loads them
// straight from x (or dy), zero where the window hangs over the padding. The
// column matrix never exists: no workspace, and no extra global-memory round
// trip. Shared memory holds exactly what GEMM rung 04's does (the A and B
// tiles, [k][j], padded by 2 floats per row against bank conflicts). As GEMMs:
//   forward          M = K, N = N*P*Q, K = C*R*S; B gathered from x, threads
//                    along (n,p,q): runs of consecutive q read x with stride sw
//   backward-data    M = C, N = N*H*W, K = K*R*S; the output is dx itself:
//                    B[(k,r,s), (n,h,w)] = dy[n, k, (h+ph-r)/sh, (w+pw-s)/sw]
//                    where that divides exactly and lands inside P x Q, else
//                    0. This turns col2im's scatter into a gather, so each
//                    thread owns its dx values: deterministic, no atomics;
//                    with stride > 1 most of B is zeros (wasted work).
//   backward-weight  M = K, N = C*R*S, K = N*P*Q; A = dy read as [k, (n,p,q)],
//                    B gathered from x, threads along (n,p,q). The long
//                    reduction runs inside one block per 64x64 dw tile
//                    (deterministic, but few blocks for small layers:
//                    LeNet's first layer is one block; rung 5 splits it).
// The index arithmetic (divisions by P*Q, Q, R*S, S per element) is what a
// production kernel would precompute per tile; here it is left plain.
//   build/sim/bench_cuda_kernels conv 3
#include "kernels/cuda/conv/rung.cuh"
#include "kernels/cuda/gemm/tile.cuh"

namespace anvil::cuda {
namespace conv_kernels {

__global__ void __launch_bounds__(tile::kThreads)
    forward_implicit(Geo g, const float* __restrict__ x, const float* __restrict__ w,
                     const float* __restrict__ bias, float* __restrict__ y) {
  const int CRS = g.C * g.RS(), PQ = g.PQ();
  tile::register_blocked(g.K, g.N * PQ, CRS, tile::Strided<false>{w, CRS}, ColByNpq{g, x},
                         [&](int k, int npq, float acc) {
                           const int n = npq / PQ, pq = npq % PQ;
                           y[(int64_t(n) * g.K + k) * PQ + pq] = bias ? acc + bias[k] : acc;
                         });
}

__global__ void __launch_bounds__(tile::kThreads)
    backward_data_implicit(Geo g, const float* __restrict__ dy, const float* __restrict__ w,
                           float* __restrict__ dx) {
  const int HW = g.H * g.W;
  tile::register_blocked(g.C, g.N * HW, g.K * g.RS(), WeightT{g, w}, DyTaps{g, dy},
                         [&](int c, int nhw, float acc) {
                           const int n = nhw / HW, hw = nhw % HW;
                           dx[(int64_t(n) * g.C + c) * HW + hw] = acc;
                         });
}

__global__ void __launch_bounds__(tile::kThreads)
    backward_weight_implicit(Geo g, const float* __restrict__ x, const float* __restrict__ dy,
                             float* __restrict__ dw) {
  const int CRS = g.C * g.RS();
  tile::register_blocked(g.K, CRS, g.N * g.PQ(), DyRows{g, dy}, ColByCrs{g, x},
                         [&](int k, int crs, float acc) { dw[int64_t(k) * CRS + crs] = acc; });
}

namespace {

dim3 tile_grid(int64_t M, int64_t N) {
  return dim3(static_cast<unsigned>((N + tile::kBN - 1) / tile::kBN),
              static_cast<unsigned>((M + tile::kBM - 1) / tile::kBM));
}

void forward(const Conv2dShape& s, const float* x, const float* w, const float* bias, float* y,
             float*, cudaStream_t stream) {
  launch(forward_implicit, tile_grid(s.K, s.N * s.P * s.Q), dim3(tile::kThreads), 0, stream,
         geo(s), x, w, bias, y);
}

void backward_data(const Conv2dShape& s, const float* dy, const float* w, float* dx, float*,
                   cudaStream_t stream) {
  launch(backward_data_implicit, tile_grid(s.C, s.N * s.H * s.W), dim3(tile::kThreads), 0,
         stream, geo(s), dy, w, dx);
}

void backward_weight(const Conv2dShape& s, const float* x, const float* dy, float* dw, float*,
                     cudaStream_t stream) {
  launch(backward_weight_implicit, tile_grid(s.K, s.C * s.R * s.S), dim3(tile::kThreads), 0,
         stream, geo(s), x, dy, dw);
}

}  // namespace
}  // namespace conv_kernels

const conv_rungs::Rung conv_rungs::kImplicitGemm = {
    "implicit GEMM", conv_kernels::no_workspace, conv_kernels::forward,
    conv_kernels::backward_data, conv_kernels::backward_weight};

}  // namespace anvil::cuda
