// The simulator's deferred streams and its worker threads: work runs at the
// synchronisation that needs it, so a missing cudaStreamWaitEvent or a pinned
// buffer overwritten too early gives the wrong bytes, as on a GPU; events,
// errors of deferred kernels, eager mode; blocks on one and on two workers.
// Each test sets the stream mode and worker count it needs, so the suite
// passes whatever ANVIL_SIM_STREAMS and ANVIL_SIM_WORKERS say.
#if defined(ANVIL_CUDA_SIM)
#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "core/tensor.h"
#include "kernels/cuda/cuda_compat.h"
#include "kernels/cuda/cuda_kernels.h"
#include "sim_stream_kernels.cu"
#include "tests/cuda_test_util.h"

using Catch::Matchers::Contains;
template <typename T>
using Buf = cuda_test::DeviceBuffer<T>;
using Vec = std::vector<float>;
namespace k = sim_stream_kernels;

namespace {

constexpr int kN = 256;
constexpr size_t kBytes = kN * sizeof(float);

// Sets the simulator's stream mode (and worker count) for one test, and
// restores the previous setting at scope exit.
struct StreamMode {
  anvil::sim::StreamMode saved = anvil::sim::stream_mode();
  explicit StreamMode(anvil::sim::StreamMode mode) { anvil::sim::set_stream_mode(mode); }
  ~StreamMode() { anvil::sim::set_stream_mode(saved); }
};
struct Workers {
  unsigned saved = anvil::sim::workers();
  explicit Workers(unsigned count) { anvil::sim::set_workers(count); }
  ~Workers() { anvil::sim::set_workers(saved); }
};

constexpr auto kDeferred = anvil::sim::StreamMode::kDeferred;
constexpr auto kEager = anvil::sim::StreamMode::kEager;

struct Stream {
  cudaStream_t s = nullptr;
  explicit Stream(unsigned flags = cudaStreamDefault) {
    anvil::cuda::check(cudaStreamCreateWithFlags(&s, flags), "cudaStreamCreateWithFlags");
  }
  ~Stream() { cudaStreamDestroy(s); }
};
struct Event {
  cudaEvent_t e = nullptr;
  explicit Event(unsigned flags = cudaEventDefault) {
    anvil::cuda::check(cudaEventCreateWithFlags(&e, flags), "cudaEventCreateWithFlags");
  }
  ~Event() { cudaEventDestroy(e); }
};
struct Pinned {
  float* p = nullptr;
  explicit Pinned(size_t n) {
    anvil::cuda::check(cudaHostAlloc(&p, n * sizeof(float), cudaHostAllocDefault),
                       "cudaHostAlloc");
  }
  ~Pinned() { cudaFreeHost(p); }
};

// The device's bytes as a synchronous cudaMemcpy sees them: it waits for the
// legacy and blocking streams, not for non-blocking ones.
Vec peek(const float* dev, int n = kN) {
  Vec v(size_t(n), -1.0f);
  anvil::cuda::check(cudaMemcpy(v.data(), dev, size_t(n) * sizeof(float), cudaMemcpyDeviceToHost),
                     "cudaMemcpy");
  return v;
}

void fill(float* dev, float value, cudaStream_t stream) {
  anvil::cuda::launch(k::fill_value, (kN + 63) / 64, dim3(64), 0, stream, dev, kN, value);
}

std::string self_path() {
  std::error_code ec;
  std::string self = std::filesystem::read_symlink("/proc/self/exe", ec).string();
  REQUIRE(!ec);
  return self;
}

// Runs this test binary on one hidden test case with `env` before it; its output.
std::string run_child(const std::string& env, const std::string& test_name) {
  const std::string cmd = env + " '" + self_path() + "' \"" + test_name + "\" 2>&1";
  FILE* pipe = popen(cmd.c_str(), "r");
  REQUIRE(pipe != nullptr);
  std::string out;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), pipe)) > 0) out.append(buf.data(), n);
  REQUIRE(pclose(pipe) == 0);
  return out;
}

}  // namespace

TEST_CASE("sim streams: a copy on another stream needs cudaStreamWaitEvent", "[sim][streams][tsan]") {
  REQUIRE(cudaSetDevice(0) == cudaSuccess);
  Buf<float> x(Vec(kN, 0.0f)), y(Vec(kN, 0.0f));
  Stream a, b;
  Event written;
  SECTION("without the wait the copy reads the bytes from before the kernel") {
    StreamMode mode(kDeferred);
    fill(x.ptr, 7.0f, a.s);
    REQUIRE(cudaMemcpyAsync(y.ptr, x.ptr, kBytes, cudaMemcpyDeviceToDevice, b.s) == cudaSuccess);
    REQUIRE(cudaStreamSynchronize(b.s) == cudaSuccess);
    CHECK(peek(y.ptr) == Vec(kN, 0.0f));  // stale, as a GPU may give
    CHECK(peek(x.ptr) == Vec(kN, 7.0f));  // the kernel ran at this synchronous copy
  }
  SECTION("with the wait it reads the kernel's output") {
    StreamMode mode(kDeferred);
    fill(x.ptr, 7.0f, a.s);
    REQUIRE(cudaEventRecord(written.e, a.s) == cudaSuccess);
    REQUIRE(cudaStreamWaitEvent(b.s, written.e, 0) == cudaSuccess);
    REQUIRE(cudaMemcpyAsync(y.ptr, x.ptr, kBytes, cudaMemcpyDeviceToDevice, b.s) == cudaSuccess);
    REQUIRE(cudaStreamSynchronize(b.s) == cudaSuccess);
    CHECK(peek(y.ptr) == Vec(kN, 7.0f));
  }
  SECTION("the legacy stream waits for blocking streams, not for non-blocking ones") {
    StreamMode mode(kDeferred);
    Stream nonblocking(cudaStreamNonBlocking);
    fill(x.ptr, 3.0f, nonblocking.s);
    fill(y.ptr, 4.0f, a.s);
    Buf<float> from_x(kN), from_y(kN);
    REQUIRE(cudaMemcpyAsync(from_x.ptr, x.ptr, kBytes, cudaMemcpyDeviceToDevice) == cudaSuccess);
    REQUIRE(cudaMemcpyAsync(from_y.ptr, y.ptr, kBytes, cudaMemcpyDeviceToDevice) == cudaSuccess);
    REQUIRE(cudaStreamSynchronize(nullptr) == cudaSuccess);
    CHECK(peek(from_y.ptr) == Vec(kN, 4.0f));
    CHECK(peek(from_x.ptr) == Vec(kN, 0.0f));
    REQUIRE(cudaStreamSynchronize(nonblocking.s) == cudaSuccess);
    CHECK(peek(x.ptr) == Vec(kN, 3.0f));
  }
  SECTION("eager mode runs the kernel at launch: no stale bytes to see") {
    StreamMode mode(kEager);
    fill(x.ptr, 7.0f, a.s);
    REQUIRE(cudaMemcpyAsync(y.ptr, x.ptr, kBytes, cudaMemcpyDeviceToDevice, b.s) == cudaSuccess);
    REQUIRE(cudaStreamSynchronize(b.s) == cudaSuccess);
    CHECK(peek(y.ptr) == Vec(kN, 7.0f));
  }
}

TEST_CASE("sim streams: pinned memory is copied when the copy runs, pageable when it is queued",
          "[sim][streams][tsan]") {
  REQUIRE(cudaSetDevice(0) == cudaSuccess);
  Buf<float> dev(Vec(kN, 0.0f));
  Stream a;
  Pinned pinned(kN);
  Vec pageable(kN);
  SECTION("a pinned source overwritten before the sync reaches the device as the new bytes") {
    StreamMode mode(kDeferred);
    std::fill_n(pinned.p, kN, 1.0f);
    REQUIRE(cudaMemcpyAsync(dev.ptr, pinned.p, kBytes, cudaMemcpyHostToDevice, a.s) == cudaSuccess);
    std::fill_n(pinned.p, kN, 2.0f);
    REQUIRE(cudaStreamSynchronize(a.s) == cudaSuccess);
    CHECK(peek(dev.ptr) == Vec(kN, 2.0f));
  }
  SECTION("a pageable source is staged when the copy is queued") {
    StreamMode mode(kDeferred);
    std::fill(pageable.begin(), pageable.end(), 1.0f);
    REQUIRE(cudaMemcpyAsync(dev.ptr, pageable.data(), kBytes, cudaMemcpyHostToDevice, a.s) ==
            cudaSuccess);
    std::fill(pageable.begin(), pageable.end(), 2.0f);
    REQUIRE(cudaStreamSynchronize(a.s) == cudaSuccess);
    CHECK(peek(dev.ptr) == Vec(kN, 1.0f));
  }
  SECTION("eager mode copies a pinned source at once") {
    StreamMode mode(kEager);
    std::fill_n(pinned.p, kN, 1.0f);
    REQUIRE(cudaMemcpyAsync(dev.ptr, pinned.p, kBytes, cudaMemcpyHostToDevice, a.s) == cudaSuccess);
    std::fill_n(pinned.p, kN, 2.0f);
    REQUIRE(cudaStreamSynchronize(a.s) == cudaSuccess);
    CHECK(peek(dev.ptr) == Vec(kN, 1.0f));
  }
  SECTION("a copy into pinned memory lands at the sync, into pageable memory before returning") {
    StreamMode mode(kDeferred);
    fill(dev.ptr, 3.0f, a.s);
    std::fill_n(pinned.p, kN, 0.0f);
    REQUIRE(cudaMemcpyAsync(pinned.p, dev.ptr, kBytes, cudaMemcpyDeviceToHost, a.s) == cudaSuccess);
    CHECK(Vec(pinned.p, pinned.p + kN) == Vec(kN, 0.0f));
    REQUIRE(cudaStreamSynchronize(a.s) == cudaSuccess);
    CHECK(Vec(pinned.p, pinned.p + kN) == Vec(kN, 3.0f));
    fill(dev.ptr, 5.0f, a.s);
    REQUIRE(cudaMemcpyAsync(pageable.data(), dev.ptr, kBytes, cudaMemcpyDeviceToHost, a.s) ==
            cudaSuccess);
    CHECK(pageable == Vec(kN, 5.0f));
  }
  SECTION("a kind that contradicts the pointers is refused; pinned memory is host memory") {
    REQUIRE(cudaMemcpyAsync(dev.ptr, pinned.p, kBytes, cudaMemcpyDeviceToHost, a.s) ==
            cudaErrorInvalidValue);
    CHECK_THAT(anvil::sim::last_error_detail(),
               Contains("cudaMemcpyAsync") && Contains("cudaMemcpyDeviceToHost"));
    REQUIRE(cudaMemcpyAsync(pinned.p, pinned.p + 8, 16, cudaMemcpyDeviceToDevice, a.s) ==
            cudaErrorInvalidValue);
    REQUIRE(cudaFreeHost(pageable.data()) == cudaErrorInvalidValue);
    REQUIRE(cudaMemcpyAsync(dev.ptr, pinned.p, kBytes, cudaMemcpyHostToDevice,
                            reinterpret_cast<cudaStream_t>(&pageable)) ==
            cudaErrorInvalidResourceHandle);
    cudaGetLastError();
  }
  SECTION("cudaMallocHost is pinned memory too") {
    StreamMode mode(kDeferred);
    float* host = nullptr;
    REQUIRE(cudaMallocHost(&host, kBytes) == cudaSuccess);
    std::fill_n(host, kN, 1.0f);
    REQUIRE(cudaMemcpyAsync(dev.ptr, host, kBytes, cudaMemcpyHostToDevice, a.s) == cudaSuccess);
    std::fill_n(host, kN, 6.0f);
    REQUIRE(cudaFreeHost(host) == cudaSuccess);  // waits for the copy, which reads the 6s
    CHECK(peek(dev.ptr) == Vec(kN, 6.0f));
  }
}

TEST_CASE("sim streams: Tensor::to from pinned memory copies the bytes of the call",
          "[sim][streams][tsan]") {
  // The backend's copy from a pinned tensor must wait for its copy: the
  // caller may reuse the buffer as soon as to() returns.
  StreamMode mode(kDeferred);
  anvil::Tensor host = anvil::Tensor::from_vector(Vec(kN, 1.0f), {kN}).pin_memory();
  REQUIRE(host.is_pinned());
  anvil::Tensor dev = host.to(anvil::Device::cuda(0));
  std::fill_n(static_cast<float*>(host.raw_data()), kN, 2.0f);
  CHECK(dev.to(anvil::Device::cpu()).to_vector() == Vec(kN, 1.0f));
}

TEST_CASE("sim streams: events and stream queries", "[sim][streams][tsan]") {
  REQUIRE(cudaSetDevice(0) == cudaSuccess);
  StreamMode mode(kDeferred);
  Buf<float> x(Vec(kN, 0.0f)), y(Vec(kN, 0.0f));
  // Non-blocking, so that peek (a synchronous copy) does not run its work.
  Stream s(cudaStreamNonBlocking);
  Event e;
  SECTION("cudaEventQuery: not ready once, then it runs the work up to the event") {
    fill(x.ptr, 5.0f, s.s);
    REQUIRE(cudaEventRecord(e.e, s.s) == cudaSuccess);
    fill(y.ptr, 9.0f, s.s);
    REQUIRE(cudaEventQuery(e.e) == cudaErrorNotReady);
    REQUIRE(cudaGetLastError() == cudaSuccess);  // not ready is not an error
    CHECK(peek(x.ptr) == Vec(kN, 0.0f));
    REQUIRE(cudaEventQuery(e.e) == cudaSuccess);
    CHECK(peek(x.ptr) == Vec(kN, 5.0f));
    CHECK(peek(y.ptr) == Vec(kN, 0.0f));  // queued after the event: not run
    REQUIRE(cudaStreamSynchronize(s.s) == cudaSuccess);
    CHECK(peek(y.ptr) == Vec(kN, 9.0f));
  }
  SECTION("a polling loop ends") {
    fill(x.ptr, 5.0f, s.s);
    REQUIRE(cudaEventRecord(e.e, s.s) == cudaSuccess);
    int polls = 0;
    cudaError_t err;
    while ((err = cudaEventQuery(e.e)) == cudaErrorNotReady) ++polls;
    REQUIRE(err == cudaSuccess);
    CHECK(polls == 1);
    CHECK(peek(x.ptr) == Vec(kN, 5.0f));
  }
  SECTION("cudaEventSynchronize runs the event's stream up to the event, no further") {
    fill(x.ptr, 5.0f, s.s);
    REQUIRE(cudaEventRecord(e.e, s.s) == cudaSuccess);
    fill(y.ptr, 9.0f, s.s);
    REQUIRE(cudaEventSynchronize(e.e) == cudaSuccess);
    CHECK(peek(x.ptr) == Vec(kN, 5.0f));
    CHECK(peek(y.ptr) == Vec(kN, 0.0f));
    REQUIRE(cudaStreamQuery(s.s) == cudaErrorNotReady);
    REQUIRE(cudaStreamQuery(s.s) == cudaSuccess);
    CHECK(peek(y.ptr) == Vec(kN, 9.0f));
    REQUIRE(cudaStreamQuery(s.s) == cudaSuccess);  // idle
  }
  SECTION("elapsed time is the host clock when each record ran") {
    Event start, end;
    const auto sleep_between_records = [&] {
      REQUIRE(cudaEventRecord(start.e, s.s) == cudaSuccess);
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      REQUIRE(cudaEventRecord(end.e, s.s) == cudaSuccess);
    };
    float ms = -1;
    // Behind a queued kernel, both records run back to back at the sync: the
    // host's sleep is not GPU time.
    fill(x.ptr, 5.0f, s.s);
    sleep_between_records();
    REQUIRE(cudaEventElapsedTime(&ms, start.e, end.e) == cudaErrorNotReady);
    REQUIRE(cudaEventSynchronize(end.e) == cudaSuccess);
    REQUIRE(cudaEventElapsedTime(&ms, start.e, end.e) == cudaSuccess);
    CHECK(ms >= 0.0f);
    CHECK(ms < 100.0f);
    // On an idle stream each record is reached when it is made, as on a GPU.
    sleep_between_records();
    REQUIRE(cudaEventElapsedTime(&ms, start.e, end.e) == cudaSuccess);
    CHECK(ms >= 150.0f);
    // Eager mode runs every record when it is queued.
    StreamMode eager(kEager);
    fill(x.ptr, 5.0f, s.s);
    sleep_between_records();
    REQUIRE(cudaEventElapsedTime(&ms, start.e, end.e) == cudaSuccess);
    CHECK(ms >= 150.0f);
  }
  SECTION("events without timing, and events never recorded") {
    Event light(cudaEventDisableTiming), never;
    REQUIRE(cudaEventRecord(light.e, s.s) == cudaSuccess);
    REQUIRE(cudaEventRecord(e.e, s.s) == cudaSuccess);
    REQUIRE(cudaStreamSynchronize(s.s) == cudaSuccess);
    float ms = 0;
    REQUIRE(cudaEventElapsedTime(&ms, e.e, light.e) == cudaErrorInvalidResourceHandle);
    CHECK_THAT(anvil::sim::last_error_detail(), Contains("cudaEventDisableTiming"));
    REQUIRE(cudaEventElapsedTime(&ms, never.e, e.e) == cudaErrorInvalidResourceHandle);
    REQUIRE(cudaEventSynchronize(never.e) == cudaSuccess);
    REQUIRE(cudaEventQuery(never.e) == cudaSuccess);
    REQUIRE(cudaStreamWaitEvent(s.s, never.e, 0) == cudaSuccess);
    REQUIRE(cudaStreamWaitEvent(s.s, e.e, 1) == cudaErrorInvalidValue);
    cudaGetLastError();
  }
  SECTION("a destroyed event's wait still holds; a destroyed stream's work still runs") {
    cudaStream_t producer;
    REQUIRE(cudaStreamCreate(&producer) == cudaSuccess);
    cudaEvent_t done;
    REQUIRE(cudaEventCreateWithFlags(&done, cudaEventDisableTiming) == cudaSuccess);
    fill(x.ptr, 8.0f, producer);
    REQUIRE(cudaEventRecord(done, producer) == cudaSuccess);
    REQUIRE(cudaStreamWaitEvent(s.s, done, 0) == cudaSuccess);
    REQUIRE(cudaEventDestroy(done) == cudaSuccess);
    REQUIRE(cudaStreamDestroy(producer) == cudaSuccess);
    REQUIRE(cudaMemcpyAsync(y.ptr, x.ptr, kBytes, cudaMemcpyDeviceToDevice, s.s) == cudaSuccess);
    REQUIRE(cudaStreamSynchronize(s.s) == cudaSuccess);
    CHECK(peek(y.ptr) == Vec(kN, 8.0f));
  }
}

TEST_CASE("sim streams: a deferred kernel's error comes back from the sync that runs it",
          "[sim][streams][tsan]") {
  REQUIRE(cudaSetDevice(0) == cudaSuccess);
  Buf<float> out(Vec(kN, 0.0f));
  Stream s;
  const std::string file = std::filesystem::path(__FILE__).filename().string();
  for (auto mode : {kDeferred, kEager}) {
    DYNAMIC_SECTION((mode == kDeferred ? "deferred" : "eager")) {
      StreamMode set(mode);
      const int line = __LINE__ + 1;
      anvil::cuda::launch(k::fail_from_block, 3, dim3(32), 0, s.s, out.ptr, 2);
      REQUIRE(cudaStreamSynchronize(s.s) == cudaErrorLaunchFailure);
      const std::string site = file + ":" + std::to_string(line);
      CHECK_THAT(anvil::sim::last_error_detail(),
                 Contains(site) && Contains("divergent __syncthreads in block (2,0,0)"));
      CHECK_THAT(cudaGetErrorString(cudaErrorLaunchFailure), Contains(site));
      REQUIRE(cudaGetLastError() == cudaErrorLaunchFailure);
      // Reported once: the next sync has nothing to say.
      REQUIRE(cudaStreamSynchronize(s.s) == cudaSuccess);
      REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    }
  }
  SECTION("anvil::cuda::check's exception names the kernel's launch") {
    StreamMode set(kDeferred);
    const int line = __LINE__ + 1;
    anvil::cuda::launch(k::throw_in_thread, 3, dim3(8), 0, s.s, 1, 5);
    REQUIRE_THROWS_WITH(anvil::cuda::check(cudaDeviceSynchronize(), "cudaDeviceSynchronize"),
                        Contains(file + ":" + std::to_string(line)) &&
                            Contains("block (1,0,0), thread (5,0,0) threw: thrown on purpose"));
  }
  SECTION("a bad configuration is still refused at the launch") {
    StreamMode set(kDeferred);
    REQUIRE_THROWS_WITH(anvil::cuda::launch(k::fill_value, 1, dim3(2048), 0, s.s, out.ptr, kN,
                                            1.0f),
                        Contains("2048 threads") && Contains(file));
    REQUIRE_THROWS_WITH(anvil::cuda::launch(k::fill_value, 1, dim3(32), 0,
                                            reinterpret_cast<cudaStream_t>(&out), out.ptr, kN,
                                            1.0f),
                        Contains("unknown stream"));
  }
}

TEST_CASE("sim workers: blocks run on several threads with the same results", "[sim][workers][tsan]") {
  REQUIRE(cudaSetDevice(0) == cudaSuccess);
  StreamMode mode(kDeferred);
  SECTION("two workers run two blocks at the same time; one runs them in turn") {
    for (unsigned workers : {1u, 2u}) {
      Workers set(workers);
      Buf<int> arrived(std::vector<int>{0}), met(std::vector<int>{-1, -1});
      // One worker: block 0 gives up after a few polls. Two: it waits for block 1.
      const long patience = workers == 1 ? 1000 : 1L << 40;
      anvil::cuda::launch(k::meet_all_blocks, 2, dim3(1), 0, nullptr, arrived.ptr, met.ptr,
                          patience);
      INFO(workers << " workers");
      CHECK(met.to_host() == (workers == 1 ? std::vector<int>{0, 1} : std::vector<int>{1, 1}));
    }
  }
  SECTION("a grid of many blocks gives the same bytes on one and on two workers") {
    constexpr int kBlocks = 120;
    Vec in(kBlocks * 64), want(kBlocks);
    for (int i = 0; i < kBlocks * 64; ++i) in[size_t(i)] = float(i % 97);  // exact sums
    for (int b = 0; b < kBlocks; ++b)
      for (int t = 0; t < 64; ++t) want[size_t(b)] += in[size_t(b * 64 + t)];
    const Vec a = cuda_test::random_floats(96 * 80, 1), bm = cuda_test::random_floats(80 * 72, 2);
    Buf<float> din(in), da(a), db(bm);
    std::vector<Vec> sums, products;
    for (unsigned workers : {1u, 2u}) {
      Workers set(workers);
      Buf<float> out(kBlocks), c(96 * 72);
      anvil::cuda::launch(k::block_sums, kBlocks, dim3(64), 0, nullptr, din.ptr, out.ptr);
      anvil::cuda::gemm(4, false, false, 96, 72, 80, 1.0f, da.ptr, 80, db.ptr, 72, 0.0f, c.ptr,
                        72, nullptr);
      sums.push_back(out.to_host());
      products.push_back(c.to_host());
    }
    CHECK(sums[0] == want);
    CHECK(sums[1] == want);
    CHECK(products[0] == products[1]);  // bit for bit
    CHECK(products[0][0] != 0.0f);
  }
  SECTION("an error in one block among many is reported once") {
    constexpr int kBlocks = 100;
    constexpr int kFirstBad = 60;
    for (unsigned workers : {1u, 2u}) {
      Workers set(workers);
      Buf<float> out(Vec(kBlocks, 0.0f));
      // Every block from kFirstBad on fails; whichever fails first is the report.
      anvil::cuda::launch(k::fail_from_block, kBlocks, dim3(32), 0, nullptr, out.ptr, kFirstBad);
      INFO(workers << " workers");
      REQUIRE(cudaDeviceSynchronize() == cudaErrorLaunchFailure);
      const std::string detail = anvil::sim::last_error_detail();
      size_t reports = 0;
      for (size_t at = detail.find("divergent"); at != std::string::npos;
           at = detail.find("divergent", at + 1))
        ++reports;
      CHECK(reports == 1);
      REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
      // Blocks are taken in order, and each taken block runs to its end: every
      // block before the first bad one ran, none after it did.
      if (workers == 1) CHECK_THAT(detail, Contains("block (60,0,0)"));
      const Vec got = peek(out.ptr, kBlocks);
      CHECK(Vec(got.begin(), got.begin() + kFirstBad) == Vec(kFirstBad, 1.0f));
      CHECK(Vec(got.begin() + kFirstBad, got.end()) == Vec(kBlocks - kFirstBad, 0.0f));
    }
    cudaGetLastError();
  }
}

TEST_CASE("sim child: report settings", "[.][sim-child]") {
  std::printf("workers=%u streams=%s\n", anvil::sim::workers(),
              anvil::sim::stream_mode() == kEager ? "eager" : "deferred");
}

TEST_CASE("sim: ANVIL_SIM_WORKERS and ANVIL_SIM_STREAMS set the defaults", "[sim][streams][tsan]") {
  CHECK_THAT(run_child("ANVIL_SIM_WORKERS=3 ANVIL_SIM_STREAMS=eager", "sim child: report settings"),
             Contains("workers=3 streams=eager"));
  CHECK_THAT(run_child("ANVIL_SIM_WORKERS=0 ANVIL_SIM_STREAMS=deferred",
                       "sim child: report settings"),
             Contains("workers=1 streams=deferred"));
  const unsigned hardware = std::max(1u, std::thread::hardware_concurrency());
  CHECK_THAT(run_child("env -u ANVIL_SIM_WORKERS -u ANVIL_SIM_STREAMS",
                       "sim child: report settings"),
             Contains("workers=" + std::to_string(hardware) + " streams=deferred"));
}

#endif  // ANVIL_CUDA_SIM
