#!/usr/bin/python3
"""PyTorch peer of bench_train: the seeds' models and recipes, timed per training step.

--model picks the network, built as the seed documents build it and matching
anvil's models::create(name, Init::Seed):
  lenet        seed 004's LeNet, N(0, 0.01) weights, zero biases
  resnet18     seed 002's d2l ResNet-18 for 28x28 inputs (3x3 stem), N(0, 0.01)
               conv/linear weights, every other parameter PyTorch's default
  resnet18-96  seed 000's ResNet-18 (7x7/2 stem + 3x3/2 max pool) on inputs
               bilinearly resized to 96x96 once, before timing
trained with SGD (--lr, --momentum; by default the seed recipe's rate and
batch, from apps/recipes.json) on cross-entropy. Fashion-MNIST is read
with gzip + numpy (no torchvision) and held in memory as one float tensor;
each step takes a contiguous slice of it, as anvil's prefetching loader hands
over a ready batch, so only the training step (forward, loss, zero_grad,
backward, SGD step, loss.item()) is timed.

Prints one JSON line on stdout, e.g.
  {"framework": "pytorch", "images_per_second": 4600.0, "threads": 2, ...}
With --breakdown it adds per-layer (per top-level child) forward/backward
milliseconds per batch, and forward/backward milliseconds per op kind from
the autograd profiler over one further batch. With --serve it instead
answers commands on stdin (see serve()), which bench_train uses to
alternate anvil's and PyTorch's timed windows on a busy machine.

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
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts"))
from anvil_recipes import recipe  # noqa: E402


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


def load_train(data_dir, limit, size):
    images = read_idx(find_split(data_dir, "train-images-idx3-ubyte"), limit)
    labels = read_idx(find_split(data_dir, "train-labels-idx1-ubyte"), limit)
    x = torch.from_numpy(images.astype(np.float32) / 255.0).reshape(-1, 1, 28, 28).contiguous()
    if size != 28:
        x = F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False).contiguous()
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


class Residual(nn.Module):
    """d2l's Residual: two 3x3 conv + BN, a 1x1 conv on the shortcut when the
    shape changes, ReLU after the sum."""

    def __init__(self, in_channels, out_channels, use_1x1conv=False, strides=1):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, kernel_size=3, padding=1,
                               stride=strides)
        self.conv2 = nn.Conv2d(out_channels, out_channels, kernel_size=3, padding=1)
        self.conv3 = nn.Conv2d(in_channels, out_channels, kernel_size=1,
                               stride=strides) if use_1x1conv else None
        self.bn1 = nn.BatchNorm2d(out_channels)
        self.bn2 = nn.BatchNorm2d(out_channels)

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        if self.conv3 is not None:
            x = self.conv3(x)
        y += x
        return F.relu(y)


def resnet18(stem, num_classes=10):
    """The seeds' ResNet-18: `stem` modules, then four stages of two Residuals
    (the first stage keeps 64 channels, each later one halves the resolution),
    global average pooling and a linear classifier."""
    def resnet_block(in_channels, out_channels, first_block=False):
        if first_block:
            return nn.Sequential(Residual(in_channels, out_channels),
                                 Residual(out_channels, out_channels))
        return nn.Sequential(Residual(in_channels, out_channels, use_1x1conv=True, strides=2),
                             Residual(out_channels, out_channels))

    net = nn.Sequential(*stem)
    net.add_module("resnet_block1", resnet_block(64, 64, first_block=True))
    net.add_module("resnet_block2", resnet_block(64, 128))
    net.add_module("resnet_block3", resnet_block(128, 256))
    net.add_module("resnet_block4", resnet_block(256, 512))
    net.add_module("global_avg_pool", nn.AdaptiveAvgPool2d((1, 1)))
    net.add_module("fc", nn.Sequential(nn.Flatten(), nn.Linear(512, num_classes)))

    # The seeds' init_weights: only conv and linear weights are redrawn.
    def init_weights(m):
        if type(m) in [nn.Linear, nn.Conv2d]:
            nn.init.normal_(m.weight, std=0.01)
    net.apply(init_weights)
    return net


def build_model(name):
    if name == "lenet":
        return lenet()
    if name == "resnet18":
        return resnet18([nn.Conv2d(1, 64, kernel_size=3, stride=1, padding=1),
                         nn.BatchNorm2d(64), nn.ReLU()])
    if name == "resnet18-96":
        return resnet18([nn.Conv2d(1, 64, kernel_size=7, stride=2, padding=3),
                         nn.BatchNorm2d(64), nn.ReLU(),
                         nn.MaxPool2d(kernel_size=3, stride=2, padding=1)])
    raise ValueError(f"unknown model {name}")


# Op kinds shared with bench_train.cpp's op_kind(): the first key contained in
# the lower-cased op name wins ("addmm" before "add"). PyTorch's
# adaptive_avg_pool2d to 1x1 runs as a mean; "TBackward0" is linear's
# weight transpose.
OP_KINDS = [("conv", "conv"), ("batchnorm", "batch_norm"), ("batch_norm", "batch_norm"),
            ("relu", "relu"), ("threshold", "relu"), ("pool", "pool"), ("mean", "pool"),
            ("addmm", "linear"), ("linear", "linear"), ("mm", "linear"),
            ("crossentropy", "loss"), ("cross_entropy", "loss"), ("softmax", "loss"),
            ("nll", "loss"), ("add", "add"), ("view", "reshape"), ("reshape", "reshape"),
            ("flatten", "reshape")]


def op_kind(name):
    n = name.lower()
    if n == "tbackward0":
        return "reshape"
    for key, kind in OP_KINDS:
        if key in n:
            return kind
    return "other"


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


def kinds_breakdown(net, opt, loss_fn, x, y):
    """Milliseconds per op kind over one profiled training step: forward from
    the outermost aten ops called by the model and the loss, backward from the
    autograd engine's per-function events."""
    prefix = "autograd::engine::evaluate_function: "
    with torch.autograd.profiler.profile() as prof:
        with torch.autograd.profiler.record_function("bench::forward"):
            loss = loss_fn(net(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        loss.item()
    kinds = {}
    for ev in prof.function_events:
        if ev.name.startswith(prefix):
            kind = op_kind(ev.name[len(prefix):])
            if kind == "other" and "AccumulateGrad" in ev.name:
                continue  # leaf-gradient bookkeeping, not an op's backward
            slot = "backward_ms"
        elif ev.cpu_parent is not None and ev.cpu_parent.name == "bench::forward":
            kind = op_kind(ev.name)
            slot = "forward_ms"
        else:
            continue
        entry = kinds.setdefault(kind, {"forward_ms": 0.0, "backward_ms": 0.0})
        entry[slot] += ev.cpu_time_total / 1000.0
    return kinds


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
        "layers": [{"name": name, "forward_ms": fwd[i] * ms, "backward_ms": bwd[i] * ms}
                   for i, (name, _) in enumerate(net.named_children())],
        "loss_forward_ms": loss_fwd * ms,
        "loss_backward_ms": loss_bwd * ms,
        "zero_grad_ms": zero * ms,
        "step_ms": step * ms,
        "iterations": iters,
    }


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", choices=["lenet", "resnet18", "resnet18-96"], default="lenet")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=None, help="default: the seed recipe's")
    p.add_argument("--warmup", type=int, default=None,
                   help="untimed batches first (default: lenet 5, resnet 2)")
    p.add_argument("--batches", type=int, default=None,
                   help="timed batches (default: lenet 60, resnet 5)")
    p.add_argument("--epochs", type=int, default=0,
                   help="time this many whole epochs over the 60000 images instead of --batches")
    p.add_argument("--repeats", type=int, default=1,
                   help="time this many consecutive windows; report the median (and best)")
    p.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--lr", type=float, default=None, help="default: the seed recipe's")
    p.add_argument("--momentum", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--breakdown", type=int, default=0, metavar="ITERS",
                   help="also time each layer over ITERS extra batches")
    p.add_argument("--serve", action="store_true",
                   help="after the warm-up, answer commands on stdin (see serve())")
    a = p.parse_args()
    resnet = a.model.startswith("resnet18")
    if a.warmup is None:
        a.warmup = 2 if resnet else 5
    if a.batches is None:
        a.batches = 5 if resnet else 60
    seed_recipe = recipe("seed", a.model)
    if a.lr is None:
        a.lr = seed_recipe["lr"]
    if a.batch_size is None:
        a.batch_size = seed_recipe["batch-size"]
    if a.batch_size < 1 or a.warmup < 0 or a.batches < 1 or a.epochs < 0 or a.threads < 1 \
            or a.repeats < 1 or a.breakdown < 0:
        p.error("sizes must be positive")

    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    run = Run(a)
    run.warm_up()
    if a.serve:
        serve(run)
        return

    rates, seconds = [], []
    window = {}
    for _ in range(a.repeats):
        window = run.timed_window()
        rates.append(window["images_per_second"])
        seconds.append(window["seconds"])
    result = run.describe()
    result.update({
        "images_per_second": statistics.median(rates),
        "best_images_per_second": max(rates),
        "repeat_images_per_second": rates,
        "batches": window["batches"],  # timed batches per repeat
        "images": window["images"],  # per repeat
        "repeat_seconds": seconds,
        "final_loss": window["loss"],
    })
    if a.breakdown > 0:
        result["breakdown"] = run.breakdown(a.breakdown)
    print(json.dumps(result), flush=True)


class Run:
    """The model, optimizer and in-memory data of one benchmark run; batches
    are taken in file order, cycling through the full batches."""

    def __init__(self, a):
        self.a = a
        # Only the images the run needs: warm-up plus timed batches (all for --epochs).
        need = 0 if a.epochs else \
            (a.warmup + a.batches * a.repeats + (a.breakdown > 0)) * a.batch_size
        self.x, self.y = load_train(a.data_dir, need, 96 if a.model == "resnet18-96" else 28)
        self.count = self.x.shape[0]
        self.full = batch_slices(self.count, a.batch_size, drop_last=True)
        if not self.full:
            sys.exit(f"train_torch.py: only {self.count} images, fewer than one batch of "
                     f"{a.batch_size}")
        self.net = build_model(a.model)
        self.net.train()
        self.opt = torch.optim.SGD(self.net.parameters(), lr=a.lr, momentum=a.momentum)
        self.loss_fn = nn.CrossEntropyLoss()
        self.k = 0  # next batch

    def next_slices(self, n):
        out = [self.full[(self.k + i) % len(self.full)] for i in range(n)]
        self.k += n
        return out

    def warm_up(self):
        for s, e in self.next_slices(self.a.warmup):
            train_step(self.net, self.opt, self.loss_fn, self.x[s:e], self.y[s:e])

    def timed_window(self):
        """--batches batches (or --epochs whole epochs), timed."""
        if self.a.epochs:
            plan = batch_slices(self.count, self.a.batch_size, drop_last=False) * self.a.epochs
        else:
            plan = self.next_slices(self.a.batches)
        images = 0
        loss = float("nan")
        t0 = time.perf_counter()
        for s, e in plan:
            loss = train_step(self.net, self.opt, self.loss_fn, self.x[s:e], self.y[s:e])
            images += e - s
        seconds = time.perf_counter() - t0
        return {"images_per_second": images / seconds, "seconds": seconds, "images": images,
                "batches": len(plan), "loss": loss}

    def breakdown(self, iters):
        s, e = self.next_slices(1)[0]
        x, y = self.x[s:e], self.y[s:e]
        result = breakdown(self.net, self.opt, self.loss_fn, x, y, iters)
        result["kinds"] = kinds_breakdown(self.net, self.opt, self.loss_fn, x, y)
        return result

    def describe(self):
        return {"framework": "pytorch", "model": self.a.model, "threads": self.a.threads,
                "torch_version": torch.__version__, "batch_size": self.a.batch_size,
                "blas": blas_library()}


def serve(run):
    """--serve: after the warm-up, prints describe() as one JSON line, then
    answers one JSON line per command read from stdin, so that bench_train
    can alternate its own timed windows with PyTorch's:
      window         one timed window (see Run.timed_window)
      breakdown N    the per-layer and per-kind breakdown over N batches
      quit           exit"""
    print(json.dumps(dict(run.describe(), ready=True)), flush=True)
    for line in sys.stdin:
        words = line.split()
        if not words:
            continue
        if words[0] == "window":
            print(json.dumps(run.timed_window()), flush=True)
        elif words[0] == "breakdown" and len(words) == 2:
            print(json.dumps(run.breakdown(int(words[1]))), flush=True)
        elif words[0] == "quit":
            return
        else:
            print(json.dumps({"error": f"unknown command: {line.strip()}"}), flush=True)


if __name__ == "__main__":
    main()
