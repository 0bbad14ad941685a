#!/usr/bin/env bash
# README command 2: install what is missing, then build and run every test
# twice: the release build (real CUDA kernels compiled for sm_80/sm_90 when
# nvcc is present; their tests run where a GPU is), and the simulator build,
# where the same CUDA kernels run on simulated devices against the CPU backend.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
for preset in release sim; do
  echo "== ${preset}: build and tests"
  cmake --preset "${preset}" >/dev/null
  cmake --build --preset "${preset}" -j "$(nproc)"
  ctest --preset "${preset}" -j "$(nproc)"
done
