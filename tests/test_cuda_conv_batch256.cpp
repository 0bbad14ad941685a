// Conv rungs 08 (BF16) and 09 (TF32), the shipped tensor-core rungs, at the
// training's batch of 256 on LeNet's and ResNet-18's layers (the shapes of
// tools/predict/kernel_table.py's layers(256)), in the simulator. Every
// direction runs at its full size through the rung's entry point, the
// conversions and split sums whole; a sim::BlockFilter keeps some blocks of
// the GEMM kernel alone (the corner tiles: the first and last along the
// GEMM's rows and columns; for backward-weight one tile with every chunk of
// its split, on rung 08 only where N*P*Q <= 32768), since a whole ResNet layer
// at batch 256 would take the simulator hours. Every element those blocks wrote, or an even sample of
// them, is held to tests/conv_test_util.h's bounds against FP64, and the
// last image's last output is among them: the offsets, masks and steps at
// n = 255, where the GEMM's rows pass 2^16 (LeNet's conv1: 173,056).
//
// Run by its own ctest in the simulator build only (tests/CMakeLists.txt):
// the sanitizers would take minutes over it, and the smaller shapes of
// test_cuda_conv_tf32.cpp run there.
#if defined(ANVIL_CUDA_SIM)
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "sim/cuda_sim.h"
#include "tests/conv_test_util.h"
#include "tests/cuda_test_util.h"

namespace {

using namespace conv_test;
using cuda_test::DeviceBuffer;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// The layers at batch 256 (kernel_table.py's layers: LeNet on 28x28 images,
// ResNet-18 on 28x28 with a 3x3 stem).
std::vector<Conv2dShape> layers() {
  return {make_shape(256, 1, 28, 28, 20, 3, 3, 1, 1, 0, 0),      // LeNet conv1: C = 1, padded
          make_shape(256, 20, 13, 13, 50, 5, 5, 1, 1, 0, 0),     // LeNet conv2: 5x5, unpadded
          make_shape(256, 64, 28, 28, 128, 3, 3, 2, 2, 1, 1),    // ResNet s2: 3x3 stride 2
          make_shape(256, 128, 14, 14, 256, 1, 1, 2, 2, 0, 0),   // ResNet s3 shortcut: 1x1/2
          make_shape(256, 512, 4, 4, 512, 3, 3, 1, 1, 1, 1)};    // ResNet s4: 512 channels
}

// The indices of the elements to check among those written (not NaN in
// `out`; `written` says otherwise where a memset may stand for unrun
// blocks): all of them up to `most`, else `most` evenly spread ones and the
// last. Fails unless every index in `required` was written.
std::vector<size_t> to_check(const Vec& out, size_t most, const std::vector<size_t>& required,
                             const std::function<bool(size_t, float)>& written) {
  std::vector<size_t> all;
  for (size_t i = 0; i < out.size(); ++i)
    if (written(i, out[i])) all.push_back(i);
  for (size_t i : required) {
    INFO("element " << i << " of " << out.size() << " was not written by the blocks kept");
    REQUIRE(written(i, out[i]));
  }
  if (all.size() <= most) return all;
  std::vector<size_t> some;
  for (size_t j = 0; j < most; ++j) some.push_back(all[j * all.size() / most]);
  some.push_back(all.back());
  return some;
}

bool not_nan(size_t, float v) { return !std::isnan(v); }

void require_bounds(const Ratios& r, size_t checked, const char* direction) {
  INFO(direction << ": " << checked << " elements checked (reduction " << r.R
                 << "), worst error / bound: the rung's " << r.bound
                 << ", FP32 of the rounded operands " << r.rounded);
  REQUIRE(checked > 0);
  REQUIRE(r.bound <= 1.0);
  REQUIRE(r.rounded <= 1.0);
}

// The first and last tiles along the GEMM's rows (output pixels: the first
// image's first, the last image's last) and along its columns (channels).
bool corners(const dim3& g, const uint3& b) {
  return (b.x == 0 || b.x == g.x - 1) && (b.y == 0 || b.y == g.y - 1);
}

// The rung's three directions on s, each with its GEMM kernel filtered;
// rung 08 reads bfloat16 tensors (as autocast gives it), rung 09 float32.
// whole_reduction: backward-weight too (one tile's reduction over the whole
// batch: the most simulated work of the three).
void run_layer(const Rung& rung, const Conv2dShape& s, uint32_t seed, bool whole_reduction) {
  const bool bf16_tensors = rung.math == cu::gemm_rungs::Math::kBf16;
  const Inputs in = draw(s, seed, bf16_tensors);
  const Vec &x = in.x, &w = in.w, &bias = in.bias, &dy = in.dy;
  DeviceBuffer<float> d_bias(bias);
  DeviceBuffer<float> ws(Vec(cu::conv2d_workspace_floats(rung.rung, s), kNaN));
  DeviceBuffer<float> y(Vec(dy.size(), kNaN)), dx(Vec(x.size(), kNaN)), dw(Vec(w.size(), kNaN));
  // Unwritten workspace reads as NaN (0xFF bytes) in every direction: a
  // split's partials from blocks the filter skipped make their sums NaN,
  // not the values an earlier direction left there.
  const auto fresh_workspace = [&] {
    REQUIRE(cudaMemset(ws.ptr, 0xFF, ws.count * sizeof(float)) == cudaSuccess);
  };
  const auto run = [&](const auto& d_x, const auto& d_w, const auto& d_dy) {
    {  // forward: the corner tiles, the first and last along rows and columns
      anvil::sim::BlockFilter keep("forward_nhwc", corners);
      cu::conv2d_forward(rung.rung, s, d_x.ptr, d_w.ptr, d_bias.ptr, y.ptr, ws.ptr, nullptr);
      REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
      REQUIRE(keep.launches() == 1);
    }
    fresh_workspace();
    {  // backward-data: the corner tiles of each residue class's launch
      anvil::sim::BlockFilter keep("forward_nhwc", corners);
      cu::conv2d_backward_data(rung.rung, s, d_dy.ptr, d_w.ptr, dx.ptr, ws.ptr, nullptr);
      REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
      REQUIRE(keep.launches() >= 1);
    }
    fresh_workspace();
    if (whole_reduction) {  // backward-weight: one tile, every chunk of its split
      anvil::sim::BlockFilter keep("backward_weight_nhwc", [](const dim3& g, const uint3& b) {
        return b.x == 0 && b.y == g.y - 1;
      });
      if constexpr (std::is_same_v<std::remove_cvref_t<decltype(*d_x.ptr)>, float>)
        cu::conv2d_backward_weight(rung.rung, s, d_x.ptr, d_dy.ptr, dw.ptr, nullptr, ws.ptr,
                                   nullptr);
      else
        cu::conv2d_backward_weight(rung.rung, s, d_x.ptr, d_dy.ptr, dw.ptr, ws.ptr, nullptr);
      REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
      REQUIRE(keep.launches() == 1);
    }
  };
  if (bf16_tensors) {
    const DeviceBuffer<anvil::bfloat16> d_x(to_bf16(x)), d_w(to_bf16(w)), d_dy(to_bf16(dy));
    run(d_x, d_w, d_dy);
  } else {
    const DeviceBuffer<float> d_x(x), d_w(w), d_dy(dy);
    run(d_x, d_w, d_dy);
  }

  // The input pixel tap (r, t) of output (p, q) reads, if inside.
  const auto pixel = [&](int64_t p, int64_t q, int64_t r, int64_t t, int64_t& h, int64_t& wi) {
    h = p * s.stride_h - s.pad_h + r;
    wi = q * s.stride_w - s.pad_w + t;
    return h >= 0 && h < s.H && wi >= 0 && wi < s.W;
  };
  const int64_t N = s.N, C = s.C, H = s.H, W = s.W, K = s.K, R = s.R, S = s.S, P = s.P,
                Q = s.Q;

  // Forward: y[n, k, p, q] over (c, r, t).
  const Vec yh = y.to_host();
  Ratios fwd;
  const std::vector<size_t> y_check =
      to_check(yh, 4096, {0, yh.size() - 1}, not_nan);  // y[0,0,0,0] and y[255,K-1,P-1,Q-1]
  for (size_t i : y_check) {
    const int64_t q = int64_t(i) % Q, p = int64_t(i) / Q % P, k = int64_t(i) / (P * Q) % K,
                  n = int64_t(i) / (P * Q * K);
    Sums sum;
    for (int64_t c = 0; c < C; ++c)
      for (int64_t r = 0; r < R; ++r)
        for (int64_t t = 0; t < S; ++t) {
          int64_t h, wi;
          if (pixel(p, q, r, t, h, wi))
            sum.add(w[size_t(at4(k, C, c, R, r, S, t))], x[size_t(at4(n, C, c, H, h, W, wi))],
                    rung.round);
        }
    fwd.check(yh[i], sum, bias[size_t(k)], C * R * S, rung.u);
  }
  require_bounds(fwd, y_check.size(), "forward");

  // Backward-data: dx[n, c, h, w] over the taps that reach it. A stride
  // with residue classes no tap reaches (the 1x1 shortcut) zeroes dx first:
  // there a pixel no tap reaches must be +0, and a pixel some tap reaches
  // still 0 was in a block the filter skipped.
  const Vec dxh = dx.to_host();
  const auto reached = [&](int64_t h, int64_t wi) {
    bool rows = false, cols = false;
    for (int64_t r = 0; r < R; ++r) {
      const int64_t ph = h + s.pad_h - r;
      rows |= ph >= 0 && ph % s.stride_h == 0 && ph / s.stride_h < P;
    }
    for (int64_t t = 0; t < S; ++t) {
      const int64_t pw = wi + s.pad_w - t;
      cols |= pw >= 0 && pw % s.stride_w == 0 && pw / s.stride_w < Q;
    }
    return rows && cols;
  };
  bool memset = false;
  for (int64_t h = 0; h < std::min(H, s.stride_h); ++h)
    for (int64_t wi = 0; wi < std::min(W, s.stride_w); ++wi) memset |= !reached(h, wi);
  size_t unreached = 0;
  const auto dx_written = [&](size_t i, float v) {
    const int64_t wi = int64_t(i) % W, h = int64_t(i) / W % H;
    if (!reached(h, wi)) return false;
    return memset ? v != 0.0f : !std::isnan(v);
  };
  for (size_t i = 0; memset && i < dxh.size(); ++i) {
    const int64_t wi = int64_t(i) % W, h = int64_t(i) / W % H;
    if (!reached(h, wi)) {
      ++unreached;
      if (!(dxh[i] == 0.0f && !std::signbit(dxh[i]))) {
        INFO("dx element " << i << ", reached by no tap, is " << dxh[i]);
        REQUIRE(dxh[i] == 0.0f);
      }
    }
  }
  // The last pixel a tap reaches in the last image, and the first.
  size_t last = dxh.size() - 1;
  while (!reached(int64_t(last) / W % H, int64_t(last) % W)) --last;
  size_t first = 0;
  while (!reached(int64_t(first) / W % H, int64_t(first) % W)) ++first;
  Ratios bwd_d;
  const std::vector<size_t> dx_check = to_check(dxh, 4096, {first, last}, dx_written);
  for (size_t i : dx_check) {
    const int64_t wi = int64_t(i) % W, h = int64_t(i) / W % H, c = int64_t(i) / (H * W) % C,
                  n = int64_t(i) / (H * W * C);
    Sums sum;
    for (int64_t k = 0; k < K; ++k)
      for (int64_t r = 0; r < R; ++r)
        for (int64_t t = 0; t < S; ++t) {
          const int64_t ph = h + s.pad_h - r, pw = wi + s.pad_w - t;
          if (ph < 0 || pw < 0 || ph % s.stride_h || pw % s.stride_w) continue;
          const int64_t p = ph / s.stride_h, q = pw / s.stride_w;
          if (p >= P || q >= Q) continue;
          sum.add(w[size_t(at4(k, C, c, R, r, S, t))], dy[size_t(at4(n, K, k, P, p, Q, q))],
                  rung.round);
        }
    bwd_d.check(dxh[i], sum, 0, K * R * S, rung.u);
  }
  INFO(unreached << " dx elements reached by no tap are +0");
  require_bounds(bwd_d, dx_check.size(), "backward-data");

  // Backward-weight: dw[k, c, r, t] over every (n, p, q) of the batch.
  if (!whole_reduction) return;
  const Vec dwh = dw.to_host();
  Ratios bwd_w;
  const std::vector<size_t> dw_check = to_check(dwh, 48, {}, not_nan);
  for (size_t i : dw_check) {
    const int64_t t = int64_t(i) % S, r = int64_t(i) / S % R, c = int64_t(i) / (R * S) % C,
                  k = int64_t(i) / (R * S * C);
    Sums sum;
    for (int64_t n = 0; n < N; ++n)
      for (int64_t p = 0; p < P; ++p)
        for (int64_t q = 0; q < Q; ++q) {
          int64_t h, wi;
          if (pixel(p, q, r, t, h, wi))
            sum.add(dy[size_t(at4(n, K, k, P, p, Q, q))], x[size_t(at4(n, C, c, H, h, W, wi))],
                    rung.round);
        }
    bwd_w.check(dwh[i], sum, 0, N * P * Q, rung.u);
  }
  require_bounds(bwd_w, dw_check.size(), "backward-weight");
}

}  // namespace

TEST_CASE("cuda conv batch 256: rungs 8 and 9 within their bounds on LeNet's and ResNet-18's "
          "layers at the training's batch",
          "[.][cuda][conv][batch256]") {
  if (!cuda_test::have_device("batch-256 conv test")) return;
  uint32_t seed = 500;
  for (const Rung& rung : {kBf16Multistage, kTf32Multistage})
    for (const Conv2dShape& s : layers()) {
      INFO("rung " << rung.rung << ", " << describe(s));
      // Backward-weight's longest reductions (LeNet's conv1 over 173,056
      // positions, the 3x3/2 transition over 50,176) run on rung 9 alone
      // (TF32, the default); rung 8's iterator is the same template.
      const bool whole_reduction = rung.rung == 9 || s.N * s.P * s.Q <= 32768;
      run_layer(rung, s, seed += 7, whole_reduction);
    }
}
#endif
