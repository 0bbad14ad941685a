// bench_cuda_kernels' GEMM and convolution families: every rung checked
// against the CPU, then timed beside the vendor in the same arithmetic
// (cuBLAS SGEMM / TF32 / BF16; cuDNN's fastest FP32 and TF32 algorithms).
#include "bench/cuda_kernels/bench.h"

#if defined(ANVIL_CUDA_BACKEND)
namespace bench_cuda {

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
  // The rungs that read bfloat16 operands (10, 12) again on bfloat16 A and B
  // (the draws rounded, half the bytes), as autocast hands them to the
  // backend: rung 12 reads only these (float32 operands run rung 10).
  std::vector<anvil::bfloat16> a16, b16;
  for (float x : a) a16.push_back(anvil::bfloat16(x));
  for (float x : b) b16.push_back(anvil::bfloat16(x));
  DeviceBuffer da16((a16.size() + 1) / 2), db16((b16.size() + 1) / 2);  // floats' room
  cu::check(cudaMemcpy(da16.get(), a16.data(), a16.size() * 2, cudaMemcpyHostToDevice),
            "cudaMemcpy to device");
  cu::check(cudaMemcpy(db16.get(), b16.data(), b16.size() * 2, cudaMemcpyHostToDevice),
            "cudaMemcpy to device");
  const auto* pa16 = reinterpret_cast<const anvil::bfloat16*>(da16.get());
  const auto* pb16 = reinterpret_cast<const anvil::bfloat16*>(db16.get());
  for (int v : rungs_of(opt, cu::kGemmVariants)) {
    const auto& rung = cu::gemm_rungs::kRungs[v - 1];
    if (rung.launch_bf16 == nullptr) continue;
    const std::string impl = fmt::format("v{} {}, bf16 in memory", v, rung.name);
    auto call = [&] {
      cu::gemm(v, false, false, M, N, K, 1.0f, pa16, K, pb16, N, 0.0f, dc.get(), N, dws.get(),
               stream);
    };
    dc.poison(stream);
    call();
    if (!verify("gemm", shape, impl, dc.download(), ref, K, gemm_rounding(rung.math))) continue;
    row("gemm", shape, impl, timer->median_ms(call), flop, vendor_ms[int(rung.math)]);
  }
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
// The fastest algorithm that ran (Find sorts by time): for the FP32 baseline
// one without tensor-op math; for the TF32 baseline any but those that
// convert FP32 down to FP16.
template <typename Perf>
const Perf* fastest(const Perf* perfs, int count, bool tensor_ops) {
  for (int i = 0; i < count; ++i)
    if (perfs[i].status == CUDNN_STATUS_SUCCESS &&
        perfs[i].mathType != CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION &&
        (tensor_ops || perfs[i].mathType != CUDNN_TENSOR_OP_MATH))
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
        if (const auto* p = fastest(perfs, found, tf32 == 1))
          algo = int(p->algo), algo_ws = p->memory;
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
      const cu::gemm_rungs::Math math = cu::conv_rungs::rung(v).math;
      const double rounding = gemm_rounding(math);
      bool ok = verify(op, shape, impl, out.download(), *refs[dir], reductions[dir], rounding);
      if (ok && dir == kBackwardWeight)
        ok = verify("bwdW", shape, impl + " dbias", d_db.download(), db_ref, s.N * s.P * s.Q);
      if (ok)
        // (No cuDNN BF16 baseline: it would take BF16 tensors in memory.)
        row(op, shape, impl, timer->median_ms([&] { call(false); }), flop,
            math == cu::gemm_rungs::Math::kBf16 ? kNoVendor : vendor_ms[int(math)]);
    }
  }
}

}  // namespace bench_cuda
#endif  // ANVIL_CUDA_BACKEND
