#!/usr/bin/env bash
# Fuzzes one of anvil's file parsers with libFuzzer under AddressSanitizer +
# UndefinedBehaviorSanitizer, one job, for MINUTES minutes (docs/fuzzing.md):
#   scripts/fuzz.sh TARGET MINUTES     TARGET: idx, idx_gz, safetensors, checkpoint
# Builds the `fuzz` preset (clang) first. The inputs it finds that reach new
# code are kept in build/fuzz/corpus/TARGET (the next run starts from them);
# an input that crashes, leaks, trips a sanitizer or breaks a property is
# written to build/fuzz/findings/TARGET/, and the run stops there.
set -euo pipefail
cd "$(dirname "$0")/.."

targets=(idx idx_gz safetensors checkpoint)
usage() {
  echo "usage: scripts/fuzz.sh TARGET MINUTES   (TARGET: ${targets[*]}; MINUTES: a whole number >= 1)" >&2
  exit 2
}
[[ $# -eq 2 ]] || usage
target=$1 minutes=$2
[[ " ${targets[*]} " == *" ${target} "* ]] || { echo "scripts/fuzz.sh: unknown target '${target}'" >&2; usage; }
[[ "${minutes}" =~ ^[1-9][0-9]*$ ]] || { echo "scripts/fuzz.sh: MINUTES must be a whole number >= 1, not '${minutes}'" >&2; usage; }
if ! command -v clang++ >/dev/null; then
  echo "scripts/fuzz.sh: clang++ not found (libFuzzer comes with clang): run" >&2
  echo "  bash scripts/install-deps.sh --fuzz" >&2
  exit 1
fi

cmake --preset fuzz >/dev/null
cmake --build --preset fuzz -j "$(nproc)"

work=build/fuzz/corpus/${target}
findings=build/fuzz/findings/${target}
mkdir -p "${work}" "${findings}"
dict=()
if [[ "${target}" == safetensors || "${target}" == checkpoint ]]; then
  dict=(-dict=tests/fuzz/safetensors.dict)
fi
echo "== fuzzing ${target} for ${minutes} min (corpus ${work}, findings ${findings})"
# The first folder receives new inputs; the repository's seeds and
# regressions are read only. The memory limits make an input that allocates
# what a header declares rather than what the file holds a finding.
exec "build/fuzz/tests/fuzz/fuzz_${target}" "${dict[@]}" \
  -max_total_time=$((minutes * 60)) -rss_limit_mb=1024 -malloc_limit_mb=512 -timeout=10 \
  -print_final_stats=1 -artifact_prefix="${findings}/" \
  "${work}" "tests/fuzz/corpus/${target}" "tests/fuzz/regressions/${target}"
