// The reduction step of the collectives (parallel/): dst = (dst + src) * scale,
// where src is a chunk another GPU has just sent. The ring all-reduce runs it
// once per chunk and step on the communicator's reduction stream, while the
// next chunk is on the wire.
//
// Thread -> data mapping: a grid-stride loop over [0, n), as elementwise.cu,
// but each thread moves four floats at a time (one 128-bit load of dst, one
// of src, one 128-bit store) when both pointers are 16-byte aligned, which
// the caching allocator's blocks and the collectives' chunk boundaries
// (multiples of 4 elements wherever they can be) make the common case. A
// warp then covers 512 consecutive bytes of each array per instruction, and
// there are a quarter as many loop iterations and index computations. The
// kernel is purely bandwidth-bound (12 bytes of traffic per float for one add
// and one multiply), so fewer, wider memory instructions are what matter. The
// up to three elements past the last multiple of 4 (and every element, when a
// pointer is not aligned) take the scalar loop.
//
// The grid: enough blocks of 256 threads to give each thread one float4, up
// to 2048 blocks (about two waves of resident blocks on an H100's 132 SMs);
// beyond that the grid-stride loop walks the rest.
#include <cstdint>
#include <stdexcept>
#include <string>

#include "kernels/cuda/cuda_compat.h"
#include "kernels/cuda/cuda_kernels.h"

namespace anvil::cuda {

namespace accumulate_kernels {

constexpr int kBlock = 256;
constexpr int64_t kMaxBlocks = 2048;

inline dim3 grid_for(int64_t work_items) {
  const int64_t blocks = (work_items + kBlock - 1) / kBlock;
  return dim3(static_cast<unsigned>(blocks < 1 ? 1 : blocks < kMaxBlocks ? blocks : kMaxBlocks));
}

__device__ __forceinline__ int64_t first_index() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ int64_t grid_stride() {
  return static_cast<int64_t>(gridDim.x) * blockDim.x;
}

// Elements [begin, n), one per thread per iteration.
template <typename T>
__global__ void __launch_bounds__(kBlock)
    accumulate_scalar_kernel(int64_t begin, int64_t n, T* dst, const T* src, T scale) {
  for (int64_t i = begin + first_index(); i < n; i += grid_stride())
    dst[i] = scale == T(1) ? T(dst[i] + src[i]) : T((dst[i] + src[i]) * scale);
}

// Elements [0, 4 * n4), four per thread per iteration; dst and src 16-byte aligned.
__global__ void __launch_bounds__(kBlock)
    accumulate_float4_kernel(int64_t n4, float4* dst, const float4* src, float scale) {
  for (int64_t i = first_index(); i < n4; i += grid_stride()) {
    float4 a = dst[i];
    const float4 b = src[i];
    a.x = (a.x + b.x) * scale;
    a.y = (a.y + b.y) * scale;
    a.z = (a.z + b.z) * scale;
    a.w = (a.w + b.w) * scale;
    dst[i] = a;
  }
}

// bfloat16 elements [0, n): widened to float, added and scaled in float,
// rounded to bfloat16 once on the store. Scalar: the kernel moves half the
// bytes of the float one and the collectives' bfloat16 chunks are small.
__global__ void __launch_bounds__(kBlock)
    accumulate_bf16_kernel(int64_t n, bfloat16* dst, const bfloat16* src, float scale) {
  for (int64_t i = first_index(); i < n; i += grid_stride())
    dst[i] = bfloat16((dst[i].to_float() + src[i].to_float()) * scale);
}

inline void check_n(int64_t n) {
  if (n < 0) throw std::invalid_argument("cuda::accumulate: negative size " + std::to_string(n));
}

}  // namespace accumulate_kernels

void accumulate(int64_t n, float* dst, const float* src, float scale, cudaStream_t stream) {
  using namespace accumulate_kernels;
  check_n(n);
  if (n == 0) return;
  const bool aligned = reinterpret_cast<uintptr_t>(dst) % 16 == 0 &&
                       reinterpret_cast<uintptr_t>(src) % 16 == 0;
  int64_t done = 0;
  if (aligned && n >= 4) {
    const int64_t n4 = n / 4;
    launch(accumulate_float4_kernel, grid_for(n4), dim3(kBlock), 0, stream, n4,
           reinterpret_cast<float4*>(dst), reinterpret_cast<const float4*>(src), scale);
    done = n4 * 4;
  }
  if (done < n)
    launch(accumulate_scalar_kernel<float>, grid_for(n - done), dim3(kBlock), 0, stream, done, n,
           dst, src, scale);
}

void accumulate(int64_t n, int64_t* dst, const int64_t* src, cudaStream_t stream) {
  using namespace accumulate_kernels;
  check_n(n);
  if (n == 0) return;
  launch(accumulate_scalar_kernel<int64_t>, grid_for(n), dim3(kBlock), 0, stream, int64_t{0}, n,
         dst, src, int64_t{1});
}

void accumulate(int64_t n, bfloat16* dst, const bfloat16* src, float scale,
                cudaStream_t stream) {
  using namespace accumulate_kernels;
  check_n(n);
  if (n == 0) return;
  launch(accumulate_bf16_kernel, grid_for(n), dim3(kBlock), 0, stream, n, dst, src, scale);
}

}  // namespace anvil::cuda
