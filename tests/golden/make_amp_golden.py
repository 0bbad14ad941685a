#!/usr/bin/python3
"""Writes tests/golden/amp_golden.json: anvil's LeNet (nn/models.cpp) in
PyTorch, one forward and one backward pass under
torch.autocast("cpu", dtype=torch.bfloat16), read by tests/test_autocast.cpp.

Run with Debian's python3-torch (CPU):  /usr/bin/python3 tests/golden/make_amp_golden.py
Deterministic: fixed seed, float32 values written with 9 significant digits.

The weights, the input batch and the labels are not stored: both sides
make them from an integer hash of the element index (uniform() below, which
the test repeats), Kaiming-uniform weights and small biases. The file holds
PyTorch's results: the logits (bfloat16 under autocast, written as their
float32 values), the mean cross-entropy (float32), and each parameter's
gradient (float32, as autocast leaves them; tensors over 4096 elements only
every 61st element, to keep the file small). The same pass without autocast
is written too ("fp32"), so the test can show that it tells the two apart.
"""
import json
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "amp_golden.json")


def enc(t):
    t = t.detach().contiguous()
    if t.dtype == torch.int64:
        return {"shape": list(t.shape), "data": [int(v) for v in t.reshape(-1).tolist()]}
    return {"shape": list(t.shape),
            "data": [float("%.9g" % v) for v in t.float().reshape(-1).tolist()]}


# anvil's lenet(): conv 1->20 3x3, relu, avgpool 2, conv 20->50 5x5, relu,
# avgpool 2, flatten, linear 800->128, relu, linear 128->10.
net = nn.Sequential(
    nn.Conv2d(1, 20, 3), nn.ReLU(), nn.AvgPool2d(2, 2),
    nn.Conv2d(20, 50, 5), nn.ReLU(), nn.AvgPool2d(2, 2),
    nn.Flatten(),
    nn.Linear(800, 128), nn.ReLU(), nn.Linear(128, 10))


def uniform(shape, seed, scale):
    """scale * u, u in [-1, 1): an integer hash of (index, seed), exact in both languages."""
    n = 1
    for d in shape:
        n *= d
    vals = [((((i + 1) * 2654435761 + seed * 40503) % 4294967296) / 2147483648.0 - 1.0) * scale
            for i in range(n)]
    return torch.tensor(vals, dtype=torch.float32).reshape(shape)


with torch.no_grad():
    seed = 1
    for m in net.modules():  # Kaiming-uniform weights, biases in [-0.1, 0.1)
        if isinstance(m, (nn.Conv2d, nn.Linear)):
            fan_in = m.weight[0].numel()
            m.weight.copy_(uniform(m.weight.shape, seed, (6.0 / fan_in) ** 0.5))
            m.bias.copy_(uniform(m.bias.shape, seed + 1, 0.1))
            seed += 2

x = uniform((16, 1, 28, 28), 100, 2.0)
labels = torch.tensor([(7 * i) % 10 for i in range(16)])


def sampled(t):
    t = t.detach().reshape(-1)
    return t if t.numel() <= 4096 else t[::61]


def run(amp):
    net.zero_grad()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
        logits = net(x)
        loss = F.cross_entropy(logits, labels)
    assert logits.dtype == (torch.bfloat16 if amp else torch.float32)
    assert loss.dtype == torch.float32
    loss.backward()
    return {"logits": enc(logits), "loss": float("%.9g" % loss.item()),
            "grads": {k: enc(sampled(p.grad)) for k, p in net.named_parameters()}}


doc = {"torch": torch.__version__, "bf16": run(True), "fp32": run(False)}
with open(OUT, "w") as f:
    json.dump(doc, f)
print("wrote", OUT)
