// bench_cpu_gemm: GFLOP/s of the CPU's GEMMs on the shapes ResNet-18's
// convolutions give them (im2col at batch 256, 28x28 inputs), anvil against
// PyTorch in the same run:
//   anvil FP32   cpu::gemm (OpenBLAS SGEMM), what FP32 convolutions call
//   anvil BF16   cpu::gemm_bf16 on bfloat16 values (AVX-512 BF16 where the
//                CPU has it, else SGEMM), what --amp bf16 calls
//   torch FP32 / torch BF16   torch.mm on float32 / bfloat16 tensors
//
//   bench_cpu_gemm                         # 2 threads, the default shapes
//   bench_cpu_gemm --threads 1 --shapes 512x512x512,64x4096x576
//   bench_cpu_gemm --no-torch
//
// Each row times --repeats windows of at least --seconds each and prints the
// best; the ratios divide anvil BF16 by each other column.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "core/bfloat16.h"
#include "kernels/cpu/cpu_kernels.h"

using namespace anvil;

namespace {

struct Shape {
  int64_t M, N, K;
};

// The M x N x K of ResNet-18's 3x3 convolutions at 28x28 (forward,
// backward-data, backward-weight; one chunk of images), and a square; timed
// without transposes.
const char* kDefaultShapes = "64x4096x576,128x1024x1152,256x512x2304,576x4096x64,128x1152x4096,"
                             "512x512x512";

std::vector<Shape> parse_shapes(const std::string& text) {
  std::vector<Shape> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    Shape s{};
    if (std::sscanf(item.c_str(), "%ldx%ldx%ld", &s.M, &s.N, &s.K) != 3 || s.M <= 0 || s.N <= 0 ||
        s.K <= 0)
      throw CLI::ValidationError("--shapes", "'" + item + "' is not MxNxK");
    out.push_back(s);
  }
  return out;
}

template <class F>
double best_seconds(F&& f, int repeats, double window) {
  f();
  double best = 1e30;
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    int calls = 0;
    double el = 0;
    do {
      f();
      ++calls;
      el = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    } while (el < window);
    best = std::min(best, el / calls);
  }
  return best;
}

// torch.mm's GFLOP/s per shape and dtype, or empty when PyTorch is missing.
std::vector<std::pair<double, double>> torch_gflops(const std::string& python,
                                                    const std::vector<Shape>& shapes,
                                                    int threads, int repeats, double window) {
  std::string list;
  for (const Shape& s : shapes) list += fmt::format("({},{},{}),", s.M, s.N, s.K);
  const std::string script = fmt::format(
      "import time,torch\n"
      "torch.set_num_threads({})\n"
      "def best(f):\n"
      "  f(); b=1e30\n"
      "  for _ in range({}):\n"
      "    t=time.perf_counter(); n=0\n"
      "    while True:\n"
      "      f(); n+=1; e=time.perf_counter()-t\n"
      "      if e>={}: break\n"
      "    b=min(b,e/n)\n"
      "  return b\n"
      "for M,N,K in [{}]:\n"
      "  r=[]\n"
      "  for dt in (torch.float32, torch.bfloat16):\n"
      "    a=torch.rand(M,K).to(dt); b=torch.rand(K,N).to(dt)\n"
      "    r.append(2*M*N*K/best(lambda: torch.mm(a,b))/1e9)\n"
      "  print(r[0], r[1])\n",
      threads, repeats, window, list);
  const std::string cmd = python + " -c '" + script + "' 2>/dev/null";
  std::vector<std::pair<double, double>> out;
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return out;
  double f32 = 0, b16 = 0;
  while (std::fscanf(p, "%lf %lf", &f32, &b16) == 2) out.push_back({f32, b16});
  if (pclose(p) != 0 || out.size() != shapes.size()) out.clear();
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"bench_cpu_gemm: GFLOP/s of anvil's FP32 and BF16 CPU GEMMs against torch.mm"};
  std::string shapes_text = kDefaultShapes, python = "/usr/bin/python3";
  int threads = 2, repeats = 3;
  double window = 0.3;
  bool no_torch = false;
  app.add_option("--shapes", shapes_text, "Comma-separated MxNxK list")->capture_default_str();
  app.add_option("--threads", threads, "OpenMP (and OpenBLAS, torch) threads")
      ->capture_default_str()
      ->check(CLI::Range(1, 1024));
  app.add_option("--repeats", repeats, "Timed windows per row; the best is printed")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000));
  app.add_option("--seconds", window, "Length of one timed window")
      ->capture_default_str()
      ->check(CLI::Range(0.01, 60.0));
  app.add_option("--python", python, "Python interpreter with torch")->capture_default_str();
  app.add_flag("--no-torch", no_torch, "Do not run the PyTorch comparison");
  CLI11_PARSE(app, argc, argv);
  std::vector<Shape> shapes;
  try {
    shapes = parse_shapes(shapes_text);
  } catch (const CLI::Error& e) {
    return app.exit(e);
  }
  omp_set_num_threads(threads);
  std::printf("bench_cpu_gemm: %d thread(s); anvil BF16 on %s\n", threads,
              cpu::bf16_dot_enabled() ? "AVX-512 BF16 (VDPBF16PS)"
                                      : "SGEMM (no AVX-512 BF16, or ANVIL_CPU_BF16=off)");
  const auto torch = no_torch ? std::vector<std::pair<double, double>>{}
                              : torch_gflops(python, shapes, threads, repeats, window);
  if (!no_torch && torch.empty()) std::printf("pytorch: not run (no torch in %s)\n", python.c_str());
  std::printf("%-18s %10s %10s %10s %10s %12s %12s\n", "M x N x K", "anvil FP32", "anvil BF16",
              "torch FP32", "torch BF16", "BF16/FP32", "BF16/torch");
  std::mt19937 gen(1);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  for (size_t i = 0; i < shapes.size(); ++i) {
    const Shape s = shapes[i];
    std::vector<float> A(size_t(s.M * s.K)), B(size_t(s.K * s.N)), C(size_t(s.M * s.N));
    for (float& x : A) x = bf16_bits_to_float(float_to_bf16_bits(d(gen)));
    for (float& x : B) x = bf16_bits_to_float(float_to_bf16_bits(d(gen)));
    const double flop = 2.0 * double(s.M) * double(s.N) * double(s.K);
    const double f32 = flop / 1e9 / best_seconds([&] {
      cpu::gemm(false, false, s.M, s.N, s.K, 1.0f, A.data(), s.K, B.data(), s.N, 0.0f, C.data(),
                s.N);
    }, repeats, window);
    const double b16 = flop / 1e9 / best_seconds([&] {
      cpu::gemm_bf16(false, false, s.M, s.N, s.K, 1.0f, A.data(), s.K, B.data(), s.N, 0.0f,
                     C.data(), s.N);
    }, repeats, window);
    const std::string name = fmt::format("{}x{}x{}", s.M, s.N, s.K);
    if (torch.empty()) {
      std::printf("%-18s %10.1f %10.1f %10s %10s %11.2fx %12s\n", name.c_str(), f32, b16, "-", "-",
                  b16 / f32, "-");
    } else {
      std::printf("%-18s %10.1f %10.1f %10.1f %10.1f %11.2fx %11.2fx\n", name.c_str(), f32, b16,
                  torch[i].first, torch[i].second, b16 / f32, b16 / torch[i].second);
    }
  }
  return 0;
}
