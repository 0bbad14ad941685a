// Stream capture and CUDA graphs, through the runtime API itself, so the same
// tests check the simulator's emulation (sim/capture.cpp) and, on a GPU, the
// CUDA runtime. What each test expects comes from the CUDA Programming
// Guide's rules of stream capture and the error codes cuda_runtime_api.h and
// driver_types.h document, written here independently of the emulation.
#include <catch2/catch.hpp>

#include "tests/cuda_test_util.h"

#if defined(ANVIL_CUDA_BACKEND)
#include <thread>
#include <vector>

#include "kernels/cuda/cuda_kernels.h"

namespace {

template <typename T>
using Buf = cuda_test::DeviceBuffer<T>;
constexpr int kN = 1000;
constexpr size_t kBytes = kN * sizeof(float);

// A stream, an event, a graph and its instance, released at scope exit.
struct Stream {
  cudaStream_t s = nullptr;
  explicit Stream(unsigned flags = cudaStreamNonBlocking) {
    anvil::cuda::check(cudaStreamCreateWithFlags(&s, flags), "cudaStreamCreateWithFlags");
  }
  ~Stream() { cudaStreamDestroy(s); }
};
struct Event {
  cudaEvent_t e = nullptr;
  Event() { anvil::cuda::check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "event"); }
  ~Event() { cudaEventDestroy(e); }
};
struct Graph {
  cudaGraph_t g = nullptr;
  cudaGraphExec_t exec = nullptr;
  ~Graph() {
    if (exec) cudaGraphExecDestroy(exec);
    if (g) cudaGraphDestroy(g);
  }
  size_t nodes() const {
    size_t n = 0;
    anvil::cuda::check(cudaGraphGetNodes(g, nullptr, &n), "cudaGraphGetNodes");
    return n;
  }
  void instantiate() { anvil::cuda::check(cudaGraphInstantiate(&exec, g, 0), "cudaGraphInstantiate"); }
};

cudaStreamCaptureStatus status(cudaStream_t s) {
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  anvil::cuda::check(cudaStreamIsCapturing(s, &st), "cudaStreamIsCapturing");
  return st;
}

std::vector<float> filled(float v) { return std::vector<float>(kN, v); }

}  // namespace

TEST_CASE("cuda graphs: captured work runs only when the graph is launched, and each launch "
          "repeats it",
          "[cuda][graph]") {
  if (!cuda_test::have_device()) return;
  Buf<float> x(kN), y(filled(1.0f)), z(kN);
  Stream s;
  Graph g;
  REQUIRE(cudaStreamBeginCapture(s.s, cudaStreamCaptureModeGlobal) == cudaSuccess);
  CHECK(status(s.s) == cudaStreamCaptureStatusActive);
  anvil::cuda::fill(kN, 2.0f, x.ptr, s.s);
  anvil::cuda::axpy(kN, 3.0f, x.ptr, y.ptr, s.s);  // y += 6
  REQUIRE(cudaMemcpyAsync(z.ptr, y.ptr, kBytes, cudaMemcpyDeviceToDevice, s.s) == cudaSuccess);
  REQUIRE(cudaMemsetAsync(x.ptr, 0, kBytes, s.s) == cudaSuccess);
  REQUIRE(cudaStreamEndCapture(s.s, &g.g) == cudaSuccess);
  REQUIRE(g.g != nullptr);
  CHECK(status(s.s) == cudaStreamCaptureStatusNone);
  CHECK(g.nodes() == 4);
  REQUIRE(cudaStreamSynchronize(s.s) == cudaSuccess);
  CHECK(y.to_host() == filled(1.0f));  // nothing ran at capture
  g.instantiate();
  for (int launch = 1; launch <= 3; ++launch) {
    REQUIRE(cudaGraphLaunch(g.exec, s.s) == cudaSuccess);
    REQUIRE(cudaStreamSynchronize(s.s) == cudaSuccess);
    CHECK(y.to_host() == filled(1.0f + 6.0f * launch));
    CHECK(z.to_host() == filled(1.0f + 6.0f * launch));
    CHECK(x.to_host() == filled(0.0f));
  }
}

TEST_CASE("cuda graphs: a capture across two streams joined by events, and a fork not joined "
          "back",
          "[cuda][graph]") {
  if (!cuda_test::have_device()) return;
  Buf<float> x(kN), y(filled(1.0f)), z(kN);
  Stream origin, side;
  Event forked, joined;
  Graph g;
  REQUIRE(cudaStreamBeginCapture(origin.s, cudaStreamCaptureModeGlobal) == cudaSuccess);
  anvil::cuda::fill(kN, 2.0f, x.ptr, origin.s);
  REQUIRE(cudaEventRecord(forked.e, origin.s) == cudaSuccess);
  REQUIRE(cudaStreamWaitEvent(side.s, forked.e, 0) == cudaSuccess);  // side joins the capture
  CHECK(status(side.s) == cudaStreamCaptureStatusActive);
  anvil::cuda::axpy(kN, 3.0f, x.ptr, y.ptr, side.s);
  SECTION("joined back: one graph, in order") {
    REQUIRE(cudaEventRecord(joined.e, side.s) == cudaSuccess);
    REQUIRE(cudaStreamWaitEvent(origin.s, joined.e, 0) == cudaSuccess);
    REQUIRE(cudaMemcpyAsync(z.ptr, y.ptr, kBytes, cudaMemcpyDeviceToDevice, origin.s) ==
            cudaSuccess);
    REQUIRE(cudaStreamEndCapture(origin.s, &g.g) == cudaSuccess);
    CHECK(status(side.s) == cudaStreamCaptureStatusNone);
    CHECK(g.nodes() == 3);
    g.instantiate();
    REQUIRE(cudaGraphLaunch(g.exec, origin.s) == cudaSuccess);
    REQUIRE(cudaGraphLaunch(g.exec, origin.s) == cudaSuccess);
    REQUIRE(cudaStreamSynchronize(origin.s) == cudaSuccess);
    CHECK(z.to_host() == filled(13.0f));
  }
  SECTION("not joined back: no graph") {
    CHECK(cudaStreamEndCapture(origin.s, &g.g) == cudaErrorStreamCaptureUnjoined);
    (void)cudaGetLastError();
    CHECK(g.g == nullptr);
    CHECK(status(origin.s) == cudaStreamCaptureStatusNone);
    CHECK(status(side.s) == cudaStreamCaptureStatusNone);
  }
}

TEST_CASE("cuda graphs: each rule of stream capture gives CUDA's error and invalidates the "
          "capture",
          "[cuda][graph]") {
  if (!cuda_test::have_device()) return;
  Buf<float> x(kN);
  Stream s, other;
  Event e;
  Graph g;
  // Begins a capture on s, expects `call` to return `want`, then the capture
  // to end invalidated (no graph) and s to be usable again.
  auto broken = [&](cudaError_t want, auto call) {
    REQUIRE(cudaStreamBeginCapture(s.s, cudaStreamCaptureModeGlobal) == cudaSuccess);
    CHECK(call() == want);
    (void)cudaGetLastError();
    CHECK(status(s.s) == cudaStreamCaptureStatusInvalidated);
    CHECK(cudaStreamEndCapture(s.s, &g.g) == cudaErrorStreamCaptureInvalidated);
    (void)cudaGetLastError();
    CHECK(g.g == nullptr);
    CHECK(status(s.s) == cudaStreamCaptureStatusNone);
    CHECK(cudaStreamSynchronize(s.s) == cudaSuccess);
  };
  SECTION("synchronising or querying the capturing stream") {
    broken(cudaErrorStreamCaptureUnsupported, [&] { return cudaStreamSynchronize(s.s); });
    broken(cudaErrorStreamCaptureUnsupported, [&] { return cudaStreamQuery(s.s); });
  }
  SECTION("synchronising the device while one of its streams captures") {
    broken(cudaErrorStreamCaptureUnsupported, [&] { return cudaDeviceSynchronize(); });
  }
  SECTION("querying or synchronising an event recorded in the capture") {
    broken(cudaErrorCapturedEvent, [&] {
      REQUIRE(cudaEventRecord(e.e, s.s) == cudaSuccess);
      return cudaEventQuery(e.e);
    });
    broken(cudaErrorCapturedEvent, [&] {
      REQUIRE(cudaEventRecord(e.e, s.s) == cudaSuccess);
      return cudaEventSynchronize(e.e);
    });
  }
  SECTION("cudaMalloc and cudaFree, unless the thread's mode is relaxed") {
    void* p = nullptr;
    broken(cudaErrorStreamCaptureUnsupported, [&] { return cudaMalloc(&p, 256); });
    broken(cudaErrorStreamCaptureUnsupported, [&] { return cudaFree(x.ptr); });
    REQUIRE(cudaStreamBeginCapture(s.s, cudaStreamCaptureModeGlobal) == cudaSuccess);
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    REQUIRE(cudaThreadExchangeStreamCaptureMode(&mode) == cudaSuccess);
    CHECK(mode == cudaStreamCaptureModeGlobal);
    CHECK(cudaMalloc(&p, 256) == cudaSuccess);
    REQUIRE(cudaThreadExchangeStreamCaptureMode(&mode) == cudaSuccess);
    CHECK(mode == cudaStreamCaptureModeRelaxed);
    anvil::cuda::fill(kN, 1.0f, x.ptr, s.s);
    REQUIRE(cudaStreamEndCapture(s.s, &g.g) == cudaSuccess);
    CHECK(g.nodes() == 1);
    CHECK(cudaFree(p) == cudaSuccess);
  }
  SECTION("a copy from pageable host memory") {
    std::vector<float> pageable(kN, 1.0f);
    broken(cudaErrorStreamCaptureUnsupported, [&] {
      return cudaMemcpyAsync(x.ptr, pageable.data(), kBytes, cudaMemcpyHostToDevice, s.s);
    });
  }
  SECTION("a capturing stream waiting on an event recorded outside the capture") {
    REQUIRE(cudaEventRecord(e.e, other.s) == cudaSuccess);
    broken(cudaErrorStreamCaptureIsolation, [&] { return cudaStreamWaitEvent(s.s, e.e, 0); });
  }
}

TEST_CASE("cuda graphs: the legacy stream while a blocking stream captures, and the rules of "
          "ending a capture",
          "[cuda][graph]") {
  if (!cuda_test::have_device()) return;
  Buf<float> x(kN);
  Graph g;
  SECTION("the legacy stream depends on a capturing blocking stream") {
    Stream blocking(cudaStreamDefault);
    REQUIRE(cudaStreamBeginCapture(blocking.s, cudaStreamCaptureModeGlobal) == cudaSuccess);
    CHECK(cudaMemsetAsync(x.ptr, 0, kBytes, nullptr) == cudaErrorStreamCaptureImplicit);
    (void)cudaGetLastError();
    CHECK(cudaStreamEndCapture(blocking.s, &g.g) == cudaErrorStreamCaptureInvalidated);
    (void)cudaGetLastError();
    CHECK(g.g == nullptr);
  }
  SECTION("a non-blocking stream's capture leaves the legacy stream free") {
    Stream nonblocking;
    REQUIRE(cudaStreamBeginCapture(nonblocking.s, cudaStreamCaptureModeGlobal) == cudaSuccess);
    CHECK(cudaMemsetAsync(x.ptr, 0, kBytes, nullptr) == cudaSuccess);
    CHECK(cudaStreamEndCapture(nonblocking.s, &g.g) == cudaSuccess);
  }
  SECTION("ending on a stream that joined, not the origin") {
    Stream origin, side;
    Event e;
    REQUIRE(cudaStreamBeginCapture(origin.s, cudaStreamCaptureModeGlobal) == cudaSuccess);
    REQUIRE(cudaEventRecord(e.e, origin.s) == cudaSuccess);
    REQUIRE(cudaStreamWaitEvent(side.s, e.e, 0) == cudaSuccess);
    CHECK(cudaStreamEndCapture(side.s, &g.g) == cudaErrorStreamCaptureUnmatched);
    (void)cudaGetLastError();
    CHECK(cudaStreamEndCapture(origin.s, &g.g) == cudaErrorStreamCaptureInvalidated);
    (void)cudaGetLastError();
  }
  SECTION("ending from another thread, the capture not relaxed") {
    Stream s;
    REQUIRE(cudaStreamBeginCapture(s.s, cudaStreamCaptureModeGlobal) == cudaSuccess);
    cudaError_t there = cudaSuccess;
    std::thread([&] {
      cudaSetDevice(0);
      there = cudaStreamEndCapture(s.s, &g.g);
      (void)cudaGetLastError();
    }).join();
    CHECK(there == cudaErrorStreamCaptureWrongThread);
    CHECK(status(s.s) == cudaStreamCaptureStatusActive);
    CHECK(cudaStreamEndCapture(s.s, &g.g) == cudaSuccess);
  }
  SECTION("beginning on the legacy stream or twice, ending without a capture") {
    Stream s;
    CHECK(cudaStreamBeginCapture(nullptr, cudaStreamCaptureModeGlobal) == cudaErrorInvalidValue);
    (void)cudaGetLastError();
    CHECK(cudaStreamEndCapture(s.s, &g.g) == cudaErrorInvalidValue);
    (void)cudaGetLastError();
    REQUIRE(cudaStreamBeginCapture(s.s, cudaStreamCaptureModeGlobal) == cudaSuccess);
    CHECK(cudaStreamBeginCapture(s.s, cudaStreamCaptureModeGlobal) == cudaErrorInvalidValue);
    (void)cudaGetLastError();
    CHECK(cudaStreamEndCapture(s.s, &g.g) == cudaSuccess);
  }
}

#endif  // ANVIL_CUDA_BACKEND
