// The runner of anvil-tests: Catch2's, after one line saying which CUDA
// device the tests use, with the driver's and runtime's versions, or why
// there is none (tests/cuda_test_util.h). Not printed when only listing
// tests: ctest's discovery reads that list. A run whose every test case
// called test_skip::skip exits with 4 (tests/skip.h).
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <iostream>

#include "tests/cuda_test_util.h"
#include "tests/skip.h"

namespace {

// Counts the test cases run, for the skip status (tests/skip.h).
struct CaseCounter : Catch::TestEventListenerBase {
  using TestEventListenerBase::TestEventListenerBase;
  void testCaseStarting(Catch::TestCaseInfo const& info) override {
    ++test_skip::skip_count().cases_run;
    TestEventListenerBase::testCaseStarting(info);
  }
};
CATCH_REGISTER_LISTENER(CaseCounter)

}  // namespace

int main(int argc, char** argv) {
  Catch::Session session;
  if (const int code = session.applyCommandLine(argc, argv); code != 0) return code;
  const Catch::ConfigData& config = session.configData();
  const bool listing = config.listTests || config.listTestNamesOnly || config.listTags ||
                       config.listReporters || config.showHelp;
  if (!listing) std::cout << cuda_test::device_banner() << std::endl;
  return test_skip::exit_code(session.run());
}
