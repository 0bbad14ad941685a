#!/usr/bin/python3
"""How far one ResNet-18 seed-recipe step in anvil, and the same step in PyTorch
float32, are from that step computed in float64.

    ./build/release/anvil-train --model resnet18 --recipe seed --device cpu --epochs 0 \
        --save init.safetensors
    ./build/release/anvil-train --model resnet18 --recipe seed --device cpu --epochs 1 \
        --init-from init.safetensors --no-shuffle --limit-train 256 --limit-test 256 \
        --save step1.safetensors
    /usr/bin/python3 scripts/torch_step_check.py init.safetensors step1.safetensors

The step: the first 256 training images in file order, plain SGD at lr 0.1
(what anvil-train did above). For each parameter it prints the norm of the
float64 update and the relative L2 error of PyTorch's float32 result and of
anvil's. Conv biases that feed BatchNorm get no gradient in exact arithmetic
(BatchNorm subtracts them), so their float64 update is ~0 and their relative
errors mean nothing; they are listed last.
"""
import argparse
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "golden"))
sys.path.insert(0, HERE)
from seed_models import resnet18  # noqa: E402
from torch_eval import read_safetensors  # noqa: E402
from torch_seed_recipe import SEED_RECIPE, read_split  # noqa: E402


def one_step(init, x, y, dtype):
    net = resnet18(10)
    net.load_state_dict(init, strict=True)
    net.to(dtype).train()
    opt = torch.optim.SGD(net.parameters(), lr=SEED_RECIPE["lr"])
    opt.zero_grad()
    torch.nn.functional.cross_entropy(net(x.to(dtype)), y).backward()
    opt.step()
    return {k: p.detach().double() for k, p in net.named_parameters()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("init", help="the weights before the step (anvil-train --epochs 0 --save)")
    ap.add_argument("after", help="anvil's weights after the step")
    ap.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    args = ap.parse_args()
    torch.set_num_threads(os.cpu_count())
    x, y = read_split(args.data_dir, "train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz")
    x, y = x[:256], y[:256]
    init = read_safetensors(args.init)
    after = read_safetensors(args.after)
    exact = one_step(init, x, y, torch.float64)
    single = one_step(init, x, y, torch.float32)

    rows = []
    for name, ref in exact.items():
        update = (ref - init[name].double()).norm().item()
        scale = max(update, 1e-30)
        rows.append((update < 1e-9, name, update,
                     (single[name] - ref).norm().item() / scale,
                     (after[name].double() - ref).norm().item() / scale))
    rows.sort(key=lambda r: r[0])  # stable: the ~0-update conv biases last
    print(f"{'parameter':40s} {'|update| f64':>12s} {'pytorch f32':>12s} {'anvil':>12s}")
    for _, name, update, e_torch, e_anvil in rows:
        print(f"{name:40s} {update:12.3e} {e_torch:12.2e} {e_anvil:12.2e}")
    meaningful = [r for r in rows if not r[0]]
    for label, i in (("pytorch f32", 3), ("anvil", 4)):
        errs = [r[i] for r in meaningful]
        print(f"{label}: relative error {min(errs):.2e} .. {max(errs):.2e} over "
              f"{len(errs)} parameters with a nonzero update")


if __name__ == "__main__":
    main()
