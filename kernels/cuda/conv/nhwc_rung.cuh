// The host side of the convolution rungs on the multistage mainloop over
// channels-last operands, one template over the kind of mma: rung 08
// (multistage::Bf16, 08_bf16_multistage.cu) and rung 09
// (multistage::Tf32Rounded, 09_tf32_multistage.cu). The conversions into the workspace, the
// backward-data residue classes, the backward-weight split and the
// launches; the kernels are implicit_nhwc.cuh's and wgrad_nhwc.cuh's.
#pragma once
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels/cuda/conv/conv.h"
#include "kernels/cuda/conv/implicit_nhwc.cuh"
#include "kernels/cuda/conv/rung.cuh"
#include "kernels/cuda/conv/wgrad_nhwc.cuh"
#include "kernels/cuda/gemm/split_k.h"

namespace anvil::cuda::conv_kernels {

template <class Kind>
struct NhwcRung {
  using T = Operand<Kind>;  // what the conversions write and the kernels read
  static constexpr bool kBf16 = std::is_same_v<Kind, multistage::Bf16>;
  static constexpr const char* kName = kBf16 ? "conv rung 08" : "conv rung 09";
  static constexpr int kChunk = Kind::kChunk, kBK = Kind::kBK;
  // The Bf16 shapes keep the name the launch audits and the step model
  // know them by (multistage::Shape).
  template <int WarpsM, int WarpsN, int Stages>
  using ShapeFor = std::conditional_t<kBf16, multistage::Shape<WarpsM, WarpsN, Stages, 2>,
                                      multistage::ShapeOf<Kind, WarpsM, WarpsN, Stages, 2>>;
  using Wide = ShapeFor<2, 2, 4>;    // 128 x 128, K > 64
  using Narrow = ShapeFor<4, 1, 4>;  // 256 x 64, K <= 64

  // Channels padded to whole 16-byte chunks (kChunk elements). Every
  // converted operand then has a multiple of kChunk elements, so the next
  // one starts aligned.
  static int64_t up(int64_t channels) { return (channels + kChunk - 1) / kChunk * kChunk; }
  // Operand elements as workspace floats (bfloat16 pairs, or floats).
  static int64_t floats(int64_t elems) { return elems * int64_t(sizeof(T)) / 4; }
  // Elements of x in NHWC and of w in KRSC (w follows x in the workspace).
  static int64_t x_elems(const Conv2dShape& s) { return s.N * s.H * s.W * up(s.C); }
  static int64_t w_elems(const Conv2dShape& s) { return s.K * s.R * s.S * up(s.C); }

  // Backward-data as forward convolutions, one per residue class (a, b) of
  // the stride: the pixels h = a + sh i, w = b + sw j of dx read dy only
  // through the filter rows r = r0 + sh t with r0 = (a + ph) % sh (and the
  // columns likewise), at p = base + i - t, base = (a + ph - r0) / sh. With
  // the taps flipped (t' = T-1-t) that is a stride-1 convolution of dy (K
  // channels, P x Q) with T x U taps, padded T-1-base (any sign) and
  // U-1-base', written to dx's class: every term a real tap (rung 07's GEMM
  // over K*R*S multiplies the zero taps too: three quarters of them at
  // stride 2). At stride 1 there is one class, the whole of dx: dy
  // convolved with the flipped filters, padded R-1-ph. A class without taps
  // (a 1x1 filter at stride 2 reaches one pixel in four) is zeros.
  struct DgradClass {
    NhwcGeo geo;  // the class's forward convolution, stored into dx's class
    ClassTaps taps;
  };
  static std::vector<DgradClass> dgrad_classes(const Conv2dShape& s) {
    const int sh = int(s.stride_h), sw = int(s.stride_w), Kp = int(up(s.K));
    std::vector<DgradClass> classes;
    for (int a = 0; a < sh && a < s.H; ++a)
      for (int b = 0; b < sw && b < s.W; ++b) {
        const int r0 = int((a + s.pad_h) % sh), s0 = int((b + s.pad_w) % sw);
        const int T = r0 < s.R ? int((s.R - r0 + sh - 1) / sh) : 0;
        const int U = s0 < s.S ? int((s.S - s0 + sw - 1) / sw) : 0;
        const int rows = int((s.H - a + sh - 1) / sh), cols = int((s.W - b + sw - 1) / sw);
        const int base_h = int((a + s.pad_h - r0) / sh), base_w = int((b + s.pad_w - s0) / sw);
        NhwcGeo g{int(s.N), int(s.P), int(s.Q), Kp, int(s.C), T, U, 1, 1, T - 1 - base_h,
                  U - 1 - base_w, rows, cols, (Kp + kBK - 1) / kBK, int(s.H), int(s.W), a, b,
                  sh, sw};
        classes.push_back({g, ClassTaps{int(s.K), int(s.C), int(s.R), int(s.S), r0, s0, sh, sw,
                                        T, U, Kp}});
      }
    return classes;
  }

  // Backward-weight: the GEMM's rows (R*S*Cp) and its split of N*P*Q on
  // tile S; chunks of whole k-steps.
  template <class S>
  static split_k::Plan wgrad_plan(const Conv2dShape& s) {
    const int64_t M = s.R * s.S * up(s.C), NPQ = s.N * s.P * s.Q;
    const int64_t tiles = (M + S::kBM - 1) / S::kBM * ((s.K + S::kBN - 1) / S::kBN);
    const split_k::Plan p = split_k::plan(M, s.K, NPQ, tiles, S::kMinBlocks);
    if (p.splits == 1) return p;
    const int64_t chunk = (p.chunk + kBK - 1) / kBK * kBK;
    return {int((NPQ + chunk - 1) / chunk), chunk};
  }
  static split_k::Plan wgrad_plan(const Conv2dShape& s) {
    return s.K <= Narrow::kBN ? wgrad_plan<Narrow>(s) : wgrad_plan<Wide>(s);
  }
  // Its workspace: the partials, then x and dy in NHWC (16-byte aligned:
  // the partials' floats rounded up to a multiple of 4).
  static int64_t wgrad_partials(const Conv2dShape& s) {
    return (split_k::workspace_floats(wgrad_plan(s), s.K, s.C * s.R * s.S) + 3) / 4 * 4;
  }
  static int64_t wgrad_floats(const Conv2dShape& s) {
    return wgrad_partials(s) + floats(x_elems(s) + s.N * s.P * s.Q * up(s.K));
  }

  static size_t workspace(const Conv2dShape& s) {
    int64_t taps = 0;  // the largest class's flipped filters, after dy in NHWC
    for (const DgradClass& c : dgrad_classes(s))
      taps = std::max<int64_t>(taps, c.taps.T * c.taps.U);
    const int64_t dgrad = (s.N * s.P * s.Q + s.C * taps) * up(s.K);
    return size_t(std::max({floats(x_elems(s) + w_elems(s)), floats(dgrad), wgrad_floats(s)}));
  }

  static NhwcGeo nhwc_geo(const Conv2dShape& s) {
    const int Cp = int(up(s.C)), P = int(s.P), Q = int(s.Q);
    return NhwcGeo{int(s.N), int(s.H), int(s.W), Cp, int(s.K), int(s.R), int(s.S),
                   int(s.stride_h), int(s.stride_w), int(s.pad_h), int(s.pad_w), P, Q,
                   (Cp + kBK - 1) / kBK, P, Q, 0, 0, 1, 1};
  }

  // in [N, C, H, W] (float32 or bfloat16) into out, NHWC with C padded to Cp.
  template <class TI>
  static void to_nhwc(int64_t N, int64_t C, int64_t H, int64_t W, int64_t Cp, const TI* in,
                      T* out, cudaStream_t stream) {
    const int64_t tiles_hw = (H * W + kTransposeTile - 1) / kTransposeTile;
    const dim3 grid(unsigned(N * tiles_hw), unsigned((Cp + kTransposeTile - 1) / kTransposeTile));
    void (*kernel)(int, int, int, int, const TI*, T*) = to_channels_last<TI>;
    launch(kernel, grid, dim3(kTransposeTile, kTransposeRows), 0, stream, int(C), int(H * W),
           int(Cp), int(tiles_hw), in, out);
  }

  template <class S, class TY>
  static void launch_forward(const NhwcGeo& g, const T* x, const T* w, const float* bias, TY* y,
                             cudaStream_t stream) {
    void (*kernel)(NhwcGeo, const T*, const T*, const float*, TY*) = forward_nhwc<S>;
    static std::atomic<uint64_t> devices{0};  // this kernel's (one per S, TY)
    opt_in_shared(kernel, S::kSharedBytes, devices);
    const int64_t M = int64_t(g.N) * g.P * g.Q;
    const dim3 grid(unsigned((M + S::kBM - 1) / S::kBM), unsigned((g.K + S::kBN - 1) / S::kBN));
    launch(kernel, grid, dim3(S::kThreads), S::kSharedBytes, stream, g, x, w, bias, y);
  }

  // x and w (float32 or bfloat16, NCHW and KCRS) converted into ws, then the
  // GEMM on shape S (the rung's tile choice unless a test names the stages).
  template <class S, class TI, class TY>
  static void forward_on(const Conv2dShape& s, const TI* x, const TI* w, const float* bias, TY* y,
                         float* ws, cudaStream_t stream) {
    const int64_t Cp = up(s.C);
    T* xh = reinterpret_cast<T*>(ws);
    T* wh = xh + x_elems(s);
    to_nhwc(s.N, s.C, s.H, s.W, Cp, x, xh, stream);
    to_nhwc(s.K, s.C, s.R, s.S, Cp, w, wh, stream);
    launch_forward<S>(nhwc_geo(s), xh, wh, bias, y, stream);
  }

  template <class TI, class TY>
  static void forward(const Conv2dShape& s, const TI* x, const TI* w, const float* bias, TY* y,
                      float* ws, cudaStream_t stream) {
    if (s.K <= Narrow::kBN)
      forward_on<Narrow>(s, x, w, bias, y, ws, stream);
    else
      forward_on<Wide>(s, x, w, bias, y, ws, stream);
  }

  // The forward at `stages` (2, 3 or 4) on the 128 x 128 tile.
  static void forward_stages(int stages, const Conv2dShape& s, const float* x, const float* w,
                             const float* bias, float* y, float* ws, cudaStream_t stream) {
    switch (stages) {
      case 2: return forward_on<ShapeFor<2, 2, 2>>(s, x, w, bias, y, ws, stream);
      case 3: return forward_on<ShapeFor<2, 2, 3>>(s, x, w, bias, y, ws, stream);
      case 4: return forward_on<Wide>(s, x, w, bias, y, ws, stream);
    }
    throw std::invalid_argument(std::string(kName) + ": " + std::to_string(stages) +
                                " stages (2, 3 or 4 are built)");
  }

  // dy into NHWC in ws, then per residue class its flipped filters after it
  // and the class's forward GEMM (the classes run in order on the stream, so
  // they share the filters' space).
  template <class TI, class TY>
  static void backward_data(const Conv2dShape& s, const TI* dy, const TI* w, TY* dx, float* ws,
                            cudaStream_t stream) {
    const std::vector<DgradClass> classes = dgrad_classes(s);
    const int64_t Kp = up(s.K);
    T* dyh = reinterpret_cast<T*>(ws);
    T* wh = dyh + s.N * s.P * s.Q * Kp;
    bool empty_class = false;
    for (const DgradClass& c : classes) empty_class |= c.taps.T == 0 || c.taps.U == 0;
    if (empty_class)  // zeros where no tap reaches (+0 in float32 and bfloat16 alike)
      check(cudaMemsetAsync(dx, 0, size_t(s.N * s.C * s.H * s.W) * sizeof(TY), stream),
            (std::string("cudaMemsetAsync(") + kName + " backward-data dx)").c_str());
    to_nhwc(s.N, s.K, s.P, s.Q, Kp, dy, dyh, stream);
    for (const DgradClass& c : classes) {
      if (c.taps.T == 0 || c.taps.U == 0) continue;
      void (*flip)(ClassTaps, const TI*, T*) = flipped_to_channels_last<TI>;
      launch_1d(flip, s.C * c.taps.T * c.taps.U * Kp, stream, c.taps, w, wh);
      if (s.C <= Narrow::kBN)
        launch_forward<Narrow>(c.geo, dyh, wh, nullptr, dx, stream);
      else
        launch_forward<Wide>(c.geo, dyh, wh, nullptr, dx, stream);
    }
  }

  // x and dy into NHWC after the partials in ws, then the GEMM on tile S,
  // split as wgrad_plan says.
  template <class S, class TI>
  static void backward_weight_on(const Conv2dShape& s, const TI* x, const TI* dy, float* dw,
                                 float* ws, cudaStream_t stream) {
    const int64_t Cp = up(s.C), Kp = up(s.K);
    const split_k::Plan plan = wgrad_plan<S>(s);
    float* partials = ws;
    T* xh = reinterpret_cast<T*>(ws + wgrad_partials(s));
    T* dyh = xh + x_elems(s);
    to_nhwc(s.N, s.C, s.H, s.W, Cp, x, xh, stream);
    to_nhwc(s.N, s.K, s.P, s.Q, Kp, dy, dyh, stream);
    const WgradGeo g{int(s.N),        int(s.H),        int(s.W),     int(s.C), int(Cp),
                     int(s.K),        int(Kp),         int(s.R),     int(s.S), int(s.stride_h),
                     int(s.stride_w), int(s.pad_h),    int(s.pad_w), int(s.P), int(s.Q),
                     int(plan.chunk)};
    void (*kernel)(WgradGeo, const T*, const T*, float*) = backward_weight_nhwc<S>;
    static std::atomic<uint64_t> devices{0};
    opt_in_shared(kernel, S::kSharedBytes, devices);
    const int64_t M = s.R * s.S * Cp;
    const dim3 grid(unsigned((M + S::kBM - 1) / S::kBM), unsigned((s.K + S::kBN - 1) / S::kBN),
                    unsigned(plan.splits));
    launch(kernel, grid, dim3(S::kThreads), S::kSharedBytes, stream, g, xh, dyh,
           plan.splits == 1 ? dw : partials);
    if (plan.splits > 1) {
      const int64_t KCRS = s.K * s.C * s.R * s.S;
      split_k::sum_split_k(plan.splits, 1, int(KCRS), partials, 1.0f, 0.0f, nullptr, dw, KCRS,
                           stream);
    }
  }

  template <class TI>
  static void backward_weight(const Conv2dShape& s, const TI* x, const TI* dy, float* dw,
                              float* ws, cudaStream_t stream) {
    if (s.K <= Narrow::kBN)
      backward_weight_on<Narrow>(s, x, dy, dw, ws, stream);
    else
      backward_weight_on<Wide>(s, x, dy, dw, ws, stream);
  }
};

}  // namespace anvil::cuda::conv_kernels
