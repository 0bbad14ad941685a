// The listener that counts the test cases a runner runs, for the skip
// status (tests/skip.h). Included once per test binary, by its runner
// (tests/runner.cpp), after Catch2 with
// CATCH_CONFIG_RUNNER: the listener's base class is in Catch2's runner part.
#pragma once
#include <catch2/catch.hpp>

#include "tests/skip.h"

namespace {

struct CaseCounter : Catch::TestEventListenerBase {
  using TestEventListenerBase::TestEventListenerBase;
  void testCaseStarting(Catch::TestCaseInfo const& info) override {
    ++test_skip::skip_count().cases_run;
    TestEventListenerBase::testCaseStarting(info);
  }
};
CATCH_REGISTER_LISTENER(CaseCounter)

}  // namespace
