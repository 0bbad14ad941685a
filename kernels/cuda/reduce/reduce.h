// Reductions: the sum of a vector, per-channel sums of a gradient (bias
// gradients), and the check of int64 labels against a class count. Every
// kernel is launched with 256 threads (__launch_bounds__).
//
// sum(rung, n, x, out): out[0] = x[0] + ... + x[n-1], a ladder of rungs:
//   sum_01_atomic.cu            one atomicAdd per element
//   sum_02_tree.cu              per-thread slices, a shared-memory tree per block
//   sum_03_shuffle.cu           the block's tree by warp shuffles
//   sum_04_two_pass.cu (ships)  per-block partials, a second pass: deterministic
// channel_sum(rung, outer, C, inner, dy, db): db[c] = the sum of
// dy[o, c, i] over o and i, overwriting db; deterministic in both rungs:
//   channel_sum_01_block.cu          one block per channel
//   channel_sum_02_split.cu (ships)  several blocks per channel, a fixed-order fold
// label_check.cu has no ladder; channel_split.cuh is the split shared with
// BatchNorm's rung 02.
// Run one rung alone (checked against the CPU, then timed):
//   build/sim/bench_cuda_kernels sum 3
//   build/sim/bench_cuda_kernels csum 1
#pragma once
#include <cstddef>
#include <cstdint>

#include "core/bfloat16.h"
#include "kernels/cuda/runtime.h"

namespace anvil::cuda {

// Rungs 01-03 zero out[0] on the stream (cudaMemsetAsync) before their
// kernel. The grid is capped (1024 blocks), each thread looping over its
// grid-stride slice; indices are int64, so n may exceed 2^31. n == 0 gives 0.
constexpr int kSumRungs = 4;
constexpr int kBestSum = 4;
size_t sum_workspace_floats(int rung, int64_t n);
void sum(int rung, int64_t n, const float* x, float* out, float* workspace,
         cudaStream_t stream);

// A channel is `outer` runs of `inner` contiguous floats, C*inner apart.
constexpr int kChannelSumRungs = 2;
constexpr int kBestChannelSum = 2;
size_t channel_sum_workspace_floats(int rung, int64_t outer, int64_t C, int64_t inner);
void channel_sum(int rung, int64_t outer, int64_t C, int64_t inner, const float* dy, float* db,
                 float* workspace, cudaStream_t stream);
// The same sum of a bfloat16 dy (autocast's gradients), read as stored and
// added in FP32 in the float32 sum's order, so db is bitwise the sum of dy's
// float32 copy; only the rung with a bfloat16 launcher (02) reads it.
void channel_sum(int rung, int64_t outer, int64_t C, int64_t inner, const bfloat16* dy,
                 float* db, float* workspace, cudaStream_t stream);

// The first label outside [0, classes) in labels[0..n), n >= 1, kept in
// `record` (kLabelRecordSlots int64 of device memory) unless it already holds
// one (record[kLabelRecordIndex] >= 0; -1: none): its position, the label,
// classes, `batch` (the caller's number for this check) and n. Nothing is
// written when every label is in range.
enum LabelRecordSlot : int {
  kLabelRecordIndex,
  kLabelRecordLabel,
  kLabelRecordClasses,
  kLabelRecordBatch,
  kLabelRecordSize,
  kLabelRecordSlots
};
void label_check(int64_t n, const int64_t* labels, int64_t classes, int64_t batch,
                 int64_t* record, cudaStream_t stream);

// The rungs' launchers (arguments checked, n > 0 / C > 0).
namespace sum_rungs {
using Launch = void (*)(int64_t n, const float* x, float* out, float* workspace, cudaStream_t);
void atomic(int64_t, const float*, float*, float*, cudaStream_t);
void tree(int64_t, const float*, float*, float*, cudaStream_t);
void shuffle(int64_t, const float*, float*, float*, cudaStream_t);
void two_pass(int64_t, const float*, float*, float*, cudaStream_t);
size_t two_pass_workspace_floats(int64_t n);
struct Rung {
  const char* name;
  Launch launch;
};
inline constexpr Rung kRungs[kSumRungs] = {
    {"atomic", atomic}, {"tree", tree}, {"shuffle", shuffle}, {"two-pass", two_pass}};
}  // namespace sum_rungs

namespace channel_sum_rungs {
using Launch = void (*)(int64_t outer, int64_t C, int64_t inner, const float* dy, float* db,
                        float* workspace, cudaStream_t);
void block_per_channel(int64_t, int64_t, int64_t, const float*, float*, float*, cudaStream_t);
void split(int64_t, int64_t, int64_t, const float*, float*, float*, cudaStream_t);
void split(int64_t, int64_t, int64_t, const bfloat16*, float*, float*, cudaStream_t);
size_t split_workspace_floats(int64_t outer, int64_t C, int64_t inner);
using LaunchBf16 = void (*)(int64_t outer, int64_t C, int64_t inner, const bfloat16* dy,
                            float* db, float* workspace, cudaStream_t);
struct Rung {
  const char* name;
  Launch launch;
  LaunchBf16 launch_bf16 = nullptr;  // null: reads float32 only
};
inline constexpr Rung kRungs[kChannelSumRungs] = {
    {"block per channel", block_per_channel}, {"split", split, split}};
}  // namespace channel_sum_rungs

}  // namespace anvil::cuda
