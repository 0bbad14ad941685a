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
// Backward-data at stride 1 (ResNet-18's 3x3 layers but the three that
// halve the image, LeNet's) is the same kernel: the forward convolution of
// dy with the filters flipped and C and K swapped (backward_data_as_forward
// below), so it multiplies no structural zeros; at stride 2 it is rung 07's,
// zeros included. Backward-weight is rung 07's.
//   build/sim/bench_cuda_kernels conv 8
#include <atomic>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "kernels/cuda/conv/conv.h"
#include "kernels/cuda/conv/implicit_nhwc.cuh"
#include "kernels/cuda/conv/rung.cuh"

namespace anvil::cuda {
namespace {

using conv_kernels::NhwcGeo;
using Wide = multistage::Shape<2, 2, 4, 2>;    // 128 x 128, K > 64
using Narrow = multistage::Shape<4, 1, 4, 2>;  // 256 x 64, K <= 64

int64_t padded_channels(const Conv2dShape& s) { return (s.C + 7) / 8 * 8; }
// Elements of x in NHWC, rounded up to whole 16-byte chunks (w follows).
int64_t x_elems(const Conv2dShape& s) { return s.N * s.H * s.W * padded_channels(s); }
int64_t w_elems(const Conv2dShape& s) { return s.K * s.R * s.S * padded_channels(s); }

size_t forward_workspace(const Conv2dShape& s) {
  return size_t((x_elems(s) + w_elems(s) + 7) / 8 * 8 / 2);  // bfloat16 pairs as floats
}

// Backward-data at stride 1 is the forward convolution of dy (K channels,
// P x Q) with each filter flipped in r and s and C and K swapped, padded
// R-1-ph and S-1-pw: dx[n,c,h,w] = sum over (k, r', s') of
// dy[n, k, h - (R-1-ph) + r', w - (S-1-pw) + s'] * w[k, c, R-1-r', S-1-s'],
// every term a real tap (rung 07's GEMM over K*R*S multiplies the zeros of
// the taps outside dy too). Needs ph < R and pw < S (a padding of at least
// 0); other shapes, and strides above 1, take rung 07.
bool backward_data_as_forward(const Conv2dShape& s) {
  return s.stride_h == 1 && s.stride_w == 1 && s.pad_h < s.R && s.pad_w < s.S;
}
Conv2dShape as_forward(const Conv2dShape& s) {
  return Conv2dShape{s.N, s.K, s.P, s.Q, s.C, s.R, s.S, 1, 1, s.R - 1 - s.pad_h, s.S - 1 - s.pad_w,
                     s.H, s.W};
}

size_t workspace(const Conv2dShape& s) {
  size_t most = std::max(forward_workspace(s), conv_rungs::kBf16Mma.workspace(s));
  if (backward_data_as_forward(s)) most = std::max(most, forward_workspace(as_forward(s)));
  return most;
}

NhwcGeo nhwc_geo(const Conv2dShape& s) {
  const int Cp = int(padded_channels(s));
  return NhwcGeo{int(s.N),        int(s.H),        int(s.W),     Cp,           int(s.K),
                 int(s.R),        int(s.S),        int(s.stride_h), int(s.stride_w),
                 int(s.pad_h),    int(s.pad_w),    int(s.P),     int(s.Q),     (Cp + 31) / 32};
}

template <class T>
void to_channels_last(int64_t N, int64_t C, int64_t H, int64_t W, int64_t Cp, const T* in,
                      bfloat16* out, cudaStream_t stream) {
  conv_kernels::launch_1d(conv_kernels::to_channels_last<T>, N * H * W * Cp, stream, int(N),
                          int(C), int(H), int(W), int(Cp), in, out);
}

// The kernel's dynamic shared memory, opted in to once per kernel and
// device (more than 48 KB needs it; the attribute is the function's in the
// current device's context). `devices`: a bit per device already done.
template <class Kernel>
void opt_in(Kernel kernel, int bytes, std::atomic<uint64_t>& devices) {
  int device = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  const uint64_t bit = uint64_t{1} << (device & 63);
  if (devices.load(std::memory_order_acquire) & bit) return;
  check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes),
        "cudaFuncSetAttribute(conv rung 08, MaxDynamicSharedMemorySize)");
  devices.fetch_or(bit, std::memory_order_release);
}

template <class S, class TY>
void launch_forward(const NhwcGeo& g, const bfloat16* x, const bfloat16* w, const float* bias,
                    TY* y, cudaStream_t stream) {
  void (*kernel)(NhwcGeo, const bfloat16*, const bfloat16*, const float*, TY*) =
      conv_kernels::forward_nhwc<S>;
  static std::atomic<uint64_t> devices{0};  // this kernel's (one per S, TY)
  opt_in(kernel, S::kSharedBytes, devices);
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
  bfloat16* wh = xh + (x_elems(s) + 7) / 8 * 8;
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

// dy into NHWC and the flipped filters into ws, then the forward GEMM of
// as_forward(s), whose output channels are x's.
template <class S, class T, class TY>
void backward_data_on(const Conv2dShape& s, const T* dy, const T* w, TY* dx, float* ws,
                      cudaStream_t stream) {
  const Conv2dShape f = as_forward(s);
  const int64_t Kp = padded_channels(f);
  bfloat16* dyh = reinterpret_cast<bfloat16*>(ws);
  bfloat16* wh = dyh + (x_elems(f) + 7) / 8 * 8;
  to_channels_last(s.N, s.K, s.P, s.Q, Kp, dy, dyh, stream);
  conv_kernels::launch_1d(conv_kernels::flipped_to_channels_last<T>, s.C * s.R * s.S * Kp, stream,
                          int(s.K), int(s.C), int(s.R), int(s.S), int(Kp), w, wh);
  launch_forward<S>(nhwc_geo(f), dyh, wh, nullptr, dx, stream);
}

template <class T, class TY>
void backward_data(const Conv2dShape& s, const T* dy, const T* w, TY* dx, float* ws,
                   cudaStream_t stream) {
  if (!backward_data_as_forward(s)) {
    const conv_rungs::Rung& r07 = conv_rungs::kBf16Mma;
    if constexpr (std::is_same_v<T, float>)
      return r07.backward_data(s, dy, w, dx, ws, stream);
    else if constexpr (std::is_same_v<TY, float>)
      return r07.backward_data_bf16(s, dy, w, dx, ws, stream);
    else
      return r07.backward_data_bf16_out(s, dy, w, dx, ws, stream);
  }
  if (s.C <= Narrow::kBN)
    backward_data_on<Narrow>(s, dy, w, dx, ws, stream);
  else
    backward_data_on<Wide>(s, dy, w, dx, ws, stream);
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
  return r;
}();

}  // namespace anvil::cuda
