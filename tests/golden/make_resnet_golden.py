#!/usr/bin/python3
"""Writes tests/golden/resnet_golden.json, read by tests/test_resnet.cpp:
PyTorch's answers for the two ResNet-18 variants of the seed documents.

Run with Debian's python3-torch (CPU):  /usr/bin/python3 tests/golden/make_resnet_golden.py

The modules are the seeds' PyTorch code, re-typed in seed_models.py, so that
the state-dict names below are what PyTorch itself produces.

Contents:
  state_dicts   {model: [[name, shape, dtype], ...]} of resnet18(10) and
                resnet18_96(10) (1 input channel): what load_state_dict(strict=True)
                demands, in state_dict() order; num_parameters {model: n}.
  residual      Residual blocks from deterministic weights and inputs, in train
                and eval mode: output y, the running statistics afterwards, and
                the gradients of L = sum(y * R) for the input and every parameter.
  training      a reduced resnet18 (widths 4, 8, 8, 16; 1x12x12 inputs; batch 4;
                10 classes): two SGD steps (lr 0.1, momentum 0.9, weight decay
                5e-4, cross-entropy): the two losses, the final state dict and
                the eval-mode logits afterwards.

Deterministic values. Instead of storing every weight, both this script and the
C++ test fill tensors from an integer hash (det_values) that both languages
compute exactly: a 32-bit hash of (index, salt), scaled to [lo, hi) in double
and rounded to float32. fill_deterministic picks each tensor's range from its
name and shape, walking the state dict in order with salt = base + position, so
only PyTorch's results need to be stored. Floats are written with 9 significant
digits (exact for float32).
"""
import json
import math
import os

import torch
from torch.nn import functional as F

from seed_models import d2l_v0, resnet18, resnet18_96

torch.set_default_dtype(torch.float32)
HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "resnet_golden.json")


# ---------------------------------------------------------------- deterministic values

def hash32(i, salt):
    """A 32-bit integer hash of (i, salt); tests/test_resnet.cpp has the same one."""
    x = (i + salt * 0x9E3779B9) & 0xFFFFFFFF
    x ^= x >> 16
    x = (x * 0x7FEB352D) & 0xFFFFFFFF
    x ^= x >> 15
    x = (x * 0x846CA68B) & 0xFFFFFFFF
    x ^= x >> 16
    return x


def det_values(shape, salt, lo, hi):
    n = math.prod(shape)
    vals = [lo + (hi - lo) * (hash32(i, salt) / 4294967296.0) for i in range(n)]
    return torch.tensor(vals, dtype=torch.float32).reshape(shape)


def value_range(name, t):
    """The range fill_deterministic uses for a state-dict entry (None: leave it)."""
    if name.endswith("num_batches_tracked"):
        return None
    if name.endswith("running_mean"):
        return (-0.5, 0.5)
    if name.endswith("running_var"):
        return (0.5, 2.0)
    if name.endswith("weight") and t.dim() == 1:  # BatchNorm scale
        return (0.5, 1.5)
    if name.endswith("bias"):
        return (-0.5, 0.5)
    bound = math.sqrt(3.0 / (t[0].numel()))  # unit variance through the layer
    return (-bound, bound)


def fill_deterministic(model, salt_base):
    with torch.no_grad():
        for k, (name, t) in enumerate(model.state_dict().items()):
            r = value_range(name, t)
            if r is not None:
                t.copy_(det_values(list(t.shape), salt_base + k, *r))


# ---------------------------------------------------------------- encoding

def enc(t):
    t = t.detach().contiguous()
    if t.dtype == torch.int64:
        data = [int(v) for v in t.reshape(-1).tolist()]
    else:
        data = [float("%.9g" % v) for v in t.float().reshape(-1).tolist()]
    return {"shape": list(t.shape), "data": data}


def dtype_name(t):
    return {torch.float32: "F32", torch.int64: "I64"}[t.dtype]


def listing(model):
    return [[k, list(v.shape), dtype_name(v)] for k, v in model.state_dict().items()]


doc = {"generator": "tests/golden/make_resnet_golden.py", "torch_version": torch.__version__}

# ---------------------------------------------------------------- state dicts
full = resnet18(10)
full96 = resnet18_96(10)
with torch.no_grad():
    full96.eval()(torch.zeros(1, 1, 96, 96))  # materialises the lazy layers
doc["state_dicts"] = {"resnet18": listing(full), "resnet18-96": listing(full96)}
doc["reprs"] = {"resnet18": repr(full), "resnet18-96": repr(full96)}
doc["num_parameters"] = {"resnet18": sum(p.numel() for p in full.parameters()),
                         "resnet18-96": sum(p.numel() for p in full96.parameters())}
del full, full96

# ---------------------------------------------------------------- Residual blocks
residual_cases = []
for name, cin, cout, conv3, stride, training, shape in [
        ("identity_train", 3, 3, False, 1, True, [2, 3, 5, 4]),
        ("identity_eval", 3, 3, False, 1, False, [2, 3, 5, 4]),
        ("conv3_stride2_train", 3, 4, True, 2, True, [2, 3, 6, 5]),
        ("conv3_stride2_eval", 3, 4, True, 2, False, [2, 3, 6, 5])]:
    blk = d2l_v0.Residual(cin, cout, use_1x1conv=conv3, strides=stride)
    fill_deterministic(blk, 100)
    blk.train(training)
    x = det_values(shape, 1000, -2.0, 2.0).requires_grad_()
    y = blk(x)
    R = det_values(list(y.shape), 2000, -1.0, 1.0)
    (y * R).sum().backward()
    grads = {"x": enc(x.grad)}
    for pname, p in blk.named_parameters():
        grads[pname] = enc(p.grad)
    residual_cases.append({
        "name": name, "in_channels": cin, "out_channels": cout, "use_1x1conv": conv3,
        "stride": stride, "training": training, "x_shape": shape,
        "state_dict": listing(blk), "repr": repr(blk), "y": enc(y),
        "buffers_after": {k: enc(v) for k, v in blk.named_buffers()},
        "grads": grads})
doc["residual"] = {"param_salt_base": 100, "x_salt": 1000, "x_range": [-2.0, 2.0],
                   "R_salt": 2000, "R_range": [-1.0, 1.0], "cases": residual_cases}

# ---------------------------------------------------------------- two SGD steps
widths = [4, 8, 8, 16]
net = resnet18(10, 1, widths)
fill_deterministic(net, 300)
x = det_values([4, 1, 12, 12], 3000, 0.0, 1.0)
labels = torch.tensor([3, 0, 7, 9], dtype=torch.int64)
opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
losses = []
net.train()
for step in range(2):
    opt.zero_grad()
    loss = F.cross_entropy(net(x), labels)
    losses.append(loss.item())
    loss.backward()
    opt.step()
net.eval()
with torch.no_grad():
    eval_logits = net(x)
doc["training"] = {
    "widths": widths, "num_classes": 10, "in_channels": 1, "param_salt_base": 300,
    "x_shape": [4, 1, 12, 12], "x_salt": 3000, "x_range": [0.0, 1.0],
    "labels": labels.tolist(), "lr": 0.1, "momentum": 0.9, "weight_decay": 5e-4,
    "losses": losses,
    "final_state": [[k, enc(v)] for k, v in net.state_dict().items()],
    "eval_logits": enc(eval_logits)}

with open(OUT, "w") as f:
    json.dump(doc, f, separators=(",", ":"))
    f.write("\n")
print("wrote %s: %d bytes; losses %s; parameters %s" %
      (OUT, os.path.getsize(OUT), losses, doc["num_parameters"]))
