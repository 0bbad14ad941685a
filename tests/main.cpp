// The runner of anvil-tests: Catch2's, after one line saying which CUDA
// device the tests use, with the driver's and runtime's versions, or why
// there is none (tests/cuda_test_util.h). Not printed when only listing
// tests: ctest's discovery reads that list. A run whose every test case
// called test_skip::skip exits with 4 (tests/skip.h).
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <iostream>

#include "tests/case_counter.h"
#include "tests/cuda_test_util.h"
#include "tests/skip.h"

int main(int argc, char** argv) {
  Catch::Session session;
  if (const int code = session.applyCommandLine(argc, argv); code != 0) return code;
  const Catch::ConfigData& config = session.configData();
  const bool listing = config.listTests || config.listTestNamesOnly || config.listTags ||
                       config.listReporters || config.showHelp;
  if (!listing) std::cout << cuda_test::device_banner() << std::endl;
  return test_skip::exit_code(session.run());
}
