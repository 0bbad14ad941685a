// anvil-comm-fault: a small MPI job that runs a few collectives with one
// fault injected, for the fault tests (tests/parallel/CMakeLists.txt runs it
// under mpiexec and checks how the whole job ends, and how soon):
//   none      every rank behaves, in the world and in a group of the ranks
//             of its parity: prints "all collectives done", exits 0
//   silent    the last rank never calls the second collective
//   hung-native  the per-call check is off and the all-reduces are MPI's
//             own (MPI_Allreduce): the last rank never calls the second, so
//             the others block inside MPI_Allreduce, where only the
//             communicator's watchdog can end the wait
//   mismatch  rank 1 asks for 1001 elements where the others ask for 1000
//   chunk     rank 1 cuts the ring's messages in chunks of 64 bytes
//   fingerprint  rank 1 says its tensor is another one (allreduce's
//             fingerprint) than rank 0 does
//   kill      rank 1 dies (SIGKILL) before the second collective
//   no-send   rank 1 never sends what rank 0 receives (point to point:
//             rank 0's wait for rank 1's side of the call passes its deadline)
//   p2p-mismatch  rank 0 sends float32 [4, 8] where rank 1 receives
//             bfloat16 [4, 16] (the same bytes)
//   sigterm   the last rank gets SIGTERM, sent by itself (not by mpirun)
//   sigterm-save  the last rank gets SIGTERM in the middle of a save
//             (nn::save_safetensors into --dir): its temporary file must go
//   late-send rank 0's receive times out (the per-call check off: the
//             data's wait); rank 1 sends that message after it: rank 0's
//             tensor must keep what it held (its receive was cancelled, and
//             completed, before the call returned)
//   serialized  the program initialises MPI itself at MPI_THREAD_SERIALIZED
//             before asking for a communicator
// --nccl runs the collectives on GPU tensors over nccl_world (one process
// per GPU) instead of mpi_world.
// A rank whose call fails prints the error and exits 1 (mpirun then ends the
// job); a rank that has to wait out the others sleeps far past the deadline.
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "nn/safetensors.h"
#include "parallel/communicator.h"

namespace par = anvil::parallel;

int main(int argc, char** argv) {
  CLI::App app{"one MPI job with one fault, for anvil's fault tests"};
  std::string fault = "none";
  double timeout = 2;
  bool nccl = false;
  app.add_option("--fault", fault, "none, silent, hung-native, mismatch, chunk, fingerprint, "
                                    "kill, no-send, p2p-mismatch, late-send, sigterm, sigterm-save or "
                                    "serialized")
      ->check(CLI::IsMember({"none", "silent", "hung-native", "mismatch", "chunk", "fingerprint",
                             "kill", "no-send", "p2p-mismatch", "late-send", "sigterm",
                             "sigterm-save",
                             "serialized"}));
  std::string dir = ".";
  app.add_option("--dir", dir, "sigterm-save: the directory it saves into");
  app.add_flag("--nccl", nccl, "GPU tensors over nccl_world instead of CPU tensors over mpi_world");
  app.add_option("--timeout", timeout, "the communicator's deadline, in seconds");
  CLI11_PARSE(app, argc, argv);

  par::CommOptions options;
  options.timeout = std::chrono::milliseconds(int64_t(timeout * 1000));
  try {
    if (fault == "serialized") {
      int provided = 0;
      MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
    }
    auto comm = nccl ? par::nccl_world(options) : par::mpi_world(options);
    const int rank = comm->rank(), size = comm->size();
    const anvil::Device device = comm->device();
    auto sleep_past_deadline = [&] {
      std::this_thread::sleep_for(std::chrono::duration<double>(timeout * 20));
    };
    const par::Algorithm algorithm =
        fault == "hung-native" ? par::Algorithm::kNative : par::Algorithm::kRing;
    if (fault == "hung-native") comm->set_check_calls(false);
    anvil::Tensor t = anvil::Tensor::ones({1000}, anvil::DType::Float32, device);
    comm->allreduce(t, par::ReduceOp::kSum, algorithm);  // one that works: the job is up
    comm->synchronize();
    if ((fault == "silent" || fault == "hung-native") && rank == size - 1) sleep_past_deadline();
    if (fault == "kill" && rank == 1) std::raise(SIGKILL);
    if (fault == "sigterm" && rank == size - 1) std::raise(SIGTERM);
    if (fault == "sigterm-save" && rank == size - 1) {
      // A thread raises SIGTERM as soon as the save's temporary file is
      // there; the saves (64 MiB each) go on until it does.
      std::thread([dir] {
        for (;;) {
          for (const auto& e : std::filesystem::directory_iterator(dir))
            if (e.path().filename().string().find(".tmp.") != std::string::npos) std::raise(SIGTERM);
          std::this_thread::sleep_for(std::chrono::microseconds(200));
        }
      }).detach();
      const anvil::Tensor big = anvil::Tensor::ones({16 << 20}, anvil::DType::Float32);
      for (int i = 0; i < 100; ++i)
        anvil::nn::save_safetensors((std::filesystem::path(dir) / "cut.safetensors").string(),
                                    {{"big", big}});
      std::printf("rank %d: 100 saves and no SIGTERM\n", rank);
      return 1;
    }
    if (fault == "mismatch" && rank == 1)
      t = anvil::Tensor::ones({1001}, anvil::DType::Float32, device);
    if (fault == "chunk" && rank == 1) comm->set_chunk_bytes(64);
    if (fault == "late-send") {
      // A second communicator for the barriers: the first fails on rank 0.
      auto sync = nccl ? par::nccl_world(options) : par::mpi_world(options);
      const anvil::Tensor mine = anvil::Tensor::full({16}, -1.0, anvil::DType::Float32, device);
      comm->set_check_calls(false);
      if (rank == 0) {
        try {
          comm->recv(mine, 1);
          std::printf("rank 0: the receive completed, but rank 1 had not sent yet\n");
        } catch (const std::exception& e) {
          std::fprintf(stderr, "anvil-comm-fault: %s\n", e.what());
        }
      } else if (rank == 1) {
        std::this_thread::sleep_for(std::chrono::duration<double>(timeout * 1.5));
        // Small: sent without a receive to meet it.
        comm->send(anvil::Tensor::full({16}, 7.0, anvil::DType::Float32, device), 0);
      }
      sync->barrier();  // MPI moves the late message while ranks wait here
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      sync->barrier();
      if (rank == 0) {
        const std::vector<float> held = mine.to_vector();
        const bool kept = std::all_of(held.begin(), held.end(), [](float v) { return v == -1; });
        std::printf("rank 0: %s (element 0: %g)\n",
                    kept ? "the tensor still holds what it held before the timed-out receive"
                         : "the late message landed in the tensor of the timed-out receive",
                    double(held[0]));
        std::fflush(stdout);
        return 1;  // its communicator failed: the job ends as a failed one does
      }
      sync->barrier();  // (rank 0 never comes: mpirun ends the job)
      return 0;
    }
    if (fault == "no-send") {
      if (rank == 1) sleep_past_deadline();
      if (rank == 0) comm->recv(anvil::Tensor::zeros({10}, anvil::DType::Float32, device), 1);
    } else if (fault == "p2p-mismatch") {
      if (rank == 0) comm->send(anvil::Tensor::zeros({4, 8}, anvil::DType::Float32, device), 1);
      if (rank == 1) comm->recv(anvil::Tensor::zeros({4, 16}, anvil::DType::BFloat16, device), 0);
    } else if (fault == "fingerprint") {
      comm->allreduce(t, par::ReduceOp::kSum, par::Algorithm::kRing, rank == 1 ? 0x52 : 0x51);
    } else {
      comm->allreduce(t, par::ReduceOp::kSum, algorithm);
    }
    comm->synchronize();
    if (fault == "none") {  // and in a group (ANVIL_COMM_DEBUG names it)
      auto group = comm->split(rank % 2, rank, "dp");
      group->allreduce(t);
      group->synchronize();
    }
    std::printf("rank %d: all collectives done\n", rank);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "anvil-comm-fault: %s\n", e.what());
    return 1;
  }
}
