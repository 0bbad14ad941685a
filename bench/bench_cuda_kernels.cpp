// bench_cuda_kernels: checks and times every numbered rung of the CUDA
// backend's GEMM and convolution kernels, one kernel at a time (in the manner
// of llm.c's dev/cuda), against the vendor libraries measured in the same run;
// also both rungs of channel_sum (op csum) and of BatchNorm's training
// forward and backward (bnF, bnB) on ResNet-18's shapes (--no-norm skips
// them), memory-bound, so their GFLOP/s column is 0.
//
//   bench_cuda_kernels                         # GEMM 1024, 2048, 4096 + the conv shapes
//   bench_cuda_kernels gemm 3                  # one rung of one ladder (gemm.h, conv.h)
//   bench_cuda_kernels conv                    # every rung of one family
//   bench_cuda_kernels --gemm-sizes 512,1024 --repeats 50 --no-conv
//   bench_cuda_kernels conv --conv-set training  # the training runs' layers only
//   bench_cuda_kernels gemm --rungs 8,12         # some rungs of one family
//   bench_cuda_kernels conv --conv-set training --write-rung-table rung_table.inc
//                                              # the fastest conv rung per layer (rung_table.h)
//   bench_cuda_kernels --smoke                 # tiny shapes: correctness only
// Families: gemm, conv, sum, softmax (softmax cross-entropy forward), csum
// (channel_sum), bn (BatchNorm training).
//
// For each shape: the vendor baselines first, then anvil::cuda rungs
// 1..kGemmRungs and 1..kConvRungs. Every result (the vendor's too) is
// first compared with the CPU kernel (anvil::cpu::gemm / conv2d_*); a wrong
// rung is reported by name (a FAIL line), is not timed, and makes the
// exit status 1. Timing: --warmup calls, then --repeats calls each between
// two CUDA events on one stream (3 calls, after one warm-up, for a rung
// whose first call takes over 100 ms); the median is reported as ms,
// GFLOP/s (2*M*N*K; 2*N*K*C*R*S*P*Q for every conv direction) and as a
// percentage of the vendor's time in the same arithmetic (vendor ms / ours
// ms), with the baseline it was taken from named in the last column.
//
// The baselines, each in one arithmetic (gemm.cpp and conv.cpp say more):
// cuBLAS in FP32 (no TF32), TF32 on float32 operands and BF16 on bfloat16
// operands (cuBLASLt); cuDNN forward, backward-data and
// backward-filter in FP32 (CUDNN_FMA_MATH), TF32 (CUDNN_TENSOR_OP_MATH) and
// BF16 (bfloat16 tensors), NCHW and NHWC. Each is the fastest algorithm
// that passes the same check: an algorithm that fails it is named on a
// REJECTED line and the next one is taken; a baseline none passes is a
// MISSING line with every reason. Our forward and backward-weight are timed
// without bias / bias gradient, as cuDNN's calls compute neither (both are
// checked with them).
//
// Conv shapes (--conv-set): the training runs' own convolutions, every
// distinct one of ResNet-18 at 28x28 (stride 2 and the 1x1 shortcuts
// included) and LeNet's two, at batch 256; and the 3x3 stages of ResNet-18
// on 96x96 inputs at batch 128 (bench/cuda_kernels/conv.cpp lists them).
//
// Baselines exist only in a real CUDA build (ANVIL_BENCH_CUBLAS / _CUDNN, set
// by CMake when it finds the libraries). A simulator build (or --smoke) runs
// tiny shapes as a smoke test; simulator times are not GPU times. Without a
// device (or in a CPU-only build) it prints one line and exits 0, or 1 in a
// CUDA build under ANVIL_REQUIRE_CUDA=1 (the GPU check's: no passing by skipping).
#include <fstream>

#include <CLI/CLI.hpp>

#include "bench/cuda_kernels/bench.h"

namespace bench_cuda {
#if defined(ANVIL_CUDA_BACKEND)

// The families a run names, and how many rungs each has.
struct Family {
  const char* name;
  int rungs;
};
const Family kFamilies[] = {{"gemm", cu::kGemmRungs},
                            {"conv", cu::kConvRungs},
                            {"softmax", cu::kSoftmaxRungs},
                            {"sum", cu::kSumRungs},
                            {"csum", cu::kChannelSumRungs},
                            {"bn", cu::kBatchNormRungs}};

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
    fmt::print("simulator build: smoke test of every rung on tiny shapes; times are "
               "simulator, not GPU time, and make no performance claim\n");
  else if (smoke)
    fmt::print("--smoke: tiny shapes, correctness first; times are too short to mean much\n");
  fmt::print("timing: {} warm-up + median of {} calls, CUDA events\n", opt.warmup, opt.repeats);
#if BENCH_CUBLAS
  check_cublas(cublasLtCreate(&b.cublas_lt), "cublasLtCreate");
  fmt::print("GEMM baselines: cuBLAS {}, the fastest of cuBLASLt's heuristic candidates that "
             "passes the check: FP32 (CUBLAS_COMPUTE_32F on float32), TF32 "
             "(CUBLAS_COMPUTE_32F_FAST_TF32 on float32), BF16 (CUBLAS_COMPUTE_32F on "
             "bfloat16 A, B); C float32\n",
             cublasLtGetVersion());
#elif !defined(ANVIL_CUDA_SIM)
  fmt::print("GEMM baseline: none (cuBLAS not linked)\n");
#endif
#if BENCH_CUDNN
  check_cudnn(cudnnCreate(&b.cudnn), "cudnnCreate");
  check_cudnn(cudnnSetStream(b.cudnn, b.stream), "cudnnSetStream");
  DeviceBuffer cudnn_ws(size_t{256} << 20);  // 1 GiB of workspace for cudnnFind*Ex
  b.cudnn_ws = &cudnn_ws;
  fmt::print("conv baselines: cuDNN {}, the fastest algorithm of cudnnFind*AlgorithmEx that "
             "passes the check, FP32 (CUDNN_FMA_MATH), TF32 (CUDNN_TENSOR_OP_MATH) and BF16 "
             "(bfloat16 tensors, float32 accumulation), NCHW and NHWC; a rung's baseline is the "
             "faster layout\n",
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
      b.gemm(40, 24, 600);  // one tile, a long K: rung 8 splits it
    } else {
      for (int64_t n : opt.gemm_sizes) b.gemm(n, n, n);
      b.gemm(128, 128, 1 << 16);  // one tile, a long K: rung 8 splits it
    }
  }
  if (wanted("conv", opt.no_conv)) {
    if (smoke) {
      b.conv("tiny", conv_shape(2, 3, 8, 8, 4, 3, 1, 1));
      b.conv("tiny", conv_shape(2, 4, 7, 7, 6, 5, 1, 0));
      b.conv("tiny s2", conv_shape(2, 5, 9, 9, 8, 3, 2, 1));
      b.conv("tiny split-K", conv_shape(4, 3, 12, 12, 8, 3, 1, 1));  // rung 5 splits dW
    } else {
      b.conv_table();
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
  check_cublas(cublasLtDestroy(b.cublas_lt), "cublasLtDestroy");
#endif
  cu::check(cudaStreamDestroy(b.stream), "cudaStreamDestroy");
  if (!opt.rung_table.empty()) {
    std::ofstream out(opt.rung_table);
    cu::write_conv_rung_table(out, b.fastest_conv_rungs,
                              fmt::format("{} (sm_{}{}){}, {} entries", prop.name, prop.major,
                                          prop.minor, kSim ? ", simulated: no timing claim" : "",
                                          b.fastest_conv_rungs.size()));
    if (!out.flush())
      throw std::runtime_error("--write-rung-table " + opt.rung_table + ": cannot write");
    fmt::print("conv rung table ({} entries): {}\n", b.fastest_conv_rungs.size(),
               opt.rung_table);
  }
  if (b.failures > 0) {
    fmt::print("\n{} result(s) differ from the CPU kernels (see FAIL lines)\n", b.failures);
    return 1;
  }
  fmt::print("\nall results match the CPU kernels\n");
  return 0;
}
#endif  // ANVIL_CUDA_BACKEND

}  // namespace bench_cuda

using namespace bench_cuda;

int main(int argc, char** argv) {
  Options opt;
  CLI::App app{"Checks and times the CUDA GEMM and conv kernel rungs against cuBLAS/cuDNN"};
  app.add_option("--gemm-sizes", opt.gemm_sizes, "square GEMM sizes")->delimiter(',');
  app.add_option("--warmup", opt.warmup, "untimed calls before timing")->check(CLI::NonNegativeNumber);
  app.add_option("--repeats", opt.repeats, "timed calls (median reported)")->check(CLI::PositiveNumber);
  app.add_option("--device", opt.device, "CUDA device");
  app.add_option("--seed", opt.seed, "seed of the random inputs");
  app.add_flag("--smoke", opt.smoke, "tiny shapes: a correctness smoke test");
  app.add_flag("--no-gemm", opt.no_gemm, "skip the GEMM shapes");
  app.add_flag("--no-conv", opt.no_conv, "skip the conv shapes");
  app.add_flag("--no-norm", opt.no_norm, "skip the sum, softmax, channel-sum and BatchNorm shapes");
  app.add_option("--conv-set", opt.conv_set,
                 "conv shapes: training (the training runs' layers), resnet18-96, or all")
      ->check(CLI::IsMember({"training", "resnet18-96", "all"}));
  app.add_option("--rungs", opt.rungs, "these rungs of the named family only, e.g. 8,9,10,11,12")
      ->delimiter(',');
  app.add_option("--write-rung-table", opt.rung_table,
                 "write the conv rungs measured fastest per shape, direction and arithmetic to "
                 "this file (kernels/cuda/conv/rung_table.inc's form)");
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
    auto refuse = [&](int r) {
      std::fprintf(stderr, "bench_cuda_kernels: %s has rungs 1 to %d, not %d\n", f->name,
                   f->rungs, r);
      return 2;
    };
    if (opt.rung < 0 || opt.rung > f->rungs) return refuse(opt.rung);
    for (int r : opt.rungs)
      if (r < 1 || r > f->rungs) return refuse(r);
    if (opt.rung > 0 && !opt.rungs.empty()) {
      std::fprintf(stderr, "bench_cuda_kernels: name one rung or --rungs, not both\n");
      return 2;
    }
  } else if (!opt.rungs.empty()) {
    std::fprintf(stderr, "bench_cuda_kernels: --rungs needs a family (gemm, conv, ...)\n");
    return 2;
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
