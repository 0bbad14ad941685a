// Convolution rung 08, BF16 tensor cores on the multistage mainloop: the
// forward convolution as an implicit GEMM over channels-last (NHWC)
// activations and KRSC filters (implicit_nhwc.cuh), on GEMM rung 12's
// mainloop (gemm/mma_multistage.cuh: cp.async stages, ldmatrix fragments,
// mma.sync.m16n8k16, FP32 accumulation), 4 stages deep in dynamic shared
// memory. The numerics are rung 07's: operands rounded once to bfloat16
// (nearest even), products summed in FP32, so rung 07's bounds hold
// (tests/test_cuda_conv_tf32.cpp); the order of the sums differs.
//
// Why channels-last. In NCHW the reduction's consecutive elements (c, r, s)
// lie H*W apart (or in R*S runs), so rungs 06/07 gather each operand
// element by element, recomputing (n, p, q) and (c, r, s) with divisions
// per element per k-step. In NHWC 8 consecutive channels of a pixel are 16
// contiguous bytes: one cp.async. Each thread computes its rows' pixels
// once (the only divisions, before the loop) and then steps a tap (r, s) and
// a channel block with additions: per 16-byte chunk and k-step, two adds,
// two unsigned compares (the padding mask) and a 64-bit add. C is padded
// with zeros to a multiple of 8 (LeNet's and ResNet-18's first layers have
// C = 1: eight times the products of their tiny GEMM).
//
// Threads and tiles. 128 threads, warps of 64 x 64 (mma_multistage.cuh's
// Shape): 256 x 64 blocks (4 x 1 warps) for K <= 64 output channels,
// 128 x 128 (2 x 2) above, rows along N*P*Q (blockIdx.x), columns along K.
// Per 32 of k a warp issues 16 ldmatrix.x4 for 64 mma; a thread 8 (wide)
// or 10 (narrow) cp.async of 16 bytes.
//
// Shared memory and pipeline. Both operands are contiguous along the
// reduction, so their stages are 12_bf16_pipelined.cu's "contiguous along
// k" layout (rows of 4 chunks, chunk c of row j at c ^ (j / 2 % 4): every
// ldmatrix and cp.async store conflict-free, the argument there). 4 stages
// of 16 KB (wide) or 20 KB (narrow): 64 or 80 KB of dynamic shared memory,
// past the 48 KB a kernel gets without cudaFuncSetAttribute's opt-in, which
// the launcher makes once per kernel.
//
// What reaches the kernel. The backend's tensors are NCHW, so x and w are
// first converted into the workspace (to_channels_last: bfloat16, C padded);
// y is written NCHW by the epilogue (bias added in FP32, rounded once to
// bfloat16 for a bfloat16 y).
//
// Backward-data is the same kernel, without structural zeros: at stride 1
// the forward convolution of dy with the filters flipped and C and K
// swapped; at stride 2 one such convolution per residue class of the
// stride, over that class's taps only, written to its pixels of dx
// (dgrad_classes below; CUTLASS calls it strided dgrad).
//
// Backward-weight (wgrad_nhwc.cuh) is the GEMM dw = col^T dy over N*P*Q on
// the same mainloop: x and dy converted to NHWC, M = R*S*Cp rows of the
// column matrix, N = K columns, both operands contiguous along their rows
// (ldmatrix.trans). Its tiles are the forward's (256 x 64 for K <= 64),
// and where they are too few to fill the GPU (ResNet-18's 64-channel 3x3
// layers: 3 tiles) the reduction is cut into chunks over grid.z
// (split_k.h's plan, each chunk whole k-steps of 32), their float32
// partials summed in a fixed order by split_k::sum_split_k.
//   build/sim/bench_cuda_kernels conv 8
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cuda/conv/conv.h"
#include "kernels/cuda/conv/implicit_nhwc.cuh"
#include "kernels/cuda/conv/rung.cuh"
#include "kernels/cuda/conv/wgrad_nhwc.cuh"
#include "kernels/cuda/gemm/split_k.h"

namespace anvil::cuda {
namespace {

using conv_kernels::ClassTaps;
using conv_kernels::NhwcGeo;
using Wide = multistage::Shape<2, 2, 4, 2>;    // 128 x 128, K > 64
using Narrow = multistage::Shape<4, 1, 4, 2>;  // 256 x 64, K <= 64

// Channels padded to whole 16-byte chunks of bfloat16. Every converted
// operand then has a multiple of 8 elements, so the next one starts aligned.
int64_t up8(int64_t channels) { return (channels + 7) / 8 * 8; }
int64_t padded_channels(const Conv2dShape& s) { return up8(s.C); }
// Elements of x in NHWC and of w in KRSC (w follows x in the workspace).
int64_t x_elems(const Conv2dShape& s) { return s.N * s.H * s.W * padded_channels(s); }
int64_t w_elems(const Conv2dShape& s) { return s.K * s.R * s.S * padded_channels(s); }

size_t forward_workspace(const Conv2dShape& s) {
  return size_t((x_elems(s) + w_elems(s)) / 2);  // bfloat16 pairs as floats
}

// Backward-data as forward convolutions, one per residue class (a, b) of
// the stride: the pixels h = a + sh i, w = b + sw j of dx read dy only
// through the filter rows r = r0 + sh t with r0 = (a + ph) % sh (and the
// columns likewise), at p = base + i - t, base = (a + ph - r0) / sh. With
// the taps flipped (t' = T-1-t) that is a stride-1 convolution of dy (K
// channels, P x Q) with T x U taps, padded T-1-base (any sign) and
// U-1-base', written to dx's class: every term a real tap (rung 07's GEMM
// over K*R*S multiplies the zero taps too: three quarters of them at
// stride 2). At stride 1 there is one class, the whole of dx: dy
// convolved with the flipped filters, padded R-1-ph. A class without taps
// (a 1x1 filter at stride 2 reaches one pixel in four) is zeros.
struct DgradClass {
  NhwcGeo geo;  // the class's forward convolution, stored into dx's class
  ClassTaps taps;
};
std::vector<DgradClass> dgrad_classes(const Conv2dShape& s) {
  const int sh = int(s.stride_h), sw = int(s.stride_w), Kp = int(up8(s.K));
  std::vector<DgradClass> classes;
  for (int a = 0; a < sh && a < s.H; ++a)
    for (int b = 0; b < sw && b < s.W; ++b) {
      const int r0 = int((a + s.pad_h) % sh), s0 = int((b + s.pad_w) % sw);
      const int T = r0 < s.R ? int((s.R - r0 + sh - 1) / sh) : 0;
      const int U = s0 < s.S ? int((s.S - s0 + sw - 1) / sw) : 0;
      const int rows = int((s.H - a + sh - 1) / sh), cols = int((s.W - b + sw - 1) / sw);
      const int base_h = int((a + s.pad_h - r0) / sh), base_w = int((b + s.pad_w - s0) / sw);
      NhwcGeo g{int(s.N), int(s.P), int(s.Q), Kp, int(s.C), T, U, 1, 1, T - 1 - base_h,
                U - 1 - base_w, rows, cols, (Kp + 31) / 32, int(s.H), int(s.W), a, b, sh, sw};
      classes.push_back({g, ClassTaps{int(s.K), int(s.C), int(s.R), int(s.S), r0, s0, sh, sw, T,
                                      U, Kp}});
    }
  return classes;
}

// Backward-weight: the GEMM's rows (R*S*Cp) and its split of N*P*Q on
// tile S; chunks of whole k-steps.
template <class S>
split_k::Plan wgrad_plan(const Conv2dShape& s) {
  const int64_t M = s.R * s.S * padded_channels(s), NPQ = s.N * s.P * s.Q;
  const int64_t tiles = (M + S::kBM - 1) / S::kBM * ((s.K + S::kBN - 1) / S::kBN);
  const split_k::Plan p = split_k::plan(M, s.K, NPQ, tiles, S::kMinBlocks);
  if (p.splits == 1) return p;
  const int64_t chunk = (p.chunk + 31) / 32 * 32;
  return {int((NPQ + chunk - 1) / chunk), chunk};
}
split_k::Plan wgrad_plan(const Conv2dShape& s) {
  return s.K <= Narrow::kBN ? wgrad_plan<Narrow>(s) : wgrad_plan<Wide>(s);
}
// Its workspace: the partials, then x and dy in NHWC (16-byte aligned:
// the partials' floats rounded up to a multiple of 4).
int64_t wgrad_partials(const Conv2dShape& s) {
  return (split_k::workspace_floats(wgrad_plan(s), s.K, s.C * s.R * s.S) + 3) / 4 * 4;
}
int64_t wgrad_floats(const Conv2dShape& s) {
  return wgrad_partials(s) + (x_elems(s) + s.N * s.P * s.Q * up8(s.K)) / 2;
}

size_t workspace(const Conv2dShape& s) {
  int64_t taps = 0;  // the largest class's flipped filters, after dy in NHWC
  for (const DgradClass& c : dgrad_classes(s)) taps = std::max<int64_t>(taps, c.taps.T * c.taps.U);
  const int64_t dgrad = (s.N * s.P * s.Q + s.C * taps) * up8(s.K);
  return std::max({forward_workspace(s), size_t(dgrad / 2), size_t(wgrad_floats(s))});
}

NhwcGeo nhwc_geo(const Conv2dShape& s) {
  const int Cp = int(padded_channels(s)), P = int(s.P), Q = int(s.Q);
  return NhwcGeo{int(s.N),     int(s.H),     int(s.W), Cp, int(s.K), int(s.R),      int(s.S),
                 int(s.stride_h), int(s.stride_w), int(s.pad_h), int(s.pad_w), P, Q,
                 (Cp + 31) / 32, P, Q, 0, 0, 1, 1};
}

template <class T>
void to_channels_last(int64_t N, int64_t C, int64_t H, int64_t W, int64_t Cp, const T* in,
                      bfloat16* out, cudaStream_t stream) {
  using conv_kernels::kTransposeRows;
  using conv_kernels::kTransposeTile;
  const int64_t tiles_hw = (H * W + kTransposeTile - 1) / kTransposeTile;
  const dim3 grid(unsigned(N * tiles_hw), unsigned((Cp + kTransposeTile - 1) / kTransposeTile));
  launch(conv_kernels::to_channels_last<T>, grid, dim3(kTransposeTile, kTransposeRows), 0, stream,
         int(C), int(H * W), int(Cp), int(tiles_hw), in, out);
}

template <class S, class TY>
void launch_forward(const NhwcGeo& g, const bfloat16* x, const bfloat16* w, const float* bias,
                    TY* y, cudaStream_t stream) {
  void (*kernel)(NhwcGeo, const bfloat16*, const bfloat16*, const float*, TY*) =
      conv_kernels::forward_nhwc<S>;
  static std::atomic<uint64_t> devices{0};  // this kernel's (one per S, TY)
  opt_in_shared(kernel, S::kSharedBytes, devices);
  const int64_t M = int64_t(g.N) * g.P * g.Q;
  const dim3 grid(unsigned((M + S::kBM - 1) / S::kBM), unsigned((g.K + S::kBN - 1) / S::kBN));
  launch(kernel, grid, dim3(S::kThreads), S::kSharedBytes, stream, g, x, w, bias, y);
}

// x and w (float32 or bfloat16, NCHW and KCRS) converted into ws, then the
// GEMM on shape S (the rung's tile choice unless a test names the stages).
template <class S, class T, class TY>
void forward_on(const Conv2dShape& s, const T* x, const T* w, const float* bias, TY* y, float* ws,
                cudaStream_t stream) {
  const int64_t Cp = padded_channels(s);
  bfloat16* xh = reinterpret_cast<bfloat16*>(ws);
  bfloat16* wh = xh + x_elems(s);
  to_channels_last(s.N, s.C, s.H, s.W, Cp, x, xh, stream);
  to_channels_last(s.K, s.C, s.R, s.S, Cp, w, wh, stream);
  launch_forward<S>(nhwc_geo(s), xh, wh, bias, y, stream);
}

template <class T, class TY>
void forward(const Conv2dShape& s, const T* x, const T* w, const float* bias, TY* y, float* ws,
             cudaStream_t stream) {
  if (s.K <= Narrow::kBN)
    forward_on<Narrow>(s, x, w, bias, y, ws, stream);
  else
    forward_on<Wide>(s, x, w, bias, y, ws, stream);
}

// dy into NHWC in ws, then per residue class its flipped filters after it
// and the class's forward GEMM (the classes run in order on the stream, so
// they share the filters' space).
template <class T, class TY>
void backward_data(const Conv2dShape& s, const T* dy, const T* w, TY* dx, float* ws,
                   cudaStream_t stream) {
  const std::vector<DgradClass> classes = dgrad_classes(s);
  const int64_t Kp = up8(s.K);
  bfloat16* dyh = reinterpret_cast<bfloat16*>(ws);
  bfloat16* wh = dyh + s.N * s.P * s.Q * Kp;
  bool empty_class = false;
  for (const DgradClass& c : classes) empty_class |= c.taps.T == 0 || c.taps.U == 0;
  if (empty_class)  // zeros where no tap reaches (+0 in float32 and bfloat16 alike)
    check(cudaMemsetAsync(dx, 0, size_t(s.N * s.C * s.H * s.W) * sizeof(TY), stream),
          "cudaMemsetAsync(conv rung 08 backward-data dx)");
  to_channels_last(s.N, s.K, s.P, s.Q, Kp, dy, dyh, stream);
  for (const DgradClass& c : classes) {
    if (c.taps.T == 0 || c.taps.U == 0) continue;
    conv_kernels::launch_1d(conv_kernels::flipped_to_channels_last<T>,
                            s.C * c.taps.T * c.taps.U * Kp, stream, c.taps, w, wh);
    if (s.C <= Narrow::kBN)
      launch_forward<Narrow>(c.geo, dyh, wh, nullptr, dx, stream);
    else
      launch_forward<Wide>(c.geo, dyh, wh, nullptr, dx, stream);
  }
}

// x and dy into NHWC after the partials in ws, then the GEMM on tile S,
// split as wgrad_plan says.
template <class S, class T>
void backward_weight_on(const Conv2dShape& s, const T* x, const T* dy, float* dw, float* ws,
                        cudaStream_t stream) {
  const int64_t Cp = padded_channels(s), Kp = up8(s.K);
  const split_k::Plan plan = wgrad_plan<S>(s);
  float* partials = ws;
  bfloat16* xh = reinterpret_cast<bfloat16*>(ws + wgrad_partials(s));
  bfloat16* dyh = xh + x_elems(s);
  to_channels_last(s.N, s.C, s.H, s.W, Cp, x, xh, stream);
  to_channels_last(s.N, s.K, s.P, s.Q, Kp, dy, dyh, stream);
  const conv_kernels::WgradGeo g{int(s.N), int(s.H), int(s.W), int(s.C), int(Cp),
                                 int(s.K), int(Kp),  int(s.R), int(s.S), int(s.stride_h),
                                 int(s.stride_w), int(s.pad_h), int(s.pad_w), int(s.P),
                                 int(s.Q), int(plan.chunk)};
  void (*kernel)(conv_kernels::WgradGeo, const bfloat16*, const bfloat16*, float*) =
      conv_kernels::backward_weight_nhwc<S>;
  static std::atomic<uint64_t> devices{0};
  opt_in_shared(kernel, S::kSharedBytes, devices);
  const int64_t M = s.R * s.S * Cp;
  const dim3 grid(unsigned((M + S::kBM - 1) / S::kBM), unsigned((s.K + S::kBN - 1) / S::kBN),
                  unsigned(plan.splits));
  launch(kernel, grid, dim3(S::kThreads), S::kSharedBytes, stream, g, xh, dyh,
         plan.splits == 1 ? dw : partials);
  if (plan.splits > 1) {
    const int64_t KCRS = s.K * s.C * s.R * s.S;
    split_k::sum_split_k(plan.splits, 1, int(KCRS), partials, 1.0f, 0.0f, nullptr, dw, KCRS,
                         stream);
  }
}

template <class T>
void backward_weight(const Conv2dShape& s, const T* x, const T* dy, float* dw, float* ws,
                     cudaStream_t stream) {
  if (s.K <= Narrow::kBN)
    backward_weight_on<Narrow>(s, x, dy, dw, ws, stream);
  else
    backward_weight_on<Wide>(s, x, dy, dw, ws, stream);
}

}  // namespace

void conv_rungs::bf16_multistage_forward(int stages, const Conv2dShape& s, const float* x,
                                         const float* w, const float* bias, float* y, float* ws,
                                         cudaStream_t stream) {
  switch (stages) {
    case 2: return forward_on<multistage::Shape<2, 2, 2, 2>>(s, x, w, bias, y, ws, stream);
    case 3: return forward_on<multistage::Shape<2, 2, 3, 2>>(s, x, w, bias, y, ws, stream);
    case 4: return forward_on<Wide>(s, x, w, bias, y, ws, stream);
  }
  throw std::invalid_argument("conv rung 08: " + std::to_string(stages) +
                              " stages (2, 3 or 4 are built)");
}

// Constant-initialised rung 07 (a constexpr rung()) is complete before any
// dynamic initialisation, this one's included.
const conv_rungs::Rung conv_rungs::kBf16Multistage = [] {
  Rung r = kBf16Mma;
  r.name = "bf16 multistage";
  r.workspace = workspace;
  r.forward = forward<float, float>;
  r.forward_bf16 = forward<bfloat16, float>;
  r.forward_bf16_out = forward<bfloat16, bfloat16>;
  r.backward_data = backward_data<float, float>;
  r.backward_data_bf16 = backward_data<bfloat16, float>;
  r.backward_data_bf16_out = backward_data<bfloat16, bfloat16>;
  r.backward_weight = backward_weight<float>;
  r.backward_weight_bf16 = backward_weight<bfloat16>;
  return r;
}();

}  // namespace anvil::cuda
