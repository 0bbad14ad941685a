// Convolution rung 04, implicit GEMM on the warp tile. Rung 3's operands (the
// same index functions, the same three GEMMs) on GEMM rung 07's tile
// (warp_tile::multiply, gemm/warp_tile.cuh): 8x8 outputs per thread in warp
// sub-tiles, K steps of 8 through two shared-memory stages, the gathers of
// step t+1 in flight during the multiply-adds of step t. Results of more than
// 64 rows (forward and backward-weight: K output channels; backward-data: C
// input channels) use the 128x128 tile of 256 threads; 64 rows or fewer the
// 64x128 tile of 128 threads (DoubleBufferedNarrow), so that a 64-channel
// layer does not leave half of every tile empty. The weights, when they are A
// as stored (forward: w is [K, C*R*S]), are read with 16-byte loads where
// C*R*S is a multiple of 4 and w is 16-byte aligned. The gathered operands
// have no aligned vector (a window crosses the padding and row ends); each
// reads its quad as four scalar loads that share one set of index divisions
// (the Walk helper carries from one position to the next), where rung 3
// divides afresh for every element. The output is written through the same
// index functions as rung 3's.
//   build/sim/bench_cuda_kernels conv 4
#include "kernels/cuda/conv/warp_tile_kernels.cuh"

namespace anvil::cuda {
namespace conv_kernels {
namespace {

// One chunk: the whole reduction in each block.
struct Unsplit {
  template <class S>
  split_k::Plan operator()(S, const Gemm& m) const { return {1, m.K}; }
};

void forward(const Conv2dShape& s, const float* x, const float* w, const float* bias, float* y,
             float* ws, cudaStream_t stream) {
  warp_tile_forward(s, x, w, bias, y, ws, stream, Unsplit{});
}

void backward_data(const Conv2dShape& s, const float* dy, const float* w, float* dx, float* ws,
                   cudaStream_t stream) {
  warp_tile_backward_data(s, dy, w, dx, ws, stream, Unsplit{});
}

void backward_weight(const Conv2dShape& s, const float* x, const float* dy, float* dw, float* ws,
                     cudaStream_t stream) {
  warp_tile_backward_weight(s, x, dy, dw, ws, stream, Unsplit{});
}

}  // namespace
}  // namespace conv_kernels

const conv_rungs::Rung conv_rungs::kImplicitWarpTile = {
    "implicit GEMM, warp tile", conv_kernels::no_workspace, conv_kernels::forward,
    conv_kernels::backward_data, conv_kernels::backward_weight};

}  // namespace anvil::cuda
