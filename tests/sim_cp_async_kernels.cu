// Kernels for the cp.async tests (test_cp_async.cpp), each recording what a
// thread sees in shared memory around its copies. Included by
// test_cp_async.cpp in the simulator build.
#include "kernels/cuda/cp_async.cuh"
#include "sim/cp_async_sim.h"

namespace sim_cp_async_kernels {

namespace cp = anvil::cuda::cp_async;

constexpr uint32_t kOld = 0xA5A5A5A5u;  // shared memory before the copies

// One block of 32 threads; thread i copies src[4i..4i+3] (16 bytes) to its
// own 4 words of shared memory. out[8i + ...]: its first word right after
// the copy is issued (0), after commit_group (1), after wait_group<0> (2);
// its committed groups pending before the wait (3) and after it (4); after
// a __syncthreads, thread i+1's first word (5).
__global__ void arrival(const uint32_t* src, uint32_t* out) {
  alignas(16) __shared__ uint32_t s[32 * 4];
  const int i = int(threadIdx.x);
  for (int w = 0; w < 4; ++w) s[4 * i + w] = kOld;
  __syncthreads();
  cp::copy_cg(&s[4 * i], &src[4 * i]);
  out[8 * i + 0] = s[4 * i];
  cp::commit_group();
  out[8 * i + 1] = s[4 * i];
  out[8 * i + 3] = uint32_t(anvil::sim::cp_async::pending_groups());
  cp::wait_group<0>();
  out[8 * i + 2] = s[4 * i];
  out[8 * i + 4] = uint32_t(anvil::sim::cp_async::pending_groups());
  __syncthreads();
  out[8 * i + 5] = s[4 * ((i + 1) % 32)];
}

// One thread: four groups of one 4-byte copy each (src[g] to word g), then
// a fifth copy (src[4] to word 4) left uncommitted. After wait_group<2>,
// wait_group<0> and wait_all in turn, out[7r + 0..4] holds words 0..4,
// out[7r + 5] the pending groups and out[7r + 6] the uncommitted copies
// (r = 0, 1, 2).
__global__ void groups(const uint32_t* src, uint32_t* out) {
  alignas(16) __shared__ uint32_t s[8];
  for (int w = 0; w < 8; ++w) s[w] = kOld;
  for (int g = 0; g < 4; ++g) {
    cp::copy_ca<4>(&s[g], &src[g]);
    cp::commit_group();
  }
  cp::copy_ca<4>(&s[4], &src[4]);
  auto record = [&](int r) {
    for (int w = 0; w < 5; ++w) out[7 * r + w] = s[w];
    out[7 * r + 5] = uint32_t(anvil::sim::cp_async::pending_groups());
    out[7 * r + 6] = uint32_t(anvil::sim::cp_async::uncommitted_copies());
  };
  cp::wait_group<2>();
  record(0);
  cp::wait_group<0>();
  record(1);
  cp::wait_all();
  record(2);
}

// One thread: a copy of `size` bytes (4, 8: .ca; 16: .cg) with src-size
// src_bytes into 16 bytes of shared memory holding kOld; out[0..3] = those
// 16 bytes after wait_all.
__global__ void zero_fill(const uint32_t* src, uint32_t* out, int size, int src_bytes) {
  alignas(16) __shared__ uint32_t s[4];
  for (int w = 0; w < 4; ++w) s[w] = kOld;
  if (size == 4) cp::copy_ca<4>(s, src, src_bytes);
  if (size == 8) cp::copy_ca<8>(s, src, src_bytes);
  if (size == 16) cp::copy_cg(s, src, src_bytes);
  cp::wait_all();
  for (int w = 0; w < 4; ++w) out[w] = s[w];
}

// One thread, one copy the ISA forbids: `which` 0, a 16-byte copy to a
// shared address 4 bytes past a 16-byte boundary; 1, from such a global
// address; 2, src-size 17 for a 16-byte copy; 3, .cg of 8 bytes.
__global__ void forbidden(const uint32_t* src, int which) {
  alignas(16) __shared__ uint32_t s[8];
  if (which == 0) cp::copy_cg(&s[1], src);
  if (which == 1) cp::copy_cg(s, &src[1]);
  if (which == 2) cp::copy_cg(s, src, 17);
  if (which == 3) anvil::sim::cp_async::copy(s, src, 8, 8, anvil::sim::cp_async::Cache::kGlobal);
  cp::wait_all();
}

}  // namespace sim_cp_async_kernels
