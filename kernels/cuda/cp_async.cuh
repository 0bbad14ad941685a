// Asynchronous copies from global to shared memory (sm_80 on), one function
// per instruction:
//   copy_ca<4|8|16>(dst, src, src_bytes)  cp.async.ca.shared.global [dst], [src], N, src_bytes
//   copy_cg(dst, src, src_bytes)          cp.async.cg.shared.global [dst], [src], 16, src_bytes
//   commit_group()                        cp.async.commit_group
//   wait_group<N>()                       cp.async.wait_group N
//   wait_all()                            cp.async.wait_all
// Under nvcc each is inline PTX; in the simulator build each calls the
// emulation (sim/cp_async_sim.h).
//
// What the PTX ISA ("Data Movement and Conversion Instructions:
// cp.async") says, and the kernels rely on:
// - A copy writes N bytes at dst (shared memory): the first src_bytes read
//   from src (global memory), the rest zeros. So src_bytes = 0 writes zeros
//   and reads nothing. dst and src are aligned to N. .cg (the L1 bypassed)
//   exists for N = 16 only.
// - Copies are asynchronous: nothing says when they land, only that the
//   thread's commit_group closes a group of its copies not yet committed,
//   and that wait_group<N> returns once all but the newest N of the
//   thread's committed groups are complete. wait_all is commit_group then
//   wait_group<0>. Copies not yet committed are not waited for by
//   wait_group.
// - Completion is per thread: another thread's copies, complete or not, are
//   visible only through a barrier after its wait (__syncthreads).
#pragma once
#include <cstdint>

#include "kernels/cuda/cuda_compat.h"
#if !defined(__CUDACC__)
#include "sim/cp_async_sim.h"
#endif

namespace anvil::cuda::cp_async {

#if defined(__CUDACC__)
__device__ __forceinline__ unsigned shared_address(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
#endif

// N bytes at dst: src_bytes of them from src, the rest zeros; cached in L1.
template <int N>
__device__ __forceinline__ void copy_ca(void* dst, const void* src, int src_bytes = N) {
  static_assert(N == 4 || N == 8 || N == 16);
#if defined(__CUDACC__)
  asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(shared_address(dst)),
               "l"(src), "n"(N), "r"(src_bytes)
               : "memory");
#else
  anvil::sim::cp_async::copy(dst, src, N, src_bytes, anvil::sim::cp_async::Cache::kAll);
#endif
}

// 16 bytes at dst: src_bytes of them from src, the rest zeros; cached in L2 only.
__device__ __forceinline__ void copy_cg(void* dst, const void* src, int src_bytes = 16) {
#if defined(__CUDACC__)
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(shared_address(dst)),
               "l"(src), "r"(src_bytes)
               : "memory");
#else
  anvil::sim::cp_async::copy(dst, src, 16, src_bytes, anvil::sim::cp_async::Cache::kGlobal);
#endif
}

__device__ __forceinline__ void commit_group() {
#if defined(__CUDACC__)
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#else
  anvil::sim::cp_async::commit_group();
#endif
}

template <int N>
__device__ __forceinline__ void wait_group() {
  static_assert(N >= 0);
#if defined(__CUDACC__)
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#else
  anvil::sim::cp_async::wait_group(N);
#endif
}

__device__ __forceinline__ void wait_all() {
#if defined(__CUDACC__)
  asm volatile("cp.async.wait_all;\n" ::: "memory");
#else
  anvil::sim::cp_async::wait_all();
#endif
}

}  // namespace anvil::cuda::cp_async
