// The tests that run anvil-train under mpirun (tests/test_cli_distributed.cpp,
// tests/test_cli_pipeline.cpp): the launcher's command line, a shell run
// with its output, a small Fashion-MNIST-like directory, and the
// comparisons of two runs' metrics and weights. Needs the build's MPI
// (ANVIL_MPIEXEC).
#pragma once
#include <catch2/catch.hpp>
#include <sys/wait.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/device.h"
#include "nn/safetensors.h"
#include "tests/cuda_test_util.h"
#include "tests/skip.h"
#include "tests/test_util.h"

namespace anvil::testing::mpi_cli {

namespace fs = std::filesystem;

// OpenMPI as root wants to be told twice; leak checks would report OpenMPI's.
inline const std::string kMpiEnv =
    "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 ASAN_OPTIONS=detect_leaks=0 "
    "OMP_NUM_THREADS=1 ";

inline std::string train_bin() { return ANVIL_TRAIN_BIN; }
inline std::string mpirun(int ranks) {
  return kMpiEnv + ANVIL_MPIEXEC + std::string(" --oversubscribe -np ") + std::to_string(ranks) +
         " ";
}

// Whether `--gpus 2` can run: cuda:0 and a second device are there. Otherwise
// the test is reported as skipped, naming why (`what` runs on them).
inline bool have_two_gpus(const char* what) {
  if (!cuda_test::have_device(what)) {
    test_skip::skip("no CUDA device: " + anvil::no_gpu_reason());
    return false;
  }
  if (anvil::device_count() < 2) {
    test_skip::skip("--gpus 2 needs 2 GPUs; this machine has " +
                    std::to_string(anvil::device_count()));
    return false;
  }
  return true;
}

struct Run {
  int code = -1;
  std::string output;
};

inline Run shell(const std::string& cmd, const TempDir& dir) {
  const std::string out = dir.file("output.txt");
  const int rc = std::system((cmd + " > " + out + " 2>&1 < /dev/null").c_str());
  Run r;
  r.code = WIFEXITED(rc) ? WEXITSTATUS(rc) : 128 + WTERMSIG(rc);
  r.output = read_file(out);
  return r;
}

// A small Fashion-MNIST-like directory: 300 training images (batches of 64:
// the last one, 44, splits unevenly) and 100 test images.
inline void write_data(const fs::path& dir) {
  fs::create_directories(dir);
  auto be32 = [](std::string& b, uint32_t v) {
    for (int s = 24; s >= 0; s -= 8) b.push_back(char(uint8_t(v >> s)));
  };
  auto write = [&](const std::string& name, uint8_t kind, uint32_t count, bool images) {
    std::string b = {0, 0, 8, char(images ? 3 : 1)};
    be32(b, count);
    if (images) {
      be32(b, 28);
      be32(b, 28);
      for (uint32_t i = 0; i < count * 784; ++i) b.push_back(char(uint8_t((i * 37 + kind * 11) % 253)));
    } else {
      for (uint32_t i = 0; i < count; ++i) b.push_back(char(uint8_t((i * 7 + kind) % 10)));
    }
    std::ofstream(dir / name, std::ios::binary) << b;
  };
  write("train-images-idx3-ubyte", 1, 300, true);
  write("train-labels-idx1-ubyte", 1, 300, false);
  write("t10k-images-idx3-ubyte", 2, 100, true);
  write("t10k-labels-idx1-ubyte", 2, 100, false);
}

inline std::vector<nlohmann::json> metrics_of(const std::string& path) {
  std::vector<nlohmann::json> out;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line));
  return out;
}

// Every parameter of two --save files within `tol` (relative).
// Every epoch's train and test loss and accuracy of two --metrics files
// within `epsilon` (relative; 0: the same numbers).
inline void require_same_metrics(const std::string& a, const std::string& b, double epsilon) {
  const auto ma = metrics_of(a), mb = metrics_of(b);
  REQUIRE(ma.size() == mb.size());
  for (size_t e = 0; e < ma.size(); ++e)
    for (const char* key : {"train_loss", "train_acc", "test_loss", "test_acc"}) {
      INFO("epoch " << e + 1 << ": " << key);
      if (epsilon == 0) REQUIRE(ma[e][key].get<double>() == mb[e][key].get<double>());
      else REQUIRE(ma[e][key].get<double>() == Approx(mb[e][key].get<double>()).epsilon(epsilon));
    }
}

inline void require_same_weights(const std::string& a, const std::string& b, double tol) {
  const auto wa = anvil::nn::load_safetensors(a), wb = anvil::nn::load_safetensors(b);
  REQUIRE(wa.size() == wb.size());
  for (size_t i = 0; i < wa.size(); ++i) {
    INFO(wa[i].first);
    REQUIRE(wa[i].first == wb[i].first);
    if (wa[i].second.dtype() != anvil::DType::Float32) continue;
    const auto va = wa[i].second.to_vector(), vb = wb[i].second.to_vector();
    for (size_t k = 0; k < va.size(); ++k)
      REQUIRE(std::fabs(va[k] - vb[k]) <= tol * (1 + std::fabs(vb[k])));
  }
}

inline const std::string kRecipe =
    " --model lenet --recipe best --epochs 2 --batch-size 64 --no-shuffle --seed 3 ";


}  // namespace anvil::testing::mpi_cli
