#!/usr/bin/env bash
# README command 1: install what is missing, build, and train LeNet on
# Fashion-MNIST with the seed recipe on the best device present.
# Extra flags go to anvil-train (e.g. --epochs 2).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cmake --preset release >/dev/null
cmake --build --preset release -j "$(nproc)" --target anvil-train
# anvil-train's defaults are the seed recipe: 10 epochs, batch 256, lr 0.2.
exec ./build/release/anvil-train --model lenet --device auto "$@"
