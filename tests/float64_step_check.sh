#!/usr/bin/env bash
# FP32 on the CPU as close to exact as PyTorch's float32: two ResNet-18 SGD
# steps (batch 32, momentum 0.9, weight decay 5e-4) from PyTorch's own
# initial weights, in anvil with --fp32-precision ieee, in PyTorch float32
# and in PyTorch float64; anvil's median and largest relative error of a
# parameter's update against float64 within 1.2x PyTorch float32's
# (scripts/torch_step_check.py). Skipped (77) without Debian's python3-torch.
# Usage: float64_step_check.sh ANVIL_TRAIN [PRECISION]
set -euo pipefail
train="$1" precision="${2:-ieee}"
here="$(cd "$(dirname "$0")/.." && pwd)"
if ! /usr/bin/python3 -c "import torch" 2>/dev/null; then
  echo "skipped: /usr/bin/python3 has no torch (apt-get install python3-torch)"; exit 77
fi
if [[ ! -e /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]]; then
  echo "skipped: no Fashion-MNIST (apt-get install dataset-fashion-mnist)"; exit 77
fi
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
/usr/bin/python3 "$here/scripts/torch_step_check.py" --make-init "$dir/init.safetensors"
"$train" --model resnet18 --recipe seed --device cpu --init-from "$dir/init.safetensors" \
  --no-shuffle --limit-train 64 --limit-test 32 --batch-size 32 --epochs 1 --lr 0.1 \
  --momentum 0.9 --weight-decay 5e-4 --fp32-precision "$precision" \
  --save "$dir/after.safetensors" >/dev/null
/usr/bin/python3 "$here/scripts/torch_step_check.py" "$dir/init.safetensors" \
  "$dir/after.safetensors" --steps 2 --batch 32 --lr 0.1 --momentum 0.9 --weight-decay 5e-4 \
  --max-ratio 1.2 | tail -3
