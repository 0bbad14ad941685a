// The CPU backend's kernels: plain functions over raw, contiguous float
// buffers (NCHW for images). OpenBLAS does the matrix products, OpenMP the
// loops. No allocation in steady state: scratch space comes from a
// grow-only per-thread workspace (cpu::scratch), so the training loop
// does not churn the allocator.
#pragma once
#include <cstddef>
#include <cstdint>

#include "core/bfloat16.h"
#include "core/pointwise.h"
#include "kernels/sgd.h"
#include "core/shapes.h"

namespace anvil::cpu {

// Grow-only scratch buffer owned by the calling thread; slot picks one of a
// few independent buffers so a kernel can hold two at once.
float* scratch(size_t floats, int slot = 0);

// Row-major C[M,N] = alpha * op(A) * op(B) + beta * C (cblas_sgemm).
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
          const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
          int64_t ldc);

// The same product when every element of A and B is a bfloat16 value, held
// in a float (rounded_operand's copies) or stored as bfloat16: FP32 sums of
// the exact products, on AVX-512 BF16's dot-product instructions where the
// CPU has them (checked at run time) and ANVIL_CPU_BF16 is not "off", else
// gemm() above on the same values (gemm_bf16.cpp). Both overloads give the
// same bits for the same values.
void gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
               const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
               int64_t ldc);
void gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
               const bfloat16* A, int64_t lda, const bfloat16* B, int64_t ldb, float beta,
               float* C, int64_t ldc);
// Whether gemm_bf16 runs on the BF16 instructions on this machine, and how
// a run's header says so: "AVX-512 BF16" or "emulated".
bool bf16_dot_enabled();
inline const char* bf16_math_word() { return bf16_dot_enabled() ? "AVX-512 BF16" : "emulated"; }

// Convolution (cross-correlation, as PyTorch). bias may be null.
// kFastest may take Winograd's transforms (3x3 layers with 16+ channels each
// way), which round differently from FP32 products and sums; kExact computes
// every output as a sum of FP32 products (im2col + GEMM, or the direct
// kernels), the highest-precision setting (core/precision.h). kBf16 is
// kExact for operands that hold bfloat16 values, with gemm_bf16 as the GEMM.
enum class ConvAlgo { kFastest, kExact, kBf16 };
void conv2d_forward(const Conv2dShape& s, const float* x, const float* w, const float* bias,
                    float* y, ConvAlgo algo = ConvAlgo::kFastest);
// dx = conv2d transposed: overwrites dx.
void conv2d_backward_data(const Conv2dShape& s, const float* dy, const float* w, float* dx,
                          ConvAlgo algo = ConvAlgo::kFastest);
// dw (and dbias when not null) overwritten with the gradient summed over the batch.
void conv2d_backward_weight(const Conv2dShape& s, const float* x, const float* dy, float* dw,
                            float* dbias, ConvAlgo algo = ConvAlgo::kFastest);
// kBf16 on bfloat16 operands as stored (autocast's): im2col, the gathering
// of dy and the GEMM's packing read bfloat16, with no float32 copy. y and dx
// are float32 or bfloat16: the FP32 sum (plus the bias) rounded once. The
// same bits as the float overloads with kBf16 on the widened operands, for
// every shape but the direct kernels' (conv_direct_suits), which the caller
// sends there.
template <class Y>
void conv2d_forward_bf16(const Conv2dShape& s, const bfloat16* x, const bfloat16* w,
                         const float* bias, Y* y);
template <class Y>
void conv2d_backward_data_bf16(const Conv2dShape& s, const bfloat16* dy, const bfloat16* w, Y* dx);
void conv2d_backward_weight_bf16(const Conv2dShape& s, const bfloat16* x, const bfloat16* dy,
                                 float* dw, float* dbias);

// Pooling. max pool records the flat input index (h*W+w within its plane) of
// each output's maximum in argmax; padding counts as -inf. avg pool divides by
// the full window including padding (PyTorch's count_include_pad=True).
// T: float or bfloat16 (kernels/element.h): a bfloat16 plane is widened as
// it is read and computed on as float32 data holding the same values, and a
// bfloat16 result is rounded once as it is stored. Average pooling also takes a
// bfloat16 x into a float32 y and a float32 dy into a bfloat16 dx (global
// average pooling under autocast).
template <class T>
void max_pool2d_forward(const Pool2dShape& s, const T* x, T* y, int64_t* argmax);
template <class T>
void max_pool2d_backward(const Pool2dShape& s, const T* dy, const int64_t* argmax, T* dx);
template <class Tx, class Ty>
void avg_pool2d_forward(const Pool2dShape& s, const Tx* x, Ty* y);
template <class Tdy, class Tdx>
void avg_pool2d_backward(const Pool2dShape& s, const Tdy* dy, Tdx* dx);

// Elementwise. Output may alias an input exactly (in place), never partially.
// T: float or bfloat16 (kernels/element.h): loaded into float, computed in
// float, stored back in T (bfloat16 rounds to nearest even).
// The ops of core/pointwise.h (ReLU, SiLU): y = op(x); dx = dy * op'(saved).
template <class T> void pointwise_forward(PointwiseOp op, int64_t n, const T* x, T* y);
template <class T>
void pointwise_backward(PointwiseOp op, int64_t n, const T* saved, const T* dy, T* dx);
template <class T> void add(int64_t n, const T* a, const T* b, T* y);
template <class T> void mul(int64_t n, const T* a, const T* b, T* y);
template <class T> void scale(int64_t n, float alpha, const T* x, T* y);  // y = alpha * x
void axpy(int64_t n, float alpha, const float* x, float* y);  // y += alpha * x
void fill(int64_t n, float value, float* y);
// float32 -> bfloat16 rounds to nearest, ties to even (NaN stays a quiet
// NaN, overflow gives Inf); bfloat16 -> float32 is exact.
void float_to_bf16(int64_t n, const float* x, bfloat16* y);
void bf16_to_float(int64_t n, const bfloat16* x, float* y);
// y = x rounded to TF32 as the tensor-core rungs round (core/tf32.h): the value a
// tensor core multiplies. y may be x.
void round_to_tf32(int64_t n, const float* x, float* y);
// y[outer, C, inner] = x + bias[C]
void add_channel_bias(int64_t outer, int64_t C, int64_t inner, const float* x, const float* bias,
                      float* y);
// db[C] = sum over outer and inner of dy[outer, C, inner]  (overwrites db);
// T: float or bfloat16, each element widened as it is read (the same bits
// as the sum of a float32 copy).
template <class T>
void channel_sum(int64_t outer, int64_t C, int64_t inner, const T* dy, float* db);
float sum(int64_t n, const float* x);  // pairwise / blocked, accumulated in double

// Fused softmax + cross-entropy over logits[N,C], labels in [0,C) (checked by
// the caller), against the smoothed target q[i] = (1 - e) onehot(label[i]) + e / C
// (e = label_smoothing in [0, 1]; 0: plain cross-entropy):
// loss[i] = logsumexp(logits[i]) - (1 - e) logits[i, label[i]] - (e / C) sum_j logits[i, j];
// probs = softmax(logits). T: float or bfloat16 logits (autocast's), each
// widened as it is read; loss and probs are float32 either way.
template <class T>
void softmax_cross_entropy_forward(int64_t N, int64_t C, const T* logits,
                                   const int64_t* labels, float label_smoothing, float* loss,
                                   float* probs);
// dlogits[i] = (probs[i] - q[i]) * dloss[i], computed in float32 and stored as
// T (float or bfloat16: rounded once, to nearest even).
template <class T>
void softmax_cross_entropy_backward(int64_t N, int64_t C, const float* probs,
                                    const int64_t* labels, float label_smoothing,
                                    const float* dloss, T* dlogits);
// The number of rows i of logits[N,C] whose prediction equals labels[i]; the
// prediction is the column of the row's largest logit, the first one on a tie
// (strict > from column 0, as cuda::count_correct). T: float or bfloat16.
template <class T>
int64_t count_correct(int64_t N, int64_t C, const T* logits, const int64_t* labels);

// BatchNorm over x[N,C,HW] per channel.
// Training: computes batch mean and biased variance, writes save_mean and
// save_invstd = 1/sqrt(var+eps), normalises with them, and updates
// running_mean/var (unbiased variance, n/(n-1)) with momentum:
// r = (1-momentum)*r + momentum*batch. running_* may be null.
// x, y, dy, dx: T = float or bfloat16 (kernels/element.h); the rest float.
// relu: y is ReLU of the normalised x, in the same pass (BatchNorm + ReLU);
// residual, when not null (x's layout): y = relu(bn(x) + residual), each of
// bn and the sum rounded to T as the separate ops would.
template <class T>
void batch_norm_forward_train(int64_t N, int64_t C, int64_t HW, const T* x, const float* gamma,
                              const float* beta, float eps, float momentum, float* running_mean,
                              float* running_var, float* save_mean, float* save_invstd, T* y,
                              bool relu = false, const T* residual = nullptr);
template <class T>
void batch_norm_forward_eval(int64_t N, int64_t C, int64_t HW, const T* x, const float* gamma,
                             const float* beta, const float* running_mean,
                             const float* running_var, float eps, T* y, bool relu = false);
// Training-mode backward with the saved batch statistics. dx, dgamma, dbeta
// overwritten. relu_y, when not null, is the output of the forward with
// relu: the gradient is ReLU's backward of dy (Relu::backward(relu_y, dy)),
// taken as dy is read (BatchNorm's and ReLU's backward in one pass family).
// dr, when not null, receives that gradient (a residual's).
template <class T>
void batch_norm_backward_train(int64_t N, int64_t C, int64_t HW, const T* x, const float* gamma,
                               const float* save_mean, const float* save_invstd, const T* dy,
                               T* dx, float* dgamma, float* dbeta, const T* relu_y = nullptr,
                               T* dr = nullptr);

// SGD with momentum / weight decay / nesterov, PyTorch semantics (dampening
// 0; kernels/sgd.h gives the formula), over every tensor of the list in one
// parallel pass. A tensor's momentum_buf may be null when momentum == 0;
// its param_copy, when not null, gets the updated p rounded to bfloat16
// (autocast's copy) in the same pass.
void sgd_update(const SgdEntry* tensors, size_t count, float lr, float momentum,
                float weight_decay, bool nesterov);
// One tensor: the list of one.
void sgd_update(int64_t n, float* param, const float* grad, float* momentum_buf, float lr,
                float momentum, float weight_decay, bool nesterov, bool first_step,
                bfloat16* param_copy = nullptr);

// The collectives' reduction step (accumulate.cpp): dst = (dst + src) * scale
// (scale 1: dst += src, exactly). dst and src must not overlap.
void accumulate(int64_t n, float* dst, const float* src, float scale);
void accumulate(int64_t n, int64_t* dst, const int64_t* src);
// bfloat16 buffers, added in float: each element is widened (exactly),
// (dst + src) * scale is computed in float and rounded to bfloat16 once, to
// nearest even, as it is stored. That one rounding per call is the only
// error a ring step adds (docs/parallel.md, "Gradients in bfloat16").
void accumulate(int64_t n, bfloat16* dst, const bfloat16* src, float scale);

}  // namespace anvil::cpu
