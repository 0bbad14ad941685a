// Max and average 2-D pooling over NCHW planes, forward and backward.
//
// Forward: one thread per OUTPUT element (n, c, p, q), in a grid-stride loop
// over the flat N*C*P*Q index with q fastest. A warp therefore writes 32
// consecutive outputs (coalesced) and reads 32 neighbouring windows of the
// same input rows: consecutive threads read addresses stride_w apart, and
// the rows of a window are shared with its neighbours, so the reads mostly
// hit cache. Each thread scans its window clipped to the real input, in
// row-major order, exactly as cpu::max_pool2d_forward / avg_pool2d_forward:
//   max: the first maximum in scan order wins (ties pick the earliest
//        element), a NaN is taken and ends the scan, padding is -inf (never
//        chosen); a window wholly in padding gives -inf and argmax -1.
//        argmax is the flat h*W+w index within the (n, c) plane.
//   avg: sum of the clipped window in scan order times 1/(kernel_h*kernel_w)
//        (padding counts as zeros: count_include_pad=True).
//
// Backward: one thread per INPUT element (n, c, h, w), a gather. The thread
// works out which output windows cover its (h, w) (p in [p_lo, p_hi], q in
// [q_lo, q_hi], at most ceil(kh/sh) * ceil(kw/sw) of them) and sums their
// gradients: for max only those whose argmax is this element, for avg all of
// them, times 1/(kh*kw). Why a gather and not a scatter (one thread per
// output adding into dx with atomicAdd), which would also be correct with
// overlapping windows (stride < kernel):
//   - deterministic: float atomics add in whatever order the hardware runs
//     them, so overlapping windows would give results that vary in the last
//     bits from run to run; the gather adds in a fixed order, ascending
//     (p, q), which is also the CPU's order (for max pooling the sums then
//     match cpu::max_pool2d_backward bit for bit);
//   - every dx element is written exactly once, coalesced, with no separate
//     zero-fill pass and no atomic traffic;
//   - the extra reads are small: dy and argmax are read once per covering
//     window (once in total when stride >= kernel).
//
// Indices: the kernels are templated on the index type, int when every flat
// index fits in 31 bits (32-bit division and modulo, used to split the flat
// index, are several times cheaper on a GPU) and int64 otherwise.
#include <stdexcept>
#include <string>

#include "kernels/cuda/cuda_compat.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/element.h"

namespace anvil::cuda {

namespace pool_kernels {

constexpr int kBlock = 256;
constexpr int64_t kMaxBlocks = 2048;

template <typename I>
struct Shape {
  I H, W, P, Q, kh, kw, sh, sw, ph, pw;
};

template <typename I>
Shape<I> narrow(const Pool2dShape& s) {
  return {static_cast<I>(s.H),        static_cast<I>(s.W),        static_cast<I>(s.P),
          static_cast<I>(s.Q),        static_cast<I>(s.kernel_h), static_cast<I>(s.kernel_w),
          static_cast<I>(s.stride_h), static_cast<I>(s.stride_w), static_cast<I>(s.pad_h),
          static_cast<I>(s.pad_w)};
}

template <typename I>
__device__ __forceinline__ I first_index() {
  return static_cast<I>(blockIdx.x) * static_cast<I>(blockDim.x) + static_cast<I>(threadIdx.x);
}
template <typename I>
__device__ __forceinline__ I grid_stride() {
  return static_cast<I>(gridDim.x) * static_cast<I>(blockDim.x);
}

// Floor division for a positive divisor and a numerator of either sign.
template <typename I>
__device__ __forceinline__ I floor_div(I a, I b) {
  const I q = a / b;
  return (a % b != 0 && a < 0) ? q - 1 : q;
}

// The output windows along one axis that cover input position x: those o
// with o*stride - pad <= x < o*stride - pad + k, clipped to [0, out).
template <typename I>
__device__ __forceinline__ void covering(I x, I k, I stride, I pad, I out, I& lo, I& hi) {
  lo = floor_div<I>(x + pad - k, stride) + 1;
  if (lo < 0) lo = 0;
  hi = (x + pad) / stride;  // x + pad >= 0
  if (hi > out - 1) hi = out - 1;
}

template <typename I, typename T>
__global__ void __launch_bounds__(kBlock) max_pool_forward_kernel(I total, Shape<I> s, const T* __restrict__ x,
                                        T* __restrict__ y, int64_t* __restrict__ argmax) {
  for (I o = first_index<I>(); o < total; o += grid_stride<I>()) {
    const I q = o % s.Q;
    const I t = o / s.Q;
    const I p = t % s.P;
    const I plane = t / s.P;
    const I hs = p * s.sh - s.ph, ws = q * s.sw - s.pw;
    const I h0 = hs < 0 ? 0 : hs, h1 = hs + s.kh < s.H ? hs + s.kh : s.H;
    const I w0 = ws < 0 ? 0 : ws, w1 = ws + s.kw < s.W ? ws + s.kw : s.W;
    const T* xp = x + static_cast<int64_t>(plane) * s.H * s.W;
    float best = -INFINITY;
    I arg = -1;
    if (h0 < h1 && w0 < w1) {
      arg = h0 * s.W + w0;
      best = load(xp[arg]);
      bool done = best != best;  // a NaN first element wins outright
      for (I h = h0; h < h1 && !done; ++h) {
        for (I w = w0; w < w1; ++w) {
          const float v = load(xp[h * s.W + w]);
          if (v > best || v != v) {
            best = v;
            arg = h * s.W + w;
            if (v != v) {
              done = true;
              break;
            }
          }
        }
      }
    }
    y[o] = store<T>(best);  // a bfloat16 input's maximum is exact in bfloat16
    argmax[o] = arg;
  }
}

template <typename I, typename T>
__global__ void __launch_bounds__(kBlock) max_pool_backward_kernel(I total, Shape<I> s, const T* __restrict__ dy,
                                         const int64_t* __restrict__ argmax,
                                         T* __restrict__ dx) {
  for (I i = first_index<I>(); i < total; i += grid_stride<I>()) {
    const I w = i % s.W;
    const I t = i / s.W;
    const I h = t % s.H;
    const I plane = t / s.H;
    I p_lo, p_hi, q_lo, q_hi;
    covering<I>(h, s.kh, s.sh, s.ph, s.P, p_lo, p_hi);
    covering<I>(w, s.kw, s.sw, s.pw, s.Q, q_lo, q_hi);
    const int64_t base = static_cast<int64_t>(plane) * s.P * s.Q;
    const int64_t me = static_cast<int64_t>(h) * s.W + w;
    float acc = 0.0f;
    for (I p = p_lo; p <= p_hi; ++p)
      for (I q = q_lo; q <= q_hi; ++q) {
        const int64_t j = base + static_cast<int64_t>(p) * s.Q + q;
        if (argmax[j] == me) acc += load(dy[j]);
      }
    dx[i] = store<T>(acc);
  }
}

// The average pooling bodies, on x, y, dy and dx of their own element types
// (each loaded into a float, the sums float32, each result stored in its
// type), so that global average pooling under autocast reads a bfloat16 x
// into a float32 y, and a float32 dy into a bfloat16 dx, without conversion
// passes. The __global__ wrappers below give each pairing a kernel name.
template <typename I, typename Tx, typename Ty>
__device__ __forceinline__ void avg_pool_forward(I total, Shape<I> s, float inv,
                                                 const Tx* __restrict__ x, Ty* __restrict__ y) {
  for (I o = first_index<I>(); o < total; o += grid_stride<I>()) {
    const I q = o % s.Q;
    const I t = o / s.Q;
    const I p = t % s.P;
    const I plane = t / s.P;
    const I hs = p * s.sh - s.ph, ws = q * s.sw - s.pw;
    const I h0 = hs < 0 ? 0 : hs, h1 = hs + s.kh < s.H ? hs + s.kh : s.H;
    const I w0 = ws < 0 ? 0 : ws, w1 = ws + s.kw < s.W ? ws + s.kw : s.W;
    const Tx* xp = x + static_cast<int64_t>(plane) * s.H * s.W;
    float acc = 0.0f;
    for (I h = h0; h < h1; ++h)
      for (I w = w0; w < w1; ++w) acc += load(xp[h * s.W + w]);
    y[o] = store<Ty>(acc * inv);
  }
}

template <typename I, typename Tdy, typename Tdx>
__device__ __forceinline__ void avg_pool_backward(I total, Shape<I> s, float inv,
                                                  const Tdy* __restrict__ dy,
                                                  Tdx* __restrict__ dx) {
  for (I i = first_index<I>(); i < total; i += grid_stride<I>()) {
    const I w = i % s.W;
    const I t = i / s.W;
    const I h = t % s.H;
    const I plane = t / s.H;
    I p_lo, p_hi, q_lo, q_hi;
    covering<I>(h, s.kh, s.sh, s.ph, s.P, p_lo, p_hi);
    covering<I>(w, s.kw, s.sw, s.pw, s.Q, q_lo, q_hi);
    const Tdy* dyp = dy + static_cast<int64_t>(plane) * s.P * s.Q;
    // fmaf, as nvcc contracts a * b + c on the GPU: written out, every
    // instance computes the same bits in the simulator too, whatever g++
    // contracts for the -march it targets.
    float acc = 0.0f;
    for (I p = p_lo; p <= p_hi; ++p)
      for (I q = q_lo; q <= q_hi; ++q) acc = fmaf(load(dyp[p * s.Q + q]), inv, acc);
    dx[i] = store<Tdx>(acc);
  }
}

template <typename I, typename T>
__global__ void __launch_bounds__(kBlock) avg_pool_forward_kernel(I total, Shape<I> s, float inv,
                                        const T* __restrict__ x, T* __restrict__ y) {
  avg_pool_forward<I, T, T>(total, s, inv, x, y);
}

template <typename I, typename T>
__global__ void __launch_bounds__(kBlock) avg_pool_backward_kernel(I total, Shape<I> s, float inv,
                                         const T* __restrict__ dy, T* __restrict__ dx) {
  avg_pool_backward<I, T, T>(total, s, inv, dy, dx);
}

// Global average pooling under autocast: a bfloat16 x into a float32 y.
template <typename I>
__global__ void __launch_bounds__(kBlock)
    avg_pool_forward_bf16_to_float_kernel(I total, Shape<I> s, float inv,
                                          const bfloat16* __restrict__ x, float* __restrict__ y) {
  avg_pool_forward<I, bfloat16, float>(total, s, inv, x, y);
}

// Its backward: a float32 dy into a bfloat16 dx, rounded once.
template <typename I>
__global__ void __launch_bounds__(kBlock)
    avg_pool_backward_float_to_bf16_kernel(I total, Shape<I> s, float inv,
                                           const float* __restrict__ dy,
                                           bfloat16* __restrict__ dx) {
  avg_pool_backward<I, float, bfloat16>(total, s, inv, dy, dx);
}

// The kernel for each pairing of element types the entry points take.
template <typename I, typename T>
auto avg_forward_for(const T*, T*) {
  return avg_pool_forward_kernel<I, T>;
}
template <typename I>
auto avg_forward_for(const bfloat16*, float*) {
  return avg_pool_forward_bf16_to_float_kernel<I>;
}
template <typename I, typename T>
auto avg_backward_for(const T*, T*) {
  return avg_pool_backward_kernel<I, T>;
}
template <typename I>
auto avg_backward_for(const float*, bfloat16*) {
  return avg_pool_backward_float_to_bf16_kernel<I>;
}

void check_shape(const Pool2dShape& s, const char* who) {
  if (s.N < 0 || s.C < 0 || s.H < 0 || s.W < 0 || s.P < 0 || s.Q < 0 || s.kernel_h <= 0 ||
      s.kernel_w <= 0 || s.stride_h <= 0 || s.stride_w <= 0 || s.pad_h < 0 || s.pad_w < 0)
    throw std::invalid_argument(std::string("cuda::") + who + ": invalid pooling shape");
}

dim3 grid_for(int64_t total) {
  const int64_t blocks = (total + kBlock - 1) / kBlock;
  return dim3(static_cast<unsigned>(blocks < kMaxBlocks ? blocks : kMaxBlocks));
}

// True when every index a kernel forms stays below 2^31: the flat indices
// (plus one grid stride, at most kMaxBlocks * kBlock = 2^19) and the window
// arithmetic (p*stride + kernel, h + pad).
bool fits_int(const Pool2dShape& s) {
  constexpr int64_t kLimit = INT32_MAX - kMaxBlocks * kBlock;
  const int64_t planes = s.N * s.C;
  return planes * s.H * s.W < kLimit && planes * s.P * s.Q < kLimit &&
         s.P * s.stride_h + s.kernel_h < kLimit && s.Q * s.stride_w + s.kernel_w < kLimit &&
         s.H + s.pad_h < kLimit && s.W + s.pad_w < kLimit;
}

// Calls launch_with(Index{}) with Index = int where fits_int(s) (32-bit
// index arithmetic is cheaper on the GPU), int64_t otherwise, so each entry
// point below states its launch once for both widths.
template <class LaunchWith>
void with_index_type(const Pool2dShape& s, LaunchWith&& launch_with) {
  if (fits_int(s))
    launch_with(int{});
  else
    launch_with(int64_t{});
}

}  // namespace pool_kernels

using namespace pool_kernels;

template <class T>
void max_pool2d_forward(const Pool2dShape& s, const T* x, T* y, int64_t* argmax,
                        cudaStream_t stream) {
  check_shape(s, "max_pool2d_forward");
  const int64_t total = s.N * s.C * s.P * s.Q;
  if (total == 0) return;
  with_index_type(s, [&](auto index) {
    using I = decltype(index);
    launch(max_pool_forward_kernel<I, T>, grid_for(total), dim3(kBlock), 0, stream,
           static_cast<I>(total), narrow<I>(s), x, y, argmax);
  });
}

template <class T>
void max_pool2d_backward(const Pool2dShape& s, const T* dy, const int64_t* argmax, T* dx,
                         cudaStream_t stream) {
  check_shape(s, "max_pool2d_backward");
  const int64_t total = s.N * s.C * s.H * s.W;
  if (total == 0) return;
  with_index_type(s, [&](auto index) {
    using I = decltype(index);
    launch(max_pool_backward_kernel<I, T>, grid_for(total), dim3(kBlock), 0, stream,
           static_cast<I>(total), narrow<I>(s), dy, argmax, dx);
  });
}

template <class Tx, class Ty>
void avg_pool2d_forward(const Pool2dShape& s, const Tx* x, Ty* y, cudaStream_t stream) {
  check_shape(s, "avg_pool2d_forward");
  const int64_t total = s.N * s.C * s.P * s.Q;
  if (total == 0) return;
  const float inv = 1.0f / static_cast<float>(s.kernel_h * s.kernel_w);
  with_index_type(s, [&](auto index) {
    using I = decltype(index);
    launch(avg_forward_for<I>(x, y), grid_for(total), dim3(kBlock), 0, stream,
           static_cast<I>(total), narrow<I>(s), inv, x, y);
  });
}

template <class Tdy, class Tdx>
void avg_pool2d_backward(const Pool2dShape& s, const Tdy* dy, Tdx* dx, cudaStream_t stream) {
  check_shape(s, "avg_pool2d_backward");
  const int64_t total = s.N * s.C * s.H * s.W;
  if (total == 0) return;
  const float inv = 1.0f / static_cast<float>(s.kernel_h * s.kernel_w);
  with_index_type(s, [&](auto index) {
    using I = decltype(index);
    launch(avg_backward_for<I>(dy, dx), grid_for(total), dim3(kBlock), 0, stream,
           static_cast<I>(total), narrow<I>(s), inv, dy, dx);
  });
}

#define ANVIL_POOL(T)                                                                          \
  template void max_pool2d_forward<T>(const Pool2dShape&, const T*, T*, int64_t*, cudaStream_t); \
  template void max_pool2d_backward<T>(const Pool2dShape&, const T*, const int64_t*, T*,         \
                                       cudaStream_t);                                            \
  template void avg_pool2d_forward<T, T>(const Pool2dShape&, const T*, T*, cudaStream_t);        \
  template void avg_pool2d_backward<T, T>(const Pool2dShape&, const T*, T*, cudaStream_t);
ANVIL_POOL(float)
ANVIL_POOL(bfloat16)
#undef ANVIL_POOL
template void avg_pool2d_forward<bfloat16, float>(const Pool2dShape&, const bfloat16*, float*,
                                                  cudaStream_t);
template void avg_pool2d_backward<float, bfloat16>(const Pool2dShape&, const float*, bfloat16*,
                                                   cudaStream_t);

}  // namespace anvil::cuda
