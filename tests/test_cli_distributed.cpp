// anvil-train's data-parallel runs, end to end: `mpirun -np N anvil-train
// --distributed` prints (and writes) what a one-device run does; a
// checkpoint from N ranks resumes on one device and the other way round; a
// rank that is killed, or stops, ends the whole job with an error within the
// deadline; bad data-parallel flags get one clear error. Needs the build's
// MPI (skipped without it).
#if defined(ANVIL_MPIEXEC)
#include <catch2/catch.hpp>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/device.h"
#include "nn/safetensors.h"
#include "tests/cuda_test_util.h"
#include "tests/skip.h"
#include "tests/cli_mpi_util.h"
#include "tests/test_util.h"

using anvil::testing::read_file;
using anvil::testing::TempDir;
using Catch::Contains;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

using namespace anvil::testing::mpi_cli;

TEST_CASE("anvil-train --distributed on 2 and 3 MPI ranks matches the one-device run",
          "[cli][distributed]") {
  TempDir dir("dist");
  write_data(dir.path / "data");
  const std::string common = kRecipe + " --device cpu --data-dir " + (dir.path / "data").string();
  const Run one = shell(train_bin() + common + " --metrics " + dir.file("one.jsonl") + " --save " +
                            dir.file("one.safetensors"),
                        dir);
  INFO(one.output);
  REQUIRE(one.code == 0);
  for (int ranks : {2, 3}) {
    const std::string tag = std::to_string(ranks);
    const Run many = shell(mpirun(ranks) + train_bin() + " --distributed" + common +
                               " --metrics " + dir.file(tag + ".jsonl") + " --save " +
                               dir.file(tag + ".safetensors"),
                           dir);
    INFO(many.output);
    REQUIRE(many.code == 0);
    REQUIRE_THAT(many.output, Contains("on " + tag + " CPU ranks (mpi, one process each, ring"));
    const auto want = metrics_of(dir.file("one.jsonl")), got = metrics_of(dir.file(tag + ".jsonl"));
    REQUIRE(got.size() == want.size());
    for (size_t e = 0; e < want.size(); ++e)
      for (const char* key : {"train_loss", "train_acc", "test_loss", "test_acc"})
        REQUIRE(got[e][key].get<double>() == Approx(want[e][key].get<double>()).epsilon(1e-4));
    REQUIRE(got[0]["ranks"] == ranks);
    require_same_weights(dir.file(tag + ".safetensors"), dir.file("one.safetensors"), 1e-4);
    // Only rank 0 printed: one epoch line per epoch.
    REQUIRE(std::count(many.output.begin(), many.output.end(), '\n') <= 8);
  }
}

TEST_CASE("a checkpoint from 2 MPI ranks resumes on one device, and one from one device on 3 "
          "ranks",
          "[cli][distributed]") {
  TempDir dir("dist_resume");
  write_data(dir.path / "data");
  const std::string common = kRecipe + " --device cpu --data-dir " + (dir.path / "data").string();
  const Run straight = shell(train_bin() + common + " --save " + dir.file("straight.safetensors"), dir);
  REQUIRE(straight.code == 0);
  SECTION("2 ranks, then 1 device") {
    const Run first = shell(mpirun(2) + train_bin() + " --distributed" + common +
                                " --stop-after-epoch 1 --checkpoint " + dir.file("run.ckpt"),
                            dir);
    INFO(first.output);
    REQUIRE(first.code == 0);
    const Run second = shell(train_bin() + common + " --resume " + dir.file("run.ckpt") +
                                 " --save " + dir.file("resumed.safetensors"),
                             dir);
    INFO(second.output);
    REQUIRE(second.code == 0);
    REQUIRE_THAT(second.output, Contains("resumed from"));
    require_same_weights(dir.file("resumed.safetensors"), dir.file("straight.safetensors"), 1e-4);
  }
  SECTION("1 device, then 3 ranks") {
    const Run first = shell(train_bin() + common + " --stop-after-epoch 1 --checkpoint " +
                                dir.file("run.ckpt"),
                            dir);
    REQUIRE(first.code == 0);
    const Run second = shell(mpirun(3) + train_bin() + " --distributed" + common + " --resume " +
                                 dir.file("run.ckpt") + " --save " +
                                 dir.file("resumed.safetensors"),
                             dir);
    INFO(second.output);
    REQUIRE(second.code == 0);
    require_same_weights(dir.file("resumed.safetensors"), dir.file("straight.safetensors"), 1e-4);
  }
  SECTION("a changed global batch is refused, naming the flag") {
    const Run first = shell(mpirun(2) + train_bin() + " --distributed" + common +
                                " --stop-after-epoch 1 --checkpoint " + dir.file("run.ckpt"),
                            dir);
    REQUIRE(first.code == 0);
    const Run second = shell(mpirun(2) + train_bin() + " --distributed" + common +
                                 " --batch-size 32 --resume " + dir.file("run.ckpt"),
                             dir);
    INFO(second.output);
    REQUIRE(second.code != 0);
    REQUIRE_THAT(second.output, Contains("was trained with --batch-size 64, this run has "
                                         "--batch-size 32"));
  }
}

namespace {

// The process id of rank `rank` of a job started by `launcher` (its
// descendants are searched through /proc), or -1 while there is none.
pid_t rank_pid(pid_t launcher, int rank) {
  for (const auto& entry : fs::directory_iterator("/proc")) {
    const std::string name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream env(entry.path() / "environ", std::ios::binary);
    std::string vars((std::istreambuf_iterator<char>(env)), {});
    if (vars.find(std::string("OMPI_COMM_WORLD_RANK=") + std::to_string(rank) + '\0') ==
        std::string::npos)
      continue;
    std::ifstream cmd(entry.path() / "cmdline", std::ios::binary);
    std::string line((std::istreambuf_iterator<char>(cmd)), {});
    if (line.find("anvil-train") == std::string::npos) continue;
    // A descendant of our launcher?
    for (pid_t p = std::stoi(name); p > 1;) {
      std::ifstream stat("/proc/" + std::to_string(p) + "/stat");
      std::string s((std::istreambuf_iterator<char>(stat)), {});
      const size_t close = s.rfind(')');
      if (close == std::string::npos) break;
      std::istringstream rest(s.substr(close + 2));
      char state;
      pid_t parent;
      rest >> state >> parent;
      if (parent == launcher) return std::stoi(name);
      p = parent;
    }
  }
  return -1;
}

// Starts `cmd` (a shell line), sends rank 1 `signal` once it has trained a
// little, and returns how the job ended and how long it took after that.
struct Ended {
  Run run;
  double seconds_after_signal = 0;
};
Ended kill_rank_one(const std::string& cmd, int signal, const TempDir& dir) {
  const std::string out = dir.file("job.txt");
  const pid_t job = fork();
  REQUIRE(job >= 0);
  if (job == 0) {
    setpgid(0, 0);
    execl("/bin/sh", "sh", "-c", (cmd + " > " + out + " 2>&1 < /dev/null").c_str(), nullptr);
    _exit(127);
  }
  pid_t victim = -1;
  for (int i = 0; i < 600 && victim < 0; ++i) {  // up to a minute for the job to start
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    victim = rank_pid(job, 1);
  }
  REQUIRE(victim > 0);
  // Into the training: past the header (start-up, data loading and the
  // ranks' first agreement, which a loaded machine can stretch past any
  // fixed sleep), then a second of steps.
  for (int i = 0; i < 600 && read_file(out).find("training ") == std::string::npos; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  std::this_thread::sleep_for(std::chrono::seconds(1));
  kill(victim, signal);
  const auto start = Clock::now();
  int status = 0;
  bool ended = false;
  while (Clock::now() - start < std::chrono::seconds(90)) {
    if (waitpid(job, &status, WNOHANG) == job) {
      ended = true;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  Ended e;
  e.seconds_after_signal = std::chrono::duration<double>(Clock::now() - start).count();
  if (!ended) {
    kill(-job, SIGKILL);
    waitpid(job, &status, 0);
  }
  e.run.code = ended ? (WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status)) : -1;
  e.run.output = read_file(out);
  kill(victim, SIGKILL);  // whatever is left of a stopped rank
  return e;
}

}  // namespace

TEST_CASE("a rank killed or stopped in training ends the whole job with an error in time",
          "[cli][distributed]") {
  TempDir dir("dist_fault");
  write_data(dir.path / "data");
  // Enough epochs that the job is still training when rank 1 is hit.
  const std::string cmd = mpirun(3) + train_bin() +
                          " --distributed --model lenet --epochs 200 --batch-size 16 --device cpu"
                          " --comm-timeout 3 --checkpoint " + dir.file("run.ckpt") +
                          " --data-dir " + (dir.path / "data").string();
  SECTION("killed") {
    const Ended e = kill_rank_one(cmd, SIGKILL, dir);
    INFO(e.run.output);
    REQUIRE(e.run.code != 0);
    REQUIRE(e.run.code != -1);  // it ended by itself
    REQUIRE(e.seconds_after_signal < 60);
    REQUIRE_THAT(e.run.output, Contains("exited on signal 9"));
  }
  SECTION("stopped") {
    const Ended e = kill_rank_one(cmd, SIGSTOP, dir);
    INFO(e.run.output);
    REQUIRE(e.run.code != 0);
    REQUIRE(e.run.code != -1);
    REQUIRE(e.seconds_after_signal < 60);
    REQUIRE_THAT(e.run.output, Contains("within 3 s (ANVIL_COMM_TIMEOUT)"));
    REQUIRE_THAT(e.run.output, Contains("rank 1"));
  }
  // Whatever was checkpointed is whole: it loads.
  if (fs::exists(dir.file("run.ckpt"))) REQUIRE_NOTHROW(anvil::nn::load_safetensors(dir.file("run.ckpt")));
}

// --gpus 2 end to end: one thread per GPU (simulated in the simulator
// build), NCCL between them, against one GPU; and with --accumulate 2 on
// top. FP32 convolutions (--fp32-precision ieee): a rank's half-batch sums
// in another order than the whole batch, within FP32's tolerance.
TEST_CASE("anvil-train --gpus 2 ends where one GPU does, with --accumulate 2 too",
          "[cli][distributed][cuda]") {
  if (!have_two_gpus("anvil-train on 2 GPU ranks")) return;
  TempDir dir("gpus2");
  write_data(dir.path / "data");
  const std::string common =
      " --model lenet --epochs 1 --batch-size 8 --limit-train 16 --limit-test 8 --init kaiming "
      "--lr 0.05 --no-shuffle --fp32-precision ieee --data-dir " + (dir.path / "data").string();
  const Run one = shell(train_bin() + common + " --device cuda:0 --metrics " +
                            dir.file("one.jsonl") + " --save " + dir.file("one.safetensors"),
                        dir);
  INFO(one.output);
  REQUIRE(one.code == 0);
  CHECK_THAT(one.output, Contains("CUDA graphs (--cuda-graphs): each steady step is one graph launch"));
  for (const std::string extra : {"", " --accumulate 2"}) {
    const std::string tag = extra.empty() ? "two" : "two-acc";
    const Run two = shell(train_bin() + common + " --gpus 2" + extra + " --metrics " +
                              dir.file(tag + ".jsonl") + " --save " + dir.file(tag + ".safetensors"),
                          dir);
    INFO(two.output);
    REQUIRE(two.code == 0);
    REQUIRE_THAT(two.output, Contains("[2 x GPU]"));
    CHECK_THAT(two.output, Contains("CUDA graphs not used: data-parallel steps run eagerly"));
    const auto want = metrics_of(dir.file("one.jsonl")), got = metrics_of(dir.file(tag + ".jsonl"));
    REQUIRE(got.size() == want.size());
    for (const char* key : {"train_loss", "train_acc", "test_loss", "test_acc"})
      REQUIRE(got[0][key].get<double>() == Approx(want[0][key].get<double>()).epsilon(1e-4));
    require_same_weights(dir.file(tag + ".safetensors"), dir.file("one.safetensors"), 1e-4);
  }
}

// One process per GPU: mpirun -np 2 anvil-train --distributed --device cuda,
// NCCL bootstrapped through MPI (nccl_world), each rank on cuda:<local
// rank>, against one GPU. In the simulator build each process has simulated
// GPUs of its own, and the simulated NCCL joins the processes through files
// (sim/nccl_sim_remote.cpp).
TEST_CASE("anvil-train --distributed --device cuda on 2 MPI ranks ends where one GPU does",
          "[cli][distributed][cuda]") {
  if (!cuda_test::have_device("anvil-train on 2 GPU ranks")) {
    test_skip::skip("no CUDA device: " + anvil::no_gpu_reason());
    return;
  }
  if (anvil::device_count() < 2) {
    test_skip::skip("2 ranks on one machine need 2 GPUs; this machine has " +
                    std::to_string(anvil::device_count()));
    return;
  }
  TempDir dir("dist_cuda");
  write_data(dir.path / "data");
  const std::string common =
      " --model lenet --epochs 1 --batch-size 16 --limit-train 64 --limit-test 16 --init kaiming "
      "--lr 0.05 --no-shuffle --fp32-precision ieee --comm-timeout 60 --data-dir " +
      (dir.path / "data").string();
  const Run one = shell(train_bin() + common + " --device cuda:0 --metrics " +
                            dir.file("one.jsonl") + " --save " + dir.file("one.safetensors"),
                        dir);
  INFO(one.output);
  REQUIRE(one.code == 0);
  const Run two = shell(mpirun(2) + train_bin() + " --distributed --device cuda" + common +
                            " --metrics " + dir.file("two.jsonl") + " --save " +
                            dir.file("two.safetensors"),
                        dir);
  INFO(two.output);
  REQUIRE(two.code == 0);
  REQUIRE_THAT(two.output, Contains("on 2 GPU ranks (nccl, ring all-reduce)"));
  const auto want = metrics_of(dir.file("one.jsonl")), got = metrics_of(dir.file("two.jsonl"));
  REQUIRE(got.size() == 1);
  REQUIRE(want.size() == 1);
  REQUIRE(got[0]["ranks"] == 2);
  for (const char* key : {"train_loss", "train_acc", "test_loss", "test_acc"})
    REQUIRE(got[0][key].get<double>() == Approx(want[0][key].get<double>()).epsilon(1e-4));
  require_same_weights(dir.file("two.safetensors"), dir.file("one.safetensors"), 1e-4);
}

// --gpus 2 with one thread failing (ANVIL_TRAIN_FAULT, after its second
// step): its error ends the other thread's work at once, long before the
// 60 s deadline; a thread that hangs instead is named by the other at the
// 4 s deadline, and the process ends without it once the grace (the same
// 4 s) has passed. Either way: exit 1, one error line. (The deadline of the
// hang is 4 s, not less, so that the state broadcast before the first step
// fits in it on a loaded machine.)
TEST_CASE("anvil-train --gpus 2 with a failing or hung rank ends with one error, in time",
          "[cli][distributed][cuda]") {
  if (!have_two_gpus("anvil-train on 2 GPU ranks")) return;
  TempDir dir("gpus2_fault");
  write_data(dir.path / "data");
  // (timeout: a process that never ends fails here, not in ctest's limit)
  const std::string cmd = "timeout 120 " + train_bin() +
                          " --gpus 2 --model lenet --epochs 1 --batch-size 8 --limit-train 64 "
                          "--limit-test 8 --data-dir " +
                          (dir.path / "data").string();
  auto errors = [](const std::string& out) {
    size_t count = 0;
    for (size_t at = out.find("error:"); at != std::string::npos; at = out.find("error:", at + 1))
      ++count;
    return count;
  };
  SECTION("a rank that fails") {
    const auto start = Clock::now();
    const Run r = shell("ANVIL_TRAIN_FAULT=1:2 " + cmd + " --comm-timeout 60", dir);
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    INFO(r.output);
    REQUIRE(r.code == 1);
    REQUIRE_THAT(r.output, Contains("anvil-train: error: rank 1: injected fault after step 2 "
                                    "(ANVIL_TRAIN_FAULT)"));
    REQUIRE(errors(r.output) == 1);
    REQUIRE(seconds < 30);
  }
  SECTION("a rank that hangs") {
    const auto start = Clock::now();
    const Run r = shell("ANVIL_TRAIN_FAULT=1:2:stall " + cmd + " --comm-timeout 4", dir);
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    INFO(r.output);
    REQUIRE(r.code == 1);
    REQUIRE_THAT(r.output, Contains("anvil-train: error: rank 0 (nccl, cuda:0): "));
    REQUIRE_THAT(r.output, Contains("within 4 s (ANVIL_COMM_TIMEOUT)"));
    REQUIRE_THAT(r.output, Contains("(rank 1 (cuda:1) did not stop within 4 s of that failure: "
                                    "the process ends without it)"));
    REQUIRE(errors(r.output) == 1);
    REQUIRE(seconds < 60);
  }
}

// --grad-dtype bf16 end to end on 2 MPI ranks: the header and the metrics
// say it, and training goes as with float32 gradients (the bound itself is
// tested in tests/parallel/bf16_scenarios.h: here a rounding of 2^-8 per
// gradient moves one epoch's mean loss by far less than 1%). Ranks started
// with different --grad-dtype stop, naming it; without data parallelism the
// flag is a usage error.
TEST_CASE("anvil-train --distributed --grad-dtype bf16 on 2 MPI ranks", "[cli][distributed]") {
  TempDir dir("grad_bf16");
  write_data(dir.path / "data");
  const std::string common = " --distributed --model lenet --init kaiming --lr 0.05 --epochs 1 "
                             "--batch-size 32 --limit-train 96 --limit-test 32 --no-shuffle "
                             "--device cpu --comm-timeout 60 --data-dir " +
                             (dir.path / "data").string();
  const Run f32 = shell(mpirun(2) + train_bin() + common + " --metrics " + dir.file("f32.jsonl"), dir);
  INFO(f32.output);
  REQUIRE(f32.code == 0);
  REQUIRE_THAT(f32.output, Contains("gradients all-reduced in float32 (--grad-dtype float32)"));
  const Run bf16 = shell(mpirun(2) + train_bin() + common + " --grad-dtype bf16 --metrics " +
                             dir.file("bf16.jsonl"),
                         dir);
  INFO(bf16.output);
  REQUIRE(bf16.code == 0);
  REQUIRE_THAT(bf16.output, Contains("gradients all-reduced in bfloat16 (--grad-dtype bf16): half "
                                     "the bytes"));
  const auto want = metrics_of(dir.file("f32.jsonl")), got = metrics_of(dir.file("bf16.jsonl"));
  REQUIRE(got.size() == 1);
  REQUIRE(want.size() == 1);
  CHECK(got[0]["grad_dtype"] == "bf16");
  CHECK(want[0]["grad_dtype"] == "float32");
  CHECK(got[0]["train_loss"].get<double>() ==
        Approx(want[0]["train_loss"].get<double>()).epsilon(1e-2));

  // One job, two programs: rank 1 reduces in bfloat16, rank 0 in float32.
  const Run mixed = shell(kMpiEnv + ANVIL_MPIEXEC + std::string(" --oversubscribe -np 1 ") +
                              train_bin() + common + " : -np 1 " + train_bin() + common +
                              " --grad-dtype bf16",
                          dir);
  INFO(mixed.output);
  REQUIRE(mixed.code != 0);
  REQUIRE_THAT(mixed.output,
               Contains("rank 1 was started with --grad-dtype \"bf16\", rank 0 with "
                        "--grad-dtype \"float32\""));

  const Run alone = shell(train_bin() + " --grad-dtype bf16 --device cpu", dir);
  INFO(alone.output);
  REQUIRE(alone.code == 2);
  REQUIRE_THAT(alone.output, Contains("--grad-dtype bf16: only for data-parallel runs (--gpus, "
                                      "--devices, --distributed)"));
}

// [devices]: what --devices says depends on how many devices the build has.
TEST_CASE("bad data-parallel flags get one clear error", "[cli][distributed][devices]") {
  TempDir dir("dist_flags");
  const Run r = shell(mpirun(2) + train_bin() + " --distributed --batch-size 1 --data-dir " +
                          dir.path.string(),
                      dir);
  INFO(r.output);
  REQUIRE(r.code != 0);
  REQUIRE_THAT(r.output, Contains("--batch-size 1: the global batch is split across 2 ranks"));
  const Run gpu = shell(train_bin() + " --distributed --device cuda:1", dir);
  REQUIRE(gpu.code == 2);
  REQUIRE_THAT(gpu.output, Contains("--device cuda:1 with --distributed"));
  const Run mixed = shell(train_bin() + " --gpus 1 --device cpu", dir);
  REQUIRE(mixed.code == 2);
  // More GPUs than the machine has (2 simulated GPUs in the simulator build).
  const int have = anvil::device_count();
  const Run many = shell(train_bin() + " --gpus " + std::to_string(have + 1), dir);
  INFO(many.output);
  REQUIRE(many.code == 2);
  REQUIRE_THAT(many.output, Contains(fmt::format("--gpus {}: this machine has {} GPU(s)",
                                                 have + 1, have)));
  const Run twice = shell(train_bin() + " --devices cuda:0,cuda:0", dir);
  INFO(twice.output);
  REQUIRE(twice.code == 2);
  REQUIRE_THAT(twice.output, Contains(have > 0 ? "--devices cuda:0,cuda:0: cuda:0 is named twice"
                                               : "--devices cuda:0,cuda:0: cuda:0 is not available"));
}

TEST_CASE("ranks started with different flags stop, naming the flag", "[cli][distributed]") {
  TempDir dir("dist_mismatch");
  write_data(dir.path / "data");
  const std::string common = train_bin() + " --distributed --model lenet --epochs 1 --batch-size 16 "
                             "--device cpu --comm-timeout 20 --data-dir " +
                             (dir.path / "data").string();
  // One job, two programs (mpirun's MPMD form): rank 1 has another rate.
  const Run r = shell(kMpiEnv + ANVIL_MPIEXEC + std::string(" --oversubscribe -np 1 ") + common +
                          " --lr 0.1 : -np 1 " + common + " --lr 0.2",
                      dir);
  INFO(r.output);
  REQUIRE(r.code != 0);
  REQUIRE_THAT(r.output, Contains("rank 1 was started with --lr 0.2, rank 0 with --lr 0.1"));
}
// Every flag of anvil-train's option table is compared, not only the
// training settings (--stop-after-epoch: one rank would stop and leave the
// others waiting; --device cpu and cuda: MPI and NCCL communicators that
// never meet), and so are the data files' contents: each differing rank
// names the difference at once, before the 20 s deadline.
TEST_CASE("ranks that differ in any flag or in their data files stop at once, naming it",
          "[cli][distributed]") {
  TempDir dir("dist_mismatch_any");
  write_data(dir.path / "data");
  const std::string data = (dir.path / "data").string();
  const std::string common = train_bin() + " --distributed --model lenet --epochs 2 --batch-size 16 "
                             "--limit-train 64 --limit-test 16 --comm-timeout 20";
  auto mpmd = [&](const std::string& rank0, const std::string& rank1) {
    const auto start = Clock::now();
    const Run r = shell(kMpiEnv + ANVIL_MPIEXEC + std::string(" --oversubscribe -np 1 ") + common +
                            rank0 + " : -np 1 " + common + rank1,
                        dir);
    INFO(r.output);
    CHECK(std::chrono::duration<double>(Clock::now() - start).count() < 15);
    CHECK(r.code != 0);
    return r.output;
  };
  const std::string cpu = " --device cpu --data-dir " + data;
  SECTION("--stop-after-epoch") {
    REQUIRE_THAT(mpmd(cpu, cpu + " --stop-after-epoch 1"),
                 Contains("rank 1 was started with --stop-after-epoch \"1\", rank 0 with "
                          "--stop-after-epoch \"(not given)\""));
  }
  SECTION("--device cpu and cuda") {
    REQUIRE_THAT(mpmd(cpu, " --device cuda --data-dir " + data),
                 Contains("rank 1 was started with --device \"cuda\", rank 0 with --device \"cpu\""));
  }
  SECTION("data files of the same size, another content") {
    const fs::path other = dir.path / "other";
    fs::copy(dir.path / "data", other);
    {  // the last training label, 4 -> 8: still a valid file
      std::fstream f(other / "train-labels-idx1-ubyte", std::ios::in | std::ios::out | std::ios::binary);
      f.seekp(-1, std::ios::end);
      f.put(char(8));
    }
    REQUIRE_THAT(mpmd(cpu, " --device cpu --data-dir " + other.string()),
                 Contains("rank 1's --data-dir " + other.string() +
                          " has train-labels-idx1-ubyte: 308 bytes, checksum 0x"));
  }
}
// A rank that fails at start, alone (its own bad flag, found before MPI
// starts), ends the job within seconds, naming its rank and the cause, not
// at rank 0's deadline and not in silence (a plain usage error is left to
// rank 0, which usually finds the same).
TEST_CASE("a rank that fails alone at start ends the job at once, naming the rank and the cause",
          "[cli][distributed]") {
  TempDir dir("dist_fail_at_start");
  write_data(dir.path / "data");
  const std::string common = train_bin() + " --distributed --model lenet --epochs 1 --batch-size 16 "
                             "--limit-train 64 --limit-test 16 --device cpu --comm-timeout 30 "
                             "--data-dir " + (dir.path / "data").string();
  const auto start = Clock::now();
  const Run r = shell(kMpiEnv + ANVIL_MPIEXEC + std::string(" --oversubscribe -np 1 ") + common +
                          " : -np 1 " + common + " --init bogus",
                      dir);
  INFO(r.output);
  CHECK(std::chrono::duration<double>(Clock::now() - start).count() < 10);
  REQUIRE(r.code != 0);
  REQUIRE_THAT(r.output, Contains("anvil-train: error: rank 1: --init: unknown scheme 'bogus'"));
}
#endif
