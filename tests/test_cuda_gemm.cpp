// kernels/cuda GEMM (kernels/cuda/gemm/): every FP32 rung, every transpose
// combination, ragged shapes and padded row strides against the CPU GEMM;
// argument checks. The tensor-core rungs (after kGemmFp32Rungs) cannot
// meet these FP32 tolerances: test_cuda_gemm_mma.cpp tests them with
// bounds derived for their rounding.
// Runs on the simulator (ANVIL_CUDA=SIM) or on a real GPU when there is one.
#if defined(ANVIL_CUDA_BACKEND)
#include <catch2/catch.hpp>
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/gemm/split_k.h"
#include "tests/cuda_test_util.h"

namespace {

using Vec = std::vector<float>;
using cuda_test::DeviceBuffer;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kSentinel = 12345.0f;  // C's padding: must come back untouched

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kSanitizerBuild = true;
#else
constexpr bool kSanitizerBuild = false;
#endif

// A rows x cols matrix stored with row stride ld; the padding holds `pad`.
Vec strided_random(int64_t rows, int64_t cols, int64_t ld, uint32_t seed, float pad) {
  Vec dense = cuda_test::random_floats(size_t(rows * cols), seed);
  Vec v(size_t(rows * ld), pad);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) v[size_t(r * ld + c)] = dense[size_t(r * cols + c)];
  return v;
}

Vec replace_padding(Vec v, int64_t rows, int64_t cols, int64_t ld, float pad) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = cols; c < ld; ++c) v[size_t(r * ld + c)] = pad;
  return v;
}

}  // namespace

TEST_CASE("cuda gemm: every FP32 rung and transpose matches the CPU GEMM on ragged shapes",
          "[cuda][gemm]") {
  if (!cuda_test::have_device()) return;
  struct Shape {
    int64_t M, N, K;
    float alpha, beta;
  };
  const Shape shapes[] = {{1, 1, 1, 1.0f, 0.0f},       {7, 5, 3, 1.0f, 0.0f},
                          {33, 65, 17, 0.5f, -1.5f},   {64, 64, 64, 1.0f, 1.0f},
                          {100, 37, 129, -2.0f, 0.25f}, {3, 70, 0, 1.0f, 2.0f},
                          {5, 9, 0, 1.0f, 0.0f}};
  int checked = 0;
  for (int rung = 1; rung <= anvil::cuda::kGemmFp32Rungs; ++rung) {
    for (int t = 0; t < 4; ++t) {
      const bool ta = t & 1, tb = t & 2;
      for (const Shape& s : shapes) {
        for (int64_t pad : {0, 3}) {
          INFO("rung " << rung << ", trans_a " << ta << ", trans_b " << tb << ", "
                          << s.M << "x" << s.N << "x" << s.K << ", alpha " << s.alpha
                          << ", beta " << s.beta << ", ld padding " << pad);
          // Stored shapes: A is M x K (K x M when transposed), B K x N (N x K).
          const int64_t a_rows = ta ? s.K : s.M, a_cols = ta ? s.M : s.K;
          const int64_t b_rows = tb ? s.N : s.K, b_cols = tb ? s.K : s.N;
          const int64_t lda = a_cols + pad, ldb = b_cols + pad, ldc = s.N + pad;
          // The device gets NaN in A's and B's padding (a kernel reading it
          // would spread NaN); the CPU reference gets zeros there.
          Vec A = strided_random(a_rows, a_cols, lda, 1, kNaN);
          Vec B = strided_random(b_rows, b_cols, ldb, 2, kNaN);
          Vec C = strided_random(s.M, s.N, ldc, 3, kSentinel);
          // beta == 0 must not read C: NaN there would leak into the result.
          if (s.beta == 0.0f) C = replace_padding(Vec(C.size(), kNaN), s.M, s.N, ldc, kSentinel);
          Vec ref = C;
          const Vec A0 = replace_padding(A, a_rows, a_cols, lda, 0.0f);
          const Vec B0 = replace_padding(B, b_rows, b_cols, ldb, 0.0f);
          anvil::cpu::gemm(ta, tb, s.M, s.N, s.K, s.alpha, A0.data(), lda, B0.data(), ldb,
                           s.beta, ref.data(), ldc);
          DeviceBuffer<float> dA(A), dB(B), dC(C);
          anvil::cuda::gemm(rung, ta, tb, s.M, s.N, s.K, s.alpha, dA.ptr, lda, dB.ptr, ldb,
                            s.beta, dC.ptr, ldc, nullptr);
          const Vec got = dC.to_host();
          REQUIRE(got.size() == ref.size());
          for (size_t i = 0; i < got.size(); ++i) {
            const int64_t r = int64_t(i) / ldc, c = int64_t(i) % ldc;
            INFO("C[" << r << "," << c << "]: got " << got[i] << ", want " << ref[i]);
            if (c >= s.N) {
              REQUIRE(got[i] == kSentinel);  // padding of C is never written
            } else {
              REQUIRE(std::fabs(got[i] - ref[i]) <= 1e-4f * std::max(1.0f, std::fabs(ref[i])));
            }
          }
          ++checked;
        }
      }
    }
  }
  REQUIRE(checked == anvil::cuda::kGemmFp32Rungs * 4 * 7 * 2);
}

TEST_CASE("cuda gemm: the tiled FP32 rungs on shapes of several tiles, with and without 16-byte "
          "alignment", "[cuda][gemm]") {
  if (!cuda_test::have_device()) return;
  // Rungs 3-7 on results of several 64x64 and 128x128 tiles, ragged at
  // the far edges (K = 75 also leaves a partial last step of 8 and of 16).
  // Row strides rounded up to a multiple of 4 floats, from a 16-byte aligned
  // base, let rungs 5-7 use 16-byte loads and stores; the quads that
  // cross the edge of a ragged dimension must still be read as scalars (the
  // rest of such a quad is padding, NaN here). An odd stride, or a base one
  // float past a 16-byte boundary, must fall back to scalars everywhere: the
  // simulator fails a launch whose 16-byte access is misaligned, as a GPU
  // faults.
  struct Shape {
    int64_t M, N, K;
  };
  const Shape shapes[] = {{260, 136, 72}, {131, 257, 75}};
  struct Layout {
    const char* name;
    int64_t (*ld)(int64_t cols);  // the row stride for a row of `cols`
    size_t offset;                // floats from the allocation's 16-byte aligned start
  };
  const auto round4 = [](int64_t cols) { return (cols + 3) / 4 * 4 + 4; };
  const Layout layouts[] = {{"strides multiple of 4", round4, 0},
                            {"odd strides", [](int64_t cols) { return cols | 1; }, 0},
                            {"base 4 bytes past 16", round4, 1}};
  const float alpha = 1.5f, beta = -0.5f;
  for (int rung = 3; rung <= anvil::cuda::kGemmFp32Rungs; ++rung) {
    for (int t = 0; t < 4; ++t) {
      const bool ta = t & 1, tb = t & 2;
      for (const Shape& s : shapes) {
        for (const Layout& lay : layouts) {
          INFO("rung " << rung << ", trans_a " << ta << ", trans_b " << tb << ", " << s.M
                          << "x" << s.N << "x" << s.K << ", " << lay.name);
          const int64_t a_rows = ta ? s.K : s.M, a_cols = ta ? s.M : s.K;
          const int64_t b_rows = tb ? s.N : s.K, b_cols = tb ? s.K : s.N;
          const int64_t lda = lay.ld(a_cols), ldb = lay.ld(b_cols), ldc = lay.ld(s.N);
          // NaN in A's and B's padding on the device, zeros for the CPU.
          const Vec A = strided_random(a_rows, a_cols, lda, 4, kNaN);
          const Vec B = strided_random(b_rows, b_cols, ldb, 5, kNaN);
          const Vec C = strided_random(s.M, s.N, ldc, 6, kSentinel);
          Vec ref = C;
          const Vec A0 = replace_padding(A, a_rows, a_cols, lda, 0.0f);
          const Vec B0 = replace_padding(B, b_rows, b_cols, ldb, 0.0f);
          anvil::cpu::gemm(ta, tb, s.M, s.N, s.K, alpha, A0.data(), lda, B0.data(), ldb, beta,
                           ref.data(), ldc);
          // The same values `offset` floats into each device buffer.
          auto shifted = [&](const Vec& v) {
            Vec out(v.size() + lay.offset, kNaN);
            std::copy(v.begin(), v.end(), out.begin() + std::ptrdiff_t(lay.offset));
            return out;
          };
          DeviceBuffer<float> dA(shifted(A)), dB(shifted(B)), dC(shifted(C));
          anvil::cuda::gemm(rung, ta, tb, s.M, s.N, s.K, alpha, dA.ptr + lay.offset, lda,
                            dB.ptr + lay.offset, ldb, beta, dC.ptr + lay.offset, ldc, nullptr);
          const Vec got = dC.to_host();
          // C's padding (the sentinel) must come back untouched too.
          cuda_test::require_close(Vec(got.begin() + std::ptrdiff_t(lay.offset), got.end()), ref,
                                   1e-4f, 1e-4f);
        }
      }
    }
  }
}

TEST_CASE("cuda gemm: rung 8 splits a long K over grid.z, deterministically",
          "[cuda][gemm][split-k]") {
  if (!cuda_test::have_device()) return;
  using anvil::cuda::gemm_workspace_floats;
  // Results of one or two 128x128 tiles with K long enough to split (every
  // chunk but the last a multiple of 16, the last ragged; from 32 splits
  // the partials are added a warp per element), and LeNet's fc1 weight
  // gradient at batch 256 (dW[128, 800] = dY^T X over the batch).
  // The sanitizer builds run the simulator several times slower: there
  // only the shapes marked small.
  struct Shape {
    int64_t M, N, K;
    const char* name;
    bool small;
  };
  const Shape shapes[] = {{70, 45, 1000, "70x45x1000", true},
                          {130, 9, 517, "130x9x517 (2 row tiles)", true},
                          {20, 9, 4096, "20x9x4096 (32 splits: summed a warp per element)", true},
                          {128, 800, 256, "LeNet fc1 weight gradient, batch 256", false}};
  for (const Shape& s : shapes) {
    if (kSanitizerBuild && !s.small) continue;
    const anvil::cuda::split_k::Plan plan = anvil::cuda::split_k::plan(
        s.M, s.N, s.K, ((s.M + 127) / 128) * ((s.N + 127) / 128), 2);
    REQUIRE(plan.splits > 1);  // the shape does split
    if (s.K == 4096) REQUIRE(plan.splits >= 32);
    REQUIRE(plan.splits * plan.chunk >= s.K);
    REQUIRE((plan.splits - 1) * plan.chunk < s.K);  // no empty chunk
    REQUIRE(gemm_workspace_floats(8, s.M, s.N, s.K) == size_t(plan.splits * s.M * s.N));
    for (int t = 0; t < 4; ++t) {
      const bool ta = t & 1, tb = t & 2;
      SECTION(std::string(s.name) + ", trans_a " + std::to_string(ta) + ", trans_b " +
              std::to_string(tb)) {
        INFO(plan.splits << " chunks of " << plan.chunk);
        const int64_t pad = 3;  // odd strides: the scalar edge paths
        const int64_t a_rows = ta ? s.K : s.M, a_cols = ta ? s.M : s.K;
        const int64_t b_rows = tb ? s.N : s.K, b_cols = tb ? s.K : s.N;
        const int64_t lda = a_cols + pad, ldb = b_cols + pad, ldc = s.N + pad;
        const Vec A = strided_random(a_rows, a_cols, lda, 7, kNaN);
        const Vec B = strided_random(b_rows, b_cols, ldb, 8, kNaN);
        const Vec C = strided_random(s.M, s.N, ldc, 9, kSentinel);
        const float alpha = 0.75f, beta = t == 3 ? 0.0f : -1.25f;
        Vec ref = C;
        const Vec A0 = replace_padding(A, a_rows, a_cols, lda, 0.0f);
        const Vec B0 = replace_padding(B, b_rows, b_cols, ldb, 0.0f);
        anvil::cpu::gemm(ta, tb, s.M, s.N, s.K, alpha, A0.data(), lda, B0.data(), ldb, beta,
                         ref.data(), ldc);
        DeviceBuffer<float> dA(A), dB(B);
        Vec first;
        for (int run = 0; run < 2; ++run) {
          // A fresh workspace of NaN each run: every partial must be written.
          DeviceBuffer<float> dC(C), ws(Vec(gemm_workspace_floats(8, s.M, s.N, s.K), kNaN));
          anvil::cuda::gemm(8, ta, tb, s.M, s.N, s.K, alpha, dA.ptr, lda, dB.ptr, ldb, beta,
                            dC.ptr, ldc, ws.ptr, nullptr);
          const Vec got = dC.to_host();
          if (run == 0) {
            cuda_test::require_close(got, ref, 1e-4f, 1e-4f * std::sqrt(float(s.K)));
            first = got;
          } else {  // bitwise the same as the first run
            REQUIRE(std::memcmp(got.data(), first.data(), got.size() * sizeof(float)) == 0);
          }
        }
      }
    }
  }
  SECTION("the workspace: none for rungs 1-7 or for shapes that fill the GPU, required "
          "where 8 splits") {
    for (int v = 1; v <= 7; ++v) REQUIRE(gemm_workspace_floats(v, 70, 45, 1000) == 0);
    REQUIRE(gemm_workspace_floats(8, 4096, 4096, 4096) == 0);  // 1024 tiles: no split
    REQUIRE(gemm_workspace_floats(8, 70, 45, 200) == 0);       // K too short to split
    // Every chunk but the last at least 128 long: K = 255 is 128 + 127, and
    // K = 500 is 128 + 128 + 128 + 116 (one tile: as many splits as allowed).
    REQUIRE(gemm_workspace_floats(8, 70, 45, 255) == 2 * 70 * 45);
    REQUIRE(gemm_workspace_floats(8, 70, 45, 500) == 4 * 70 * 45);
    float* p = nullptr;
    REQUIRE_THROWS_WITH(anvil::cuda::gemm(8, false, false, 70, 45, 1000, 1.0f, p, 1000, p, 45,
                                          0.0f, p, 45, nullptr),
                        Catch::Contains("needs") && Catch::Contains("workspace"));
  }
}

TEST_CASE("cuda gemm: bad arguments are refused, naming the argument", "[cuda][gemm]") {
  if (!cuda_test::have_device()) return;
  using anvil::cuda::gemm;
  float* p = nullptr;
  SECTION("an unknown rung") {
    REQUIRE_THROWS_WITH(gemm(anvil::cuda::kGemmRungs + 1, false, false, 1, 1, 1, 1.0f, p, 1,
                             p, 1, 0.0f, p, 1, nullptr),
                        Catch::Contains("no rung " +
                                        std::to_string(anvil::cuda::kGemmRungs + 1)));
    REQUIRE_THROWS_AS(gemm(0, false, false, 1, 1, 1, 1.0f, p, 1, p, 1, 0.0f, p, 1, nullptr),
                      std::invalid_argument);
  }
  SECTION("negative sizes") {
    REQUIRE_THROWS_WITH(gemm(1, false, false, -1, 2, 2, 1.0f, p, 2, p, 2, 0.0f, p, 2, nullptr),
                        Catch::Contains("M = -1"));
    REQUIRE_THROWS_WITH(gemm(2, false, false, 2, -3, 2, 1.0f, p, 2, p, 2, 0.0f, p, 2, nullptr),
                        Catch::Contains("N = -3"));
    REQUIRE_THROWS_WITH(gemm(4, false, false, 2, 2, -2, 1.0f, p, 2, p, 2, 0.0f, p, 2, nullptr),
                        Catch::Contains("K = -2"));
  }
  SECTION("a row stride smaller than the stored row") {
    // M=5, N=4, K=3: A is 5x3 (3x5 transposed), B 3x4 (4x3 transposed).
    REQUIRE_THROWS_WITH(gemm(3, false, false, 5, 4, 3, 1.0f, p, 2, p, 4, 0.0f, p, 4, nullptr),
                        Catch::Contains("lda = 2"));
    REQUIRE_THROWS_WITH(gemm(3, true, false, 5, 4, 3, 1.0f, p, 4, p, 4, 0.0f, p, 4, nullptr),
                        Catch::Contains("lda = 4"));
    REQUIRE_THROWS_WITH(gemm(3, false, false, 5, 4, 3, 1.0f, p, 3, p, 3, 0.0f, p, 4, nullptr),
                        Catch::Contains("ldb = 3"));
    REQUIRE_THROWS_WITH(gemm(3, false, true, 5, 4, 3, 1.0f, p, 3, p, 2, 0.0f, p, 4, nullptr),
                        Catch::Contains("ldb = 2"));
    REQUIRE_THROWS_WITH(gemm(3, false, false, 5, 4, 3, 1.0f, p, 3, p, 4, 0.0f, p, 3, nullptr),
                        Catch::Contains("ldc = 3"));
    // The transposed layouts accept what they need: lda >= M, ldb >= K.
    REQUIRE_NOTHROW(gemm(3, true, true, 0, 4, 3, 1.0f, p, 0, p, 3, 0.0f, p, 4, nullptr));
  }
}

#endif  // ANVIL_CUDA_BACKEND
