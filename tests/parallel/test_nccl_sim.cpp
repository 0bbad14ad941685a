// The simulated NCCL itself (sim/nccl_sim.cpp), through NCCL's own API: a
// stream stalls at an operation until its peer queues the matching one, and
// a blocking synchronisation waits for that; operations that wait for each
// other in a cycle are an error, not a hang; sizes that differ and host
// buffers are refused with both sides named; the directories a crashed job
// of several processes leaves in /dev/shm are swept. Simulator build only.
#if defined(ANVIL_CUDA_SIM)
#include <catch2/catch.hpp>

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <utime.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "core/device.h"
#include "parallel/nccl_api.h"
#include "tests/parallel/ranks.h"

using Catch::Matchers::Contains;

namespace {

void ok(cudaError_t e) { REQUIRE(e == cudaSuccess); }

// Two ranks, on cuda:0 and cuda:1, made from one thread (non-blocking init).
struct Pair {
  ncclComm_t comm[2] = {nullptr, nullptr};
  cudaStream_t stream[2] = {nullptr, nullptr};
  float* buf[2] = {nullptr, nullptr};
  Pair() {
    ncclUniqueId id;
    REQUIRE(ncclGetUniqueId(&id) == ncclSuccess);
    for (int r = 0; r < 2; ++r) {
      ok(cudaSetDevice(r));
      ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
      config.blocking = 0;
      const ncclResult_t res = ncclCommInitRankConfig(&comm[r], 2, id, r, &config);
      REQUIRE((res == ncclSuccess || res == ncclInProgress));
      ok(cudaStreamCreateWithFlags(&stream[r], cudaStreamNonBlocking));
      ok(cudaMalloc(&buf[r], 64 * sizeof(float)));
      ok(cudaMemset(buf[r], 0, 64 * sizeof(float)));
    }
    for (int r = 0; r < 2; ++r) settle(r);
  }
  ~Pair() {
    for (int r = 0; r < 2; ++r) {
      cudaSetDevice(r);
      ncclCommAbort(comm[r]);
      cudaStreamDestroy(stream[r]);
      cudaFree(buf[r]);
    }
  }
  // Polls the communicator until it is no longer "in progress".
  ncclResult_t settle(int r) {
    ncclResult_t state = ncclInProgress;
    for (int i = 0; i < 1000 && state == ncclInProgress; ++i)
      REQUIRE(ncclCommGetAsyncError(comm[r], &state) == ncclSuccess);
    return state;
  }
  void on(int r) { ok(cudaSetDevice(r)); }
};

}  // namespace

TEST_CASE("nccl sim: a stream stalls until the peer's thread queues the matching send",
          "[nccl][sim][tsan]") {
  if (parallel_test::gpus(2) == 0) return;
  Pair p;
  std::vector<float> ones(64, 1.0f);
  p.on(1);
  ok(cudaMemcpy(p.buf[1], ones.data(), 64 * sizeof(float), cudaMemcpyHostToDevice));
  p.on(0);
  REQUIRE(ncclRecv(p.buf[0], 64, ncclFloat32, 1, p.comm[0], p.stream[0]) == ncclInProgress);
  REQUIRE(p.settle(0) == ncclSuccess);
  // No send yet: the stream is not ready however often it is asked.
  for (int i = 0; i < 3; ++i) REQUIRE(cudaStreamQuery(p.stream[0]) == cudaErrorNotReady);
  std::thread peer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    cudaSetDevice(1);
    ncclSend(p.buf[1], 64, ncclFloat32, 0, p.comm[1], p.stream[1]);
  });
  ok(cudaStreamSynchronize(p.stream[0]));  // waits for the peer thread, then runs
  peer.join();
  std::vector<float> got(64);
  ok(cudaMemcpy(got.data(), p.buf[0], 64 * sizeof(float), cudaMemcpyDeviceToHost));
  REQUIRE(got == ones);
  p.on(1);
  ok(cudaStreamSynchronize(p.stream[1]));
}

TEST_CASE("nccl sim: operations that wait for each other in a cycle fail instead of hanging",
          "[nccl][sim][tsan]") {
  if (parallel_test::gpus(2) == 0) return;
  Pair p;
  for (int r = 0; r < 2; ++r) {  // each receives before it sends: a deadlock on a GPU
    p.on(r);
    ncclRecv(p.buf[r], 8, ncclFloat32, 1 - r, p.comm[r], p.stream[r]);
    p.settle(r);
    ncclSend(p.buf[r] + 8, 8, ncclFloat32, 1 - r, p.comm[r], p.stream[r]);
    p.settle(r);
  }
  p.on(0);
  REQUIRE(cudaStreamSynchronize(p.stream[0]) == cudaErrorLaunchFailure);
  REQUIRE_THAT(cudaGetErrorString(cudaErrorLaunchFailure), Contains("deadlock"));
}

TEST_CASE("nccl sim: a send and a receive of different sizes fail, naming both ranks",
          "[nccl][sim][tsan]") {
  if (parallel_test::gpus(2) == 0) return;
  Pair p;
  p.on(0);
  ncclSend(p.buf[0], 25, ncclFloat32, 1, p.comm[0], p.stream[0]);
  p.settle(0);
  p.on(1);
  ncclRecv(p.buf[1], 24, ncclFloat32, 0, p.comm[1], p.stream[1]);
  p.settle(1);
  REQUIRE(cudaStreamSynchronize(p.stream[1]) == cudaErrorLaunchFailure);
  REQUIRE_THAT(cudaGetErrorString(cudaErrorLaunchFailure),
               Contains("ncclSend #0 of 100 bytes from rank 0 meets ncclRecv of 96 bytes at "
                        "rank 1"));
  ncclResult_t state = ncclSuccess;
  REQUIRE(ncclCommGetAsyncError(p.comm[0], &state) == ncclSuccess);
  REQUIRE(state == ncclInvalidUsage);
}

TEST_CASE("nccl sim: host memory and another device's stream are refused at the call",
          "[nccl][sim][tsan]") {
  if (parallel_test::gpus(2) == 0) return;
  Pair p;
  p.on(0);
  std::vector<float> host(8);
  REQUIRE(ncclSend(host.data(), 8, ncclFloat32, 1, p.comm[0], p.stream[0]) ==
          ncclInvalidArgument);
  REQUIRE_THAT(ncclGetLastError(p.comm[0]), Contains("a buffer is not memory of cuda:0"));
  REQUIRE(ncclSend(p.buf[0], 8, ncclFloat32, 1, p.comm[0], p.stream[1]) == ncclInvalidArgument);
  REQUIRE_THAT(ncclGetLastError(p.comm[0]),
               Contains("the stream belongs to cuda:1, the communicator to cuda:0"));
}

TEST_CASE("nccl sim: the directory a crashed job of processes left behind is removed",
          "[nccl][sim][tsan]") {
  // A process id that no longer runs: a child's, once reaped.
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  REQUIRE(child > 0);
  REQUIRE(::waitpid(child, nullptr, 0) == child);
  struct stat st {};
  const std::string base = ::stat("/dev/shm", &st) == 0 ? "/dev/shm" : "/tmp";
  const auto make = [&](const std::string& tag, long long pid, bool old) {
    const std::string dir = base + "/anvil-nccl-sim-" + tag + "-1-" + std::to_string(pid);
    REQUIRE(::mkdir(dir.c_str(), 0700) == 0);
    std::FILE* f = std::fopen((dir + "/c-0-1").c_str(), "w");
    REQUIRE(f);
    std::fclose(f);
    if (old) {
      const utimbuf two_minutes_ago{::time(nullptr) - 120, ::time(nullptr) - 120};
      REQUIRE(::utime(dir.c_str(), &two_minutes_ago) == 0);
    }
    return dir;
  };
  const auto exists = [](const std::string& dir) { return ::access(dir.c_str(), F_OK) == 0; };
  const std::string tag = "00000000feed" + std::to_string(::getpid() % 10000);
  const std::string crashed = make(tag + "a", child, true);
  const std::string recent = make(tag + "b", child, false);  // may still be in use
  const std::string running = make(tag + "c", ::getpid(), true);
  ncclUniqueId id;
  REQUIRE(ncclGetUniqueId(&id) == ncclSuccess);
  CHECK_FALSE(exists(crashed));
  CHECK(exists(recent));
  CHECK(exists(running));
  for (const std::string& dir : {crashed, recent, running}) {
    std::remove((dir + "/c-0-1").c_str());
    ::rmdir(dir.c_str());
  }
}
#endif
