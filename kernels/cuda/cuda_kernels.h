// The CUDA backend's kernels, as host entry points over device pointers.
// Built by nvcc for a GPU, or by g++ against the simulator (sim/); the same
// source either way. Every entry point launches asynchronously on `stream`
// on the current device (cudaSetDevice), checks the launch and returns;
// memory is NCHW and contiguous, as in kernels/cpu/cpu_kernels.h, whose
// functions are the reference each kernel is tested against.
//
// A family with a ladder of numbered rungs (naive -> fast, for study and
// benchmarks) has a folder whose header lists the rungs, one file each:
// gemm/, conv/, reduce/, softmax/, batch_norm/ (included below). Its entry
// points take the rung as their first argument; kBest* names the one the
// backend uses. The families without a ladder are declared here. Sizes are
// int64 at the interface; each kernel documents the limits of its index
// arithmetic. Scratch memory is passed in by the caller (the backend takes it
// from its caching allocator): *_workspace_floats says how much a rung needs,
// and may be 0.
#pragma once
#include <cstddef>
#include <cstdint>

#include "core/bfloat16.h"
#include "kernels/cuda/batch_norm/batch_norm.h"
#include "kernels/cuda/conv/conv.h"
#include "kernels/cuda/gemm/gemm.h"
#include "kernels/cuda/reduce/reduce.h"
#include "kernels/cuda/softmax/softmax.h"
#include "kernels/cuda/runtime.h"
#include "core/pointwise.h"
#include "kernels/sgd.h"
#include "core/shapes.h"

namespace anvil::cuda {

// ---- pooling (pool.cu) ----
// Same contracts as cpu:: (argmax = flat h*W+w index within the plane,
// padding counts as -inf for max and as zeros in the average).
// T: float or bfloat16 (kernels/element.h): sums in float, stored rounded.
// Average pooling also takes Tx = bfloat16 with Ty = float, and Tdy = float
// with Tdx = bfloat16 (global average pooling under autocast), each pairing
// a kernel of its own name.
template <class T>
void max_pool2d_forward(const Pool2dShape& s, const T* x, T* y, int64_t* argmax,
                        cudaStream_t stream);
template <class T>
void max_pool2d_backward(const Pool2dShape& s, const T* dy, const int64_t* argmax, T* dx,
                         cudaStream_t stream);
template <class Tx, class Ty>
void avg_pool2d_forward(const Pool2dShape& s, const Tx* x, Ty* y, cudaStream_t stream);
template <class Tdy, class Tdx>
void avg_pool2d_backward(const Pool2dShape& s, const Tdy* dy, Tdx* dx, cudaStream_t stream);

// ---- elementwise (elementwise.cu) ----
// Output may alias an input exactly (in place).
// T: float or bfloat16 (kernels/element.h), as the cpu:: ones.
// The ops of core/pointwise.h (ReLU, SiLU), as cpu::pointwise_forward/backward.
template <class T>
void pointwise_forward(PointwiseOp op, int64_t n, const T* x, T* y, cudaStream_t stream);
template <class T>
void pointwise_backward(PointwiseOp op, int64_t n, const T* saved, const T* dy, T* dx,
                        cudaStream_t stream);
template <class T> void add(int64_t n, const T* a, const T* b, T* y, cudaStream_t stream);
template <class T> void mul(int64_t n, const T* a, const T* b, T* y, cudaStream_t stream);
template <class T> void scale(int64_t n, float alpha, const T* x, T* y, cudaStream_t stream);
void axpy(int64_t n, float alpha, const float* x, float* y, cudaStream_t stream);
void fill(int64_t n, float value, float* y, cudaStream_t stream);
void fill(int64_t n, int64_t value, int64_t* y, cudaStream_t stream);
void fill(int64_t n, uint8_t value, uint8_t* y, cudaStream_t stream);
void fill(int64_t n, bfloat16 value, bfloat16* y, cudaStream_t stream);
// float32 -> bfloat16 rounds to nearest even (NaN stays a quiet NaN);
// bfloat16 -> float32 is exact.
void float_to_bf16(int64_t n, const float* x, bfloat16* y, cudaStream_t stream);
void bf16_to_float(int64_t n, const bfloat16* x, float* y, cudaStream_t stream);
// dst[r * dst_stride + c] = src[r * src_stride + c] for r < rows, c < width,
// in elements of element_bytes (1, 2, 4 or 8)
void copy_rows(int64_t rows, int64_t width, size_t element_bytes, const void* src,
               int64_t src_stride, void* dst, int64_t dst_stride, cudaStream_t stream);
// y += value (int64 counters)
void add_scalar(int64_t n, int64_t value, int64_t* y, cudaStream_t stream);
// y[i] = alpha * x[0] for i < n (x: one float of device memory, outside y)
void broadcast_scalar(int64_t n, float alpha, const float* x, float* y, cudaStream_t stream);
// y[outer, C, inner] = x + bias[C]
void add_channel_bias(int64_t outer, int64_t C, int64_t inner, const float* x, const float* bias,
                      float* y, cudaStream_t stream);

// ---- the optimizer (sgd.cu) ----
// SGD (kernels/sgd.h, PyTorch semantics) over every tensor of the list in
// one launch (multi-tensor apply; one launch per 128 tensors with elements).
// The learning rate is *lr_device where that is not null (a float on the
// device, read when the kernel runs: a captured CUDA graph follows the
// schedule), else lr. A tensor's momentum_buf may be null when momentum == 0.
void sgd_update(const SgdEntry* tensors, size_t count, const float* lr_device, float lr,
                float momentum, float weight_decay, bool nesterov, cudaStream_t stream);
// One tensor: the list of one.
void sgd_update(int64_t n, float* param, const float* grad, float* momentum_buf, float lr,
                float momentum, float weight_decay, bool nesterov, bool first_step,
                cudaStream_t stream, bfloat16* param_copy = nullptr);
// n floats at data.
struct FloatRange {
  float* data = nullptr;
  int64_t n = 0;
};
// Every range set to zero in one launch (one per 192 ranges with elements).
void zero_floats(const FloatRange* ranges, size_t count, cudaStream_t stream);

// ---- the collectives' reduction step (accumulate.cu) ----
// As cpu::accumulate: dst = (dst + src) * scale (scale 1: dst += src). The
// collectives (parallel/) launch it on their own stream, not the compute one.
void accumulate(int64_t n, float* dst, const float* src, float scale, cudaStream_t stream);
void accumulate(int64_t n, int64_t* dst, const int64_t* src, cudaStream_t stream);
// bfloat16: widened to float, (dst + src) * scale in float, rounded to
// bfloat16 (nearest even) once as it is stored.
void accumulate(int64_t n, bfloat16* dst, const bfloat16* src, float scale, cudaStream_t stream);

}  // namespace anvil::cuda
