// Convolution rung 09, TF32 tensor cores on the multistage mainloop: rung
// 08's structure (every direction an implicit GEMM on channels-last
// operands, 08_bf16_multistage.cu) with rung 06's numerics. The same
// iterators (implicit_nhwc.cuh, wgrad_nhwc.cuh) and host side
// (nhwc_rung.cuh), instanced on the mainloop's Tf32Rounded kind
// (gemm/mma_multistage.cuh): float32 operands rounded to TF32 by
// tc::cvt_tf32 (nearest even) as the conversions write them,
// copied by cp.async as stored, fed to mma.sync.m16n8k8 as loaded, FP32
// accumulation. Each product is that of rung 06's rounded operands, summed
// in FP32 in another order, so rung 06's bounds hold
// (tests/test_cuda_conv_tf32.cpp).
//
// Where the rounding is. Every operand reaches the kernels through a
// conversion pass (to_channels_last, flipped_to_channels_last) that reads
// and writes each element once; the cvt there costs nothing beside the
// pass's bytes. Rounded in registers instead (the Tf32 kind, GEMM rung
// 11's), each fragment register takes a cvt, one per HMMA with 64 x 64
// warp tiles, and nvcc makes each cvt two instructions: the main loops
// held 5.1-5.9 instructions per HMMA that way, 3.1-3.8 this way (sm_90;
// docs/kernels-conv.md has the table), the same values reaching the mma
// (the simulator gives the same bits both ways).
//
// Chunks and stages. A 16-byte chunk is 4 float32 channels, so C (and K,
// backward-data's and backward-weight's channels of dy) is padded with
// zeros to a multiple of 4, and a stage holds 16 of k: a channel block of
// 16 per k-step (forward, backward-data), 16 positions of N*P*Q
// (backward-weight). A stage row is 64 bytes, as rung 08's 32 bfloat16:
// the copies are rung 08's, unit for unit, and a thread still copies 8
// (wide) or 10 (narrow) chunks a step.
//
// Threads and tiles: rung 08's. 128 threads, warps of 64 x 64 (4 x 8 mma
// tiles of 16 x 8): 256 x 64 blocks for K <= 64 output channels (C <= 64
// for backward-data), 128 x 128 above; rows along N*P*Q (forward,
// backward-data) or R*S*Cp (backward-weight), columns along K (C).
//
// Fragments (mma.cuh has the PTX ISA's tables). With g = lane / 4, t =
// lane % 4 the m16n8k8 .tf32 fragments are A: a0 (g, t), a1 (g+8, t), a2
// (g, t+4), a3 (g+8, t+4); B: b0 (k = t, n = g), b1 (k = t+4, n = g). An
// 8 x 8 ldmatrix matrix of 16-bit elements is 8 rows of 4 floats and hands
// lane l the word (l / 4, l % 4) = (g, t). Forward and backward-data store
// both operands contiguous along k (rows j of 4 chunks), so one ldmatrix.x4
// of rows j0..j0+15 by k0..k0+3 / k0+4..k0+7 is a0..a3, and of k first b0,
// b1 of two n tiles: per 8 of k a warp issues 4 + 4 ldmatrix.x4 and 32
// mma. Backward-weight stores both contiguous along j (a stage row is 16
// consecutive channels of x, or of dy's k, at one position):
// ldmatrix.trans transposes 16-bit elements, not 32-bit ones, so A is read
// by 8-byte loads (the mma's rows g and g + 8 of each 16 stand for the
// tile's rows 2g and 2g + 1: a0 a1 side by side; the staged epilogue
// stores them where they belong) and B by 4-byte loads: per 8 of k 8 + 16
// shared loads for 32 mma.
//
// Shared memory and bank conflicts. Contiguous along k: rows of 64 bytes,
// chunk c of row j at c ^ (j / 2 % 4): rung 08's (and GEMM rung 12's)
// layout byte for byte, every ldmatrix phase and every 16-byte store
// conflict-free (12_bf16_pipelined.cu). Contiguous along j: 16 rows of BJ
// + 8 floats, unswizzled (GEMM rung 11's layout, whose argument holds: the
// row of BJ + 8 words is 8 banks on from the one before, so B's 4-byte
// loads at (k0 + t, j0 + g) hit banks 8t + g, all 32, and A's 8-byte loads
// at (k0 + t, j0 + 2g), two phases of 16 lanes, banks 8t + 2g and the next:
// all 32). A backward-weight copy phase (8 lanes) stores 8 consecutive
// chunks of one row: 128 contiguous bytes, conflict-free
// (wgrad_nhwc.cuh's RowChunks).
//
// Pipeline: the mainloop's, 4 stages of 16 of k in dynamic shared memory,
// each operand's room that of its padded along-j layout (the larger):
// 17 KB (wide) or 21 KB (narrow) a stage, 68 or 84 KB, opted in to once per
// kernel. Step s: wait for stage s's copies, one barrier, issue the copies
// of stage s + 3 into the buffer just freed, 2 x (fragment loads, 32 mma)
// per warp on stage s. The copies' address and mask arithmetic is rung
// 08's: additions only, no division or modulo in the loop.
//
// What reaches the kernel. The backend's tensors are NCHW float32, so x and
// w (backward-data: dy and the class's flipped filters; backward-weight: x
// and dy) are first converted into the workspace (float32 NHWC rounded to
// TF32, C padded), y and dx written NCHW by the epilogue (the bias added in
// FP32), dw KCRS (split over N*P*Q where its tiles are few, chunks of whole
// k-steps of 16, summed by split_k::sum_split_k). Backward-data without
// structural zeros, one launch per residue class of the stride, as rung 08.
//   build/sim/bench_cuda_kernels conv 9
#include "kernels/cuda/conv/conv.h"
#include "kernels/cuda/conv/nhwc_rung.cuh"

namespace anvil::cuda {

using Tf32Rung = conv_kernels::NhwcRung<multistage::Tf32Rounded>;

void conv_rungs::tf32_multistage_forward(int stages, const Conv2dShape& s, const float* x,
                                         const float* w, const float* bias, float* y, float* ws,
                                         cudaStream_t stream) {
  Tf32Rung::forward_stages(stages, s, x, w, bias, y, ws, stream);
}

const conv_rungs::Rung conv_rungs::kTf32Multistage = [] {
  Rung r{};
  r.name = "tf32 multistage";
  r.workspace = Tf32Rung::workspace;
  r.forward = Tf32Rung::forward<float, float>;
  r.backward_data = Tf32Rung::backward_data<float, float>;
  r.backward_weight = Tf32Rung::backward_weight<float>;
  r.math = gemm_rungs::Math::kTf32;
  return r;
}();

}  // namespace anvil::cuda
