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
// (nhwc_rung.cuh's dgrad_classes; CUTLASS calls it strided dgrad).
//
// Backward-weight (wgrad_nhwc.cuh) is the GEMM dw = col^T dy over N*P*Q on
// the same mainloop: x and dy converted to NHWC, M = R*S*Cp rows of the
// column matrix, N = K columns, both operands contiguous along their rows
// (ldmatrix.trans). Its tiles are the forward's (256 x 64 for K <= 64),
// and where they are too few to fill the GPU (ResNet-18's 64-channel 3x3
// layers: 3 tiles) the reduction is cut into chunks over grid.z
// (split_k.h's plan, each chunk whole k-steps of 32), their float32
// partials summed in a fixed order by split_k::sum_split_k.
//
// The iterators and the host side (conversions, classes, split, launches:
// nhwc_rung.cuh) are templates over the mainloop's kind of mma, shared with
// rung 09 (TF32); this file is their Bf16 instance.
//   build/sim/bench_cuda_kernels conv 8
#include "kernels/cuda/conv/conv.h"
#include "kernels/cuda/conv/nhwc_rung.cuh"

namespace anvil::cuda {

using Bf16Rung = conv_kernels::NhwcRung<multistage::Bf16>;

void conv_rungs::bf16_multistage_forward(int stages, const Conv2dShape& s, const float* x,
                                         const float* w, const float* bias, float* y, float* ws,
                                         cudaStream_t stream) {
  Bf16Rung::forward_stages(stages, s, x, w, bias, y, ws, stream);
}

// Constant-initialised rung 07 (a constexpr rung()) is complete before any
// dynamic initialisation, this one's included.
const conv_rungs::Rung conv_rungs::kBf16Multistage = [] {
  Rung r = kBf16Mma;
  r.name = "bf16 multistage";
  r.workspace = Bf16Rung::workspace;
  r.forward = Bf16Rung::forward<float, float>;
  r.forward_bf16 = Bf16Rung::forward<bfloat16, float>;
  r.forward_bf16_out = Bf16Rung::forward<bfloat16, bfloat16>;
  r.backward_data = Bf16Rung::backward_data<float, float>;
  r.backward_data_bf16 = Bf16Rung::backward_data<bfloat16, float>;
  r.backward_data_bf16_out = Bf16Rung::backward_data<bfloat16, bfloat16>;
  r.backward_weight = Bf16Rung::backward_weight<float>;
  r.backward_weight_bf16 = Bf16Rung::backward_weight<bfloat16>;
  return r;
}();

}  // namespace anvil::cuda
