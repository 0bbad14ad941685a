#!/usr/bin/env bash
# README command 2: install what is missing, then build and run every test
# twice: the release build (real CUDA kernels compiled for sm_80/sm_90 when
# nvcc is present; their tests run where a GPU is), and the simulator build,
# where the same CUDA kernels run on simulated devices against the CPU backend.
# Prints each stage's time at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/stages.sh
bash scripts/install-deps.sh
for preset in release sim; do
  stage "${preset}: configure and build" \
    bash -c "cmake --preset ${preset} >/dev/null && cmake --build --preset ${preset} -j $(nproc)"
  stage "${preset}: tests" ctest --preset "${preset}" -j "$(nproc)"
done
stage_report
