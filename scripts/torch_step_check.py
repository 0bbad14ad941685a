#!/usr/bin/python3
"""How far ResNet-18 SGD steps in anvil, and the same steps in PyTorch float32,
are from those steps computed in float64.

    ./build/release/anvil-train --model resnet18 --recipe seed --device cpu --epochs 0 \
        --save init.safetensors
    ./build/release/anvil-train --model resnet18 --recipe seed --device cpu --epochs 1 \
        --init-from init.safetensors --no-shuffle --limit-train 256 --limit-test 256 \
        --save step1.safetensors
    /usr/bin/python3 scripts/torch_step_check.py init.safetensors step1.safetensors

The steps: the first steps x batch training images in file order, SGD at the
given lr, momentum and weight decay (the defaults: one step of 256 at the seed
recipe's lr 0.1, what anvil-train did above; --steps 2 --batch 32 --momentum
0.9 --weight-decay 5e-4 with anvil-train's --limit-train 64 --batch-size 32
and the same flags for two steps). --make-init PATH writes PyTorch's own
initial weights (its default init, torch.manual_seed(0)) for --init-from.
For each parameter it prints the norm of the float64 update and the
relative L2 error of PyTorch's float32 result and of anvil's, then the
median and largest over the parameters. Conv biases that feed BatchNorm get
no gradient in exact arithmetic (BatchNorm subtracts them), so their float64
update is ~0 and their relative errors mean nothing; they are listed last
and left out of the figures (their weight decay alone moves them in a
momentum step, so they count when --weight-decay is set).
"""
import argparse
import os
import statistics
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "golden"))
sys.path.insert(0, HERE)
from seed_models import resnet18  # noqa: E402
from torch_eval import read_safetensors, write_safetensors  # noqa: E402
from torch_seed_recipe import SEED_RECIPE, read_split  # noqa: E402


def steps(init, x, y, dtype, args):
    net = resnet18(10)
    net.load_state_dict(init, strict=True)
    net.to(dtype).train()
    opt = torch.optim.SGD(net.parameters(), lr=args.lr, momentum=args.momentum,
                          weight_decay=args.weight_decay)
    for i in range(args.steps):
        opt.zero_grad()
        xb, yb = x[i * args.batch:(i + 1) * args.batch], y[i * args.batch:(i + 1) * args.batch]
        torch.nn.functional.cross_entropy(net(xb.to(dtype)), yb).backward()
        opt.step()
    return {k: p.detach().double() for k, p in net.named_parameters()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("init", help="the weights before the steps (anvil-train --epochs 0 --save, "
                    "or --make-init)")
    ap.add_argument("after", nargs="?", help="anvil's weights after the steps")
    ap.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--steps", type=int, default=1)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--lr", type=float, default=SEED_RECIPE["lr"])
    ap.add_argument("--momentum", type=float, default=0.0)
    ap.add_argument("--weight-decay", type=float, default=0.0)
    ap.add_argument("--max-ratio", type=float,
                    help="exit 1 when anvil's median or largest error is over this many "
                    "times PyTorch float32's")
    ap.add_argument("--make-init", action="store_true",
                    help="write PyTorch's initial ResNet-18 weights to INIT and exit")
    args = ap.parse_args()
    torch.set_num_threads(os.cpu_count())
    if args.make_init:
        torch.manual_seed(0)
        write_safetensors(args.init, resnet18(10).state_dict())
        return
    if args.after is None:
        ap.error("give anvil's weights after the steps")
    x, y = read_split(args.data_dir, "train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz")
    n = args.steps * args.batch
    x, y = x[:n], y[:n]
    init = read_safetensors(args.init)
    after = read_safetensors(args.after)
    exact = steps(init, x, y, torch.float64, args)
    single = steps(init, x, y, torch.float32, args)

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
    figures = {}
    for label, i in (("pytorch f32", 3), ("anvil", 4)):
        errs = [r[i] for r in meaningful]
        figures[label] = (statistics.median(errs), max(errs))
        print(f"{label}: relative error median {figures[label][0]:.2e}, "
              f"{min(errs):.2e} .. {max(errs):.2e} over {len(errs)} parameters with a nonzero update")
    (tm, tx), (am, ax) = figures["pytorch f32"], figures["anvil"]
    print(f"anvil / pytorch f32: median {am / tm:.2f}x, largest {ax / tx:.2f}x")
    if args.max_ratio is not None and max(am / tm, ax / tx) > args.max_ratio:
        sys.exit(f"anvil's error is over {args.max_ratio}x PyTorch float32's")


if __name__ == "__main__":
    main()
