#!/usr/bin/env bash
# README command 1: install what is missing, build, and train LeNet on
# Fashion-MNIST with the seed recipe on the best device present.
# Extra flags go to anvil-train (e.g. --epochs 2).
#
# It builds only what it will run: anvil-train, with the CUDA kernels for
# the GPUs nvidia-smi lists (their compute capabilities) or, on a machine
# without a GPU, without CUDA at all. scripts/test.sh, CI and gpu-pack.sh
# build everything (the release preset: sm_80 and sm_90).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
gpu_archs() {  # "90" or "80;90": each GPU's compute capability, once
  command -v nvidia-smi >/dev/null 2>&1 || return 0
  nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null |
    tr -d ' .' | grep -E '^[0-9]+$' | sort -u | paste -sd ';' || true
}
archs="$(gpu_archs)"
if [[ -n "$archs" ]]; then
  echo "train-lenet.sh: building anvil-train with CUDA for sm_${archs//;/ and sm_} (the GPUs present; the CPU alone if nvcc is missing)"
  cuda=(-DANVIL_CUDA=AUTO "-DANVIL_CUDA_ARCHITECTURES=${archs}")
else
  echo "train-lenet.sh: no GPU (nvidia-smi lists none): building anvil-train for the CPU alone"
  cuda=(-DANVIL_CUDA=OFF)
fi
cmake --preset release "${cuda[@]}" >/dev/null
cmake --build --preset release -j "$(nproc)" --target anvil-train
# anvil-train's defaults are the seed recipe: 10 epochs, batch 256, lr 0.2.
exec ./build/release/anvil-train --model lenet --device auto "$@"
