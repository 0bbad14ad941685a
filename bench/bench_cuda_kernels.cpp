// bench_cuda_kernels: checks and times every numbered variant of the CUDA
// backend's GEMM and convolution kernels, one kernel at a time (in the manner
// of llm.c's dev/cuda), against the vendor libraries measured in the same run;
// also both variants of channel_sum (op csum) and of BatchNorm's training
// forward and backward (bnF, bnB) on ResNet-18's shapes (--no-norm skips
// them), memory-bound, so their GFLOP/s column is 0.
//
//   bench_cuda_kernels                         # GEMM 1024, 2048, 4096 + the conv shapes
//   bench_cuda_kernels gemm 3                  # one rung of one ladder (gemm.h, conv.h)
//   bench_cuda_kernels conv                    # every rung of one family
//   bench_cuda_kernels --gemm-sizes 512,1024 --repeats 50 --no-conv
//   bench_cuda_kernels --smoke                 # tiny shapes: correctness only
// Families: gemm, conv, sum, softmax (softmax cross-entropy forward), csum
// (channel_sum), bn (BatchNorm training).
//
// For each shape: the vendor baseline first (cuBLAS SGEMM; cuDNN forward,
// backward-data and backward-filter with the fastest algorithm that
// cudnnFind*AlgorithmEx reports), then anvil::cuda variants 1..kGemmVariants
// and 1..kConvVariants. Every result (the vendor's too) is first compared with
// the CPU kernel (anvil::cpu::gemm / conv2d_*); a wrong variant is reported by
// name, is not timed, and makes the exit status 1. Timing: --warmup calls,
// then --repeats calls each between two CUDA events on one stream (3 calls,
// after one warm-up, for a variant whose first call takes over 100 ms); the
// median is reported as ms, GFLOP/s (2*M*N*K; 2*N*K*C*R*S*P*Q for every conv
// direction) and as a percentage of the vendor's time (vendor ms / ours ms).
//
// Each rung against the vendor in the same arithmetic: the FP32 rungs against
// cuBLAS SGEMM (CUBLAS_DEFAULT_MATH, no TF32) and cuDNN in CUDNN_FMA_MATH; the
// tensor-core rungs against cublasGemmEx with CUBLAS_COMPUTE_32F_FAST_TF32 or
// _FAST_16BF and cuDNN in CUDNN_TENSOR_OP_MATH (TF32). Our forward
// and backward-weight are timed without bias / bias gradient, as cuDNN's calls
// compute neither (both are checked with them).
//
// Conv shapes (stride 1, no dilation): LeNet's two convolutions at batch 256
// (1->20 3x3 on 28x28; 20->50 5x5 on 13x13, unpadded) and the 3x3 padded
// convolutions of the four stages of d2l's ResNet-18 for Fashion-MNIST
// resized to 96x96, at batch 128: after the 7x7/2 stem and the 3x3/2 pool
// the stages run at 64ch@24x24, 128@12x12, 256@6x6 and 512@3x3.
//
// Baselines exist only in a real CUDA build (ANVIL_BENCH_CUBLAS / _CUDNN, set
// by CMake when it finds the libraries). A simulator build (or --smoke) runs
// tiny shapes as a smoke test; simulator times are not GPU times. Without a
// device (or in a CPU-only build) it prints one line and exits 0, or 1 in a
// CUDA build under ANVIL_REQUIRE_CUDA=1 (the GPU check's: no passing by skipping).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <limits>
#include <random>
#include <source_location>
#include <stdexcept>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#if defined(ANVIL_CUDA_BACKEND)
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/runtime.h"
#endif

#if defined(ANVIL_CUDA_BACKEND) && !defined(ANVIL_CUDA_SIM) && defined(ANVIL_BENCH_CUBLAS) && \
    ANVIL_BENCH_CUBLAS
#define BENCH_CUBLAS 1
#include <cublas_v2.h>
#else
#define BENCH_CUBLAS 0
#endif
#if defined(ANVIL_CUDA_BACKEND) && !defined(ANVIL_CUDA_SIM) && defined(ANVIL_BENCH_CUDNN) && \
    ANVIL_BENCH_CUDNN
#define BENCH_CUDNN 1
#include <cudnn.h>
#else
#define BENCH_CUDNN 0
#endif

namespace {

struct Options {
  std::vector<int64_t> gemm_sizes{1024, 2048, 4096};
  int warmup = 3;
  int repeats = 20;
  int device = 0;
  bool smoke = false;
  bool no_gemm = false;
  bool no_conv = false;
  bool no_norm = false;
  uint64_t seed = 0;
  std::string family;  // empty: every family
  int rung = 0;        // 0: every rung of the family
};

#if defined(ANVIL_CUDA_BACKEND)
using anvil::Conv2dShape;
namespace cu = anvil::cuda;
namespace cpu = anvil::cpu;
using Where = std::source_location;

#if defined(ANVIL_CUDA_SIM)
constexpr bool kSim = true;
#else
constexpr bool kSim = false;
#endif

#if BENCH_CUBLAS || BENCH_CUDNN
[[noreturn]] void fail_at(const Where& where, const char* what, const std::string& text) {
  throw std::runtime_error(fmt::format("{}:{}: {}: {}", where.file_name(), where.line(), what,
                                       text));
}
#endif

#if BENCH_CUBLAS
void check_cublas(cublasStatus_t st, const char* what, Where where = Where::current()) {
  if (st != CUBLAS_STATUS_SUCCESS) fail_at(where, what, cublasGetStatusString(st));
}
#endif
#if BENCH_CUDNN
void check_cudnn(cudnnStatus_t st, const char* what, Where where = Where::current()) {
  if (st != CUDNN_STATUS_SUCCESS) fail_at(where, what, cudnnGetErrorString(st));
}
#endif

// A device array of floats.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t n) : n_(n) {
    if (n_ > 0) cu::check(cudaMalloc(&p_, n_ * sizeof(float)), "cudaMalloc");
  }
  ~DeviceBuffer() { (void)cudaFree(p_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  float* get() const { return p_; }
  size_t bytes() const { return n_ * sizeof(float); }
  void upload(const std::vector<float>& h) {
    cu::check(cudaMemcpy(p_, h.data(), bytes(), cudaMemcpyHostToDevice), "cudaMemcpy to device");
  }
  std::vector<float> download() const {
    std::vector<float> h(n_);
    cu::check(cudaMemcpy(h.data(), p_, bytes(), cudaMemcpyDeviceToHost), "cudaMemcpy to host");
    return h;
  }
  // All-ones bytes (NaN floats): an element a kernel fails to write shows.
  void poison(cudaStream_t s) {
    cu::check(cudaMemsetAsync(p_, 0xFF, bytes(), s), "cudaMemsetAsync");
  }

 private:
  float* p_ = nullptr;
  size_t n_;
};

std::vector<float> random_vector(size_t n, std::mt19937_64& rng) {
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// The largest |got - ref| over the largest |ref|; NaN if anything is not finite.
double relative_error(const std::vector<float>& got, const std::vector<float>& ref) {
  double err = 0, scale = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (!std::isfinite(got[i])) return std::numeric_limits<double>::quiet_NaN();
    err = std::max(err, std::fabs(double(got[i]) - double(ref[i])));
    scale = std::max(scale, std::fabs(double(ref[i])));
  }
  return err / std::max(scale, 1e-30);
}

// Float sums of `reduction` terms in another order than the CPU's.
double tolerance(int64_t reduction) { return 1e-5 * (1.0 + std::sqrt(double(reduction))); }

// The same on tensor cores: each product a_k b_k also carries the rounding
// of its two operands (to nearest: relative error <= u each, so <= 2u
// together, of random sign from term to term; TF32 u = 2^-11, BF16 2^-8).
// Summed over the reduction that error grows like sqrt(reduction), as |ref|
// itself does for these random operands, so relative to the largest |ref|
// it stays near u (its largest element a few times its spread, as the
// largest |ref| is): 2u covers it with a margin, on top of the FP32 term.
// (tests/test_cuda_gemm_mma.cpp holds the kernels to a per-element bound.)
constexpr double kTf32Rounding = 0x1p-10, kBf16Rounding = 0x1p-7;
double gemm_rounding(cu::gemm_rungs::Math math) {
  using cu::gemm_rungs::Math;
  return math == Math::kTf32 ? kTf32Rounding : math == Math::kBf16 ? kBf16Rounding : 0.0;
}

// Times a call on `stream`: warm-up calls, then one pair of events per call.
class Timer {
 public:
  Timer(cudaStream_t stream, int warmup, int repeats)
      : stream_(stream), warmup_(warmup), repeats_(std::max(repeats, 1)) {
    cu::check(cudaEventCreate(&start_), "cudaEventCreate");
    cu::check(cudaEventCreate(&end_), "cudaEventCreate");
  }
  ~Timer() {
    (void)cudaEventDestroy(start_);
    (void)cudaEventDestroy(end_);
  }
  Timer(const Timer&) = delete;
  Timer& operator=(const Timer&) = delete;

  // A call slower than kSlowMs (the naive variants at 4096^3) is timed
  // kSlowRepeats times after one warm-up, so that the whole benchmark stays
  // within minutes; its median is still of several calls.
  static constexpr float kSlowMs = 100.0f;
  static constexpr int kSlowRepeats = 3;

  template <typename F>
  double median_ms(F&& call) {
    int warmup = warmup_, repeats = repeats_;
    if (warmup > 0) {
      cu::check(cudaEventRecord(start_, stream_), "cudaEventRecord");
      call();
      cu::check(cudaEventRecord(end_, stream_), "cudaEventRecord");
      cu::check(cudaEventSynchronize(end_), "cudaEventSynchronize");
      float first = 0;
      cu::check(cudaEventElapsedTime(&first, start_, end_), "cudaEventElapsedTime");
      --warmup;
      if (first > kSlowMs) warmup = 0, repeats = std::min(repeats, kSlowRepeats);
    }
    for (int i = 0; i < warmup; ++i) call();
    cu::check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
    std::vector<float> ms(repeats);
    for (float& t : ms) {
      cu::check(cudaEventRecord(start_, stream_), "cudaEventRecord");
      call();
      cu::check(cudaEventRecord(end_, stream_), "cudaEventRecord");
      cu::check(cudaEventSynchronize(end_), "cudaEventSynchronize");
      cu::check(cudaEventElapsedTime(&t, start_, end_), "cudaEventElapsedTime");
    }
    std::sort(ms.begin(), ms.end());
    const size_t n = ms.size();
    return n % 2 ? ms[n / 2] : 0.5 * (double(ms[n / 2 - 1]) + double(ms[n / 2]));
  }

 private:
  cudaStream_t stream_;
  int warmup_, repeats_;
  cudaEvent_t start_{}, end_{};
};

constexpr double kNoVendor = -1;

struct Bench {
  Options opt;
  cudaStream_t stream{};
  Timer* timer = nullptr;
  int failures = 0;
#if BENCH_CUBLAS
  cublasHandle_t cublas{};
#endif
#if BENCH_CUDNN
  cudnnHandle_t cudnn{};
  DeviceBuffer* cudnn_ws = nullptr;
#endif

  void header() const {
    fmt::print("{:<5} {:<34} {:<24} {:>10} {:>10} {:>8}\n", "op", "shape", "impl",
               kSim ? "sim ms" : "ms", "GFLOP/s", "% vendor");
  }
  void row(const char* op, const std::string& shape, const std::string& impl, double ms,
           double flop, double vendor_ms) const {
    const std::string gflops = kSim ? "-" : fmt::format("{:.1f}", flop / (ms * 1e6));
    const std::string pct =
        kSim || vendor_ms <= 0 ? "-" : fmt::format("{:.1f}", 100.0 * vendor_ms / ms);
    fmt::print("{:<5} {:<34} {:<24} {:>10.4f} {:>10} {:>8}\n", op, shape, impl, ms, gflops, pct);
    std::fflush(stdout);
  }
  // Compares and reports; true when within tolerance.
  bool verify(const char* op, const std::string& shape, const std::string& impl,
              const std::vector<float>& got, const std::vector<float>& ref, int64_t reduction,
              double rounding = 0.0) {  // the operands' rounding (tensor cores), else 0
    const double err = relative_error(got, ref), tol = rounding + tolerance(reduction);
    if (err <= tol) return true;
    fmt::print("FAIL: {} {} on {}: relative error {:.3g} > tolerance {:.3g}\n", op, impl, shape,
               err, tol);
    std::fflush(stdout);
    ++failures;
    return false;
  }

  void gemm(int64_t M, int64_t N, int64_t K);
  void conv(const char* name, const Conv2dShape& s);
  void channel_sum(const char* name, int64_t outer, int64_t C, int64_t inner);
  void softmax(const char* name, int64_t N, int64_t C);
  void sum(const char* name, int64_t n);
  void batch_norm(const char* name, int64_t N, int64_t C, int64_t HW);
};


// The families a run names, and how many rungs each has.
struct Family {
  const char* name;
  int rungs;
};
const Family kFamilies[] = {{"gemm", cu::kGemmVariants},
                            {"conv", cu::kConvVariants},
                            {"softmax", cu::kSoftmaxVariants},
                            {"sum", cu::kSumVariants},
                            {"csum", cu::kChannelSumVariants},
                            {"bn", cu::kBatchNormVariants}};

// The rungs of a family with `count` this run checks and times.
std::vector<int> rungs_of(const Options& opt, int count) {
  if (opt.rung > 0) return {opt.rung};
  std::vector<int> all(static_cast<size_t>(count));
  for (int v = 1; v <= count; ++v) all[size_t(v - 1)] = v;
  return all;
}

void Bench::gemm(int64_t M, int64_t N, int64_t K) {
  std::mt19937_64 rng(opt.seed + uint64_t(M * 31 + N * 7 + K));
  const std::vector<float> a = random_vector(size_t(M * K), rng);
  const std::vector<float> b = random_vector(size_t(K * N), rng);
  std::vector<float> ref(size_t(M * N));
  cpu::gemm(false, false, M, N, K, 1.0f, a.data(), K, b.data(), N, 0.0f, ref.data(), N);
  DeviceBuffer da(a.size()), db(b.size()), dc(ref.size());
  size_t ws_floats = 0;
  for (int v = 1; v <= cu::kGemmVariants; ++v)
    ws_floats = std::max(ws_floats, cu::gemm_workspace_floats(v, M, N, K));
  DeviceBuffer dws(ws_floats);
  da.upload(a);
  db.upload(b);
  const std::string shape = fmt::format("{}x{}x{} (MxNxK)", M, N, K);
  const double flop = 2.0 * double(M) * double(N) * double(K);
  // The vendor's time in each rung's arithmetic: SGEMM (FP32), then cublasGemmEx
  // on the same FP32 operands with TF32 and BF16 tensor-core compute.
  double vendor_ms[3] = {kNoVendor, kNoVendor, kNoVendor};
#if BENCH_CUBLAS
  {
    using cu::gemm_rungs::Math;
    struct Vendor {
      Math math;
      const char* impl;
      cublasComputeType_t compute;
    };
    const Vendor vendors[] = {{Math::kFp32, "cuBLAS SGEMM", CUBLAS_COMPUTE_32F},
                              {Math::kTf32, "cuBLAS TF32", CUBLAS_COMPUTE_32F_FAST_TF32},
                              {Math::kBf16, "cuBLAS BF16", CUBLAS_COMPUTE_32F_FAST_16BF}};
    for (const Vendor& vd : vendors) {
      // Row-major C = A B is column-major C^T = B^T A^T: swap the operands.
      const float one = 1.0f, zero = 0.0f;
      auto call = [&] {
        if (vd.math == Math::kFp32)
          check_cublas(cublasSgemm(cublas, CUBLAS_OP_N, CUBLAS_OP_N, int(N), int(M), int(K),
                                   &one, db.get(), int(N), da.get(), int(K), &zero, dc.get(),
                                   int(N)),
                       "cublasSgemm");
        else
          check_cublas(cublasGemmEx(cublas, CUBLAS_OP_N, CUBLAS_OP_N, int(N), int(M), int(K),
                                    &one, db.get(), CUDA_R_32F, int(N), da.get(), CUDA_R_32F,
                                    int(K), &zero, dc.get(), CUDA_R_32F, int(N), vd.compute,
                                    CUBLAS_GEMM_DEFAULT),
                       "cublasGemmEx");
      };
      dc.poison(stream);
      call();
      if (verify("gemm", shape, vd.impl, dc.download(), ref, K, gemm_rounding(vd.math))) {
        double& ms = vendor_ms[int(vd.math)];
        ms = timer->median_ms(call);
        row("gemm", shape, vd.impl, ms, flop, ms);
      }
    }
  }
#endif
  for (int v : rungs_of(opt, cu::kGemmVariants)) {
    const auto& rung = cu::gemm_rungs::kRungs[v - 1];
    const std::string impl = fmt::format("v{} {}", v, rung.name);
    auto call = [&] {
      cu::gemm(v, false, false, M, N, K, 1.0f, da.get(), K, db.get(), N, 0.0f, dc.get(), N,
               dws.get(), stream);
    };
    dc.poison(stream);
    call();
    if (!verify("gemm", shape, impl, dc.download(), ref, K, gemm_rounding(rung.math))) continue;
    row("gemm", shape, impl, timer->median_ms(call), flop, vendor_ms[int(rung.math)]);
  }
}

Conv2dShape conv_shape(int64_t N, int64_t C, int64_t H, int64_t W, int64_t K, int64_t R,
                       int64_t stride, int64_t pad) {
  Conv2dShape s{N, C, H, W, K, R, R, stride, stride, pad, pad, 0, 0};
  s.P = Conv2dShape::out_size(H, R, stride, pad);
  s.Q = Conv2dShape::out_size(W, R, stride, pad);
  return s;
}

#if BENCH_CUDNN
// cuDNN's descriptors of one convolution, FP32 NCHW: FMA math (no TF32), or
// tensor-op math (TF32 on the tensor cores, PyTorch's default for convolutions).
struct CudnnConv {
  cudnnTensorDescriptor_t x{}, y{};
  cudnnFilterDescriptor_t w{};
  cudnnConvolutionDescriptor_t conv{};
  CudnnConv(const Conv2dShape& s, cudnnMathType_t math) {
    check_cudnn(cudnnCreateTensorDescriptor(&x), "cudnnCreateTensorDescriptor");
    check_cudnn(cudnnCreateTensorDescriptor(&y), "cudnnCreateTensorDescriptor");
    check_cudnn(cudnnCreateFilterDescriptor(&w), "cudnnCreateFilterDescriptor");
    check_cudnn(cudnnCreateConvolutionDescriptor(&conv), "cudnnCreateConvolutionDescriptor");
    check_cudnn(cudnnSetTensor4dDescriptor(x, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, int(s.N),
                                           int(s.C), int(s.H), int(s.W)),
                "cudnnSetTensor4dDescriptor(x)");
    check_cudnn(cudnnSetTensor4dDescriptor(y, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, int(s.N),
                                           int(s.K), int(s.P), int(s.Q)),
                "cudnnSetTensor4dDescriptor(y)");
    check_cudnn(cudnnSetFilter4dDescriptor(w, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, int(s.K),
                                           int(s.C), int(s.R), int(s.S)),
                "cudnnSetFilter4dDescriptor");
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

// The fastest successful FP32 (non tensor-op) result of a cudnnFind*Ex call.
template <typename Perf>
const Perf* fastest(const Perf* perfs, int count) {
  for (int i = 0; i < count; ++i)  // Find sorts by time
    if (perfs[i].status == CUDNN_STATUS_SUCCESS && perfs[i].mathType != CUDNN_TENSOR_OP_MATH &&
        perfs[i].mathType != CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION)
      return &perfs[i];
  return nullptr;
}
#endif

enum Direction { kForward, kBackwardData, kBackwardWeight };
const char* const kDirectionNames[] = {"fwd", "bwdD", "bwdW"};

void Bench::conv(const char* name, const Conv2dShape& s) {
  std::mt19937_64 rng(opt.seed + uint64_t(s.N * 131 + s.C * 17 + s.K * 5 + s.H + s.R));
  const std::vector<float> x = random_vector(size_t(s.N * s.C * s.H * s.W), rng);
  const std::vector<float> w = random_vector(size_t(s.K * s.C * s.R * s.S), rng);
  const std::vector<float> bias = random_vector(size_t(s.K), rng);
  const std::vector<float> dy = random_vector(size_t(s.N * s.K * s.P * s.Q), rng);
  std::vector<float> y_ref(dy.size()), dx_ref(x.size()), dw_ref(w.size()), db_ref(bias.size());
  cpu::conv2d_forward(s, x.data(), w.data(), bias.data(), y_ref.data());
  cpu::conv2d_backward_data(s, dy.data(), w.data(), dx_ref.data());
  cpu::conv2d_backward_weight(s, x.data(), dy.data(), dw_ref.data(), db_ref.data());
  // cuDNN's forward has no bias: its reference is y_ref less the bias.
  std::vector<float> y_nobias = y_ref;
  for (size_t i = 0; i < y_nobias.size(); ++i)
    y_nobias[i] -= bias[(i / size_t(s.P * s.Q)) % size_t(s.K)];

  DeviceBuffer d_x(x.size()), d_w(w.size()), d_bias(bias.size()), d_dy(dy.size());
  DeviceBuffer d_y(dy.size()), d_dx(x.size()), d_dw(w.size()), d_db(bias.size());
  for (auto [d, h] : {std::pair{&d_x, &x}, {&d_w, &w}, {&d_bias, &bias}, {&d_dy, &dy}})
    d->upload(*h);
  size_t ws_floats = 0;
  for (int v = 1; v <= cu::kConvVariants; ++v)
    ws_floats = std::max(ws_floats, cu::conv2d_workspace_floats(v, s));
  DeviceBuffer d_ws(ws_floats);

  const std::string shape =
      fmt::format("{} N{} {}->{} {}x{} @{}x{}", name, s.N, s.C, s.K, s.R, s.S, s.H, s.W);
  const double flop = 2.0 * double(s.N * s.K * s.P * s.Q) * double(s.C * s.R * s.S);
  const int64_t reductions[] = {s.C * s.R * s.S, s.K * s.R * s.S, s.N * s.P * s.Q};
  DeviceBuffer* outputs[] = {&d_y, &d_dx, &d_dw};
  const std::vector<float>* refs[] = {&y_ref, &dx_ref, &dw_ref};

  for (int dir = kForward; dir <= kBackwardWeight; ++dir) {
    const char* op = kDirectionNames[dir];
    DeviceBuffer& out = *outputs[dir];
    double vendor_ms[2] = {kNoVendor, kNoVendor};  // FP32, TF32
#if BENCH_CUDNN
    for (int tf32 = 0; tf32 < 2; ++tf32) {
      CudnnConv desc(s, tf32 ? CUDNN_TENSOR_OP_MATH : CUDNN_FMA_MATH);
      void* ws = cudnn_ws->get();
      const size_t ws_bytes = cudnn_ws->bytes();
      const float one = 1.0f, zero = 0.0f;
      constexpr int kMaxAlgos = 16;
      int found = 0, algo = -1;
      size_t algo_ws = 0;
      auto pick = [&](const auto* perfs) {
        if (const auto* p = fastest(perfs, found)) algo = int(p->algo), algo_ws = p->memory;
      };
      if (dir == kForward) {
        cudnnConvolutionFwdAlgoPerf_t perfs[kMaxAlgos];
        check_cudnn(cudnnFindConvolutionForwardAlgorithmEx(
                        cudnn, desc.x, d_x.get(), desc.w, d_w.get(), desc.conv, desc.y,
                        d_y.get(), kMaxAlgos, &found, perfs, ws, ws_bytes),
                    "cudnnFindConvolutionForwardAlgorithmEx");
        pick(perfs);
      } else if (dir == kBackwardData) {
        cudnnConvolutionBwdDataAlgoPerf_t perfs[kMaxAlgos];
        check_cudnn(cudnnFindConvolutionBackwardDataAlgorithmEx(
                        cudnn, desc.w, d_w.get(), desc.y, d_dy.get(), desc.conv, desc.x,
                        d_dx.get(), kMaxAlgos, &found, perfs, ws, ws_bytes),
                    "cudnnFindConvolutionBackwardDataAlgorithmEx");
        pick(perfs);
      } else {
        cudnnConvolutionBwdFilterAlgoPerf_t perfs[kMaxAlgos];
        check_cudnn(cudnnFindConvolutionBackwardFilterAlgorithmEx(
                        cudnn, desc.x, d_x.get(), desc.y, d_dy.get(), desc.conv, desc.w,
                        d_dw.get(), kMaxAlgos, &found, perfs, ws, ws_bytes),
                    "cudnnFindConvolutionBackwardFilterAlgorithmEx");
        pick(perfs);
      }
      if (algo < 0) {
        fmt::print("{:<5} {:<34} cuDNN: no {} algorithm succeeded\n", op, shape,
                   tf32 ? "TF32" : "FP32");
      } else {
        auto call = [&] {
          if (dir == kForward)
            check_cudnn(cudnnConvolutionForward(cudnn, &one, desc.x, d_x.get(), desc.w,
                                                d_w.get(), desc.conv,
                                                cudnnConvolutionFwdAlgo_t(algo), ws, algo_ws,
                                                &zero, desc.y, d_y.get()),
                        "cudnnConvolutionForward");
          else if (dir == kBackwardData)
            check_cudnn(cudnnConvolutionBackwardData(cudnn, &one, desc.w, d_w.get(), desc.y,
                                                     d_dy.get(), desc.conv,
                                                     cudnnConvolutionBwdDataAlgo_t(algo), ws,
                                                     algo_ws, &zero, desc.x, d_dx.get()),
                        "cudnnConvolutionBackwardData");
          else
            check_cudnn(cudnnConvolutionBackwardFilter(cudnn, &one, desc.x, d_x.get(), desc.y,
                                                       d_dy.get(), desc.conv,
                                                       cudnnConvolutionBwdFilterAlgo_t(algo),
                                                       ws, algo_ws, &zero, desc.w, d_dw.get()),
                        "cudnnConvolutionBackwardFilter");
        };
        const std::string impl = fmt::format("cuDNN {}algo {}", tf32 ? "TF32 " : "", algo);
        out.poison(stream);
        call();
        const auto& ref = dir == kForward ? y_nobias : *refs[dir];
        if (verify(op, shape, impl, out.download(), ref, reductions[dir],
                   tf32 ? kTf32Rounding : 0.0)) {
          vendor_ms[tf32] = timer->median_ms(call);
          row(op, shape, impl, vendor_ms[tf32], flop, vendor_ms[tf32]);
        }
      }
    }
#endif
    for (int v : rungs_of(opt, cu::kConvVariants)) {
      const std::string impl = fmt::format("v{} {}", v, cu::conv_rungs::rung(v).name);
      // Checked with the bias (gradient), timed without, as cuDNN.
      auto call = [&](bool with_bias) {
        if (dir == kForward)
          cu::conv2d_forward(v, s, d_x.get(), d_w.get(), with_bias ? d_bias.get() : nullptr,
                             d_y.get(), d_ws.get(), stream);
        else if (dir == kBackwardData)
          cu::conv2d_backward_data(v, s, d_dy.get(), d_w.get(), d_dx.get(), d_ws.get(), stream);
        else
          cu::conv2d_backward_weight(v, s, d_x.get(), d_dy.get(), d_dw.get(),
                                     with_bias ? d_db.get() : nullptr, d_ws.get(), stream);
      };
      out.poison(stream);
      d_db.poison(stream);
      call(true);
      const double rounding = v > cu::kConvFp32Variants ? kTf32Rounding : 0.0;  // rung 6: TF32
      bool ok = verify(op, shape, impl, out.download(), *refs[dir], reductions[dir], rounding);
      if (ok && dir == kBackwardWeight)
        ok = verify("bwdW", shape, impl + " dbias", d_db.download(), db_ref, s.N * s.P * s.Q);
      if (ok)
        row(op, shape, impl, timer->median_ms([&] { call(false); }), flop,
            vendor_ms[v > cu::kConvFp32Variants ? 1 : 0]);
    }
  }
}

// Per-channel sums of dy[outer, C, inner] (bias gradients): every variant
// checked against the CPU, then timed. Bytes: dy read once.
void Bench::channel_sum(const char* name, int64_t outer, int64_t C, int64_t inner) {
  std::mt19937_64 rng(opt.seed + uint64_t(outer * 31 + C * 7 + inner));
  const std::vector<float> dy = random_vector(static_cast<size_t>(outer * C * inner), rng);
  std::vector<float> ref(static_cast<size_t>(C));
  cpu::channel_sum(outer, C, inner, dy.data(), ref.data());
  DeviceBuffer d_dy(dy.size()), d_db(ref.size());
  d_dy.upload(dy);
  const std::string shape = fmt::format("{} {}x{}x{}", name, outer, C, inner);
  for (int v : rungs_of(opt, cu::kChannelSumVariants)) {
    const std::string impl = fmt::format("v{} {}", v, cu::channel_sum_rungs::kRungs[v - 1].name);
    DeviceBuffer ws(cu::channel_sum_workspace_floats(v, outer, C, inner));
    auto call = [&] {
      cu::channel_sum(v, outer, C, inner, d_dy.get(), d_db.get(), ws.get(), stream);
    };
    d_db.poison(stream);
    call();
    if (!verify("csum", shape, impl, d_db.download(), ref, outer * inner)) continue;
    row("csum", shape, impl, timer->median_ms(call), 0.0, kNoVendor);
  }
}

// The sum of a vector: every rung checked against a double-precision sum,
// then timed. Bytes: x read once.
void Bench::sum(const char* name, int64_t n) {
  std::mt19937_64 rng(opt.seed + uint64_t(n));
  const std::vector<float> x = random_vector(static_cast<size_t>(n), rng);
  double total = 0.0;
  for (float v : x) total += v;
  const std::vector<float> ref = {static_cast<float>(total)};
  DeviceBuffer d_x(x.size()), d_out(1);
  d_x.upload(x);
  const std::string shape = fmt::format("{} {}", name, n);
  for (int v : rungs_of(opt, cu::kSumVariants)) {
    const std::string impl = fmt::format("v{} {}", v, cu::sum_rungs::kRungs[v - 1].name);
    DeviceBuffer ws(cu::sum_workspace_floats(v, n));
    auto call = [&] { cu::sum(v, n, d_x.get(), d_out.get(), ws.get(), stream); };
    d_out.poison(stream);
    call();
    if (verify("sum", shape, impl, d_out.download(), ref, n))
      row("sum", shape, impl, timer->median_ms(call), 0.0, kNoVendor);
  }
}

// Softmax cross-entropy forward (loss and probs, label smoothing 0.1): every
// rung checked against the CPU, then timed. Memory-bound: GFLOP/s is 0.
void Bench::softmax(const char* name, int64_t N, int64_t C) {
  std::mt19937_64 rng(opt.seed + uint64_t(N * 31 + C));
  const std::vector<float> logits = random_vector(static_cast<size_t>(N * C), rng);
  std::vector<int64_t> labels(static_cast<size_t>(N));
  for (auto& l : labels) l = int64_t(rng() % uint64_t(C));
  const float smoothing = 0.1f;
  std::vector<float> loss(labels.size()), probs(logits.size());
  cpu::softmax_cross_entropy_forward(N, C, logits.data(), labels.data(), smoothing, loss.data(),
                                     probs.data());
  DeviceBuffer d_logits(logits.size()), d_loss(loss.size()), d_probs(probs.size());
  d_logits.upload(logits);
  int64_t* d_labels = nullptr;
  cu::check(cudaMalloc(reinterpret_cast<void**>(&d_labels), labels.size() * sizeof(int64_t)),
            "cudaMalloc(labels)");
  cu::check(cudaMemcpy(d_labels, labels.data(), labels.size() * sizeof(int64_t),
                       cudaMemcpyHostToDevice),
            "cudaMemcpy(labels)");
  const std::string shape = fmt::format("{} {}x{}", name, N, C);
  for (int v : rungs_of(opt, cu::kSoftmaxVariants)) {
    const std::string impl = fmt::format("v{} {}", v, cu::softmax_rungs::kRungs[v - 1].name);
    auto call = [&] {
      cu::softmax_cross_entropy_forward(v, N, C, d_logits.get(), d_labels, smoothing,
                                        d_loss.get(), d_probs.get(), stream);
    };
    d_loss.poison(stream);
    d_probs.poison(stream);
    call();
    if (verify("smax", shape, impl, d_loss.download(), loss, C) &&
        verify("smax", shape, impl + " probs", d_probs.download(), probs, C))
      row("smax", shape, impl, timer->median_ms(call), 0.0, kNoVendor);
  }
  cu::check(cudaFree(d_labels), "cudaFree(labels)");
}

// BatchNorm training forward (y, mean, invstd) and backward (dx, dgamma,
// dbeta): every variant checked against the CPU, then timed.
void Bench::batch_norm(const char* name, int64_t N, int64_t C, int64_t HW) {
  std::mt19937_64 rng(opt.seed + uint64_t(N * 31 + C * 7 + HW));
  const size_t n = static_cast<size_t>(N * C * HW), nc = static_cast<size_t>(C);
  const std::vector<float> x = random_vector(n, rng), dy = random_vector(n, rng);
  const std::vector<float> gamma = random_vector(nc, rng), beta = random_vector(nc, rng);
  std::vector<float> y(n), mean(nc), invstd(nc), dx(n), dgamma(nc), dbeta(nc);
  const float eps = 1e-5f, momentum = 0.1f;
  cpu::batch_norm_forward_train(N, C, HW, x.data(), gamma.data(), beta.data(), eps, momentum,
                                nullptr, nullptr, mean.data(), invstd.data(), y.data());
  cpu::batch_norm_backward_train(N, C, HW, x.data(), gamma.data(), mean.data(), invstd.data(),
                                 dy.data(), dx.data(), dgamma.data(), dbeta.data());
  DeviceBuffer d_x(n), d_dy(n), d_gamma(nc), d_beta(nc), d_y(n), d_mean(nc), d_invstd(nc),
      d_dx(n), d_dgamma(nc), d_dbeta(nc);
  d_x.upload(x);
  d_dy.upload(dy);
  d_gamma.upload(gamma);
  d_beta.upload(beta);
  const std::string shape = fmt::format("{} {}x{}x{}", name, N, C, HW);
  const int64_t M = N * HW;
  for (int v : rungs_of(opt, cu::kBatchNormVariants)) {
    const std::string impl = fmt::format("v{} {}", v, cu::batch_norm_rungs::kRungs[v - 1]->name);
    DeviceBuffer ws(cu::batch_norm_workspace_floats(v, N, C, HW));
    auto forward = [&] {
      cu::batch_norm_forward_train(v, N, C, HW, d_x.get(), d_gamma.get(), d_beta.get(), eps,
                                   momentum, nullptr, nullptr, d_mean.get(), d_invstd.get(),
                                   d_y.get(), ws.get(), stream);
    };
    d_y.poison(stream);
    forward();
    if (verify("bnF", shape, impl, d_y.download(), y, M) &&
        verify("bnF", shape, impl + " mean", d_mean.download(), mean, M) &&
        verify("bnF", shape, impl + " invstd", d_invstd.download(), invstd, M))
      row("bnF", shape, impl, timer->median_ms(forward), 0.0, kNoVendor);
    // The backward from the CPU's saved statistics, as the CPU's backward.
    d_mean.upload(mean);
    d_invstd.upload(invstd);
    auto backward = [&] {
      cu::batch_norm_backward_train(v, N, C, HW, d_x.get(), d_gamma.get(), d_mean.get(),
                                    d_invstd.get(), d_dy.get(), d_dx.get(), d_dgamma.get(),
                                    d_dbeta.get(), ws.get(), stream);
    };
    d_dx.poison(stream);
    backward();
    if (verify("bnB", shape, impl, d_dx.download(), dx, M) &&
        verify("bnB", shape, impl + " dgamma", d_dgamma.download(), dgamma, M) &&
        verify("bnB", shape, impl + " dbeta", d_dbeta.download(), dbeta, M))
      row("bnB", shape, impl, timer->median_ms(backward), 0.0, kNoVendor);
  }
}

int run(Options opt) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    (void)cudaGetLastError();
    // tools/gpu/gpu-check.sh sets ANVIL_REQUIRE_CUDA=1 where nvidia-smi lists a
    // GPU: there a benchmark that finds no device has failed, not passed.
    const char* required = std::getenv("ANVIL_REQUIRE_CUDA");
    const bool must_run = required != nullptr && *required != '\0' && std::string(required) != "0";
    fmt::print("bench_cuda_kernels: no CUDA device ({}); nothing to benchmark{}\n",
               err != cudaSuccess ? cudaGetErrorString(err) : "device count 0",
               must_run ? " (ANVIL_REQUIRE_CUDA=1: a failure)" : "");
    return must_run ? 1 : 0;
  }
  if (opt.device < 0 || opt.device >= count)
    throw std::invalid_argument(fmt::format("--device {}: {} device(s)", opt.device, count));
  cu::check(cudaSetDevice(opt.device), "cudaSetDevice");
  cudaDeviceProp prop{};
  cu::check(cudaGetDeviceProperties(&prop, opt.device), "cudaGetDeviceProperties");

  const bool smoke = opt.smoke || kSim;
  if (smoke) {
    opt.warmup = std::min(opt.warmup, 1);
    opt.repeats = std::min(opt.repeats, 3);
  }
  Bench b;
  b.opt = opt;
  cu::check(cudaStreamCreate(&b.stream), "cudaStreamCreate");
  Timer timer(b.stream, opt.warmup, opt.repeats);
  b.timer = &timer;

  fmt::print("device {}: {} (sm_{}{})\n", opt.device, prop.name, prop.major, prop.minor);
  if (kSim)
    fmt::print("simulator build: smoke test of every variant on tiny shapes; times are "
               "simulator, not GPU time, and make no performance claim\n");
  else if (smoke)
    fmt::print("--smoke: tiny shapes, correctness first; times are too short to mean much\n");
  fmt::print("timing: {} warm-up + median of {} calls, CUDA events\n", opt.warmup, opt.repeats);
#if BENCH_CUBLAS
  check_cublas(cublasCreate(&b.cublas), "cublasCreate");
  check_cublas(cublasSetStream(b.cublas, b.stream), "cublasSetStream");
  check_cublas(cublasSetMathMode(b.cublas, CUBLAS_DEFAULT_MATH), "cublasSetMathMode");
  fmt::print("GEMM baselines: cuBLAS SGEMM (FP32, no TF32); cublasGemmEx TF32 and BF16 compute\n");
#elif !defined(ANVIL_CUDA_SIM)
  fmt::print("GEMM baseline: none (cuBLAS not linked)\n");
#endif
#if BENCH_CUDNN
  check_cudnn(cudnnCreate(&b.cudnn), "cudnnCreate");
  check_cudnn(cudnnSetStream(b.cudnn, b.stream), "cudnnSetStream");
  DeviceBuffer cudnn_ws(size_t{256} << 20);  // 1 GiB of workspace for cudnnFind*Ex
  b.cudnn_ws = &cudnn_ws;
  fmt::print("conv baselines: cuDNN {}, fastest of cudnnFind*AlgorithmEx, FP32 (CUDNN_FMA_MATH) and TF32 (CUDNN_TENSOR_OP_MATH)\n",
             cudnnGetVersion());
#elif !defined(ANVIL_CUDA_SIM)
  fmt::print("conv baseline: none (cuDNN not found at build time)\n");
#endif
  fmt::print("\n");
  b.header();

  auto wanted = [&](const char* family, bool skipped) {
    return opt.family.empty() ? !skipped : opt.family == family;
  };
  if (wanted("gemm", opt.no_gemm)) {
    if (smoke) {
      b.gemm(64, 64, 64);
      b.gemm(96, 80, 72);
      b.gemm(40, 24, 600);  // one tile, a long K: variant 8 splits it
    } else {
      for (int64_t n : opt.gemm_sizes) b.gemm(n, n, n);
      b.gemm(128, 128, 1 << 16);  // one tile, a long K: variant 8 splits it
    }
  }
  if (wanted("conv", opt.no_conv)) {
    if (smoke) {
      b.conv("tiny", conv_shape(2, 3, 8, 8, 4, 3, 1, 1));
      b.conv("tiny", conv_shape(2, 4, 7, 7, 6, 5, 1, 0));
      b.conv("tiny s2", conv_shape(2, 5, 9, 9, 8, 3, 2, 1));
      b.conv("tiny split-K", conv_shape(4, 3, 12, 12, 8, 3, 1, 1));  // variant 5 splits dW
    } else {
      b.conv("lenet c1", conv_shape(256, 1, 28, 28, 20, 3, 1, 0));
      b.conv("lenet c2", conv_shape(256, 20, 13, 13, 50, 5, 1, 0));
      b.conv("resnet s1", conv_shape(128, 64, 24, 24, 64, 3, 1, 1));
      b.conv("resnet s2", conv_shape(128, 128, 12, 12, 128, 3, 1, 1));
      b.conv("resnet s3", conv_shape(128, 256, 6, 6, 256, 3, 1, 1));
      b.conv("resnet s4", conv_shape(128, 512, 3, 3, 512, 3, 1, 1));
    }
  }

  if (wanted("sum", opt.no_norm)) {
    if (smoke) {
      b.sum("tiny", 1000);
      b.sum("tiny odd", 70001);
    } else {
      b.sum("resnet s1 activations", 256 * 64 * 784);
    }
  }
  if (wanted("softmax", opt.no_norm)) {
    if (smoke) {
      b.softmax("tiny", 5, 10);
      b.softmax("tiny wide", 3, 1000);
    } else {
      b.softmax("classifier", 256, 10);
      b.softmax("imagenet", 256, 1000);
    }
  }
  if (wanted("csum", opt.no_norm)) {
    if (smoke) {
      b.channel_sum("tiny", 3, 5, 1001);
      b.channel_sum("tiny f4", 2, 3, 1024);
    } else {
      b.channel_sum("resnet s1", 256, 64, 784);
      b.channel_sum("lenet fc1 bias", 256, 128, 1);
    }
  }
  if (wanted("bn", opt.no_norm)) {
    if (smoke) {
      b.batch_norm("tiny", 3, 2, 999);
      b.batch_norm("tiny f4", 2, 3, 1024);
    } else {
      b.batch_norm("resnet s1", 256, 64, 784);
      b.batch_norm("resnet s2", 256, 128, 196);
      b.batch_norm("resnet s3", 256, 256, 49);
      b.batch_norm("resnet s4", 256, 512, 16);
      b.batch_norm("resnet s1 b128", 128, 64, 784);
    }
  }

#if BENCH_CUDNN
  b.cudnn_ws = nullptr;
  check_cudnn(cudnnDestroy(b.cudnn), "cudnnDestroy");
#endif
#if BENCH_CUBLAS
  check_cublas(cublasDestroy(b.cublas), "cublasDestroy");
#endif
  cu::check(cudaStreamDestroy(b.stream), "cudaStreamDestroy");
  if (b.failures > 0) {
    fmt::print("\n{} result(s) differ from the CPU kernels (see FAIL lines)\n", b.failures);
    return 1;
  }
  fmt::print("\nall results match the CPU kernels\n");
  return 0;
}
#endif  // ANVIL_CUDA_BACKEND

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  CLI::App app{"Checks and times the CUDA GEMM and conv kernel variants against cuBLAS/cuDNN"};
  app.add_option("--gemm-sizes", opt.gemm_sizes, "square GEMM sizes")->delimiter(',');
  app.add_option("--warmup", opt.warmup, "untimed calls before timing")->check(CLI::NonNegativeNumber);
  app.add_option("--repeats", opt.repeats, "timed calls (median reported)")->check(CLI::PositiveNumber);
  app.add_option("--device", opt.device, "CUDA device");
  app.add_option("--seed", opt.seed, "seed of the random inputs");
  app.add_flag("--smoke", opt.smoke, "tiny shapes: a correctness smoke test");
  app.add_flag("--no-gemm", opt.no_gemm, "skip the GEMM shapes");
  app.add_flag("--no-conv", opt.no_conv, "skip the conv shapes");
  app.add_flag("--no-norm", opt.no_norm, "skip the sum, softmax, channel-sum and BatchNorm shapes");
  app.add_option("family", opt.family, "run one family only: gemm, conv, sum, softmax, csum, bn");
  app.add_option("rung", opt.rung, "run one rung of the family only (1 = the first)");
  CLI11_PARSE(app, argc, argv);
#if defined(ANVIL_CUDA_BACKEND)
  if (!opt.family.empty()) {
    const Family* f = nullptr;
    for (const Family& known : kFamilies)
      if (opt.family == known.name) f = &known;
    if (f == nullptr) {
      std::fprintf(stderr, "bench_cuda_kernels: no family '%s' (known: gemm, conv, sum, softmax, csum, bn)\n",
                   opt.family.c_str());
      return 2;
    }
    if (opt.rung < 0 || opt.rung > f->rungs) {
      std::fprintf(stderr, "bench_cuda_kernels: %s has rungs 1 to %d, not %d\n", f->name,
                   f->rungs, opt.rung);
      return 2;
    }
  }
#endif
#if defined(ANVIL_CUDA_BACKEND)
  try {
    return run(opt);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_cuda_kernels: %s\n", e.what());
    return 1;
  }
#else
  fmt::print("bench_cuda_kernels: no CUDA device (built without the CUDA backend); "
             "nothing to benchmark\n");
  return 0;
#endif
}
