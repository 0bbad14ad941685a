// Elementwise kernels: the pointwise ops of core/pointwise.h (ReLU,
// SiLU: one template each way), add, mul, axpy, scale, fill
// (float, int64, uint8, bfloat16), float32 <-> bfloat16 conversion, an int64
// counter increment, a device scalar spread over a tensor, the per-channel
// bias add and a strided copy of rows.
//
// Thread -> data mapping: one flat index space [0, n), walked by a
// grid-stride loop. Thread t of block b starts at element b*blockDim + t and
// steps by the whole grid (gridDim*blockDim) until it passes n. So at every
// step the 32 threads of a warp touch 32 consecutive elements: each load and
// store of a warp is one contiguous 128-byte segment (fully coalesced), and
// no element is touched by two threads.
//
// Why a grid-stride loop rather than one thread per element: the grid is
// capped (kMaxBlocks), so a huge n does not need a huge grid (and cannot
// overflow gridDim.x), while a small n still gets one block per 256 elements.
// The cap, 2048 blocks of 256 threads, is about twice what an H100 keeps
// resident at once, so every SM stays busy and the loop costs a few extra
// iterations per thread at most.
//
// Indexing is 64-bit (int64 start and stride), so n beyond 2^31 is fine.
// Nothing is launched when n == 0; negative sizes throw.
//
// In place: the output may alias an input exactly (y == x, y == a, ...).
// Each element is read and then written by the same thread in the same
// iteration, so aliasing is safe; for that reason no pointer here is
// declared __restrict__.
#include <stdexcept>
#include <string>

#include "kernels/cuda/cuda_compat.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/element.h"

namespace anvil::cuda {

namespace elementwise_kernels {

constexpr int kBlock = 256;
constexpr int64_t kMaxBlocks = 2048;

inline dim3 grid_for(int64_t n) {
  int64_t blocks = (n + kBlock - 1) / kBlock;
  return dim3(static_cast<unsigned>(blocks < kMaxBlocks ? blocks : kMaxBlocks));
}

inline void check_n(int64_t n, const char* who) {
  if (n < 0) throw std::invalid_argument(std::string("cuda::") + who + ": negative size " +
                                         std::to_string(n));
}

// First index and stride of the calling thread's grid-stride loop.
__device__ __forceinline__ int64_t first_index() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ int64_t grid_stride() {
  return static_cast<int64_t>(gridDim.x) * blockDim.x;
}

// The pointwise ops, add, mul and scale take float or bfloat16
// elements (T, kernels/element.h): each is loaded into a float, computed in
// float and stored back in T. A warp's 32 bfloat16 elements are one 64-byte
// segment, so the loads stay coalesced and the traffic halves.

// The ops of core/pointwise.h, one instantiation each.
template <class Op, class T>
__global__ void __launch_bounds__(kBlock) pointwise_forward_kernel(int64_t n, const T* x, T* y) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) y[i] = store<T>(Op::forward(load(x[i])));
}
template <class Op, class T>
__global__ void __launch_bounds__(kBlock) pointwise_backward_kernel(int64_t n, const T* saved, const T* dy,
                                                            T* dx) {
  for (int64_t i = first_index(); i < n; i += grid_stride())
    dx[i] = store<T>(Op::backward(load(saved[i]), load(dy[i])));
}

template <class T>
__global__ void __launch_bounds__(kBlock) add_kernel(int64_t n, const T* a, const T* b, T* y) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) y[i] = store<T>(load(a[i]) + load(b[i]));
}

template <class T>
__global__ void __launch_bounds__(kBlock) mul_kernel(int64_t n, const T* a, const T* b, T* y) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) y[i] = store<T>(load(a[i]) * load(b[i]));
}

// y += alpha * x
__global__ void __launch_bounds__(kBlock) axpy_kernel(int64_t n, float alpha, const float* x, float* y) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) y[i] += alpha * x[i];
}

// y = alpha * x
template <class T>
__global__ void __launch_bounds__(kBlock) scale_kernel(int64_t n, float alpha, const T* x, T* y) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) y[i] = store<T>(alpha * load(x[i]));
}

template <typename T>
__global__ void __launch_bounds__(kBlock) fill_kernel(int64_t n, T value, T* y) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) y[i] = value;
}

__global__ void __launch_bounds__(kBlock) float_to_bf16_kernel(int64_t n, const float* x, bfloat16* y) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) y[i] = bfloat16(x[i]);
}

__global__ void __launch_bounds__(kBlock) bf16_to_float_kernel(int64_t n, const bfloat16* x, float* y) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) y[i] = x[i].to_float();
}

// y += value over int64: counters such as BatchNorm's num_batches_tracked,
// advanced on the device so that no step waits on a device-to-host read.
__global__ void __launch_bounds__(kBlock) add_scalar_kernel(int64_t n, int64_t value, int64_t* y) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) y[i] += value;
}

// y = alpha * x[0]: a scalar that lives on the device (a loss's incoming
// gradient) spread over y with no round trip to the host. Every thread reads
// x[0] (one cached load); x must not lie inside y, or a thread could read it
// after another has overwritten it.
__global__ void __launch_bounds__(kBlock) broadcast_scalar_kernel(int64_t n, float alpha, const float* x, float* y) {
  const float value = alpha * x[0];
  for (int64_t i = first_index(); i < n; i += grid_stride()) y[i] = value;
}

// y[outer, C, inner] = x + bias[C]: the same flat walk over all
// outer*C*inner elements (coalesced in x and y); the channel of element i is
// (i / inner) % C, and bias (C floats) stays in cache. Index is int when the
// total fits in 31 bits (32-bit division is several times cheaper than
// 64-bit on a GPU), int64 otherwise.
template <typename Index>
__global__ void __launch_bounds__(kBlock) add_channel_bias_kernel(Index total, Index C, Index inner, const float* x,
                                        const float* bias, float* y) {
  const Index stride = static_cast<Index>(gridDim.x) * static_cast<Index>(blockDim.x);
  for (Index i = static_cast<Index>(blockIdx.x) * static_cast<Index>(blockDim.x) +
                 static_cast<Index>(threadIdx.x);
       i < total; i += stride)
    y[i] = x[i] + bias[(i / inner) % C];
}

// dst[r * dst_stride + c] = src[r * src_stride + c] for r < rows, c < width:
// the flat walk over rows * width elements (coalesced along each run), in
// elements of T, an unsigned type of the tensors' element size.
template <typename T>
__global__ void __launch_bounds__(kBlock) copy_rows_kernel(int64_t rows, int64_t width, const T* src,
                                                           int64_t src_stride, T* dst, int64_t dst_stride) {
  for (int64_t i = first_index(); i < rows * width; i += grid_stride()) {
    const int64_t r = i / width, c = i - r * width;
    dst[r * dst_stride + c] = src[r * src_stride + c];
  }
}

}  // namespace elementwise_kernels

using namespace elementwise_kernels;

void copy_rows(int64_t rows, int64_t width, size_t element_bytes, const void* src,
               int64_t src_stride, void* dst, int64_t dst_stride, cudaStream_t stream) {
  check_n(rows, "copy_rows");
  check_n(width, "copy_rows");
  if (rows == 0 || width == 0) return;
  const dim3 grid = grid_for(rows * width);
  auto run = [&](auto t) {
    using T = decltype(t);
    launch(copy_rows_kernel<T>, grid, dim3(kBlock), 0, stream, rows, width,
           static_cast<const T*>(src), src_stride, static_cast<T*>(dst), dst_stride);
  };
  switch (element_bytes) {
    case 1: return run(uint8_t{});
    case 2: return run(uint16_t{});
    case 4: return run(uint32_t{});
    case 8: return run(uint64_t{});
    default:
      throw std::invalid_argument("cuda::copy_rows: elements of " + std::to_string(element_bytes) +
                                  " bytes");
  }
}

template <class T>
void pointwise_forward(PointwiseOp op, int64_t n, const T* x, T* y, cudaStream_t stream) {
  check_n(n, "pointwise_forward");
  if (n == 0) return;
  visit_pointwise(op, [&](auto o) {
    launch(pointwise_forward_kernel<decltype(o), T>, grid_for(n), dim3(kBlock), 0, stream, n, x,
           y);
  });
}

template <class T>
void pointwise_backward(PointwiseOp op, int64_t n, const T* saved, const T* dy, T* dx,
                        cudaStream_t stream) {
  check_n(n, "pointwise_backward");
  if (n == 0) return;
  visit_pointwise(op, [&](auto o) {
    launch(pointwise_backward_kernel<decltype(o), T>, grid_for(n), dim3(kBlock), 0, stream, n,
           saved, dy, dx);
  });
}

template <class T>
void add(int64_t n, const T* a, const T* b, T* y, cudaStream_t stream) {
  check_n(n, "add");
  if (n == 0) return;
  launch(add_kernel<T>, grid_for(n), dim3(kBlock), 0, stream, n, a, b, y);
}

template <class T>
void mul(int64_t n, const T* a, const T* b, T* y, cudaStream_t stream) {
  check_n(n, "mul");
  if (n == 0) return;
  launch(mul_kernel<T>, grid_for(n), dim3(kBlock), 0, stream, n, a, b, y);
}

void axpy(int64_t n, float alpha, const float* x, float* y, cudaStream_t stream) {
  check_n(n, "axpy");
  if (n == 0) return;
  launch(axpy_kernel, grid_for(n), dim3(kBlock), 0, stream, n, alpha, x, y);
}

template <class T>
void scale(int64_t n, float alpha, const T* x, T* y, cudaStream_t stream) {
  check_n(n, "scale");
  if (n == 0) return;
  launch(scale_kernel<T>, grid_for(n), dim3(kBlock), 0, stream, n, alpha, x, y);
}

// The two element types of each (kernels/element.h).
#define ANVIL_ELEMENTWISE(T)                                                                   \
  template void pointwise_forward<T>(PointwiseOp, int64_t, const T*, T*, cudaStream_t);       \
  template void pointwise_backward<T>(PointwiseOp, int64_t, const T*, const T*, T*,           \
                                      cudaStream_t);                                          \
  template void add<T>(int64_t, const T*, const T*, T*, cudaStream_t);                        \
  template void mul<T>(int64_t, const T*, const T*, T*, cudaStream_t);                        \
  template void scale<T>(int64_t, float, const T*, T*, cudaStream_t);
ANVIL_ELEMENTWISE(float)
ANVIL_ELEMENTWISE(bfloat16)
#undef ANVIL_ELEMENTWISE

void fill(int64_t n, float value, float* y, cudaStream_t stream) {
  check_n(n, "fill");
  if (n == 0) return;
  launch(fill_kernel<float>, grid_for(n), dim3(kBlock), 0, stream, n, value, y);
}

void fill(int64_t n, int64_t value, int64_t* y, cudaStream_t stream) {
  check_n(n, "fill");
  if (n == 0) return;
  launch(fill_kernel<int64_t>, grid_for(n), dim3(kBlock), 0, stream, n, value, y);
}

void fill(int64_t n, uint8_t value, uint8_t* y, cudaStream_t stream) {
  check_n(n, "fill");
  if (n == 0) return;
  launch(fill_kernel<uint8_t>, grid_for(n), dim3(kBlock), 0, stream, n, value, y);
}

void fill(int64_t n, bfloat16 value, bfloat16* y, cudaStream_t stream) {
  check_n(n, "fill");
  if (n == 0) return;
  launch(fill_kernel<bfloat16>, grid_for(n), dim3(kBlock), 0, stream, n, value, y);
}

void float_to_bf16(int64_t n, const float* x, bfloat16* y, cudaStream_t stream) {
  check_n(n, "float_to_bf16");
  if (n == 0) return;
  launch(float_to_bf16_kernel, grid_for(n), dim3(kBlock), 0, stream, n, x, y);
}

void bf16_to_float(int64_t n, const bfloat16* x, float* y, cudaStream_t stream) {
  check_n(n, "bf16_to_float");
  if (n == 0) return;
  launch(bf16_to_float_kernel, grid_for(n), dim3(kBlock), 0, stream, n, x, y);
}

void add_scalar(int64_t n, int64_t value, int64_t* y, cudaStream_t stream) {
  check_n(n, "add_scalar");
  if (n == 0) return;
  launch(add_scalar_kernel, grid_for(n), dim3(kBlock), 0, stream, n, value, y);
}

void broadcast_scalar(int64_t n, float alpha, const float* x, float* y, cudaStream_t stream) {
  check_n(n, "broadcast_scalar");
  if (n == 0) return;
  launch(broadcast_scalar_kernel, grid_for(n), dim3(kBlock), 0, stream, n, alpha, x, y);
}

void add_channel_bias(int64_t outer, int64_t C, int64_t inner, const float* x, const float* bias,
                      float* y, cudaStream_t stream) {
  if (outer < 0 || C < 0 || inner < 0)
    throw std::invalid_argument("cuda::add_channel_bias: negative size " + std::to_string(outer) +
                                "x" + std::to_string(C) + "x" + std::to_string(inner));
  if (outer == 0 || C == 0 || inner == 0) return;
  if (C > INT64_MAX / outer || outer * C > INT64_MAX / inner)
    throw std::invalid_argument("cuda::add_channel_bias: size overflows int64");
  const int64_t total = outer * C * inner;
  // The 32-bit path also needs i + stride to stay below 2^31: stride is at
  // most kMaxBlocks * kBlock = 2^19.
  if (total <= INT32_MAX - kMaxBlocks * kBlock)
    launch(add_channel_bias_kernel<int>, grid_for(total), dim3(kBlock), 0, stream,
           static_cast<int>(total), static_cast<int>(C), static_cast<int>(inner), x, bias, y);
  else
    launch(add_channel_bias_kernel<int64_t>, grid_for(total), dim3(kBlock), 0, stream, total, C,
           inner, x, bias, y);
}

}  // namespace anvil::cuda
