// GEMM rung 11, TF32 tensor cores on the multistage mainloop: rung 09's
// numerics (every operand rounded by tc::cvt_tf32, nearest with ties to
// even, mma.sync.m16n8k8, FP32 accumulation, so its error bounds hold) and
// its split-K, on the mainloop of rung 12 (mma_multistage.cuh, its Tf32
// kind) fed by the GEMM iterator of mma_ldmatrix.cuh. float32 operands are
// copied as they are stored and rounded in registers after the fragment
// load: no rounding pass through shared memory, no extra barrier.
//
// Threads. A block of 128 threads (4 warps, 2 x 2) computes a 128 x 128
// tile of C; each warp 64 x 64 of it, 4 x 8 mma tiles of 16 x 8 (128
// accumulators a lane). Per 8 of k a warp loads its 4 A and 8 B fragments
// (4 + 4 ldmatrix.x4; for an operand contiguous along j, below, 8 eight-
// byte loads for A, 16 four-byte ones for B), rounds their 32 registers
// and issues 32 mma.
//
// Fragments (kernels/cuda/mma.cuh has the PTX ISA's tables). With g =
// lane / 4, t = lane % 4 the m16n8k8 .tf32 fragments are A: a0 (g, t), a1
// (g+8, t), a2 (g, t+4), a3 (g+8, t+4); B: b0 (k = t, n = g), b1 (k = t+4,
// n = g), one float each. An 8 x 8 ldmatrix matrix of 16-bit elements is 8
// rows of 16 bytes, 4 floats, and hands lane l the 32-bit word (row l / 4,
// word l % 4): (g, t). So for an operand stored contiguous along k (op(A) =
// A, op(B) = B^T), whose stage rows are (j, 4 k) per chunk, an ldmatrix.x4
// of rows j0..j0+7 / j0+8..j0+15 by k0..k0+3 / k0+4..k0+7 is a0..a3 in that
// order, and of k first is b0, b1 of two n tiles: the bytes and addresses of
// rung 12's BF16 fragments, half the k. ldmatrix.trans transposes 16-bit
// elements, so it cannot turn an operand stored contiguous along j (op(A)
// = A^T, op(B) = B) into fragments; an iterator transposing on the copy
// would need 4-byte cp.async, four times the copies. Those operands are
// read by shared loads instead. B: lane (g, t) reads b0 at (k0 + t, j0 +
// g) and b1 4 rows on, 4 bytes each. A: a lane's a0 and a1 are rows g and
// g + 8, 8 floats apart in a stage row; the tile permutes which of its
// rows the mma's rows stand for (mma rows g and g + 8 of each 16 are rows
// 2g and 2g + 1, the epilogue stores them there), so that a0 a1 (at k0 +
// t) and a2 a3 (4 rows on) are two 8-byte loads. Each register is then
// rounded by tc::cvt_tf32: one cvt per register, the same rounding as
// rung 09's, of the same values.
//
// Shared memory. A stage holds 16 of k of each operand as stored, in
// 16-byte chunks of 4 floats along the contiguous index:
//   contiguous along k: 128 rows j of 64 bytes (4 chunks); chunk c of row j
//     at position c ^ (j / 2 % 4): rung 12's layout, byte for byte;
//   contiguous along j: 16 rows k of 128 + 8 floats (32 chunks and a pad of
//     32 bytes), unswizzled.
// Bank conflicts. Along k, the ldmatrix phases and 16-byte stores are
// rung 12's (12_bf16_pipelined.cu): conflict-free. Along j, B's 4-byte
// load is one phase of 32 lanes: lane (g, t) reads word (k0 + t) * 136 +
// j0 + g (+ a constant), and 136 is 8 mod 32, so the banks are 8t + g + c
// mod 32: all 32. A's 8-byte load is two phases of 16 lanes (g = 0..3 or
// 4..7, t = 0..3), lane (g, t) at words 136 t + 2g (+ c) and the next: 8t
// + 2g runs over 16 even banks, each with its neighbour: all 32. A store
// phase (8 lanes of consecutive units) is 8 consecutive chunks of one row,
// 128 contiguous bytes. Every fragment load and every cp.async store is
// conflict-free.
//
// Pipeline: the mainloop's (mma_multistage.cuh), 4 stages of 16 of k:
// 4 x 17 KB = 68 KB of dynamic shared memory (each operand's room that of
// its padded layout), opted in to by the launcher (mma_rung.cuh). Stage s
// is copied into buffer s % 4 by cp.async.cg, 16 bytes a copy (4 per thread
// and operand), src-size short of 16 at ragged edges and 0 outside them
// (zeros: the products past M, N, K are 0); an operand whose base or row
// stride is not a multiple of 16 bytes (4 floats) is first copied to an
// aligned one (below, "Unaligned operands"); a block whose chunks all lie
// inside the operands in every step (aligned, its rows inside M and N, K a multiple of
// 16) copies through mma_ldmatrix.cuh's FullIterator, without masks (one
// branch for the block). Step s:
//   wait_group 2        this thread's copies of stage s have landed
//   __syncthreads       publishes stage s; every warp is past its mma of
//                       stage s - 1
//   copy stage s + 3    into buffer (s + 3) % 4 = (s - 1) % 4, just freed
//   2 x (fragment loads, 32 cvt, 32 mma) per warp on buffer s % 4
// One barrier per 16 of k, three stages (48 of k) of copies in flight
// behind the mma. Each accumulator sees the same mma, k ascending in steps
// of 8, on the same rounded operands as rung 09's: the same bits
// (tests/test_cuda_gemm_mma.cpp). The main loop's cost (docs/kernels.md,
// "The issue bound"): 3.25-3.69 instructions per HMMA on sm_90, one of them
// the cvt (cvt.rn.tf32.f32: F2FP.TF32.F32); on sm_80, with no cvt.rn.tf32,
// 6.25-6.59, four of them the rounding in integer instructions.
//
// Split-K and the kernel: mma_rung.cuh's, as 09's.
//
// Unaligned operands (aligned_copy.h; rung 12 does the same): the launcher
// copies each operand whose base or row stride is not a multiple of 16
// bytes into the workspace, its rows rounded up to whole 16-byte chunks
// (one copy_rows launch per operand), and runs the kernel on the copy.
// Why a copy: a second main loop, of 4-byte cp.async (one per element,
// each with its own address and mask), would double the kernel's instances
// (nvcc's longest file: each is compiled for two GPUs) and issue four
// copies where one does; rung 09, which reads any alignment, runs 8.9
// instructions per HMMA, over the bound of 4 (docs/kernels.md, "The issue
// bound"). The copy costs one small launch per unaligned operand and its
// bytes read and written once; the operands that need it are narrow (the
// 10-wide classifier's dY, batch x 10: 10 KB at batch 256), so its bytes
// are few against the product's. The result is the aligned path's bits,
// which are rung 09's.
//   build/sim/bench_cuda_kernels gemm 11
#include <stdexcept>
#include <string>

#include "kernels/cuda/gemm/aligned_copy.h"
#include "kernels/cuda/gemm/mma_ldmatrix.cuh"
#include "kernels/cuda/gemm/mma_rung.cuh"

namespace anvil::cuda {

using PipelinedRung = gemm_kernels::MmaRung<mma_ldmatrix::Tf32>;

size_t gemm_rungs::tf32_pipelined_workspace_floats(int64_t M, int64_t N, int64_t K) {
  return PipelinedRung::workspace_floats(M, N, K);
}

// Operands whose 16-byte chunks are not all aligned are copied to aligned
// ones past the split's partials first (aligned_copy.h).
void gemm_rungs::tf32_pipelined(const GemmArgs& g, cudaStream_t stream) {
  const size_t partials = PipelinedRung::workspace_floats(g.M, g.N, g.K);
  gemm_kernels::by_transpose<PipelinedRung::Run>(aligned_copy::operands(g, partials, stream),
                                                 stream);
}

// The stage-depth sweep of the tests: 2 stages (34 KB, static shared
// memory), 3 (51 KB, dynamic) or the rung's 4. The split plan, hence the
// workspace, is the rung's (the same block tile and kMinBlocks). The 2- and
// 3-stage builds take A along k only, with B either way: the depth changes
// the pipeline, which both of B's iterators feed and A's transpose does not
// touch, and each instance is compiled for two GPUs (nvcc's longest file).
void gemm_rungs::tf32_pipelined_stages(int stages, const GemmArgs& g, cudaStream_t stream) {
  using Two = mma_ldmatrix::ShapeOf<multistage::Tf32, 2, 2, 2, 2>;
  using Three = mma_ldmatrix::ShapeOf<multistage::Tf32, 2, 2, 3, 2>;
  static_assert(Two::kDynamicSharedBytes == 0 && Three::kDynamicSharedBytes > 0);
  if (stages == 4) return tf32_pipelined(g, stream);
  if (stages != 2 && stages != 3)
    throw std::invalid_argument("gemm rung 11: " + std::to_string(stages) +
                                " stages (2, 3 or 4 are built)");
  if (g.trans_a)
    throw std::invalid_argument("gemm rung 11: " + std::to_string(stages) +
                                " stages are built for A along k only (trans_a false)");
  const GemmArgs a =
      aligned_copy::operands(g, PipelinedRung::workspace_floats(g.M, g.N, g.K), stream);
  if (stages == 2)
    return a.trans_b ? gemm_kernels::MmaRung<Two>::Run<false, true>::run(a, stream)
                     : gemm_kernels::MmaRung<Two>::Run<false, false>::run(a, stream);
  return a.trans_b ? gemm_kernels::MmaRung<Three>::Run<false, true>::run(a, stream)
                   : gemm_kernels::MmaRung<Three>::Run<false, false>::run(a, stream);
}

}  // namespace anvil::cuda
