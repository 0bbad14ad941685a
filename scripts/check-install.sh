#!/usr/bin/env bash
# CI: anvil as a library. Installs the release build (build/release, made by
# scripts/test.sh) into a temporary prefix, builds examples/small-cnn against
# it with find_package(anvil), and runs it on a few hundred images: it must
# print a test accuracy and save its weights. The prefix is removed after.
#   scripts/check-install.sh [BUILD_DIR]     (default build/release)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build/release}
if [[ ! -f "${build}/CMakeCache.txt" ]]; then
  echo "check-install.sh: ${build} is not a configured build folder (run scripts/test.sh first)" >&2
  exit 1
fi
work=$(mktemp -d)
trap 'rm -rf "${work}"' EXIT

cmake --build "${build}" -j "$(nproc)" --target anvil anvil-train
cmake --install "${build}" --prefix "${work}/prefix" >/dev/null
cmake -S examples/small-cnn -B "${work}/build" -DCMAKE_PREFIX_PATH="${work}/prefix" >/dev/null
cmake --build "${work}/build" -j "$(nproc)"
"${work}/build/small-cnn" --limit-train 512 --limit-test 256 --save "${work}/small-cnn.safetensors" |
  tee "${work}/output.txt"
grep -q "test acc " "${work}/output.txt" || { echo "check-install.sh: no test accuracy printed" >&2; exit 1; }
[[ -s "${work}/small-cnn.safetensors" ]] || { echo "check-install.sh: no weights saved" >&2; exit 1; }
echo "check-install.sh: find_package(anvil) and examples/small-cnn work"
