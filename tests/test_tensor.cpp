// Tensor basics: creation, views, copies, devices, errors.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "core/cpu_check.h"
#include "core/device.h"
#include "core/ops.h"
#include "core/random.h"
#include "core/tensor.h"
#include "tests/cuda_test_util.h"

using namespace anvil;
using Catch::Matchers::Contains;

TEST_CASE("creation fills and shapes", "[tensor]") {
  SECTION("zeros, ones, full") {
    Tensor z = Tensor::zeros({2, 3});
    CHECK(z.shape() == Shape{2, 3});
    CHECK(z.numel() == 6);
    CHECK(z.to_vector() == std::vector<float>(6, 0.f));
    CHECK(Tensor::ones({4}).to_vector() == std::vector<float>(4, 1.f));
    CHECK(Tensor::full({2, 2}, 2.5).to_vector() == std::vector<float>(4, 2.5f));
    CHECK(Tensor::full({3}, 7, DType::Int64).to_int_vector() == std::vector<int64_t>{7, 7, 7});
  }
  SECTION("arange and from_vector") {
    CHECK(Tensor::arange(4).to_vector() == std::vector<float>{0, 1, 2, 3});
    CHECK(Tensor::arange(3, DType::Int64).to_int_vector() == std::vector<int64_t>{0, 1, 2});
    Tensor t = Tensor::from_vector(std::vector<float>{1, 2, 3, 4, 5, 6}, {2, 3});
    CHECK(t.size(0) == 2);
    CHECK(t.size(-1) == 3);
    CHECK(t.strides() == Shape{3, 1});
    CHECK_THROWS_WITH(Tensor::from_vector(std::vector<float>{1, 2}, {3}), Contains("[3]"));
  }
  SECTION("scalars") {
    Tensor s = Tensor::full({}, 4.0);
    CHECK(s.dim() == 0);
    CHECK(s.numel() == 1);
    CHECK(s.item() == 4.0);
    CHECK_THROWS_WITH(Tensor::zeros({2}).item(), Contains("2 elements"));
  }
  SECTION("negative dimensions are refused") {
    CHECK_THROWS_WITH(Tensor::empty({2, -1}), Contains("negative"));
  }
}

TEST_CASE("seeded random numbers are reproducible", "[tensor]") {
  Generator a(42), b(42), c(43);
  Tensor x = Tensor::randn({1000}, &a), y = Tensor::randn({1000}, &b), z = Tensor::randn({1000}, &c);
  CHECK(x.to_vector() == y.to_vector());
  CHECK(x.to_vector() != z.to_vector());
  std::vector<float> v = x.to_vector();
  double mean = 0, sq = 0;
  for (float f : v) mean += f;
  mean /= double(v.size());
  for (float f : v) sq += (f - mean) * (f - mean);
  double std = std::sqrt(sq / double(v.size()));
  CHECK(std::abs(mean) < 0.1);
  CHECK(std::abs(std - 1.0) < 0.1);
  Tensor u = Tensor::rand({1000}, &a);
  for (float f : u.to_vector()) {
    REQUIRE(f >= 0.f);
    REQUIRE(f < 1.f);
  }
  manual_seed(7);
  Tensor p = Tensor::randn({5});
  manual_seed(7);
  CHECK(Tensor::randn({5}).to_vector() == p.to_vector());
}

TEST_CASE("views share storage, clone does not", "[tensor]") {
  Tensor t = Tensor::arange(12).reshape({3, 4});
  SECTION("reshape with -1 and flatten") {
    Tensor v = t.reshape({-1, 6});
    CHECK(v.shape() == Shape{2, 6});
    CHECK(t.reshape({2, 2, 3}).flatten(1).shape() == Shape{2, 6});
    CHECK(t.flatten().shape() == Shape{12});
    v.data<float>()[0] = 100.f;
    CHECK(t.data<float>()[0] == 100.f);
    CHECK_THROWS_WITH(t.reshape({5, -1}), Contains("[3, 4]") && Contains("[5, -1]"));
  }
  SECTION("narrow along dim 0") {
    Tensor rows = t.narrow(1, 2);
    CHECK(rows.shape() == Shape{2, 4});
    CHECK(rows.to_vector() == std::vector<float>{4, 5, 6, 7, 8, 9, 10, 11});
    rows.data<float>()[0] = -1.f;
    CHECK(t.to_vector()[4] == -1.f);
    CHECK_THROWS_WITH(t.narrow(2, 2), Contains("out of range"));
  }
  SECTION("clone and copy_") {
    Tensor c = t.clone();
    c.data<float>()[0] = 55.f;
    CHECK(t.data<float>()[0] == 0.f);
    Tensor d = Tensor::zeros({3, 4});
    d.copy_(t);
    CHECK(d.to_vector() == t.to_vector());
    Tensor wrong = Tensor::zeros({4, 3});
    CHECK_THROWS_WITH(wrong.copy_(t), Contains("[3, 4]") && Contains("[4, 3]"));
  }
  SECTION("dtype conversion") {
    Tensor f = Tensor::from_vector(std::vector<float>{1.f, 2.f, 3.f}, {3});
    CHECK(f.to(DType::Int64).to_int_vector() == std::vector<int64_t>{1, 2, 3});
    CHECK_THROWS_WITH(f.data<int64_t>(), Contains("float32") && Contains("int64"));
  }
}

TEST_CASE("devices", "[tensor][device]") {
  CHECK(Device::parse("cpu") == Device::cpu());
  CHECK(Device::parse("cuda") == Device::cuda(0));
  CHECK(Device::parse("cuda:3") == Device::cuda(3));
  CHECK(Device::cuda(1).str() == "cuda:1");
  for (const char* bad : {"gpu", "cuda:", "cuda:-1", "cuda:1x", "CPU", ""})
    CHECK_THROWS_WITH(Device::parse(bad), Contains("invalid device"));

  Tensor t = Tensor::ones({2});
  CHECK(t.to(Device::cpu()).same(t));  // already there: the same tensor
  const int n = device_count();
  if (!cuda_test::have_device("CUDA part")) {
    // No GPU (or no CUDA backend): none is reported, nothing crashes.
    CHECK(try_gpu() == Device::cpu());
    CHECK(try_all_gpus() == std::vector<Device>{Device::cpu()});
    CHECK(!no_gpu_reason().empty());
    CHECK_THROWS_WITH(t.to(Device::cuda(0)), Contains("cuda:0") && Contains("not available"));
    CHECK_THAT(device_summary(), Contains("no CUDA devices"));
  } else {
    CHECK(try_gpu() == Device::cuda(0));
    CHECK(try_all_gpus().size() == size_t(n));
    CHECK(no_gpu_reason().empty());
    CHECK_THROWS_WITH(t.to(Device::cuda(n)),
                      Contains(Device::cuda(n).str()) && Contains("not available") &&
                          Contains(std::to_string(n) + " CUDA device"));
    DeviceProperties p = device_properties(Device::cuda(0));
    CHECK(!p.name.empty());
    CHECK(p.total_memory > 0);
    CHECK(p.major >= 7);
    CHECK(p.simulated == devices_are_simulated());
    CHECK_THAT(device_summary(), Contains("cuda:0") && Contains("GiB"));
  }
#if defined(ANVIL_CUDA_SIM)
  CHECK(devices_are_simulated());
  CHECK(n == 2);  // ANVIL_SIM_DEVICES unset: two simulated devices
#endif
}

TEST_CASE("shape errors name the op and both shapes", "[tensor][errors]") {
  Tensor a = Tensor::zeros({2, 3}), b = Tensor::zeros({4, 5});
  CHECK_THROWS_WITH(matmul(a, b), Contains("matmul") && Contains("[2, 3]") && Contains("[4, 5]"));
  CHECK_THROWS_WITH(add(a, b), Contains("add") && Contains("[2, 3]") && Contains("[4, 5]"));
  CHECK_THROWS_WITH(conv2d(Tensor::zeros({1, 2, 5, 5}), Tensor::zeros({3, 1, 3, 3})),
                    Contains("conv2d") && Contains("[3, 1, 3, 3]") && Contains("[1, 2, 5, 5]"));
  CHECK_THROWS_WITH(linear(a, Tensor::zeros({4, 2})), Contains("linear") && Contains("[4, 2]"));
  CHECK_THROWS_WITH(cross_entropy(a, Tensor::from_vector(std::vector<int64_t>{0, 3}, {2})),
                    Contains("label 3") && Contains("3 classes"));
  CHECK_THROWS_WITH(cross_entropy(a, Tensor::from_vector(std::vector<int64_t>{-1, 0}, {2})),
                    Contains("label -1"));
  const Tensor two_labels = Tensor::from_vector(std::vector<int64_t>{0, 2}, {2});
  for (double bad : {-0.1, 1.5, std::nan("")})
    CHECK_THROWS_WITH(cross_entropy(a, two_labels, Reduction::Mean, bad),
                      Contains("cross_entropy") && Contains("label_smoothing must be in [0, 1]"));
  CHECK_THROWS_WITH(max_pool2d(Tensor::zeros({1, 1, 2, 2}), 3), Contains("larger"));
}

TEST_CASE("the CPU check names the features the build uses and a CPU lacks", "[tensor][cpu]") {
  using anvil::detail::cpu_features_built_for;
  using anvil::detail::missing_cpu_features;
  const std::vector<std::string> built = cpu_features_built_for();
  const auto has = [&](const char* f) {
    return std::find(built.begin(), built.end(), f) != built.end();
  };
  // This file has the library's -march: the two lists agree.
#ifdef __AVX2__
  CHECK(has("avx2"));
#else
  CHECK_FALSE(has("avx2"));
#endif
#ifdef __AVX512F__
  CHECK(has("avx512f"));
#else
  CHECK_FALSE(has("avx512f"));
#endif
#ifdef __FMA__
  CHECK(has("fma"));
#else
  CHECK_FALSE(has("fma"));
#endif
  // A CPU without AVX-512 (or AVX2) misses exactly what the build has of it.
  const auto without = [&](const std::string& prefix) {
    std::string want;
    for (const std::string& f : built)
      if (f.rfind(prefix, 0) == 0) want += (want.empty() ? "" : ", ") + f;
    CHECK(missing_cpu_features([&](const std::string& f) { return f.rfind(prefix, 0) != 0; }) ==
          want);
  };
  without("avx512");
  without("avx2");
  // This CPU runs the build, so it has every feature.
  CHECK(anvil::detail::cpu_matches_build());
  CHECK(missing_cpu_features([](const std::string&) { return true; }).empty());
}

// copy_rows_ (core/ops.h) on the CPU and on a GPU (simulated where there is
// none): float32, bfloat16 and int64 runs with ragged counts, widths, strides
// and offsets, into a destination of sentinels, against a loop on the host;
// runs that leave either tensor are refused.
TEST_CASE("copy_rows_ moves exactly its runs, on the CPU and a GPU", "[tensor][ops]") {
  std::vector<Device> devices = {Device::cpu()};
  if (cuda_test::have_device("copy_rows_ on a GPU")) devices.push_back(Device::cuda(0));
  struct Case {
    int64_t rows, width, src_offset, src_stride, dst_offset, dst_stride;
  };
  const Case cases[] = {{0, 5, 0, 5, 0, 5},   {3, 0, 1, 4, 2, 7},   {1, 1, 0, 1, 0, 1},
                        {5, 3, 2, 7, 1, 4},   {4, 13, 0, 13, 5, 40}, {7, 1000, 3, 1001, 0, 1000},
                        {3, 6, 0, 0, 1, 6}};  // a src stride of 0: one run copied three times
  for (Device device : devices)
    for (DType dtype : {DType::Float32, DType::BFloat16, DType::Int64})
      for (const Case& c : cases) {
        INFO(device.str() << ", " << dtype_name(dtype) << ": " << c.rows << " rows of " << c.width
                          << ", src " << c.src_offset << " + i * " << c.src_stride << ", dst "
                          << c.dst_offset << " + i * " << c.dst_stride);
        const int64_t src_n = c.src_offset + std::max<int64_t>(c.rows - 1, 0) * c.src_stride + c.width + 2;
        const int64_t dst_n = c.dst_offset + std::max<int64_t>(c.rows - 1, 0) * c.dst_stride + c.width + 3;
        std::vector<float> s(static_cast<size_t>(src_n)), d(static_cast<size_t>(dst_n), -7.f);
        for (size_t i = 0; i < s.size(); ++i) s[i] = float(i % 251);  // exact in every dtype
        std::vector<float> want = d;
        for (int64_t i = 0; i < c.rows; ++i)
          for (int64_t k = 0; k < c.width; ++k)
            want[size_t(c.dst_offset + i * c.dst_stride + k)] = s[size_t(c.src_offset + i * c.src_stride + k)];
        const Tensor src = Tensor::from_vector(s, {src_n}).to(dtype).to(device);
        const Tensor dst = Tensor::from_vector(d, {dst_n}).to(dtype).to(device);
        copy_rows_(src, c.src_offset, c.src_stride, dst, c.dst_offset, c.dst_stride, c.rows, c.width);
        CHECK(dst.to(Device::cpu()).to(DType::Float32).to_vector() == want);
      }
  const Tensor a = Tensor::zeros({10}), b = Tensor::zeros({10});
  CHECK_THROWS_WITH(copy_rows_(a, 0, 4, b, 0, 3, 3, 3),
                    Contains("3 rows of 3 elements from src's element 0, 4 apart") &&
                        Contains("its 10 elements"));
  CHECK_THROWS_WITH(copy_rows_(a, 0, 3, b, 2, 3, 3, 3), Contains("dst's element 2"));
  CHECK_THROWS_WITH(copy_rows_(a, 0, 1, Tensor::zeros({10}, DType::Int64), 0, 1, 1, 1),
                    Contains("src is float32, dst int64"));
}
