// 2-D convolution (cross-correlation, as PyTorch and cpu::conv2d_*), NCHW:
//   y[n,k,p,q] = bias[k] + sum_{c,r,s} w[k,c,r,s] * x[n, c, p*sh - ph + r, q*sw - pw + s]
// with zeros outside the image. Three directions (forward, backward-data,
// backward-weight); all three are GEMMs in disguise over the "column matrix"
// col[(c,r,s), (n,p,q)] = x[n, c, p*sh - ph + r, q*sw - pw + s]:
//   forward          y[k, (n,p,q)]   = W[k, (c,r,s)] * col
//   backward-data    dcol            = W^T * dy[k, (n,p,q)], then each pixel
//                                      sums the dcol entries that read it
//   backward-weight  dw[k, (c,r,s)]  = dy[k, (n,p,q)] * col^T
//
// The ladder, one file per rung, each doing all three directions:
//   01_direct.cu             one thread per output element, from the definition
//   02_im2col.cu             column matrix in the workspace, then GEMM rung 04
//   03_implicit_gemm.cu      GEMM rung 04's tile reading the columns from x
//   04_implicit_warp_tile.cu GEMM rung 07's warp tile on the same readers
//   05_split_k.cu  (ships)   04 plus chunks of the reduction over grid.z: FP32
//   06_tf32_mma.cu           05 on TF32 tensor cores (mma.sync m16n8k8), FP32
//                            accumulation (ANVIL_CONV_TF32_RUNG=6)
//   07_bf16_mma.cu           06 with BF16 operands (mma.sync m16n8k16): the
//                            arithmetic of BF16 mixed precision; reads x, w
//                            and dy as bfloat16 when given them, stores y
//                            and dx as bfloat16 when asked
//                            (ANVIL_CONV_BF16_RUNG=7)
//   08_bf16_multistage.cu    07's numerics; every direction an implicit
//   (ships)                  GEMM on channels-last operands on the
//                            multistage mainloop (cp.async, ldmatrix, 4
//                            stages): backward-data the forward's kernel on
//                            dy and the flipped filters, one launch per
//                            residue class of the stride (no zero taps);
//                            backward-weight split over N*P*Q where its
//                            tiles are few: BF16 autocast
//   09_tf32_multistage.cu    06's numerics on 08's structure: the same
//   (ships)                  iterators and launches over the mainloop's
//                            TF32 kind (float32 channels-last operands
//                            rounded to TF32 by the conversions,
//                            mma.sync m16n8k8): the default on CUDA, as
//                            PyTorch's (docs/precision.md; --fp32-precision
//                            ieee takes 05)
// "(ships)": the rung the CUDA backend runs in its arithmetic (FP32, TF32,
// BF16; kBestConv, kTf32Conv, kBf16Conv below) wherever the table measured
// on a GPU (rung_table.h) names no other rung of that arithmetic for the
// layer's shape and direction. The tensor-core defaults are the multistage
// rungs, whose main loops issue 3.1-3.8 instructions per HMMA against rungs
// 06 and 07's 56-366 (docs/generated/kernel-table.md): the issue bound alone
// puts 06 and 07 an order of magnitude behind (docs/step-model.md).
// Run one rung alone (checked against the CPU, then timed):
//   build/sim/bench_cuda_kernels conv 3
#pragma once
#include <cstddef>
#include <cstdint>

#include "core/bfloat16.h"
#include "kernels/cuda/gemm/gemm.h"
#include "kernels/cuda/runtime.h"
#include "core/shapes.h"

namespace anvil::cuda {

constexpr int kConvRungs = 9;
constexpr int kBestConv = 5;  // the one the backend uses in FP32
constexpr int kTf32Conv = 9;  // ... and in TF32 (core/precision.h)
constexpr int kBf16Conv = 8;  // ... and in BF16 (autocast)
// The BF16 rung the backend runs: kBf16Conv, or ANVIL_CONV_BF16_RUNG (8 or
// 7, the single-stage rung on NCHW operands; read once,
// std::invalid_argument naming it otherwise), for every layer, whatever the
// measured table says.
int bf16_conv_rung();
// ... and the TF32 one: kTf32Conv, or ANVIL_CONV_TF32_RUNG (9 or 6).
int tf32_conv_rung();
// Rungs 1..kConvFp32Rungs compute in FP32; the rungs after them on
// tensor cores with FP32 accumulation, operands rounded to TF32 (06, 09: 10
// mantissa bits) or BF16 (07, 08: 7 bits), both nearest even.
constexpr int kConvFp32Rungs = 5;

// The workspace (floats) a rung needs for all three directions of `s`,
// the bias gradient's included; 0 where it needs none.
size_t conv2d_workspace_floats(int rung, const Conv2dShape& s);

// Each call overwrites its output (y; dx; dw and, when non-null, dbias);
// bias / dbias may be null; P and Q as Conv2dShape::out_size gives them.
// dbias is channel_sum (reduce/reduce.h) over dy [N, K, P*Q] in every rung.
// Bad shapes or rungs throw std::invalid_argument naming the field.
// Limits: every dimension, and each GEMM dimension (N*P*Q, N*H*W, C*R*S,
// K*R*S), below 2^31; element counts and addresses are 64-bit.
void conv2d_forward(int rung, const Conv2dShape& s, const float* x, const float* w,
                    const float* bias, float* y, float* workspace, cudaStream_t stream);
void conv2d_backward_data(int rung, const Conv2dShape& s, const float* dy, const float* w,
                          float* dx, float* workspace, cudaStream_t stream);
void conv2d_backward_weight(int rung, const Conv2dShape& s, const float* x, const float* dy,
                            float* dw, float* dbias, float* workspace, cudaStream_t stream);
// The same directions on bfloat16 x, w and dy (bias, dw and workspace
// float32; y and dx float32 or bfloat16, the float32 values rounded once
// to nearest even in the rung's epilogue, or in its split's second pass):
// only the rungs with bfloat16 launchers (07 and 08, kBf16Conv) read them, as they
// are stored; any other rung throws std::invalid_argument. The bias
// gradient is not among them: channel_sum's bfloat16 overload sums dy.
void conv2d_forward(int rung, const Conv2dShape& s, const bfloat16* x, const bfloat16* w,
                    const float* bias, float* y, float* workspace, cudaStream_t stream);
void conv2d_forward(int rung, const Conv2dShape& s, const bfloat16* x, const bfloat16* w,
                    const float* bias, bfloat16* y, float* workspace, cudaStream_t stream);
void conv2d_backward_data(int rung, const Conv2dShape& s, const bfloat16* dy,
                          const bfloat16* w, float* dx, float* workspace, cudaStream_t stream);
void conv2d_backward_data(int rung, const Conv2dShape& s, const bfloat16* dy,
                          const bfloat16* w, bfloat16* dx, float* workspace, cudaStream_t stream);
void conv2d_backward_weight(int rung, const Conv2dShape& s, const bfloat16* x,
                            const bfloat16* dy, float* dw, float* workspace, cudaStream_t stream);

// The rungs' launchers. The entry points above check the shape, handle empty
// outputs and the bias gradient, then call one of these on a non-empty
// problem with the workspace the rung asked for.
namespace conv_rungs {
struct Rung {
  const char* name;
  size_t (*workspace)(const Conv2dShape&);
  void (*forward)(const Conv2dShape&, const float* x, const float* w, const float* bias,
                  float* y, float* workspace, cudaStream_t);
  void (*backward_data)(const Conv2dShape&, const float* dy, const float* w, float* dx,
                        float* workspace, cudaStream_t);
  void (*backward_weight)(const Conv2dShape&, const float* x, const float* dy, float* dw,
                          float* workspace, cudaStream_t);
  gemm_rungs::Math math = gemm_rungs::Math::kFp32;  // how its products round
  // The directions on bfloat16 x, w and dy (same workspace); null for the
  // rungs that read float32 only.
  void (*forward_bf16)(const Conv2dShape&, const bfloat16* x, const bfloat16* w,
                       const float* bias, float* y, float* workspace, cudaStream_t) = nullptr;
  void (*backward_data_bf16)(const Conv2dShape&, const bfloat16* dy, const bfloat16* w,
                             float* dx, float* workspace, cudaStream_t) = nullptr;
  void (*backward_weight_bf16)(const Conv2dShape&, const bfloat16* x, const bfloat16* dy,
                               float* dw, float* workspace, cudaStream_t) = nullptr;
  // ... and y, dx stored as bfloat16.
  void (*forward_bf16_out)(const Conv2dShape&, const bfloat16* x, const bfloat16* w,
                           const float* bias, bfloat16* y, float* workspace,
                           cudaStream_t) = nullptr;
  void (*backward_data_bf16_out)(const Conv2dShape&, const bfloat16* dy, const bfloat16* w,
                                 bfloat16* dx, float* workspace, cudaStream_t) = nullptr;
};
extern const Rung kDirect, kIm2col, kImplicitGemm, kImplicitWarpTile, kSplitK, kTf32Mma,
    kBf16Mma, kBf16Multistage, kTf32Multistage;
// Rung 08's (09's) forward with `stages` (2, 3 or 4) pipeline stages on
// its 128 x 128 tile (the rung runs 4): every depth gives the same bits,
// which the tests check. std::invalid_argument for another depth.
void bf16_multistage_forward(int stages, const Conv2dShape& s, const float* x, const float* w,
                             const float* bias, float* y, float* workspace, cudaStream_t stream);
void tf32_multistage_forward(int stages, const Conv2dShape& s, const float* x, const float* w,
                             const float* bias, float* y, float* workspace, cudaStream_t stream);
// Rung `rung` (1 to kConvRungs; std::invalid_argument otherwise).
const Rung& rung(int rung);
}  // namespace conv_rungs

}  // namespace anvil::cuda
