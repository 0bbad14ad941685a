#!/usr/bin/env bash
# ctest's check that a CLI test case needing a GPU cannot pass without one:
#   bash tests/cli_skip_check.sh ANVIL_TESTS TEST_CASE
# With no GPU (none simulated either) the case must exit with 4 (ctest:
# skipped) and say why. Where a real GPU is present there is nothing to
# check: exit 77.
set -uo pipefail
bin=$1 case=$2
out=$(env -u ANVIL_REQUIRE_CUDA ANVIL_SIM_DEVICES=0 "$bin" "$case" -r compact 2>&1)
rc=$?
printf '%s\n-- exit status %d\n' "$out" "$rc"
if grep -q '^CUDA: tests run on cuda:0' <<<"$out"; then
  echo "a CUDA device is present: nothing to check here"
  exit 77
fi
if ((rc != 4)); then
  echo "FAILED: without a GPU the case exited with $rc, not 4 (skipped)"
  exit 1
fi
if ! grep -q "warning: 'skipped: " <<<"$out"; then
  echo "FAILED: the skipped case does not say why"
  exit 1
fi
echo "OK: skipped without a GPU"
