#!/usr/bin/env bash
# ctest's check that an NCCL test case cannot pass without running:
#   bash tests/parallel/skip_check.sh ANVIL_PARALLEL_TESTS TEST_CASE
# With one (simulated) GPU or none, a case that needs 3 must exit with 4
# (ctest: skipped) and say why; under ANVIL_REQUIRE_CUDA=1 with no GPU it
# must fail, saying why. Where real GPUs are present there is nothing to
# check: exit 77.
set -uo pipefail
bin=$1 case=$2
fail() {
  echo "FAILED: $*"
  exit 1
}
out=$(env -u ANVIL_REQUIRE_CUDA ANVIL_SIM_DEVICES=1 "$bin" "$case" --warn NoAssertions -r compact 2>&1)
rc=$?
printf '%s\n-- exit status %d\n' "$out" "$rc"
if grep -q '^CUDA: tests run on cuda:0' <<<"$out" && ! grep -q '(simulated)' <<<"$out"; then
  echo "a CUDA device is present: nothing to check here"
  exit 77
fi
((rc == 4)) || fail "with at most one GPU the case exited with $rc, not 4 (skipped)"
grep -q "warning: 'skipped: " <<<"$out" || fail "the skipped case does not say why"
out=$(ANVIL_SIM_DEVICES=0 ANVIL_REQUIRE_CUDA=1 "$bin" "$case" --warn NoAssertions -r compact 2>&1)
rc=$?
printf '%s\n-- exit status %d\n' "$out" "$rc"
((rc != 0 && rc != 4)) || fail "ANVIL_REQUIRE_CUDA=1 without a GPU, yet the case exited with $rc"
grep -q "ANVIL_REQUIRE_CUDA=1 and no" <<<"$out" || fail "the failure does not say why"
echo "OK: skipped with one GPU, failed under ANVIL_REQUIRE_CUDA=1 without one"
