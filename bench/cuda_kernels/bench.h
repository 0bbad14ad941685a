// The shared parts of bench_cuda_kernels (bench/bench_cuda_kernels.cpp says
// what it measures and how): its options, the vendor-library checks, device
// buffers, the CPU comparison's tolerances, the timer, and the Bench that
// each family's file (gemm.cpp, conv.cpp, memory_bound.cpp) adds its method to.
#pragma once
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

#include <fmt/format.h>
#include <fmt/ranges.h>

#if defined(ANVIL_CUDA_BACKEND)
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cuda/conv/rung_table.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/runtime.h"
#endif

#if defined(ANVIL_CUDA_BACKEND) && !defined(ANVIL_CUDA_SIM) && defined(ANVIL_BENCH_CUBLAS) && \
    ANVIL_BENCH_CUBLAS
#define BENCH_CUBLAS 1
#include <cublasLt.h>
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

namespace bench_cuda {

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
  std::string conv_set = "all";  // training, resnet18-96 or all
  std::string family;  // empty: every family
  int rung = 0;        // 0: every rung of the family
  std::vector<int> rungs;  // --rungs: these rungs of the family (empty: every one)
  std::string rung_table;  // --write-rung-table: the conv rungs measured fastest, written here
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
[[noreturn]] inline void fail_at(const Where& where, const char* what, const std::string& text) {
  throw std::runtime_error(fmt::format("{}:{}: {}: {}", where.file_name(), where.line(), what,
                                       text));
}
#endif

#if BENCH_CUBLAS
inline void check_cublas(cublasStatus_t st, const char* what, Where where = Where::current()) {
  if (st != CUBLAS_STATUS_SUCCESS) fail_at(where, what, cublasGetStatusString(st));
}
#endif
#if BENCH_CUDNN
inline void check_cudnn(cudnnStatus_t st, const char* what, Where where = Where::current()) {
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

inline std::vector<float> random_vector(size_t n, std::mt19937_64& rng) {
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// The largest |got - ref| over the largest |ref|; NaN if anything is not finite.
inline double relative_error(const std::vector<float>& got, const std::vector<float>& ref) {
  double err = 0, scale = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (!std::isfinite(got[i])) return std::numeric_limits<double>::quiet_NaN();
    err = std::max(err, std::fabs(double(got[i]) - double(ref[i])));
    scale = std::max(scale, std::fabs(double(ref[i])));
  }
  return err / std::max(scale, 1e-30);
}

// Float sums of `reduction` terms in another order than the CPU's.
inline double tolerance(int64_t reduction) { return 1e-5 * (1.0 + std::sqrt(double(reduction))); }

// The same on tensor cores: each product a_k b_k also carries the rounding
// of its two operands (to nearest: relative error <= u each, so <= 2u
// together, of random sign from term to term; TF32 u = 2^-11, BF16 2^-8).
// Summed over the reduction that error grows like sqrt(reduction), as |ref|
// itself does for these random operands, so relative to the largest |ref|
// it stays near u (its largest element a few times its spread, as the
// largest |ref| is): 2u covers it with a margin, on top of the FP32 term.
// (The worst case, every error of one sign, would be 2u * reduction times
// the largest |a_k b_k| over |ref|: not what uniform random operands give,
// and tests/test_cuda_gemm_mma.cpp holds the kernels to a per-element bound.)
// A result stored as bfloat16 rounds once more, by at most 2^-9 of itself:
// kBf16Output (2^-8) covers it.
constexpr double kTf32Rounding = 0x1p-10, kBf16Rounding = 0x1p-7, kBf16Output = 0x1p-8;
inline double gemm_rounding(cu::gemm_rungs::Math math) {
  using cu::gemm_rungs::Math;
  return math == Math::kTf32 ? kTf32Rounding : math == Math::kBf16 ? kBf16Rounding : 0.0;
}
inline const char* math_name(cu::gemm_rungs::Math math) {
  using cu::gemm_rungs::Math;
  return math == Math::kFp32 ? "FP32" : math == Math::kTf32 ? "TF32" : "BF16";
}

// bfloat16 on the device, in a DeviceBuffer of floats' room: the values
// rounded to nearest even, and read back as floats.
inline void upload_bf16(DeviceBuffer& d, const std::vector<float>& h) {
  std::vector<anvil::bfloat16> b(h.size());
  for (size_t i = 0; i < h.size(); ++i) b[i] = anvil::bfloat16(h[i]);
  if (d.bytes() < b.size() * sizeof(anvil::bfloat16))
    throw std::logic_error("upload_bf16: the buffer is too small");
  cu::check(cudaMemcpy(d.get(), b.data(), b.size() * sizeof(anvil::bfloat16),
                       cudaMemcpyHostToDevice),
            "cudaMemcpy to device");
}
inline std::vector<float> download_bf16(const DeviceBuffer& d, size_t n) {
  std::vector<anvil::bfloat16> b(n);
  cu::check(cudaMemcpy(b.data(), d.get(), n * sizeof(anvil::bfloat16), cudaMemcpyDeviceToHost),
            "cudaMemcpy to host");
  std::vector<float> h(n);
  for (size_t i = 0; i < n; ++i) h[i] = float(b[i]);
  return h;
}
inline size_t bf16_room(size_t n) { return (n + 1) / 2; }  // floats that hold n bfloat16

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

  // A call slower than kSlowMs (the naive rungs at 4096^3) is timed
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
  // Per convolution, direction and arithmetic, the fastest rung that
  // passed its check (--write-rung-table).
  std::vector<cu::ConvRungEntry> fastest_conv_rungs;
  void keep_if_fastest(cu::ConvRungEntry e);
#if BENCH_CUBLAS
  cublasLtHandle_t cublas_lt{};
#endif
#if BENCH_CUDNN
  cudnnHandle_t cudnn{};
  DeviceBuffer* cudnn_ws = nullptr;
#endif

  void header() const {
    fmt::print("{:<5} {:<46} {:<38} {:>10} {:>10} {:>8}  {}\n", "op", "shape", "impl",
               kSim ? "sim ms" : "ms", "GFLOP/s", "% vendor", "vendor");
  }
  // One timed result. `% vendor` is the baseline's time over this one's (its
  // speed as a share of the baseline's, in the same run and arithmetic);
  // `vendor` names that baseline ("-" on the baseline's own rows, or none).
  void row(const char* op, const std::string& shape, const std::string& impl, double ms,
           double flop, double vendor_ms, const std::string& vendor = "-") const {
    const std::string gflops = kSim ? "-" : fmt::format("{:.1f}", flop / (ms * 1e6));
    const std::string pct =
        kSim || vendor_ms <= 0 ? "-" : fmt::format("{:.1f}", 100.0 * vendor_ms / ms);
    fmt::print("{:<5} {:<46} {:<38} {:>10.4f} {:>10} {:>8}  {}\n", op, shape, impl, ms, gflops,
               pct, vendor_ms <= 0 ? "-" : vendor);
    std::fflush(stdout);
  }
  // Why `got` is not `ref` within tolerance, or "" when it is.
  static std::string mismatch(const std::vector<float>& got, const std::vector<float>& ref,
                              int64_t reduction, double rounding) {
    const double err = relative_error(got, ref), tol = rounding + tolerance(reduction);
    if (err <= tol) return "";
    return fmt::format("relative error {:.3g} > tolerance {:.3g}", err, tol);
  }
  // Compares and reports; true when within tolerance.
  bool verify(const char* op, const std::string& shape, const std::string& impl,
              const std::vector<float>& got, const std::vector<float>& ref, int64_t reduction,
              double rounding = 0.0) {  // the operands' rounding (tensor cores), else 0
    const std::string why = mismatch(got, ref, reduction, rounding);
    if (why.empty()) return true;
    fmt::print("FAIL: {} {} on {}: {}\n", op, impl, shape, why);
    std::fflush(stdout);
    ++failures;
    return false;
  }
  // A vendor baseline that could not be had: named, with every reason.
  void missing(const char* op, const std::string& shape, const std::string& vendor,
               const std::vector<std::string>& reasons) const {
    fmt::print("MISSING: {} {} on {}: none passed verification ({})\n", op, vendor, shape,
               reasons.empty() ? "no algorithm ran" : fmt::format("{}", fmt::join(reasons, "; ")));
    std::fflush(stdout);
  }

  void gemm(int64_t M, int64_t N, int64_t K);
  void conv(const char* name, const Conv2dShape& s);
  void conv_table();
  void channel_sum(const char* name, int64_t outer, int64_t C, int64_t inner);
  void softmax(const char* name, int64_t N, int64_t C);
  void sum(const char* name, int64_t n);
  void batch_norm(const char* name, int64_t N, int64_t C, int64_t HW);
};

// The rungs of a family with `count` this run checks and times.
inline std::vector<int> rungs_of(const Options& opt, int count) {
  if (opt.rung > 0) return {opt.rung};
  if (!opt.rungs.empty()) return opt.rungs;  // main() held them to 1..count
  std::vector<int> all(static_cast<size_t>(count));
  for (int v = 1; v <= count; ++v) all[size_t(v - 1)] = v;
  return all;
}


// A conv shape with a square window and one stride and padding both ways.
inline Conv2dShape conv_shape(int64_t N, int64_t C, int64_t H, int64_t W, int64_t K, int64_t R,
                              int64_t stride, int64_t pad) {
  Conv2dShape s{N, C, H, W, K, R, R, stride, stride, pad, pad, 0, 0};
  s.P = Conv2dShape::out_size(H, R, stride, pad);
  s.Q = Conv2dShape::out_size(W, R, stride, pad);
  return s;
}
#endif  // ANVIL_CUDA_BACKEND

}  // namespace bench_cuda
