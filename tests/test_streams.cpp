// Events, pinned memory, copy_async and the DevicePrefetcher (core/stream.h,
// data/device_prefetcher.h): on the CPU always, on cuda:0 where there is one
// (the simulator build, whose deferred streams run queued work only at sync
// points, so a missing wait shows up as wrong data).
#include <catch2/catch.hpp>

#include <numeric>
#include <thread>

#include "core/ops.h"
#include "core/stream.h"
#include "core/tensor.h"
#include "data/device_prefetcher.h"
#include "tests/cuda_test_util.h"
#if defined(ANVIL_CUDA_BACKEND)
#include "kernels/cuda/cuda_backend.h"
#endif

using namespace anvil;
using Catch::Matchers::Contains;

namespace {

std::vector<float> iota_floats(size_t n, float start) {
  std::vector<float> v(n);
  std::iota(v.begin(), v.end(), start);
  return v;
}

// A set whose every pixel encodes (example, position), so a batch that
// reaches the device from the wrong example or slot is seen.
data::ImageSet numbered_set(int64_t count, int64_t rows, int64_t cols) {
  data::ImageSet set;
  set.count = count;
  set.rows = rows;
  set.cols = cols;
  for (int64_t i = 0; i < count; ++i) {
    for (int64_t p = 0; p < rows * cols; ++p) set.pixels.push_back(uint8_t((i * 7 + p) % 251));
    set.labels.push_back(i % 10);
  }
  return set;
}

}  // namespace

TEST_CASE("Event on the CPU is the host clock", "[stream]") {
  Event start, end;
  SECTION("elapsed time between two records") {
    start.record();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    end.record();
    CHECK(start.ready());
    start.wait();         // nothing to wait for on the CPU
    end.synchronize();
    double ms = start.elapsed_ms(end);
    CHECK(ms >= 19.0);
    CHECK(ms < 2000.0);
  }
  SECTION("using an event before recording it is an error") {
    CHECK_THROWS_WITH(start.wait(), Contains("has not been recorded") && Contains("cpu"));
    CHECK_THROWS_WITH(start.elapsed_ms(end), Contains("has not been recorded"));
  }
  SECTION("a non-timing event refuses elapsed_ms") {
    Event a(Device::cpu(), /*timing=*/false);
    a.record();
    end.record();
    CHECK_THROWS_WITH(a.elapsed_ms(end), Contains("timing off"));
  }
}

TEST_CASE("copy_async checks shapes and copies between CPU tensors", "[stream]") {
  Tensor a = Tensor::from_vector(iota_floats(6, 1), {2, 3});
  Tensor b = Tensor::zeros({2, 3});
  copy_async(b, a);
  CHECK(b.to_vector() == a.to_vector());
  CHECK_THROWS_WITH(copy_async(Tensor::zeros({3, 2}), a),
                    Contains("copy_async") && Contains("[2, 3]") && Contains("[3, 2]"));
}

TEST_CASE("pin_memory", "[stream]") {
  Tensor a = Tensor::from_vector(iota_floats(1000, -3), {10, 100});
  CHECK_FALSE(a.is_pinned());
  if (!cuda_test::have_device("CUDA part")) {
    CHECK_THROWS_WITH(a.pin_memory(), Contains("pinned host memory needs a CUDA device"));
    return;
  }
  Tensor p = a.pin_memory();
  CHECK(p.is_pinned());
  CHECK(p.device() == Device::cpu());
  CHECK(p.to_vector() == a.to_vector());
  CHECK(p.pin_memory().same(p));  // already pinned: the same tensor
  CHECK_THROWS_WITH(Tensor::zeros({2}, DType::Float32, Device::cuda(0)).pin_memory(),
                    Contains("pin_memory") && Contains("cuda:0"));
  SECTION("freed pinned blocks are reused once their copies are done") {
    auto before = pinned_host_allocator().stats();
    { Tensor q = Tensor::empty({123, 7}).pin_memory(); }
    // The free recorded an event on every stream of every device in use;
    // once those are idle the block is free to reuse. (synchronize opens no
    // context on a device nothing has used.)
    for (int d = 0; d < device_count(); ++d) synchronize(Device::cuda(d));
    { Tensor q = Tensor::empty({123, 7}).pin_memory(); }
    auto after = pinned_host_allocator().stats();
    CHECK(after.cache_hits >= before.cache_hits + 1);
  }
}

#if defined(ANVIL_CUDA_BACKEND)
TEST_CASE("freeing pinned memory never throws, touches only devices in use, keeps the current device",
          "[stream][cuda]") {
  if (!cuda_test::have_device("CUDA test")) return;
  const int n = device_count();
  const int other = n - 1;  // the current device while freeing (cuda:0 on a one-GPU machine)
  Tensor pinned = Tensor::from_vector(iota_floats(64, 1), {64}).pin_memory();
  (void)pinned.to(Device::cuda(0));  // cuda:0 is in use
  const bool other_was_in_use = anvil::cuda::initialised(other);
  SECTION("an ordinary free") {
    anvil::cuda::check(cudaSetDevice(other), "cudaSetDevice");
    pinned = Tensor();
    int current = -1;
    anvil::cuda::check(cudaGetDevice(&current), "cudaGetDevice");
    CHECK(current == other);
    CHECK(anvil::cuda::initialised(other) == other_was_in_use);  // no context opened there
  }
  SECTION("a free after a CUDA error (as after a kernel fault) leaks the block, saying so") {
    const size_t leaked = anvil::cuda::pinned_blocks_leaked();
    const MemoryStats before = pinned_host_allocator().stats();
    anvil::cuda::check(cudaSetDevice(other), "cudaSetDevice");
    anvil::cuda::fail_next_pinned_free(cudaErrorLaunchFailure);
    pinned = Tensor();  // ~Storage: would terminate the test run if the free threw
    CHECK(anvil::cuda::pinned_blocks_leaked() == leaked + 1);
    const MemoryStats after = pinned_host_allocator().stats();
    CHECK(after.allocated == before.allocated - 64 * sizeof(float));
    CHECK(after.reserved == before.reserved - 64 * sizeof(float));
    int current = -1;
    anvil::cuda::check(cudaGetDevice(&current), "cudaGetDevice");
    CHECK(current == other);
    // Nothing is left in an error state: the next CUDA work runs.
    CHECK(Tensor::ones({4}, DType::Float32, Device::cuda(0)).to_vector() == std::vector<float>(4, 1));
  }
  anvil::cuda::check(cudaSetDevice(0), "cudaSetDevice");
}
#endif

TEST_CASE("copy_async and events on a CUDA device", "[stream][cuda]") {
  if (!cuda_test::have_device("CUDA part")) return;
  const Device gpu = Device::cuda(0);
  const std::vector<float> values = iota_floats(4096, 0.5f);
  Tensor host = Tensor::from_vector(values, {64, 64}).pin_memory();

  SECTION("host to device on the copy stream, then compute waits for it") {
    Tensor dev = Tensor::empty({64, 64}, DType::Float32, gpu);
    copy_async(dev, host, Stream::Copy);
    Event copied(gpu, /*timing=*/false);
    copied.record(Stream::Copy);
    copied.wait(Stream::Compute);
    Tensor doubled = add(dev, dev);  // a kernel on the compute stream
    std::vector<float> out = doubled.to_vector();
    for (size_t i = 0; i < values.size(); ++i) REQUIRE(out[i] == 2 * values[i]);
  }
  SECTION("a copy on the copy stream comes after kernels already issued") {
    Tensor src = Tensor::full({64, 64}, 3.0, DType::Float32, gpu);  // fill kernel, compute stream
    Tensor dst = Tensor::zeros({64, 64}, DType::Float32, gpu);
    copy_async(dst, src, Stream::Copy);
    Event copied(gpu);
    copied.record(Stream::Copy);
    copied.synchronize();
    CHECK(copied.ready());
    for (float v : dst.to_vector()) REQUIRE(v == 3.0f);
  }
  SECTION("device to host returns with the data") {
    Tensor dev = host.to(gpu);
    Tensor back = Tensor::empty({64, 64}).pin_memory();
    copy_async(back, dev, Stream::Copy);
    CHECK(back.to_vector() == values);
  }
  SECTION("timing events give a non-negative time; events of two devices do not mix") {
    Event start(gpu), end(gpu);
    start.record();
    Tensor x = Tensor::ones({256}, DType::Float32, gpu);
    x = add(x, x);
    end.record();
    CHECK(start.elapsed_ms(end) >= 0.0);
    Event cpu_event;
    cpu_event.record();
    CHECK_THROWS_WITH(start.elapsed_ms(cpu_event), Contains("different devices"));
  }
}

TEST_CASE("DevicePrefetcher hands out every batch, on the device, in order", "[stream][data]") {
  const data::ImageSet set = numbered_set(23, 5, 4);
  std::vector<Device> devices{Device::cpu()};
  if (cuda_test::have_device("cuda:0 part")) devices.push_back(Device::cuda(0));
  for (Device device : devices) {
    DYNAMIC_SECTION("on " << device.str()) {
      data::DataLoader loader(set, 4, /*shuffle=*/true, /*drop_last=*/false, /*seed=*/7);
      data::DevicePrefetcher batches(loader, device);
      for (int epoch = 0; epoch < 2; ++epoch) {
        batches.start_epoch();
        data::DeviceBatch b;
        int64_t seen = 0, count = 0;
        std::vector<int64_t> order = data::DataLoader::shuffled_order(23, 7, uint64_t(epoch));
        while (batches.next(b)) {
          REQUIRE(b.images.device() == device);
          REQUIRE(b.labels.device() == device);
          REQUIRE(b.images.shape() == Shape{b.host.size, 1, 5, 4});
          REQUIRE(b.images.to_vector() == b.host.images);
          REQUIRE(b.labels.to_int_vector() == b.host.labels);
          for (int64_t i = 0; i < b.host.size; ++i) REQUIRE(b.host.indices[size_t(i)] == order[size_t(seen + i)]);
          seen += b.host.size;
          ++count;
        }
        CHECK(seen == 23);
        CHECK(count == 6);
      }
    }
  }
}

TEST_CASE("DevicePrefetcher keeps batches apart when the caller holds several", "[stream][data]") {
  if (!cuda_test::have_device("CUDA part")) return;
  const data::ImageSet set = numbered_set(12, 3, 3);
  data::DataLoader loader(set, 2, /*shuffle=*/false, /*drop_last=*/false, /*seed=*/1);
  data::DevicePrefetcher batches(loader, Device::cuda(0));
  batches.start_epoch();
  // Hold all six device batches before reading any back: each must keep its
  // own data although the two pinned staging buffers were refilled meanwhile.
  std::vector<data::DeviceBatch> held(6);
  for (auto& b : held) REQUIRE(batches.next(b));
  data::DeviceBatch extra;
  CHECK_FALSE(batches.next(extra));
  for (size_t k = 0; k < held.size(); ++k) {
    std::vector<float> expected;
    for (int64_t i = int64_t(2 * k); i < int64_t(2 * k + 2); ++i)
      for (int64_t p = 0; p < 9; ++p) expected.push_back(float((i * 7 + p) % 251) / 255.0f);
    std::vector<float> got = held[k].images.to_vector();
    REQUIRE(got.size() == expected.size());
    for (size_t j = 0; j < got.size(); ++j) REQUIRE(got[j] == Approx(expected[j]).epsilon(1e-6));
  }
}

TEST_CASE("DevicePrefetcher copies batches of the static buffers' shape into them, others not",
          "[stream][data]") {
  const data::ImageSet set = numbered_set(11, 3, 3);
  std::vector<Device> devices{Device::cpu()};
  if (cuda_test::have_device("cuda:0 part")) devices.push_back(Device::cuda(0));
  for (Device device : devices) {
    DYNAMIC_SECTION("on " << device.str()) {
      data::DataLoader loader(set, 4, /*shuffle=*/true, /*drop_last=*/false, /*seed=*/2);
      data::DevicePrefetcher batches(loader, device);
      const Tensor images = Tensor::empty({4, 1, 3, 3}, DType::Float32, device);
      const Tensor labels = Tensor::empty({4}, DType::Int64, device);
      batches.set_static_buffers(images, labels);
      batches.start_epoch();
      data::DeviceBatch b;
      int64_t in_static = 0, count = 0;
      while (batches.next(b)) {
        const bool same = b.images.impl() == images.impl();
        CHECK(same == (b.host.size == 4));  // the last batch, of 3, in tensors of its own
        CHECK((b.labels.impl() == labels.impl()) == same);
        REQUIRE(b.images.to_vector() == b.host.images);
        REQUIRE(b.labels.to_int_vector() == b.host.labels);
        in_static += same;
        ++count;
      }
      CHECK(count == 3);
      CHECK(in_static == 2);
    }
  }
}
