// GEMM, row-major as cblas_sgemm:
//   C[M,N] = alpha * op(A)[M,K] * op(B)[K,N] + beta * C,   op(X) = X or X^T.
// A is stored M x K with row stride lda (K x M when trans_a), B K x N with row
// stride ldb (N x K when trans_b), C M x N with row stride ldc.
//
// The ladder: each rung one idea on top of the one before, one file each,
// read in this order. Every rung takes every transpose combination, stride
// and ragged size, and is tested (tests/test_cuda_gemm.cpp) and benchmarked.
//   01_naive.cu              one thread per element of C, threads walking down M
//   02_coalesced.cu          threads along N: C stores and B loads coalesced
//   03_smem_tiled.cu         32x32 tiles of A and B staged in shared memory
//   04_register_blocked.cu   64x64 tile, 4x4 outputs per thread in registers
//   05_vectorised.cu         16-byte global and shared-memory accesses
//   06_warp_tiled.cu         128x128 tile, warp sub-tiles, 8x8 per thread
//   07_double_buffered.cu    two shared-memory stages: loads overlap the FMAs
//   08_split_k.cu  (ships)   7 plus chunks of K over grid.z when tiles are few
//   09_tf32_mma.cu           TF32 tensor cores (mma.sync m16n8k8), FP32 accumulation,
//                            split-K as 8
//   10_bf16_mma.cu           9 with BF16 operands (mma.sync m16n8k16), read
//                            as bfloat16 from memory when given them; C
//                            float32, or bfloat16 rounded in the epilogue
//   11_tf32_pipelined.cu     9's numerics on the multistage mainloop
//   (ships)                  (mma_multistage.cuh: 64 x 64 warp tiles, 4 cp.async
//                            stages of 16 of k, fragments by ldmatrix from
//                            XOR-swizzled rows, rounded in registers):
//                            matmuls under --fp32-precision tf32
//   12_bf16_pipelined.cu     10's numerics (bfloat16 operands; float32 ones run
//   (ships)                  10) on the same mainloop, 4 stages of 32 of k in
//                            dynamic shared memory: matmuls under autocast
// "(ships)": the rung the CUDA backend runs in each arithmetic (FP32, TF32,
// BF16: kBestGemm, kTf32Gemm, kBf16Gemm below). The tensor-core ones are the
// multistage rungs, whose main loops issue 3.6-3.8 instructions per HMMA
// against rungs 09 and 10's 8.6-21.4 (docs/generated/kernel-table.md), on
// every operand: one not 16-byte aligned is copied to an aligned one first
// (aligned_copy.h).
// Run one rung alone (checked against the CPU, then timed; simulated in the
// sim build, on the GPU in the release build):
//   build/sim/bench_cuda_kernels gemm 3
#pragma once
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "core/bfloat16.h"
#include "kernels/cuda/runtime.h"

namespace anvil::cuda {

constexpr int kGemmRungs = 12;
constexpr int kBestGemm = 8;  // the one the backend uses in FP32
constexpr int kTf32Gemm = 11;  // ... and in TF32 (core/precision.h)
constexpr int kBf16Gemm = 12;  // ... and in BF16 (autocast)
// Rungs 1..kGemmFp32Rungs compute in FP32 (FP32 operands, products and
// sums); the rungs after them on tensor cores, with rounded operands (each
// Rung's `math` below).
constexpr int kGemmFp32Rungs = 8;

// The workspace (floats) `rung` needs for an M x N x K product of operands
// whose 16-byte chunks are aligned (each base, and each row stride a
// multiple of 16 bytes), and of any operands a rung does not copy
// (gemm_rungs::AlignedCopies below): 0 but for the split shapes of 08 to 12.
size_t gemm_workspace_floats(int rung, int64_t M, int64_t N, int64_t K);
// ... for this product of these operands (as gemm() below takes them): the
// above, plus, on the rungs that copy unaligned operands to aligned ones
// (11 and 12, gemm/aligned_copy.h), room for those copies. What a caller
// that does not know its operands' alignment sizes by.
size_t gemm_workspace_floats(int rung, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                             const float* A, int64_t lda, const float* B, int64_t ldb);
size_t gemm_workspace_floats(int rung, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                             const bfloat16* A, int64_t lda, const bfloat16* B, int64_t ldb);

// Launches rung `rung` asynchronously on `stream`; the overload without a
// workspace is for shapes that need none. Throws std::invalid_argument,
// naming the argument, for an unknown rung, sizes < 0 or >= 2^31, an ld
// smaller than the stored row, or a missing workspace (one given must hold
// the floats of the operands' gemm_workspace_floats). With beta == 0, C is
// not read (it may hold garbage or NaN, as in BLAS).
void gemm(int rung, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
          const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
          int64_t ldc, float* workspace, cudaStream_t stream);
void gemm(int rung, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
          const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
          int64_t ldc, cudaStream_t stream);
// The same product of bfloat16 A and B (lda, ldb in elements), C float32:
// only the rungs with a bfloat16 launcher (10 and 12, kBf16Gemm) read them, as
// they are stored; any other rung throws std::invalid_argument.
void gemm(int rung, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
          const bfloat16* A, int64_t lda, const bfloat16* B, int64_t ldb, float beta, float* C,
          int64_t ldc, float* workspace, cudaStream_t stream);
// ... with a bias (null, or N floats, one per column of C, added in FP32
// to alpha * op(A) * op(B) before beta * C), and C float32 or bfloat16: a
// bfloat16 C holds the float32 C's values rounded once to nearest even, in
// the rung's epilogue (split: in its second pass, the partials float32).
// Only the rungs with a bfloat16 launcher (10, 12).
void gemm(int rung, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
          const bfloat16* A, int64_t lda, const bfloat16* B, int64_t ldb, float beta, float* C,
          int64_t ldc, const float* bias, float* workspace, cudaStream_t stream);
void gemm(int rung, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
          const bfloat16* A, int64_t lda, const bfloat16* B, int64_t ldb, float beta, bfloat16* C,
          int64_t ldc, const float* bias, float* workspace, cudaStream_t stream);

// One GEMM's arguments, checked, as every rung's launcher takes them; T is
// the operands' element type (float, or bfloat16), TC C's (float, or
// bfloat16 for rung 10's launcher of bfloat16 outputs).
template <class T, class TC = float>
struct GemmArgsOf {
  bool trans_a, trans_b;
  int M, N, K;  // checked below 2^31: kernels index with int
  float alpha;
  const T* A;
  int64_t lda;
  const T* B;
  int64_t ldb;
  float beta;
  TC* C;
  int64_t ldc;
  float* workspace;  // split-K partials and aligned copies, sized by gemm_workspace_floats
  const float* bias = nullptr;  // per column of C; read by rungs 10 and 12 only
};
using GemmArgs = GemmArgsOf<float>;
using Bf16GemmArgs = GemmArgsOf<bfloat16>;
using Bf16OutGemmArgs = GemmArgsOf<bfloat16, bfloat16>;

// The rungs' launchers, one per file, in the ladder's order.
namespace gemm_rungs {
using Launch = void (*)(const GemmArgs&, cudaStream_t);
void naive(const GemmArgs&, cudaStream_t);
void coalesced(const GemmArgs&, cudaStream_t);
void smem_tiled(const GemmArgs&, cudaStream_t);
void register_blocked(const GemmArgs&, cudaStream_t);
void vectorised(const GemmArgs&, cudaStream_t);
void warp_tiled(const GemmArgs&, cudaStream_t);
void double_buffered(const GemmArgs&, cudaStream_t);
void split_k(const GemmArgs&, cudaStream_t);
size_t split_k_workspace_floats(int64_t M, int64_t N, int64_t K);
void tf32_mma(const GemmArgs&, cudaStream_t);
size_t tf32_mma_workspace_floats(int64_t M, int64_t N, int64_t K);
void bf16_mma(const GemmArgs&, cudaStream_t);
void bf16_mma_of_bf16(const Bf16GemmArgs&, cudaStream_t);  // operands read as bfloat16
void bf16_mma_to_bf16(const Bf16OutGemmArgs&, cudaStream_t);  // ... and C stored as bfloat16
size_t bf16_mma_workspace_floats(int64_t M, int64_t N, int64_t K);
void tf32_pipelined(const GemmArgs&, cudaStream_t);
size_t tf32_pipelined_workspace_floats(int64_t M, int64_t N, int64_t K);
// Rung 11 with `stages` (2, 3 or 4) pipeline stages (the rung runs 4):
// every depth gives the same bits, which the tests check.
// std::invalid_argument for another depth.
void tf32_pipelined_stages(int stages, const GemmArgs&, cudaStream_t);
void bf16_pipelined(const GemmArgs&, cudaStream_t);  // runs bf16_mma
void bf16_pipelined_of_bf16(const Bf16GemmArgs&, cudaStream_t);
void bf16_pipelined_to_bf16(const Bf16OutGemmArgs&, cudaStream_t);
size_t bf16_pipelined_workspace_floats(int64_t M, int64_t N, int64_t K);

// What a rung's arithmetic is: FP32 throughout, or TF32 operands (rounded
// to 10 mantissa bits, nearest, ties to even) or BF16 operands (7 mantissa
// bits, nearest, ties to even) with FP32 accumulation.
enum class Math { kFp32, kTf32, kBf16 };

using Workspace = size_t (*)(int64_t M, int64_t N, int64_t K);
inline size_t no_workspace(int64_t, int64_t, int64_t) { return 0; }
using LaunchBf16 = void (*)(const Bf16GemmArgs&, cudaStream_t);
using LaunchBf16Out = void (*)(const Bf16OutGemmArgs&, cudaStream_t);
// The operands a rung's launcher copies to 16-byte aligned ones in its
// workspace when their chunks are not (gemm/aligned_copy.h): none, its
// float32 ones (rung 11) or its bfloat16 ones (rung 12, whose float32 ones
// run rung 10).
enum class AlignedCopies { kNone, kFloat32, kBf16 };
struct Rung {
  const char* name;
  Launch launch;
  Math math = Math::kFp32;
  Workspace workspace = no_workspace;  // floats of partials for a shape
  // The launchers for bfloat16 operands, with a float32 C and with a
  // bfloat16 one (the same split, so the same workspace; both take a bias);
  // null for the rungs that read float32 only.
  LaunchBf16 launch_bf16 = nullptr;
  LaunchBf16Out launch_bf16_out = nullptr;
  AlignedCopies copies = AlignedCopies::kNone;
};
inline constexpr Rung kRungs[kGemmRungs] = {
    {"naive", naive},
    {"coalesced", coalesced},
    {"smem tiled", smem_tiled},
    {"register blocked", register_blocked},
    {"vectorised", vectorised},
    {"warp tiled", warp_tiled},
    {"double buffered", double_buffered},
    {"split-K", split_k, Math::kFp32, split_k_workspace_floats},
    {"tf32 mma", tf32_mma, Math::kTf32, tf32_mma_workspace_floats},
    {"bf16 mma", bf16_mma, Math::kBf16, bf16_mma_workspace_floats, bf16_mma_of_bf16,
     bf16_mma_to_bf16},
    {"tf32 mma pipelined", tf32_pipelined, Math::kTf32, tf32_pipelined_workspace_floats,
     nullptr, nullptr, AlignedCopies::kFloat32},
    {"bf16 mma ldmatrix", bf16_pipelined, Math::kBf16, bf16_pipelined_workspace_floats,
     bf16_pipelined_of_bf16, bf16_pipelined_to_bf16, AlignedCopies::kBf16},
};
static_assert(kRungs[kGemmFp32Rungs - 1].math == Math::kFp32 &&
              kRungs[kGemmFp32Rungs].math != Math::kFp32);
// The tensor-core rungs, and they alone, have "mma" in their names: the GPU
// report (tools/gpu/gpu_report.py) compares those with the vendor's TF32/BF16.
static_assert([] {
  for (const Rung& r : kRungs)
    if ((r.math != Math::kFp32) != (std::string_view(r.name).find("mma") != std::string_view::npos))
      return false;
  return true;
}());
}  // namespace gemm_rungs

}  // namespace anvil::cuda
