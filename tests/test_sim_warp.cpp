// The simulator's warp intrinsics: every shuffle, vote and __syncwarp on a
// 64-thread block (two full warps) and a ragged 40-thread block (a full warp
// and one of 8 lanes), widths 8 and 16, against a host model written from
// CUDA's documentation; then the misuses that must be reported, not hang.
#if defined(ANVIL_CUDA_SIM)
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cuda/cuda_compat.h"
#include "tests/cuda_test_util.h"
#include "sim_broken_warp_kernels.cu"

namespace {

template <typename T>
using Buf = cuda_test::DeviceBuffer<T>;

std::vector<int> iota_ints(int n) {
  std::vector<int> v(n);
  for (int i = 0; i < n; ++i) v[i] = 100 + 3 * i;
  return v;
}

// The lane a shuffle reads, as CUDA's programming guide describes it, or -1
// when the lane reads its own value.
int model_source(int op, int lane, int arg, int width) {
  const int seg = lane / width * width;
  switch (op) {
    case 0: return seg + arg % width;
    case 1: return lane - seg >= arg ? lane - arg : -1;
    case 2: return lane - seg + arg < width ? lane + arg : -1;
    default: {
      const int src = lane ^ arg;
      return src < seg + width ? src : -1;  // earlier segments yes, later ones no
    }
  }
}

constexpr int kPoisonInt = -1;  // all-ones bits: a lane that takes no part

}  // namespace

TEST_CASE("sim warp: every shuffle matches CUDA's lane rules", "[sim][warp][tsan]") {
  const char* names[] = {"__shfl_sync", "__shfl_up_sync", "__shfl_down_sync", "__shfl_xor_sync"};
  for (int threads : {64, 40}) {
    for (int op = 0; op < 4; ++op) {
      for (int width : {32, 16, 8}) {
        for (int arg : {0, 1, 3, 7, 13}) {
          for (unsigned mask : {0xffffffffu, 0x00ffff0fu}) {
            DYNAMIC_SECTION(threads << " threads, " << names[op] << ", arg " << arg << ", width "
                                    << width << ", mask " << mask) {
              const std::vector<int> in = iota_ints(threads);
              Buf<int> din(in), dout(threads);
              anvil::cuda::launch(sim_warp_kernels::shuffle_lanes, 1, dim3(threads), 0, nullptr,
                                  din.ptr, dout.ptr, op, arg, width, mask);
              const std::vector<int> got = dout.to_host();
              for (int t = 0; t < threads; ++t) {
                const int lane = t % 32, base = t - lane;
                int want = in[t];
                if (mask >> lane & 1u) {
                  const int src = model_source(op, lane, arg, width);
                  if (src >= 0) {
                    const bool takes_part = (mask >> src & 1u) && base + src < threads;
                    want = takes_part ? in[base + src] : kPoisonInt;
                  }
                }
                INFO("thread " << t);
                REQUIRE(got[t] == want);
              }
            }
          }
        }
      }
    }
  }
}

TEST_CASE("sim warp: a __shfl_down_sync reduction sums each warp", "[sim][warp][tsan]") {
  for (int threads : {64, 40}) {
    DYNAMIC_SECTION(threads << " threads") {
      std::vector<float> in(threads);
      for (int i = 0; i < threads; ++i) in[i] = 0.25f * float(i) - 3.0f;
      Buf<float> din(in), dout(2);
      anvil::cuda::launch(sim_warp_kernels::warp_sum_down, 1, dim3(threads), 0, nullptr, din.ptr,
                          dout.ptr);
      const std::vector<float> got = dout.to_host();
      for (int w = 0; w < 2; ++w) {
        float want = 0.0f;
        for (int i = w * 32; i < std::min(threads, w * 32 + 32); ++i) want += in[i];
        REQUIRE(got[w] == Approx(want).margin(1e-5));
      }
    }
  }
}

TEST_CASE("sim warp: xor butterflies and up-scans over segments", "[sim][warp][tsan]") {
  for (int threads : {64, 40}) {
    for (int width : {32, 16, 8}) {
      DYNAMIC_SECTION(threads << " threads, width " << width) {
        // The butterfly needs whole segments: the 8-lane warp has one only at width 8.
        const int whole = threads == 40 && width > 8 ? 32 : threads;
        std::vector<float> in(threads);
        for (int i = 0; i < threads; ++i) in[i] = float(i % 7) - 2.5f;
        Buf<float> din(in), dsum(threads);
        if (whole == threads) {
          anvil::cuda::launch(sim_warp_kernels::segment_sum_xor, 1, dim3(threads), 0, nullptr,
                              din.ptr, dsum.ptr, width);
          const std::vector<float> got = dsum.to_host();
          for (int t = 0; t < threads; ++t) {
            float want = 0.0f;
            for (int i = t / width * width; i < t / width * width + width; ++i) want += in[i];
            INFO("thread " << t);
            REQUIRE(got[t] == Approx(want).margin(1e-5));
          }
        }
        const std::vector<int> ints = iota_ints(threads);
        Buf<int> dints(ints), dscan(threads);
        anvil::cuda::launch(sim_warp_kernels::segment_scan_up, 1, dim3(threads), 0, nullptr,
                            dints.ptr, dscan.ptr, width);
        const std::vector<int> scan = dscan.to_host();
        for (int t = 0; t < threads; ++t) {
          int want = 0;
          for (int i = t / width * width; i <= t; ++i) want += ints[i];
          INFO("thread " << t);
          REQUIRE(scan[t] == want);
        }
      }
    }
  }
}

TEST_CASE("sim warp: broadcast of an 8-byte value from lane 7", "[sim][warp][tsan]") {
  for (int threads : {64, 40}) {
    for (int width : {32, 16, 8}) {
      DYNAMIC_SECTION(threads << " threads, width " << width) {
        std::vector<double> in(threads);
        for (int i = 0; i < threads; ++i) in[i] = 1.0 + i * 1e-12;  // needs all 8 bytes
        Buf<double> din(in), dout(threads);
        anvil::cuda::launch(sim_warp_kernels::broadcast_lane7, 1, dim3(threads), 0, nullptr,
                            din.ptr, dout.ptr, width);
        const std::vector<double> got = dout.to_host();
        for (int t = 0; t < threads; ++t) {
          const int src = t / width * width + 7;
          INFO("thread " << t);
          if (src < threads) {
            REQUIRE(got[t] == in[src]);
          } else {
            REQUIRE(std::isnan(got[t]));  // lane 15 of the 8-lane warp's segment: no such lane
          }
        }
      }
    }
  }
}

TEST_CASE("sim warp: ballot, any, all and activemask", "[sim][warp][tsan]") {
  for (int threads : {64, 40}) {
    DYNAMIC_SECTION(threads << " threads") {
      std::vector<int> in(threads);
      for (int i = 0; i < threads; ++i) in[i] = i % 3 == 0 || i >= 32;  // warp 1: all true
      Buf<int> din(in), dany(threads), dall(threads);
      Buf<unsigned> dballot(threads), dactive(threads);
      anvil::cuda::launch(sim_warp_kernels::votes, 1, dim3(threads), 0, nullptr, din.ptr,
                          dballot.ptr, dany.ptr, dall.ptr, dactive.ptr);
      const auto ballot = dballot.to_host(), active = dactive.to_host();
      const auto any = dany.to_host(), all = dall.to_host();
      unsigned want0 = 0;
      for (int l = 0; l < 32; ++l) want0 |= unsigned(in[l]) << l;
      const unsigned exists1 = threads == 64 ? 0xffffffffu : 0xffu;
      for (int t = 0; t < threads; ++t) {
        INFO("thread " << t);
        REQUIRE(ballot[t] == (t < 32 ? want0 : exists1));
        REQUIRE(any[t] == 1);
        REQUIRE(all[t] == (t < 32 ? 0 : 1));
        REQUIRE(active[t] == (t < 32 ? 0xffffffffu : exists1));
      }
    }
  }
  SECTION("lanes follow the linear thread id of a 2D block") {
    // block (8,5): warp 0 is rows y = 0..3, warp 1 is row 4 (8 lanes).
    std::vector<int> in(40, 0);
    for (int x = 0; x < 8; ++x) in[3 * 8 + x] = 1;  // row y = 3: lanes 24..31 of warp 0
    Buf<int> din(in), dany(40), dall(40);
    Buf<unsigned> dballot(40), dactive(40);
    anvil::cuda::launch(sim_warp_kernels::votes, 1, dim3(8, 5), 0, nullptr, din.ptr, dballot.ptr,
                        dany.ptr, dall.ptr, dactive.ptr);
    const auto ballot = dballot.to_host();
    const auto any = dany.to_host();
    REQUIRE(ballot[0] == 0xff000000u);
    REQUIRE(ballot[39] == 0u);
    REQUIRE(any[39] == 0);
  }
  SECTION("disjoint masks in one warp complete separately") {
    const std::vector<int> in = iota_ints(64);
    Buf<int> din(in), dout(64);
    anvil::cuda::launch(sim_warp_kernels::disjoint_half_warps, 1, dim3(64), 0, nullptr, din.ptr,
                        dout.ptr);
    const auto got = dout.to_host();
    for (int t = 0; t < 64; ++t) REQUIRE(got[t] == in[t / 16 * 16]);
  }
}

TEST_CASE("sim warp: misused warp collectives are reported, not hangs", "[sim][warp][tsan]") {
  // Each launch is accepted; its failure comes back from the sync in to_host().
  using namespace sim_warp_kernels;
  Buf<float> out(64);
  auto site = Catch::Contains("test_sim_warp.cpp");
  SECTION("a mask naming a lane that has returned") {
    anvil::cuda::launch(shuffle_after_return, 2, dim3(64), 0, nullptr, out.ptr);
    REQUIRE_THROWS_WITH(out.to_host(), site && Catch::Contains("__shfl_sync") &&
                            Catch::Contains("names lane 16: it has returned"));
  }
  SECTION("a mask naming a lane that waits at __syncthreads") {
    anvil::cuda::launch(shuffle_against_syncthreads, 1, dim3(32), 0, nullptr, out.ptr);
    REQUIRE_THROWS_WITH(
        out.to_host(),
        site && Catch::Contains("__shfl_xor_sync") && Catch::Contains("waits at __syncthreads"));
  }
  SECTION("lanes of a warp with different masks") {
    anvil::cuda::launch(mismatched_masks, 1, dim3(64), 0, nullptr, out.ptr);
    REQUIRE_THROWS_WITH(out.to_host(), site && Catch::Contains("different masks") &&
                            Catch::Contains("0xffff0000"));
  }
  SECTION("a mask that leaves out the calling lane") {
    anvil::cuda::launch(mask_without_self, 1, dim3(32), 0, nullptr, out.ptr);
    REQUIRE_THROWS_WITH(out.to_host(), site && Catch::Contains("lane 1 ") &&
                            Catch::Contains("does not name the lane itself"));
  }
  SECTION("different collectives with the same mask") {
    anvil::cuda::launch(mismatched_ops, 1, dim3(32), 0, nullptr, out.ptr);
    REQUIRE_THROWS_WITH(out.to_host(), site && Catch::Contains("__ballot_sync") &&
                            Catch::Contains("__shfl_sync"));
  }
  SECTION("a width that is not a power of two") {
    anvil::cuda::launch(bad_width, 1, dim3(32), 0, nullptr, out.ptr);
    REQUIRE_THROWS_WITH(out.to_host(), site && Catch::Contains("width 12"));
  }
  SECTION("a warp intrinsic outside a kernel") {
    REQUIRE_THROWS_AS(__shfl_sync(0xffffffffu, 1, 0), std::logic_error);
  }
  // The simulator is usable again after each of these.
  const std::vector<int> in = iota_ints(40);
  Buf<int> din(in), dscan(40);
  anvil::cuda::launch(segment_scan_up, 1, dim3(40), 0, nullptr, din.ptr, dscan.ptr, 8);
  REQUIRE(dscan.to_host()[1] == in[0] + in[1]);
}

#endif  // ANVIL_CUDA_SIM
