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
images in eval mode after each epoch. Three settings:

  --fp32-precision ieee (the default here)  FP32 throughout: TF32 off for
      matrix products and cuDNN convolutions, cudnn.benchmark on, as
      `anvil-train --fp32-precision ieee` and the kernel benchmark's FP32
      baselines
  --fp32-precision default  PyTorch as shipped, nothing set: cuDNN
      convolutions in TF32, matmuls in FP32, cudnn.benchmark off; beside
      `anvil-train`'s default (TF32 convolutions)
  --best  PyTorch at its fastest for this model: autocast to bfloat16
      (AMP), channels_last, cudnn.benchmark on, TF32 for what stays
      float32; beside `anvil-train --amp bf16`

An epoch's seconds are what anvil-train's epoch_seconds are: the training
steps and the loader that feeds them (from the first batch's request to
the last step, synchronised at the epoch's end; the test pass after it is
not in them). --loader host (the default), as anvil's DataLoader and
DevicePrefetcher: the images kept as bytes on the host, each batch
gathered from a shuffled order, converted to float32 / 255 there, and
copied to the device from pinned memory without blocking, so that the next
batch is prepared while the GPU runs this one. --loader device: the whole
set moved to the device once and each batch sliced there (no loader in
the time, which anvil's figure always has). Prints one JSON line per
epoch: epoch, train_loss, train_acc, test_loss, test_acc, epoch_seconds,
images_per_second, device, model, torch, setting, loader.

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
    """The images as uint8 [n, 1, 28, 28] and the labels as int64, on the host."""
    stem = "train" if train else "t10k"
    images = read_idx(data_dir, f"{stem}-images-idx3-ubyte.gz", 16).reshape(-1, 1, 28, 28)
    labels = read_idx(data_dir, f"{stem}-labels-idx1-ubyte.gz", 8)
    if limit:
        images, labels = images[:limit], labels[:limit]
    return torch.from_numpy(np.ascontiguousarray(images)), torch.from_numpy(labels.astype(np.int64))


def to_float(images):
    return images.float().div_(255.0)


def host_batches(images, labels, batch_size, device, memory_format):
    """One epoch's batches as anvil's loader hands them over: gathered on the
    host in a fresh shuffled order, converted there, copied from pinned memory
    without blocking (the copy and the next gather overlap the GPU's work)."""
    order = torch.randperm(len(images))
    pin = device.type == "cuda"
    for s in range(0, len(order), batch_size):
        idx = order[s:s + batch_size]
        x, y = to_float(images[idx]), labels[idx]
        if pin:
            x, y = x.pin_memory(), y.pin_memory()
        yield (x.to(device, non_blocking=True).contiguous(memory_format=memory_format),
               y.to(device, non_blocking=True))


def device_batches(images, labels, batch_size, device, memory_format):
    """One epoch's batches sliced on the device from the whole set (moved once)."""
    order = torch.randperm(len(images), device=device)
    for s in range(0, len(order), batch_size):
        idx = order[s:s + batch_size]
        yield images[idx].contiguous(memory_format=memory_format), labels[idx]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", choices=sorted(MODELS), required=True)
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--limit-train", type=int, default=0, help="first N training images (0: all)")
    ap.add_argument("--limit-test", type=int, default=0, help="first N test images (0: all)")
    ap.add_argument("--fp32-precision", choices=["ieee", "default"], default=None,
                    help="ieee (the default): no TF32 anywhere; default: PyTorch as shipped "
                         "(TF32 convolutions)")
    ap.add_argument("--best", action="store_true",
                    help="AMP bf16 + channels_last + cudnn.benchmark (+ TF32 for float32)")
    ap.add_argument("--loader", choices=["host", "device"], default="host",
                    help="host: batches prepared on the host and copied, as anvil's loader; "
                         "device: the set on the device, sliced there")
    args = ap.parse_args()
    if args.epochs < 1:
        sys.exit(f"--epochs: {args.epochs}: must be >= 1")
    if args.best and args.fp32_precision is not None:
        sys.exit("--best sets its own precision (bf16 autocast, TF32 for what stays float32): "
                 "leave out --fp32-precision")
    if not args.best and args.fp32_precision is None:
        args.fp32_precision = "ieee"

    device = torch.device(args.device)
    setting = "best" if args.best else "defaults" if args.fp32_precision == "default" else "ieee"
    if device.type == "cuda":
        if setting == "ieee":
            torch.backends.cuda.matmul.allow_tf32 = False
            torch.backends.cudnn.allow_tf32 = False
            torch.backends.cudnn.benchmark = True
        elif setting == "best":
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True
            torch.backends.cudnn.benchmark = True
        # "defaults": nothing set.
    memory_format = torch.channels_last if args.best else torch.contiguous_format
    amp = torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=args.best)
    torch.manual_seed(args.seed)
    make, zero_biases = MODELS[args.model]
    seed_recipe = recipe("seed", args.model)
    net = make()
    for m in net.modules():  # the seeds' init_weights
        if type(m) in (nn.Linear, nn.Conv2d):
            nn.init.normal_(m.weight, std=0.01)
            if zero_biases and m.bias is not None:
                nn.init.zeros_(m.bias)
    net.to(device, memory_format=memory_format)
    train_x, train_y = read_split(args.data_dir, True, args.limit_train)
    test_x, test_y = read_split(args.data_dir, False, args.limit_test)
    test_x = to_float(test_x).to(device).contiguous(memory_format=memory_format)
    test_y = test_y.to(device)
    if args.loader == "device":
        train_x, train_y = to_float(train_x).to(device), train_y.to(device)
        batches = device_batches
    else:
        batches = host_batches
    trainer = torch.optim.SGD(net.parameters(), lr=seed_recipe["lr"])
    loss_fn = nn.CrossEntropyLoss()
    batch_size = seed_recipe["batch-size"]

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    for epoch in range(1, args.epochs + 1):
        net.train()
        loss_sum = torch.zeros((), device=device)
        correct = torch.zeros((), dtype=torch.int64, device=device)
        sync()
        start = time.perf_counter()
        for x, y in batches(train_x, train_y, batch_size, device, memory_format):
            trainer.zero_grad(set_to_none=True)
            with amp:
                logits = net(x)
                loss = loss_fn(logits, y)
            loss.backward()
            trainer.step()
            loss_sum += loss.detach().float() * len(y)
            correct += (logits.argmax(1) == y).sum()
        sync()
        seconds = time.perf_counter() - start
        with amp:
            test_loss, test_acc = evaluate(net, test_x, test_y, batch_size)
        print(json.dumps({
            "epoch": epoch, "train_loss": round(loss_sum.item() / len(train_x), 4),
            "train_acc": round(correct.item() / len(train_x), 4),
            "test_loss": round(test_loss, 4), "test_acc": test_acc,
            "epoch_seconds": round(seconds, 3), "images_per_second": round(len(train_x) / seconds, 1),
            "device": str(device), "model": args.model, "torch": torch.__version__,
            "setting": setting, "loader": args.loader,
            "fp32_precision": args.fp32_precision or "tf32", "amp": "bf16" if args.best else None,
            "channels_last": args.best, "cudnn_benchmark": torch.backends.cudnn.benchmark,
            "tf32": {"cudnn": torch.backends.cudnn.allow_tf32,
                     "matmul": torch.backends.cuda.matmul.allow_tf32}}), flush=True)


if __name__ == "__main__":
    main()
