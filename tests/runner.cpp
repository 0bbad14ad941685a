// The runner of both test programs (anvil-tests, anvil-parallel-tests):
// Catch2's, compiled once per build (it is Catch2's whole implementation,
// the longest file of each test program), without sanitizers and at -O1
// (tests/CMakeLists.txt): it is the harness, not what the tests check.
//
// - One line first saying which CUDA device the tests use, with the driver's
//   and runtime's versions, or why there is none (tests/cuda_test_util.h);
//   not printed when only listing tests (ctest's discovery reads that list).
// - Under mpiexec every process runs the same test cases in the same order
//   (their collectives meet); rank 0 reports as usual, the other ranks write
//   their report to a file that is printed, with the rank's name, only if
//   that rank failed.
// - A simulated NCCL operation that no peer meets fails after 120 s, not the
//   simulator's 300, unless ANVIL_SIM_STALL_TIMEOUT says otherwise.
// - Exit status: kSkipExitCode when every test case run was skipped
//   (tests/skip.h), 2 when the filter matched no test case (as --warn NoTests,
//   for the runs that cannot take a second --warn), else Catch2's.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <string>

#include "tests/case_counter.h"
#include "tests/cuda_test_util.h"
#include "tests/skip.h"

int main(int argc, char** argv) {
  ::setenv("ANVIL_SIM_STALL_TIMEOUT", "120", 0);
  Catch::Session session;
  if (const int code = session.applyCommandLine(argc, argv); code != 0) return code;
  const char* world_rank = std::getenv("OMPI_COMM_WORLD_RANK");
  const int rank = world_rank ? std::atoi(world_rank) : 0;
  const Catch::ConfigData& config = session.configData();
  const bool listing = config.listTests || config.listTestNamesOnly || config.listTags ||
                       config.listReporters || config.showHelp;
  if (!listing && rank == 0) std::cout << cuda_test::device_banner() << std::endl;
  std::string log;
  if (rank > 0) {
    log = "/tmp/anvil-tests-rank" + std::to_string(rank) + "-" + std::to_string(::getpid()) +
          ".log";
    session.configData().outputFilename = log;
  }
  const int result = session.run();
  if (!log.empty()) {
    if (result != 0) {
      std::ifstream in(log);
      for (std::string line; std::getline(in, line);)
        std::cerr << "rank " << rank << ": " << line << "\n";
    }
    std::remove(log.c_str());
  }
  if (!listing && result == 0 && test_skip::skip_count().cases_run == 0) {
    std::cerr << "rank " << rank << ": no test case matches the filter\n";
    return 2;
  }
  return test_skip::exit_code(result);
}
