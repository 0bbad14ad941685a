#!/usr/bin/env bash
# ctest's check that SIGTERM in the middle of a save leaves no temporary file:
#   bash tests/parallel/sigterm_save_check.sh MPIEXEC ANVIL_COMM_FAULT
# Rank 1 of 2 raises SIGTERM while nn::save_safetensors writes
# cut.safetensors.tmp.XXXXXX; the job must fail, rank 1 must say that it was
# signalled itself (not blame another rank), and the directory must hold no
# *.tmp.* file afterwards.
set -uo pipefail
mpiexec=$1 bin=$2
dir=$(mktemp -d /tmp/anvil-sigterm-save.XXXXXX)
trap 'rm -rf "$dir"' EXIT
out=$(timeout 60 "$mpiexec" --oversubscribe -np 2 "$bin" --fault sigterm-save --timeout 2 --dir "$dir" 2>&1)
rc=$?
printf '%s\n-- exit status %d\n-- left in the directory:\n' "$out" "$rc"
ls -la "$dir"
fail() {
  echo "FAILED: $*"
  exit 1
}
((rc != 0 && rc != 124)) || fail "the job exited with $rc"
grep -q "anvil: rank 1: stopped by SIGTERM sent to this rank (by process [0-9]*, not mpirun)" <<<"$out" ||
  fail "rank 1 does not say that it was signalled itself"
leftover=$(find "$dir" -name '*.tmp.*')
[[ -z $leftover ]] || fail "the cut-off save left $leftover"
echo "OK: no temporary file left"
