#!/usr/bin/env bash
# ctest's check of ANVIL_REQUIRE_CUDA (tests/CMakeLists.txt), for a real-CUDA
# build on a machine without a usable device:
#
#   bash tests/require_cuda.sh strict ANVIL_TESTS TESTSPEC...
#       with ANVIL_REQUIRE_CUDA=1 every selected test case must fail, naming
#       why (no driver, driver too old, no device), and the run exit non-zero
#   bash tests/require_cuda.sh lenient ANVIL_TESTS TESTSPEC...
#       without it every one must skip, saying why, and the run pass
#
# On a machine with a device there is nothing to check: exit 77 (ctest:
# skipped). The compact reporter writes each message on one line (the
# console one wraps them at 80 columns).
set -uo pipefail
mode=$1 bin=$2
shift 2
cases=$("$bin" "$@" --list-test-names-only | grep -c .)
if [[ "$mode" == strict ]]; then
  out=$(ANVIL_REQUIRE_CUDA=1 "$bin" "$@" -r compact 2>&1)
else
  out=$(env -u ANVIL_REQUIRE_CUDA "$bin" "$@" -r compact 2>&1)
fi
rc=$?
printf '%s\n' "$out"
echo "-- exit status $rc, $cases test cases selected"
fail() {
  echo "FAILED: $*"
  exit 1
}
if grep -q '^CUDA: tests run on cuda:0' <<<"$out"; then
  echo "a CUDA device is present: nothing to check here"
  exit 77
fi
((cases > 0)) || fail "no test case matches $*"
reason='(no CUDA driver|CUDA driver too old|no CUDA device): '
skips=$(grep -cE "warning: 'no CUDA device \($reason.*\): .* not run'" <<<"$out")
if [[ "$mode" == strict ]]; then
  grep -qE "^CUDA: no usable device: $reason.*ANVIL_REQUIRE_CUDA=1: the CUDA tests fail$" <<<"$out" ||
    fail "the first line does not give the reason and say that the CUDA tests fail"
  ((rc != 0)) || fail "ANVIL_REQUIRE_CUDA=1 without a device, yet the run passed"
  ((skips == 0)) || fail "$skips test cases skipped instead of failing"
  failed=$(grep -cE "failed: explicitly with 1 message: 'ANVIL_REQUIRE_CUDA=1 and no usable CUDA device: $reason" <<<"$out")
  ((failed == cases)) || fail "$failed of $cases test cases failed naming the reason"
  echo "OK: all $cases test cases failed, naming the reason"
else
  grep -qE "^CUDA: no usable device: $reason.*the CUDA tests skip" <<<"$out" ||
    fail "the first line does not give the reason and say that the CUDA tests skip"
  ((rc == 0)) || fail "without ANVIL_REQUIRE_CUDA the run failed"
  ((skips == cases)) || fail "$skips of $cases test cases said they did not run"
  echo "OK: all $cases test cases skipped, saying why"
fi
