// Convolution rung 05, rung 4 with split-K. Rung 4's threads and tiles; what
// changes is how many blocks share a GEMM. Backward-weight is a GEMM of K x
// C*R*S outputs, a few tiles (LeNet's layers: 1 to 4; ResNet-18's 64-channel
// 3x3 layers: 5), over a reduction of N*P*Q, hundreds of thousands of terms at
// batch 256: rung 4 leaves most of an H100's 132 SMs idle. Rung 5 launches
// grid.z = splits copies of rung 4's tile grid, block (tile, z) reducing the
// chunk [z*chunk, (z+1)*chunk) of the GEMM's K (a warp_tile::KSlice of both
// operands; within a chunk threads map to data exactly as in rung 4) into its
// own partial output in the workspace (partial z at z * the output's size, in
// the output's layout); then GEMM's add_partials (one thread per output
// element; from 32 splits one warp) sums the partials in a fixed order (no
// atomics: bitwise the same from run to run). The split count comes from the
// shape (split_k.h): where the tiles fill less than one wave (132 SMs x the
// tile's resident blocks), the fewest splits whose blocks best fill whole
// waves (at most 4), chunks at least 128 long and multiples of 16 (so a slice
// of the weights keeps its 16-byte loads). LeNet's conv1 at batch 256: 1 block
// -> 387 of the 64x128 tile's 396 slots; ResNet-18's 64-channel layers: 5 ->
// 395. The same applies to forward and backward-data, whose K (C*R*S, K*R*S)
// is shorter but whose 128x128 tiles can be too few at small batches
// (ResNet-18's 512-channel layers at batch 128: 64 blocks); the forward adds
// the bias in partial 0 only. A GEMM whose tiles fill the GPU, or whose K is
// short, runs unsplit: rung 4 exactly, no workspace.
//   build/sim/bench_cuda_kernels conv 5
#include "kernels/cuda/conv/warp_tile_kernels.cuh"

namespace anvil::cuda {
namespace conv_kernels {
namespace {

// The partials of whichever direction splits most.
size_t workspace(const Conv2dShape& s) { return split_workspace(s, Fp32Tiles{}); }

void forward(const Conv2dShape& s, const float* x, const float* w, const float* bias, float* y,
             float* ws, cudaStream_t stream) {
  warp_tile_forward(s, x, w, bias, y, ws, stream, SplitByWaves{});
}

void backward_data(const Conv2dShape& s, const float* dy, const float* w, float* dx, float* ws,
                   cudaStream_t stream) {
  warp_tile_backward_data(s, dy, w, dx, ws, stream, SplitByWaves{});
}

void backward_weight(const Conv2dShape& s, const float* x, const float* dy, float* dw, float* ws,
                     cudaStream_t stream) {
  warp_tile_backward_weight(s, x, dy, dw, ws, stream, SplitByWaves{});
}

}  // namespace
}  // namespace conv_kernels

const conv_rungs::Rung conv_rungs::kSplitK = {"split-K", conv_kernels::workspace,
                                              conv_kernels::forward, conv_kernels::backward_data,
                                              conv_kernels::backward_weight};

}  // namespace anvil::cuda
