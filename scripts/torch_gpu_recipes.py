#!/usr/bin/env python3
"""PyTorch runs anvil-train's seed recipes on one device, for the GPU check's
ratios (tools/gpu/gpu-check.sh): the same model, init, batch, rate and epochs as

    anvil-train --model lenet    --recipe seed [--epochs N] --device cuda:0
    anvil-train --model resnet18 --recipe seed [--epochs N] --device cuda:0

  lenet     anvil's LeNet (tests/golden/seed_models.py), conv/linear weights
            N(0, 0.01), biases 0
  resnet18  d2l's ResNet-18 for 28x28 inputs, conv/linear weights N(0, 0.01),
            every other parameter PyTorch's default

both with plain SGD at the seed recipe's rate and batch (apps/recipes.json) on
pixels / 255, the training set reshuffled every epoch
(the last, short batch kept), cross-entropy, evaluated on the 10,000 test
images in eval mode after each epoch. --fp32-precision ieee (the default
here): FP32 throughout, TF32 turned off for matrix products and cuDNN
convolutions, as `anvil-train --fp32-precision ieee` and the kernel
benchmark's FP32 baselines; --fp32-precision default: PyTorch's own defaults
(cuDNN convolutions in TF32, matmuls in FP32), as `anvil-train`'s default.
cudnn.benchmark picks the fastest algorithm per shape (its search falls in
the first epoch).

The data is moved to the device once; each step slices a shuffled batch on the
device, so an epoch's seconds are the training steps (synchronised at the
epoch's end), as anvil-train's epoch_seconds are. Prints one JSON line per
epoch: epoch, train_loss, train_acc, test_loss, test_acc, epoch_seconds,
images_per_second, device, model, torch.

    python3 scripts/torch_gpu_recipes.py --model lenet --epochs 10 \\
        --data-dir .gpu/data/fashion-mnist --device cuda:0
"""
import argparse
import json
import os
import sys
import time

import numpy as np
import torch
from torch import nn

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "golden"))
sys.path.insert(0, HERE)
from seed_models import lenet, resnet18  # noqa: E402
from torch_eval import evaluate, read_idx  # noqa: E402
from anvil_recipes import recipe  # noqa: E402

# The model and whether its biases start at 0, as the seeds' init_weights does.
MODELS = {"lenet": (lenet, True), "resnet18": (lambda: resnet18(10), False)}


def read_split(data_dir, train, limit):
    stem = "train" if train else "t10k"
    images = read_idx(data_dir, f"{stem}-images-idx3-ubyte.gz", 16).reshape(-1, 1, 28, 28)
    labels = read_idx(data_dir, f"{stem}-labels-idx1-ubyte.gz", 8)
    if limit:
        images, labels = images[:limit], labels[:limit]
    return (torch.from_numpy(images.astype(np.float32) / 255.0),
            torch.from_numpy(labels.astype(np.int64)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", choices=sorted(MODELS), required=True)
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--limit-train", type=int, default=0, help="first N training images (0: all)")
    ap.add_argument("--limit-test", type=int, default=0, help="first N test images (0: all)")
    ap.add_argument("--fp32-precision", choices=["ieee", "default"], default="ieee",
                    help="ieee: no TF32 anywhere; default: PyTorch's (TF32 convolutions)")
    args = ap.parse_args()
    if args.epochs < 1:
        sys.exit(f"--epochs: {args.epochs}: must be >= 1")

    device = torch.device(args.device)
    if device.type == "cuda":
        if args.fp32_precision == "ieee":
            torch.backends.cuda.matmul.allow_tf32 = False
            torch.backends.cudnn.allow_tf32 = False
        torch.backends.cudnn.benchmark = True
    torch.manual_seed(args.seed)
    make, zero_biases = MODELS[args.model]
    seed_recipe = recipe("seed", args.model)
    net = make()
    for m in net.modules():  # the seeds' init_weights
        if type(m) in (nn.Linear, nn.Conv2d):
            nn.init.normal_(m.weight, std=0.01)
            if zero_biases and m.bias is not None:
                nn.init.zeros_(m.bias)
    net.to(device)
    train_x, train_y = (t.to(device) for t in read_split(args.data_dir, True, args.limit_train))
    test_x, test_y = (t.to(device) for t in read_split(args.data_dir, False, args.limit_test))
    trainer = torch.optim.SGD(net.parameters(), lr=seed_recipe["lr"])
    loss_fn = nn.CrossEntropyLoss()
    batch_size = seed_recipe["batch-size"]

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    for epoch in range(1, args.epochs + 1):
        net.train()
        order = torch.randperm(len(train_x), device=device)
        loss_sum = torch.zeros((), device=device)
        correct = torch.zeros((), dtype=torch.int64, device=device)
        sync()
        start = time.perf_counter()
        for s in range(0, len(order), batch_size):
            idx = order[s:s + batch_size]
            x, y = train_x[idx], train_y[idx]
            trainer.zero_grad(set_to_none=True)
            logits = net(x)
            loss = loss_fn(logits, y)
            loss.backward()
            trainer.step()
            loss_sum += loss.detach() * len(idx)
            correct += (logits.argmax(1) == y).sum()
        sync()
        seconds = time.perf_counter() - start
        test_loss, test_acc = evaluate(net, test_x, test_y, batch_size)
        print(json.dumps({
            "epoch": epoch, "train_loss": round(loss_sum.item() / len(train_x), 4),
            "train_acc": round(correct.item() / len(train_x), 4),
            "test_loss": round(test_loss, 4), "test_acc": test_acc,
            "epoch_seconds": round(seconds, 3), "images_per_second": round(len(train_x) / seconds, 1),
            "device": str(device), "model": args.model, "torch": torch.__version__,
            "fp32_precision": args.fp32_precision,
            "tf32": {"cudnn": torch.backends.cudnn.allow_tf32,
                     "matmul": torch.backends.cuda.matmul.allow_tf32}}), flush=True)


if __name__ == "__main__":
    main()
