#!/usr/bin/python3
"""PyTorch evaluates an anvil model on the Fashion-MNIST test set: an independent
check of anvil-train's test accuracy, and proof that its files load into the
seeds' PyTorch modules with load_state_dict(strict=True).

    /usr/bin/python3 scripts/torch_eval.py FILE [--model lenet|resnet18|resnet18-96]
                                                [--resize N] [--normalize]
                                                [--bn-recalibrate N]

FILE is what anvil-train writes: a --save weights file, or a --checkpoint file,
whose "model." tensors are the weights and whose trainer.state holds the run's
settings (model, resize, normalize) and its per-epoch history, so that nothing
but FILE is needed and the script reports anvil's own figure beside PyTorch's.
Inputs are prepared as anvil-train prepares test images: pixels / 255,
bilinear resize (F.interpolate, align_corners=False), then normalisation with
the mean and (population) std of the images the run trained on.

--bn-recalibrate N is a diagnostic for models with BatchNorm: before evaluating,
it replaces the running mean and variance of every BatchNorm layer with their
plain average over N batches of 256 training images (shuffled with seed 0,
without augmentation), the weights untouched, as torch.optim.swa_utils.update_bn
does. If accuracy then rises, the stored running statistics, which average
the last few dozen training steps, lag behind the final weights.

Reads (and writes) safetensors with struct + json: no package beyond Debian's python3-torch.
"""
import argparse
import gzip
import json
import os
import struct
import sys

import numpy as np
import torch
from torch.nn import functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                "golden"))
from seed_models import lenet, resnet18, resnet18_96  # noqa: E402

MODELS = {"lenet": lenet, "resnet18": resnet18, "resnet18-96": resnet18_96}
DTYPES = {"F32": torch.float32, "I64": torch.int64, "U8": torch.uint8}


def read_safetensors(path):
    with open(path, "rb") as f:
        raw = f.read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    data = raw[8 + n:]
    tensors = {}
    for key, v in header.items():
        if key == "__metadata__":
            continue
        begin, end = v["data_offsets"]
        tensors[key] = torch.frombuffer(bytearray(data[begin:end]),
                                        dtype=DTYPES[v["dtype"]]).reshape(v["shape"])
    return tensors


def write_safetensors(path, tensors):
    """float32 and int64 tensors as a safetensors file (header, then the data in order)."""
    header, blobs, offset = {}, [], 0
    for name, t in tensors.items():
        wide = t.dtype == torch.int64
        data = t.detach().to(torch.int64 if wide else torch.float32).contiguous().numpy().tobytes()
        header[name] = {"dtype": "I64" if wide else "F32", "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw + b"".join(blobs))


def read_anvil_model(path):
    """The model's tensors of an anvil-train --save or --checkpoint file, with
    the run's settings and per-epoch history ({} and [] for a --save file)."""
    tensors = read_safetensors(path)
    settings, history = {}, []
    if "trainer.state" in tensors:  # a --checkpoint file: model.*, optimizer.*, trainer.state
        state = json.loads(tensors.pop("trainer.state").numpy().tobytes().decode())
        settings = state["info"].get("settings", {})
        history = state["info"].get("history", [])
        tensors = {k[len("model."):]: v for k, v in tensors.items() if k.startswith("model.")}
    return tensors, settings, history


def read_idx(directory, name, offset):
    with gzip.open(os.path.join(directory, name)) as f:
        return np.frombuffer(f.read()[offset:], np.uint8)


def evaluate(net, x, y, batch_size=256):
    """Mean cross-entropy and accuracy in eval mode (running statistics)."""
    net.eval()
    loss_sum, correct = 0.0, 0
    with torch.no_grad():
        for start in range(0, len(x), batch_size):
            logits = net(x[start:start + batch_size])
            target = y[start:start + batch_size]
            loss_sum += F.cross_entropy(logits, target, reduction="sum").item()
            correct += (logits.argmax(1) == target).sum().item()
    return loss_sum / len(x), correct / len(x)


def recalibrate_batch_norm(net, train, prepare, batches, batch_size=256):
    if batches < 0:
        sys.exit(f"--bn-recalibrate: {batches} batches: must be >= 0")
    norms = [m for m in net.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    if not norms:
        sys.exit("--bn-recalibrate: the model has no BatchNorm layer")
    if batches * batch_size > len(train):
        sys.exit(f"--bn-recalibrate: {batches} batches of {batch_size} need "
                 f"{batches * batch_size} training images, there are {len(train)}")
    for m in norms:
        m.reset_running_stats()
        m.momentum = None  # a plain (cumulative) average over the batches
    order = np.random.default_rng(0).permutation(len(train))
    net.train()
    with torch.no_grad():
        for b in range(batches):
            net(prepare(train[order[b * batch_size:(b + 1) * batch_size]]))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("file")
    ap.add_argument("--model", choices=sorted(MODELS), help="default: the checkpoint's, else lenet")
    ap.add_argument("--resize", type=int, help="default: the checkpoint's, else 0 (keep 28x28)")
    ap.add_argument("--normalize", action="store_true", default=None,
                    help="default: the checkpoint's, else off")
    ap.add_argument("--bn-recalibrate", type=int, default=0, metavar="N",
                    help="re-estimate BatchNorm running statistics over N training batches first")
    ap.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    args = ap.parse_args()

    tensors, settings, history = read_anvil_model(args.file)
    model = args.model or settings.get("model", "lenet")
    resize = args.resize if args.resize is not None else settings.get("resize", 0)
    normalize = args.normalize if args.normalize is not None else settings.get("normalize", False)
    if model == "resnet18-96":
        resize = 96

    net = MODELS[model](10)
    net.load_state_dict(tensors, strict=True)

    mean = std = None
    train = None
    if normalize or args.bn_recalibrate:
        # The images the run trained on (--limit-train: the first N).
        train = read_idx(args.data_dir, "train-images-idx3-ubyte.gz", 16).reshape(-1, 1, 28, 28)
        limit = settings.get("limit-train", 0)
        if limit:
            train = train[:limit]
    if normalize:
        pixels = train.astype(np.float64) / 255
        mean, std = pixels.mean(), pixels.std()

    def prepare(images):
        batch = torch.tensor(images, dtype=torch.float32) / 255
        if resize:
            batch = F.interpolate(batch, size=(resize, resize), mode="bilinear",
                                  align_corners=False, antialias=False)
        if normalize:
            batch = (batch - mean) / std
        return batch

    if args.bn_recalibrate != 0:
        recalibrate_batch_norm(net, train, prepare, args.bn_recalibrate)

    net.eval()
    x = read_idx(args.data_dir, "t10k-images-idx3-ubyte.gz", 16).reshape(-1, 1, 28, 28)
    y = read_idx(args.data_dir, "t10k-labels-idx1-ubyte.gz", 8)
    correct = 0
    with torch.no_grad():
        for begin in range(0, len(y), 500):
            pred = net(prepare(x[begin:begin + 500])).argmax(1).numpy()
            correct += int((pred == y[begin:begin + 500]).sum())
    what = f"{model}, resize {resize or 'none'}, normalize {'on' if normalize else 'off'}"
    if normalize:
        what += f" (mean {mean:.4f}, std {std:.4f})"
    print(f"{args.file}: {what}; loaded with strict=True")
    if args.bn_recalibrate:
        print(f"BatchNorm running statistics re-estimated over {args.bn_recalibrate} batches "
              f"of 256 training images")
    print(f"PyTorch {torch.__version__} test accuracy: {correct / len(y):.4f} ({correct}/{len(y)})")
    if history:
        last = history[-1]
        print(f"anvil-train's test accuracy after epoch {last['epoch']}: {last['test_acc']:.4f}")


if __name__ == "__main__":
    main()
