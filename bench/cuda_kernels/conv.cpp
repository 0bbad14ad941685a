// bench_cuda_kernels' convolution family: every rung, in all three
// directions, checked against the CPU, then timed beside cuDNN in the same
// arithmetic, measured in the same run:
//   FP32  float32 tensors, CUDNN_FMA_MATH (no tensor cores)
//   TF32  float32 tensors, CUDNN_TENSOR_OP_MATH (TF32 tensor cores, never
//         the FP16 conversion), PyTorch's default for convolutions
//   BF16  bfloat16 x, w, y (CUDNN_DATA_BFLOAT16), float32 accumulation
//         (the convolution's compute type), as autocast runs them
// each in NCHW and NHWC; a rung's baseline ("vendor" column) is the faster
// of the two layouts (cuDNN's tensor-core kernels are NHWC underneath), and
// the table names it. The BF16 rung (7) is timed twice: on float32 tensors
// (rounded as it loads) and on bfloat16 x, w, dy with bfloat16 y and dx, as
// autocast hands them over and as cuDNN's BF16 baseline reads and writes.
//
// Each baseline is the fastest algorithm that passes the check: the ones
// cudnnFind*AlgorithmEx ran, fastest first, each run, checked against the
// CPU; one that fails is named on a REJECTED line and the next is taken; if
// none passes, a MISSING line gives every reason.
//
// Two tables (--conv-set training | resnet18-96 | all):
//   training     every distinct convolution of the training runs, at their
//                batch (256, apps/recipes.json; kTrainingShapes below)
//   resnet18-96  the 3x3 convolutions of ResNet-18 on inputs resized to
//                96x96 (models::resnet18_96), at batch 128
#include "bench/cuda_kernels/bench.h"

#if defined(ANVIL_CUDA_BACKEND)
namespace bench_cuda {
namespace {

using cu::gemm_rungs::Math;
enum Direction { kForward, kBackwardData, kBackwardWeight };
const char* const kDirectionNames[] = {"fwd", "bwdD", "bwdW"};

struct NamedShape {
  const char* name;
  Conv2dShape shape;
};

// The training runs' convolutions at batch 256. ResNet-18 as models::resnet18
// (nn/models.cpp) builds it for 28x28 Fashion-MNIST: the 3x3 stem (1->64,
// stride 1, pad 1, no pooling), resnet_block1's 3x3 64->64 at 28x28 (its
// four convolutions alike), then in blocks 2-4 (nn::Residual with the 1x1
// shortcut, stride 2; nn/layers.cpp) conv1 3x3/2 and conv3 1x1/2 from the
// previous resolution (conv3 is the shortcut), and conv2 3x3/1 at the new
// one (the second Residual's two the same): 28 -> 14 -> 7 -> 4. LeNet as models::lenet:
// 1->20 3x3 on 28x28, then 20->50 5x5 on 13x13 (a 2x2 average pool of 26x26).
const NamedShape kTrainingShapes[] = {
    {"lenet c1", conv_shape(256, 1, 28, 28, 20, 3, 1, 0)},
    {"lenet c2", conv_shape(256, 20, 13, 13, 50, 5, 1, 0)},
    {"resnet stem", conv_shape(256, 1, 28, 28, 64, 3, 1, 1)},
    {"resnet b1.conv", conv_shape(256, 64, 28, 28, 64, 3, 1, 1)},
    {"resnet b2.conv1", conv_shape(256, 64, 28, 28, 128, 3, 2, 1)},
    {"resnet b2.conv3", conv_shape(256, 64, 28, 28, 128, 1, 2, 0)},
    {"resnet b2.conv2", conv_shape(256, 128, 14, 14, 128, 3, 1, 1)},
    {"resnet b3.conv1", conv_shape(256, 128, 14, 14, 256, 3, 2, 1)},
    {"resnet b3.conv3", conv_shape(256, 128, 14, 14, 256, 1, 2, 0)},
    {"resnet b3.conv2", conv_shape(256, 256, 7, 7, 256, 3, 1, 1)},
    {"resnet b4.conv1", conv_shape(256, 256, 7, 7, 512, 3, 2, 1)},
    {"resnet b4.conv3", conv_shape(256, 256, 7, 7, 512, 1, 2, 0)},
    {"resnet b4.conv2", conv_shape(256, 512, 4, 4, 512, 3, 1, 1)},
};

// ResNet-18 on 96x96 inputs (models::resnet18_96) at batch 128: after the
// 7x7/2 stem and the 3x3/2 pool the stages' 3x3 convolutions run at
// 64ch@24x24, 128@12x12, 256@6x6 and 512@3x3.
const NamedShape kResnet96Shapes[] = {
    {"r96 s1", conv_shape(128, 64, 24, 24, 64, 3, 1, 1)},
    {"r96 s2", conv_shape(128, 128, 12, 12, 128, 3, 1, 1)},
    {"r96 s3", conv_shape(128, 256, 6, 6, 256, 3, 1, 1)},
    {"r96 s4", conv_shape(128, 512, 3, 3, 512, 3, 1, 1)},
};

// [A, B, H, W] in A-major order to [A, H, W, B] (NCHW to NHWC; a filter's
// KCRS to KRSC), and back.
std::vector<float> to_nhwc(const std::vector<float>& v, int64_t A, int64_t B, int64_t H,
                           int64_t W) {
  std::vector<float> out(v.size());
  for (int64_t a = 0; a < A; ++a)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t hw = 0; hw < H * W; ++hw)
        out[size_t((a * H * W + hw) * B + b)] = v[size_t((a * B + b) * H * W + hw)];
  return out;
}
std::vector<float> from_nhwc(const std::vector<float>& v, int64_t A, int64_t B, int64_t H,
                             int64_t W) {
  std::vector<float> out(v.size());
  for (int64_t a = 0; a < A; ++a)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t hw = 0; hw < H * W; ++hw)
        out[size_t((a * B + b) * H * W + hw)] = v[size_t((a * H * W + hw) * B + b)];
  return out;
}

// The three tensors a direction reads or writes, as dims [A, B, H, W]:
// x [N, C, H, W], y and dy [N, K, P, Q], w [K, C, R, S].
struct Dims {
  int64_t a, b, h, w;
  size_t count() const { return size_t(a * b * h * w); }
};
Dims x_dims(const Conv2dShape& s) { return {s.N, s.C, s.H, s.W}; }
Dims y_dims(const Conv2dShape& s) { return {s.N, s.K, s.P, s.Q}; }
Dims w_dims(const Conv2dShape& s) { return {s.K, s.C, s.R, s.S}; }

// x, w and dy on the device in one layout and type, with room for the three
// outputs (y, dx, dw) in the same.
struct Operands {
  Conv2dShape s;
  bool nhwc, bf16;
  DeviceBuffer x, w, dy, y, dx, dw;
  static size_t room(Dims d, bool bf16) { return bf16 ? bf16_room(d.count()) : d.count(); }
  Operands(const Conv2dShape& shape, bool nhwc_, bool bf16_, const std::vector<float>& hx,
           const std::vector<float>& hw, const std::vector<float>& hdy)
      : s(shape), nhwc(nhwc_), bf16(bf16_),
        x(room(x_dims(s), bf16)), w(room(w_dims(s), bf16)), dy(room(y_dims(s), bf16)),
        y(room(y_dims(s), bf16)), dx(room(x_dims(s), bf16)), dw(room(w_dims(s), bf16)) {
    put(x, hx, x_dims(s));
    put(w, hw, w_dims(s));
    put(dy, hdy, y_dims(s));
  }
  void put(DeviceBuffer& d, const std::vector<float>& h, Dims dims) {
    const std::vector<float> v = nhwc ? to_nhwc(h, dims.a, dims.b, dims.h, dims.w) : h;
    if (bf16)
      upload_bf16(d, v);
    else
      d.upload(v);
  }
  DeviceBuffer& out(int dir) { return dir == kForward ? y : dir == kBackwardData ? dx : dw; }
  Dims out_dims(int dir) const {
    return dir == kForward ? y_dims(s) : dir == kBackwardData ? x_dims(s) : w_dims(s);
  }
  // A direction's output read back as float32 NCHW (KCRS).
  std::vector<float> read(int dir) {
    const Dims d = out_dims(dir);
    std::vector<float> v = bf16 ? download_bf16(out(dir), d.count()) : out(dir).download();
    return nhwc ? from_nhwc(v, d.a, d.b, d.h, d.w) : v;
  }
};

#if BENCH_CUDNN
// cuDNN's descriptors of one convolution in one layout, data type and math.
struct CudnnConv {
  cudnnTensorDescriptor_t x{}, y{};
  cudnnFilterDescriptor_t w{};
  cudnnConvolutionDescriptor_t conv{};
  CudnnConv(const Conv2dShape& s, cudnnTensorFormat_t format, cudnnDataType_t type,
            cudnnMathType_t math) {
    check_cudnn(cudnnCreateTensorDescriptor(&x), "cudnnCreateTensorDescriptor");
    check_cudnn(cudnnCreateTensorDescriptor(&y), "cudnnCreateTensorDescriptor");
    check_cudnn(cudnnCreateFilterDescriptor(&w), "cudnnCreateFilterDescriptor");
    check_cudnn(cudnnCreateConvolutionDescriptor(&conv), "cudnnCreateConvolutionDescriptor");
    check_cudnn(cudnnSetTensor4dDescriptor(x, format, type, int(s.N), int(s.C), int(s.H),
                                           int(s.W)),
                "cudnnSetTensor4dDescriptor(x)");
    check_cudnn(cudnnSetTensor4dDescriptor(y, format, type, int(s.N), int(s.K), int(s.P),
                                           int(s.Q)),
                "cudnnSetTensor4dDescriptor(y)");
    check_cudnn(cudnnSetFilter4dDescriptor(w, type, format, int(s.K), int(s.C), int(s.R),
                                           int(s.S)),
                "cudnnSetFilter4dDescriptor");
    // Products accumulate in float32 in every arithmetic here.
    check_cudnn(cudnnSetConvolution2dDescriptor(conv, int(s.pad_h), int(s.pad_w), int(s.stride_h),
                                                int(s.stride_w), 1, 1, CUDNN_CROSS_CORRELATION,
                                                CUDNN_DATA_FLOAT),
                "cudnnSetConvolution2dDescriptor");
    check_cudnn(cudnnSetConvolutionMathType(conv, math), "cudnnSetConvolutionMathType");
    int n = 0, c = 0, h = 0, wd = 0;
    check_cudnn(cudnnGetConvolution2dForwardOutputDim(conv, x, w, &n, &c, &h, &wd),
                "cudnnGetConvolution2dForwardOutputDim");
    if (n != s.N || c != s.K || h != s.P || wd != s.Q)
      throw std::runtime_error("cuDNN's output shape differs from Conv2dShape's");
  }
  ~CudnnConv() {
    (void)cudnnDestroyConvolutionDescriptor(conv);
    (void)cudnnDestroyFilterDescriptor(w);
    (void)cudnnDestroyTensorDescriptor(y);
    (void)cudnnDestroyTensorDescriptor(x);
  }
  CudnnConv(const CudnnConv&) = delete;
  CudnnConv& operator=(const CudnnConv&) = delete;
};

// One algorithm cudnnFind*AlgorithmEx ran (any direction's).
struct Candidate {
  int algo;
  size_t memory;
  cudnnStatus_t status;
  cudnnMathType_t math;
};
template <typename Perf>
std::vector<Candidate> candidates(const Perf* perfs, int count) {
  std::vector<Candidate> out;
  for (int i = 0; i < count; ++i)
    out.push_back({int(perfs[i].algo), perfs[i].memory, perfs[i].status, perfs[i].mathType});
  return out;
}

// Why an algorithm does not count as `math`'s baseline, or "": FP32 takes no
// tensor-op algorithm; none takes one that converts float32 down to FP16.
std::string excluded(const Candidate& c, Math math) {
  if (c.status != CUDNN_STATUS_SUCCESS) return cudnnGetErrorString(c.status);
  if (c.math == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION) return "converts to FP16";
  if (math == Math::kFp32 && c.math == CUDNN_TENSOR_OP_MATH) return "tensor-op math";
  return "";
}
#endif

cu::ConvRungEntry entry(const Conv2dShape& s, Math math, int dir, int rung, double ms) {
  return {math, cu::ConvDirection(dir), s.N, s.C, s.H, s.W, s.K, s.R, s.S, s.stride_h,
          s.stride_w, s.pad_h, s.pad_w, rung, ms};
}

}  // namespace

// The fastest cuDNN baseline of each arithmetic and direction, and its name.
struct ConvBaselines {
  double ms[3][3] = {{kNoVendor, kNoVendor, kNoVendor},
                     {kNoVendor, kNoVendor, kNoVendor},
                     {kNoVendor, kNoVendor, kNoVendor}};  // [dir][Math]
  std::string name[3][3];
};

#if BENCH_CUDNN
// cuDNN's three directions on `ops` in `math`: per direction the algorithms
// cudnnFind*AlgorithmEx ran, fastest first, until one passes the check.
static void cudnn_directions(Bench& b, const std::string& shape, Operands& ops, Math math,
                             const std::vector<float>* refs[3], const int64_t reductions[3],
                             double flop, ConvBaselines& best) {
  const Conv2dShape& s = ops.s;
  const char* layout = ops.nhwc ? "NHWC" : "NCHW";
  CudnnConv desc(s, ops.nhwc ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW,
                 ops.bf16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_FLOAT,
                 math == Math::kFp32 ? CUDNN_FMA_MATH : CUDNN_TENSOR_OP_MATH);
  void* ws = b.cudnn_ws->get();
  const size_t ws_bytes = b.cudnn_ws->bytes();
  const float one = 1.0f, zero = 0.0f;
  const double rounding = gemm_rounding(math) + (ops.bf16 ? kBf16Output : 0.0);
  for (int dir = kForward; dir <= kBackwardWeight; ++dir) {
    const char* op = kDirectionNames[dir];
    const std::string vendor = fmt::format("cuDNN {} {}", math_name(math), layout);
    constexpr int kMaxAlgos = 16;
    int found = 0;
    std::vector<Candidate> algos;
    // A search cuDNN refuses (a layout or type it lacks here) is a missing
    // baseline, reported as such, not the end of the benchmark.
    cudnnStatus_t st;
    const char* find = "";
    if (dir == kForward) {
      cudnnConvolutionFwdAlgoPerf_t perfs[kMaxAlgos];
      find = "cudnnFindConvolutionForwardAlgorithmEx";
      st = cudnnFindConvolutionForwardAlgorithmEx(b.cudnn, desc.x, ops.x.get(), desc.w,
                                                  ops.w.get(), desc.conv, desc.y, ops.y.get(),
                                                  kMaxAlgos, &found, perfs, ws, ws_bytes);
      if (st == CUDNN_STATUS_SUCCESS) algos = candidates(perfs, found);
    } else if (dir == kBackwardData) {
      cudnnConvolutionBwdDataAlgoPerf_t perfs[kMaxAlgos];
      find = "cudnnFindConvolutionBackwardDataAlgorithmEx";
      st = cudnnFindConvolutionBackwardDataAlgorithmEx(b.cudnn, desc.w, ops.w.get(), desc.y,
                                                       ops.dy.get(), desc.conv, desc.x,
                                                       ops.dx.get(), kMaxAlgos, &found, perfs,
                                                       ws, ws_bytes);
      if (st == CUDNN_STATUS_SUCCESS) algos = candidates(perfs, found);
    } else {
      cudnnConvolutionBwdFilterAlgoPerf_t perfs[kMaxAlgos];
      find = "cudnnFindConvolutionBackwardFilterAlgorithmEx";
      st = cudnnFindConvolutionBackwardFilterAlgorithmEx(b.cudnn, desc.x, ops.x.get(), desc.y,
                                                         ops.dy.get(), desc.conv, desc.w,
                                                         ops.dw.get(), kMaxAlgos, &found, perfs,
                                                         ws, ws_bytes);
      if (st == CUDNN_STATUS_SUCCESS) algos = candidates(perfs, found);
    }
    if (st != CUDNN_STATUS_SUCCESS) {
      b.missing(op, shape, vendor, {fmt::format("{}: {}", find, cudnnGetErrorString(st))});
      continue;
    }
    std::vector<std::string> reasons;
    bool passed = false;
    for (const Candidate& c : algos) {
      if (std::string why = excluded(c, math); !why.empty()) {
        reasons.push_back(fmt::format("algo {}: {}", c.algo, why));
        continue;
      }
      auto call = [&] {
        if (dir == kForward)
          check_cudnn(cudnnConvolutionForward(b.cudnn, &one, desc.x, ops.x.get(), desc.w,
                                              ops.w.get(), desc.conv,
                                              cudnnConvolutionFwdAlgo_t(c.algo), ws, c.memory,
                                              &zero, desc.y, ops.y.get()),
                      "cudnnConvolutionForward");
        else if (dir == kBackwardData)
          check_cudnn(cudnnConvolutionBackwardData(b.cudnn, &one, desc.w, ops.w.get(), desc.y,
                                                   ops.dy.get(), desc.conv,
                                                   cudnnConvolutionBwdDataAlgo_t(c.algo), ws,
                                                   c.memory, &zero, desc.x, ops.dx.get()),
                      "cudnnConvolutionBackwardData");
        else
          check_cudnn(cudnnConvolutionBackwardFilter(b.cudnn, &one, desc.x, ops.x.get(), desc.y,
                                                     ops.dy.get(), desc.conv,
                                                     cudnnConvolutionBwdFilterAlgo_t(c.algo), ws,
                                                     c.memory, &zero, desc.w, ops.dw.get()),
                      "cudnnConvolutionBackwardFilter");
      };
      std::string why;
      double ms = 0;
      try {  // an algorithm that fails to run is passed over, as one that is wrong
        ops.out(dir).poison(b.stream);
        call();
        why = Bench::mismatch(ops.read(dir), *refs[dir], reductions[dir], rounding);
        if (why.empty()) ms = b.timer->median_ms(call);
      } catch (const std::exception& e) {
        why = e.what();
      }
      if (!why.empty()) {
        fmt::print("REJECTED: {} {} algo {} on {}: {}; the next is tried\n", op, vendor, c.algo,
                   shape, why);
        reasons.push_back(fmt::format("algo {}: {}", c.algo, why));
        continue;
      }
      b.row(op, shape, fmt::format("{} algo {}", vendor, c.algo), ms, flop, ms);
      double& kept = best.ms[dir][int(math)];
      if (kept <= 0 || ms < kept) {
        kept = ms;
        best.name[dir][int(math)] = fmt::format("cuDNN-{}-{}", math_name(math), layout);
      }
      passed = true;
      break;
    }
    if (!passed) b.missing(op, shape, vendor, reasons);
  }
}
#endif

void Bench::conv(const char* name, const Conv2dShape& s) {
  std::mt19937_64 rng(opt.seed + uint64_t(s.N * 131 + s.C * 17 + s.K * 5 + s.H + s.R + s.stride_h));
  const std::vector<float> x = random_vector(size_t(s.N * s.C * s.H * s.W), rng);
  const std::vector<float> w = random_vector(size_t(s.K * s.C * s.R * s.S), rng);
  const std::vector<float> bias = random_vector(size_t(s.K), rng);
  const std::vector<float> dy = random_vector(size_t(s.N * s.K * s.P * s.Q), rng);
  std::vector<float> y_ref(dy.size()), dx_ref(x.size()), dw_ref(w.size()), db_ref(bias.size());
  cpu::conv2d_forward(s, x.data(), w.data(), bias.data(), y_ref.data());
  cpu::conv2d_backward_data(s, dy.data(), w.data(), dx_ref.data());
  cpu::conv2d_backward_weight(s, x.data(), dy.data(), dw_ref.data(), db_ref.data());
  // cuDNN's forward, and ours as timed, have no bias: their reference is y_ref less it.
  std::vector<float> y_nobias = y_ref;
  for (size_t i = 0; i < y_nobias.size(); ++i)
    y_nobias[i] -= bias[(i / size_t(s.P * s.Q)) % size_t(s.K)];

  const std::string shape = fmt::format("{} N{} {}->{} {}x{}/{} @{}x{}", name, s.N, s.C, s.K,
                                        s.R, s.S, s.stride_h, s.H, s.W);
  const double flop = 2.0 * double(s.N * s.K * s.P * s.Q) * double(s.C * s.R * s.S);
  const int64_t reductions[] = {s.C * s.R * s.S, s.K * s.R * s.S, s.N * s.P * s.Q};
  const std::vector<float>* refs[] = {&y_ref, &dx_ref, &dw_ref};
  const std::vector<float>* vendor_refs[] = {&y_nobias, &dx_ref, &dw_ref};

  // anvil's operands (NCHW, float32 and bfloat16), which cuDNN's NCHW runs share.
  Operands f32(s, false, false, x, w, dy), b16(s, false, true, x, w, dy);
  ConvBaselines best;
#if BENCH_CUDNN
  for (Math math : {Math::kFp32, Math::kTf32})
    cudnn_directions(*this, shape, f32, math, vendor_refs, reductions, flop, best);
  cudnn_directions(*this, shape, b16, Math::kBf16, vendor_refs, reductions, flop, best);
  {
    Operands nhwc(s, true, false, x, w, dy);
    for (Math math : {Math::kFp32, Math::kTf32})
      cudnn_directions(*this, shape, nhwc, math, vendor_refs, reductions, flop, best);
  }
  {
    Operands nhwc(s, true, true, x, w, dy);
    cudnn_directions(*this, shape, nhwc, Math::kBf16, vendor_refs, reductions, flop, best);
  }
#else
  (void)vendor_refs;
#endif

  DeviceBuffer d_bias(bias.size()), d_db(bias.size());
  d_bias.upload(bias);
  size_t ws_floats = 0;
  for (int v = 1; v <= cu::kConvRungs; ++v)
    ws_floats = std::max(ws_floats, cu::conv2d_workspace_floats(v, s));
  DeviceBuffer d_ws(ws_floats);
  const auto* bx = reinterpret_cast<const anvil::bfloat16*>(b16.x.get());
  const auto* bw = reinterpret_cast<const anvil::bfloat16*>(b16.w.get());
  const auto* bdy = reinterpret_cast<const anvil::bfloat16*>(b16.dy.get());
  auto* by = reinterpret_cast<anvil::bfloat16*>(b16.y.get());
  auto* bdx = reinterpret_cast<anvil::bfloat16*>(b16.dx.get());

  for (int dir = kForward; dir <= kBackwardWeight; ++dir) {
    const char* op = kDirectionNames[dir];
    for (int v : rungs_of(opt, cu::kConvRungs)) {
      const auto& rung = cu::conv_rungs::rung(v);
      const std::string impl = fmt::format("v{} {}", v, rung.name);
      // Checked with the bias (gradient), timed without, as cuDNN.
      auto call = [&](bool with_bias) {
        if (dir == kForward)
          cu::conv2d_forward(v, s, f32.x.get(), f32.w.get(), with_bias ? d_bias.get() : nullptr,
                             f32.y.get(), d_ws.get(), stream);
        else if (dir == kBackwardData)
          cu::conv2d_backward_data(v, s, f32.dy.get(), f32.w.get(), f32.dx.get(), d_ws.get(),
                                   stream);
        else
          cu::conv2d_backward_weight(v, s, f32.x.get(), f32.dy.get(), f32.dw.get(),
                                     with_bias ? d_db.get() : nullptr, d_ws.get(), stream);
      };
      f32.out(dir).poison(stream);
      d_db.poison(stream);
      call(true);
      const double rounding = gemm_rounding(rung.math);
      bool ok = verify(op, shape, impl, f32.read(dir), *refs[dir], reductions[dir], rounding);
      if (ok && dir == kBackwardWeight)
        ok = verify("bwdW", shape, impl + " dbias", d_db.download(), db_ref, s.N * s.P * s.Q);
      if (!ok) continue;
      const double ms = timer->median_ms([&] { call(false); });
      row(op, shape, impl, ms, flop, best.ms[dir][int(rung.math)], best.name[dir][int(rung.math)]);
      // The BF16 rungs enter the table as autocast runs them (below).
      if (rung.math != Math::kBf16) keep_if_fastest(entry(s, rung.math, dir, v, ms));
    }
    // The rungs that read bfloat16 as stored, on bfloat16 x, w, dy, writing
    // y and dx as bfloat16 (dw float32), as autocast runs them.
    for (int v : rungs_of(opt, cu::kConvRungs)) {
      const auto& rung = cu::conv_rungs::rung(v);
      if (rung.forward_bf16 == nullptr) continue;
      const std::string impl = fmt::format("v{} {}, bf16 in memory", v, rung.name);
      auto call = [&] {
        if (dir == kForward)
          cu::conv2d_forward(v, s, bx, bw, nullptr, by, d_ws.get(), stream);
        else if (dir == kBackwardData)
          cu::conv2d_backward_data(v, s, bdy, bw, bdx, d_ws.get(), stream);
        else
          cu::conv2d_backward_weight(v, s, bx, bdy, f32.dw.get(), d_ws.get(), stream);
      };
      const bool bf16_out = dir != kBackwardWeight;
      Operands& where = bf16_out ? b16 : f32;
      where.out(dir).poison(stream);
      call();
      const double rounding = gemm_rounding(rung.math) + (bf16_out ? kBf16Output : 0.0);
      if (!verify(op, shape, impl, where.read(dir), *vendor_refs[dir], reductions[dir], rounding))
        continue;
      const double ms = timer->median_ms(call);
      row(op, shape, impl, ms, flop, best.ms[dir][int(Math::kBf16)],
          best.name[dir][int(Math::kBf16)]);
      keep_if_fastest(entry(s, Math::kBf16, dir, v, ms));
    }
  }
}

void Bench::keep_if_fastest(cu::ConvRungEntry e) {
  for (cu::ConvRungEntry& kept : fastest_conv_rungs)
    if (kept.fits(e.math, e.direction, e.shape())) {
      if (e.ms < kept.ms) kept = e;
      return;
    }
  fastest_conv_rungs.push_back(e);
}

// One of the two tables, or both (opt.conv_set).
void Bench::conv_table() {
  const bool both = opt.conv_set == "all";
  if (both || opt.conv_set == "training") {
    fmt::print("-- conv: the training runs' convolutions (ResNet-18 at 28x28, LeNet; batch 256)\n");
    for (const NamedShape& n : kTrainingShapes) conv(n.name, n.shape);
  }
  if (both || opt.conv_set == "resnet18-96") {
    fmt::print("-- conv: ResNet-18 on 96x96 inputs, its 3x3 stages (batch 128)\n");
    for (const NamedShape& n : kResnet96Shapes) conv(n.name, n.shape);
  }
}

}  // namespace bench_cuda
#endif  // ANVIL_CUDA_BACKEND
