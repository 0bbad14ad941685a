// bench_cuda_kernels' GEMM family: every rung checked against the CPU, then
// timed beside cuBLAS in the same arithmetic, measured in the same run:
//   FP32  float32 A and B, CUBLAS_COMPUTE_32F (no TF32): SGEMM
//   TF32  float32 A and B, CUBLAS_COMPUTE_32F_FAST_TF32
//   BF16  bfloat16 A and B (CUDA_R_16BF in memory, as a BF16 GEMM reads
//         them), CUBLAS_COMPUTE_32F (float32 accumulation)
// C is float32 throughout, as anvil's rungs write it. The BF16 rungs are
// timed twice: on float32 operands (each rung rounds them as it loads) and
// on bfloat16 operands, as autocast hands them over; both against the one
// BF16 baseline, which reads bfloat16.
//
// Each baseline is the fastest cuBLAS kernel that passes the check: the
// candidates cuBLASLt's heuristic offers for the problem (up to 8, with a
// 64 MiB workspace; its first is what cublasGemmEx would run), each timed,
// then checked fastest first; one that fails is named on a REJECTED line
// and the next is taken; if none passes, a MISSING line gives the reasons.
#include "bench/cuda_kernels/bench.h"

#include <memory>

#if defined(ANVIL_CUDA_BACKEND)
namespace bench_cuda {

#if BENCH_CUBLAS
// Row-major C[M, N] = A[M, K] B[K, N] as cuBLASLt's column-major
// C^T[N, M] = B^T[N, K] A^T[K, M], and the heuristic's candidates for it.
class LtGemm {
 public:
  std::vector<cublasLtMatmulHeuristicResult_t> found;

  LtGemm(cublasLtHandle_t lt, int64_t M, int64_t N, int64_t K, cudaDataType_t operands,
         cublasComputeType_t compute, size_t workspace_bytes)
      : lt_(lt) {
    check_cublas(cublasLtMatmulDescCreate(&op_, compute, CUDA_R_32F), "cublasLtMatmulDescCreate");
    check_cublas(cublasLtMatrixLayoutCreate(&first_, operands, uint64_t(N), uint64_t(K), N),
                 "cublasLtMatrixLayoutCreate(B^T)");
    check_cublas(cublasLtMatrixLayoutCreate(&second_, operands, uint64_t(K), uint64_t(M), K),
                 "cublasLtMatrixLayoutCreate(A^T)");
    check_cublas(cublasLtMatrixLayoutCreate(&c_, CUDA_R_32F, uint64_t(N), uint64_t(M), N),
                 "cublasLtMatrixLayoutCreate(C^T)");
    cublasLtMatmulPreference_t pref{};
    check_cublas(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate");
    const cublasStatus_t st = cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes, sizeof(workspace_bytes));
    constexpr int kCandidates = 8;
    found.resize(kCandidates);
    int returned = 0;
    cublasStatus_t hst = st;
    if (st == CUBLAS_STATUS_SUCCESS)
      hst = cublasLtMatmulAlgoGetHeuristic(lt_, op_, first_, second_, c_, c_, pref, kCandidates,
                                           found.data(), &returned);
    (void)cublasLtMatmulPreferenceDestroy(pref);
    check_cublas(st, "cublasLtMatmulPreferenceSetAttribute");
    // NOT_SUPPORTED: no candidate at all, which the caller reports as missing.
    if (hst != CUBLAS_STATUS_NOT_SUPPORTED) check_cublas(hst, "cublasLtMatmulAlgoGetHeuristic");
    found.resize(size_t(std::max(returned, 0)));
    std::erase_if(found, [](const auto& r) { return r.state != CUBLAS_STATUS_SUCCESS; });
  }
  ~LtGemm() {
    (void)cublasLtMatrixLayoutDestroy(c_);
    (void)cublasLtMatrixLayoutDestroy(second_);
    (void)cublasLtMatrixLayoutDestroy(first_);
    (void)cublasLtMatmulDescDestroy(op_);
  }
  LtGemm(const LtGemm&) = delete;
  LtGemm& operator=(const LtGemm&) = delete;

  // C^T = B^T A^T with candidate `i` (b, a: the row-major B and A).
  void run(int i, const void* b, const void* a, float* c, void* workspace,
           cudaStream_t stream) const {
    const float one = 1.0f, zero = 0.0f;
    const auto& r = found[size_t(i)];
    check_cublas(cublasLtMatmul(lt_, op_, &one, b, first_, a, second_, &zero, c, c_, c, c_,
                                &r.algo, workspace, r.workspaceSize, stream),
                 "cublasLtMatmul");
  }
  // The candidate's algorithm id (CUBLASLT_ALGO_CONFIG_ID), -1 if unknown.
  int algo_id(int i) const {
    int id = -1;
    size_t written = 0;
    if (cublasLtMatmulAlgoConfigGetAttribute(&found[size_t(i)].algo, CUBLASLT_ALGO_CONFIG_ID, &id,
                                             sizeof(id), &written) != CUBLAS_STATUS_SUCCESS)
      return -1;
    return id;
  }

 private:
  cublasLtHandle_t lt_;
  cublasLtMatmulDesc_t op_{};
  cublasLtMatrixLayout_t first_{}, second_{}, c_{};
};
#endif

void Bench::gemm(int64_t M, int64_t N, int64_t K) {
  using cu::gemm_rungs::Math;
  std::mt19937_64 rng(opt.seed + uint64_t(M * 31 + N * 7 + K));
  const std::vector<float> a = random_vector(size_t(M * K), rng);
  const std::vector<float> b = random_vector(size_t(K * N), rng);
  std::vector<float> ref(size_t(M * N));
  cpu::gemm(false, false, M, N, K, 1.0f, a.data(), K, b.data(), N, 0.0f, ref.data(), N);
  DeviceBuffer da(a.size()), db(b.size()), dc(ref.size());
  da.upload(a);
  db.upload(b);
  // The same draws as bfloat16 (rounded to nearest even): the BF16 baseline's
  // operands, and those of the rungs that read bfloat16 as stored.
  DeviceBuffer da16(bf16_room(a.size())), db16(bf16_room(b.size()));
  upload_bf16(da16, a);
  upload_bf16(db16, b);
  // The most any rung needs for these operands, float32 or bfloat16 (with
  // room for the aligned copies of rungs 11 and 12).
  size_t ws_floats = 0;
  const auto* a16 = reinterpret_cast<const anvil::bfloat16*>(da16.get());
  const auto* b16 = reinterpret_cast<const anvil::bfloat16*>(db16.get());
  for (int v = 1; v <= cu::kGemmRungs; ++v)
    ws_floats = std::max({ws_floats,
                          cu::gemm_workspace_floats(v, false, false, M, N, K, da.get(), K,
                                                    db.get(), N),
                          cu::gemm_workspace_floats(v, false, false, M, N, K, a16, K, b16, N)});
  DeviceBuffer dws(ws_floats);
  const std::string shape = fmt::format("{}x{}x{} (MxNxK)", M, N, K);
  const double flop = 2.0 * double(M) * double(N) * double(K);
  double vendor_ms[3] = {kNoVendor, kNoVendor, kNoVendor};  // by Math
  const char* const vendor_name[3] = {"cuBLAS-FP32", "cuBLAS-TF32", "cuBLAS-BF16"};
#if BENCH_CUBLAS
  struct Vendor {
    Math math;
    cudaDataType_t operands;
    cublasComputeType_t compute;
  };
  const Vendor vendors[] = {{Math::kFp32, CUDA_R_32F, CUBLAS_COMPUTE_32F},
                            {Math::kTf32, CUDA_R_32F, CUBLAS_COMPUTE_32F_FAST_TF32},
                            {Math::kBf16, CUDA_R_16BF, CUBLAS_COMPUTE_32F}};
  DeviceBuffer lt_ws(size_t{16} << 20);  // 64 MiB
  for (const Vendor& vd : vendors) {
    const bool bf16 = vd.operands == CUDA_R_16BF;
    const std::string vendor = fmt::format("cuBLAS {}", math_name(vd.math));
    std::unique_ptr<LtGemm> made;
    try {  // a problem cuBLASLt refuses is a missing baseline, not the benchmark's end
      made = std::make_unique<LtGemm>(cublas_lt, M, N, K, vd.operands, vd.compute, lt_ws.bytes());
    } catch (const std::exception& e) {
      missing("gemm", shape, vendor, {e.what()});
      continue;
    }
    const LtGemm& lt = *made;
    const void* pa = bf16 ? da16.get() : da.get();
    const void* pb = bf16 ? db16.get() : db.get();
    struct Timed {
      int rank;
      double ms;
    };
    std::vector<Timed> timed;
    std::vector<std::string> reasons;
    for (int i = 0; i < int(lt.found.size()); ++i) {
      try {
        auto call = [&] { lt.run(i, pb, pa, dc.get(), lt_ws.get(), stream); };
        timed.push_back({i, timer->median_ms(call)});
      } catch (const std::exception& e) {  // a candidate that does not run is passed over
        reasons.push_back(fmt::format("heuristic {}: {}", i, e.what()));
      }
    }
    std::sort(timed.begin(), timed.end(),
              [](const Timed& x, const Timed& y) { return x.ms < y.ms; });
    bool passed = false;
    for (const Timed& t : timed) {
      const std::string impl =
          fmt::format("{} heuristic {} (algo {})", vendor, t.rank, lt.algo_id(t.rank));
      std::string why;
      try {
        dc.poison(stream);
        lt.run(t.rank, pb, pa, dc.get(), lt_ws.get(), stream);
        why = mismatch(dc.download(), ref, K, gemm_rounding(vd.math));
      } catch (const std::exception& e) {
        why = e.what();
      }
      if (!why.empty()) {
        fmt::print("REJECTED: gemm {} on {}: {}; the next is tried\n", impl, shape, why);
        reasons.push_back(fmt::format("heuristic {}: {}", t.rank, why));
        continue;
      }
      vendor_ms[int(vd.math)] = t.ms;
      row("gemm", shape, impl, t.ms, flop, t.ms);
      passed = true;
      break;
    }
    if (!passed) missing("gemm", shape, vendor, reasons);
  }
#endif
  for (int v : rungs_of(opt, cu::kGemmRungs)) {
    const auto& rung = cu::gemm_rungs::kRungs[v - 1];
    const std::string impl = fmt::format("v{} {}", v, rung.name);
    auto call = [&] {
      cu::gemm(v, false, false, M, N, K, 1.0f, da.get(), K, db.get(), N, 0.0f, dc.get(), N,
               dws.get(), stream);
    };
    dc.poison(stream);
    call();
    if (!verify("gemm", shape, impl, dc.download(), ref, K, gemm_rounding(rung.math))) continue;
    const int m = int(rung.math);
    row("gemm", shape, impl, timer->median_ms(call), flop, vendor_ms[m], vendor_name[m]);
  }
  // The rungs that read bfloat16 operands (10, 12) again on bfloat16 A and B
  // (the draws rounded, half the bytes), as autocast hands them to the
  // backend: rung 12 reads only these (float32 operands run rung 10).
  for (int v : rungs_of(opt, cu::kGemmRungs)) {
    const auto& rung = cu::gemm_rungs::kRungs[v - 1];
    if (rung.launch_bf16 == nullptr) continue;
    const std::string impl = fmt::format("v{} {}, bf16 in memory", v, rung.name);
    auto call = [&] {
      cu::gemm(v, false, false, M, N, K, 1.0f, a16, K, b16, N, 0.0f, dc.get(), N, dws.get(),
               stream);
    };
    dc.poison(stream);
    call();
    if (!verify("gemm", shape, impl, dc.download(), ref, K, gemm_rounding(rung.math))) continue;
    const int m = int(rung.math);
    row("gemm", shape, impl, timer->median_ms(call), flop, vendor_ms[m], vendor_name[m]);
  }
}

}  // namespace bench_cuda
#endif  // ANVIL_CUDA_BACKEND
