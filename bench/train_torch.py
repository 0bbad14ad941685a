#!/usr/bin/python3
"""PyTorch peer of bench_lenet: the seed LeNet recipe, timed per training step.

Model, init and recipe match anvil's models::lenet(Init::Seed) trained with SGD
(lr 0.2, batch 256, cross-entropy). Fashion-MNIST is read with gzip + numpy
(no torchvision) and held in memory as one float tensor; each step takes a
contiguous slice of it, as anvil's prefetching loader hands over a ready batch,
so only the training step (forward, loss, zero_grad, backward, SGD step,
loss.item()) is timed.

Prints one JSON line on stdout, e.g.
  {"framework": "pytorch", "images_per_second": 4600.0, "threads": 2, ...}
With --breakdown it adds per-layer forward/backward milliseconds per batch.

Run with Debian's interpreter (/usr/bin/python3), which has python3-torch.
"""
import argparse
import gzip
import json
import os
import statistics
import sys
import time

import numpy as np
import torch
from torch import nn

LAYER_NAMES = ["conv1", "relu1", "pool1", "conv2", "relu2", "pool2", "flatten", "fc1", "relu3",
               "fc2"]


def read_idx(path, max_items=0):
    """Reads a (gzip-compressed or raw) ubyte IDX file; returns a numpy array."""
    with open(path, "rb") as f:
        opener = gzip.open if f.read(2) == b"\x1f\x8b" else open
    with opener(path, "rb") as f:
        header = f.read(4)
        if len(header) != 4 or header[0] != 0 or header[1] != 0 or header[2] != 0x08:
            raise ValueError(f"{path}: not a ubyte IDX file")
        ndims = header[3]
        dims = list(np.frombuffer(f.read(4 * ndims), dtype=">u4").astype(np.int64))
        if max_items > 0:
            dims[0] = min(dims[0], max_items)
        count = int(np.prod(dims))
        data = f.read(count)
        if len(data) != count:
            raise ValueError(f"{path}: truncated: expected {count} data bytes, found {len(data)}")
    return np.frombuffer(data, dtype=np.uint8).reshape(dims)


def find_split(data_dir, stem):
    for name in (stem, stem + ".gz"):
        path = os.path.join(data_dir, name)
        if os.path.exists(path):
            return path
    raise FileNotFoundError(f"{data_dir}: neither {stem} nor {stem}.gz exists")


def load_train(data_dir, limit):
    images = read_idx(find_split(data_dir, "train-images-idx3-ubyte"), limit)
    labels = read_idx(find_split(data_dir, "train-labels-idx1-ubyte"), limit)
    x = torch.from_numpy(images.astype(np.float32) / 255.0).reshape(-1, 1, 28, 28).contiguous()
    y = torch.from_numpy(labels.astype(np.int64))
    return x, y


def blas_library():
    """Which libblas.so.3 Debian's torch (BLAS_INFO=generic) resolves to."""
    if "BLAS_INFO=generic" not in torch.__config__.show():
        return "bundled"
    for d in ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib"):
        path = os.path.join(d, "libblas.so.3")
        if os.path.exists(path):
            return os.path.realpath(path)
    return "libblas.so.3"


def lenet():
    net = nn.Sequential(
        nn.Conv2d(1, 20, kernel_size=3), nn.ReLU(), nn.AvgPool2d(kernel_size=2, stride=2),
        nn.Conv2d(20, 50, kernel_size=5), nn.ReLU(), nn.AvgPool2d(kernel_size=2, stride=2),
        nn.Flatten(), nn.Linear(800, 128), nn.ReLU(), nn.Linear(128, 10))
    for m in net:
        if isinstance(m, (nn.Conv2d, nn.Linear)):
            nn.init.normal_(m.weight, 0.0, 0.01)
            nn.init.zeros_(m.bias)
    return net


def batch_slices(count, batch_size, drop_last):
    """[start, end) of each batch of an epoch over `count` examples in file order."""
    out = []
    for start in range(0, count, batch_size):
        end = min(start + batch_size, count)
        if drop_last and end - start < batch_size:
            break
        out.append((start, end))
    return out


def train_step(net, opt, loss_fn, x, y):
    logits = net(x)
    loss = loss_fn(logits, y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return loss.item()


def breakdown(net, opt, loss_fn, x, y, iters):
    """Milliseconds per batch for each layer's forward and backward.

    Forward: each layer called in turn and timed. Backward: hooks on every
    layer's output record when its gradient arrives; since the net is a chain,
    the time between the gradient of layer i's output and that of layer i-1's
    output is layer i's backward (including autograd's bookkeeping and the
    accumulation of its parameters' gradients)."""
    n = len(net)
    fwd = [0.0] * n
    bwd = [0.0] * n
    loss_fwd = loss_bwd = zero = step = 0.0
    for _ in range(iters):
        stamps = [None] * n

        def hook_for(i):
            def hook(grad):
                stamps[i] = time.perf_counter()
            return hook

        # No list of the outputs is kept: holding on to tensors the graph
        # does not save (e.g. conv1's output before the ReLU) changes how
        # torch's allocator reuses memory and slows the step by ~20%.
        h = x
        for i, layer in enumerate(net):
            t0 = time.perf_counter()
            h = layer(h)
            fwd[i] += time.perf_counter() - t0
            if h.requires_grad:
                h.register_hook(hook_for(i))
        t0 = time.perf_counter()
        loss = loss_fn(h, y)
        loss_fwd += time.perf_counter() - t0
        del h
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        t1 = time.perf_counter()
        zero += t1 - t0
        loss.backward()
        t_end = time.perf_counter()
        # stamps[n-1]: gradient of the logits, i.e. the loss backward is done.
        loss_bwd += stamps[n - 1] - t1
        for i in range(n - 1, -1, -1):
            if stamps[i] is None:
                continue
            later = stamps[i - 1] if i > 0 and stamps[i - 1] is not None else t_end
            bwd[i] += later - stamps[i]
        t0 = time.perf_counter()
        opt.step()
        loss.item()
        step += time.perf_counter() - t0
    ms = 1000.0 / iters
    return {
        "layers": [{"name": LAYER_NAMES[i] if i < len(LAYER_NAMES) else str(i),
                    "forward_ms": fwd[i] * ms, "backward_ms": bwd[i] * ms} for i in range(n)],
        "loss_forward_ms": loss_fwd * ms,
        "loss_backward_ms": loss_bwd * ms,
        "zero_grad_ms": zero * ms,
        "step_ms": step * ms,
        "iterations": iters,
    }


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--warmup", type=int, default=5, help="untimed batches first")
    p.add_argument("--batches", type=int, default=60, help="timed batches")
    p.add_argument("--epochs", type=int, default=0,
                   help="time this many whole epochs over the 60000 images instead of --batches")
    p.add_argument("--repeats", type=int, default=1,
                   help="time this many consecutive windows; report the median (and best)")
    p.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--lr", type=float, default=0.2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--breakdown", type=int, default=0, metavar="ITERS",
                   help="also time each layer over ITERS extra batches")
    a = p.parse_args()
    if a.batch_size < 1 or a.warmup < 0 or a.batches < 1 or a.epochs < 0 or a.threads < 1 \
            or a.repeats < 1 or a.breakdown < 0:
        p.error("sizes must be positive")

    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)

    # Only the images the run needs: warm-up plus timed batches (all for --epochs).
    need = 0 if a.epochs else \
        (a.warmup + a.batches * a.repeats + (a.breakdown > 0)) * a.batch_size
    x_all, y_all = load_train(a.data_dir, need)
    count = x_all.shape[0]
    full = batch_slices(count, a.batch_size, drop_last=True)
    if not full:
        sys.exit(f"lenet_torch.py: only {count} images, fewer than one batch of {a.batch_size}")

    net = lenet()
    net.train()
    opt = torch.optim.SGD(net.parameters(), lr=a.lr)
    loss_fn = nn.CrossEntropyLoss()

    k = 0  # next batch, cycling through the full batches in file order
    for _ in range(a.warmup):
        s, e = full[k % len(full)]
        k += 1
        train_step(net, opt, loss_fn, x_all[s:e], y_all[s:e])

    rates, seconds = [], []
    images = 0
    loss = float("nan")
    for _ in range(a.repeats):
        if a.epochs:
            plan = batch_slices(count, a.batch_size, drop_last=False) * a.epochs
        else:
            plan = [full[(k + i) % len(full)] for i in range(a.batches)]
        k += len(plan)
        images = 0
        t0 = time.perf_counter()
        for s, e in plan:
            loss = train_step(net, opt, loss_fn, x_all[s:e], y_all[s:e])
            images += e - s
        seconds.append(time.perf_counter() - t0)
        rates.append(images / seconds[-1])

    result = {
        "framework": "pytorch",
        "images_per_second": statistics.median(rates),
        "best_images_per_second": max(rates),
        "repeat_images_per_second": rates,
        "threads": a.threads,
        "torch_version": torch.__version__,
        "batch_size": a.batch_size,
        "batches": len(plan),  # timed batches per repeat
        "images": images,  # per repeat
        "repeat_seconds": seconds,
        "final_loss": loss,
        "blas": blas_library(),
    }
    if a.breakdown > 0:
        s, e = full[k % len(full)]
        result["breakdown"] = breakdown(net, opt, loss_fn, x_all[s:e], y_all[s:e], a.breakdown)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
