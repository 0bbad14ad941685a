#!/usr/bin/python3
"""Writes tests/golden/ops_golden.json: small inputs and PyTorch's outputs
(and gradients) for the ops anvil implements, read by tests/test_golden.cpp.

Run with Debian's python3-torch (CPU):  /usr/bin/python3 tests/golden/make_golden.py
Deterministic: fixed seeds, float32 values written with 9 significant digits
(which round-trip float32 exactly).

Every case has
  name, op, params            what to run
  inputs   {name: tensor}     float32 (or int64 labels) inputs
  outputs  {name: tensor}     expected results
  grads    {name: tensor}     (optional) d/d(input) of L = sum(out * R), where
                              R = inputs["R"] has the output's shape
A tensor is {"shape": [...], "data": [flat row-major values]}.
"""
import json
import os

import torch
import torch.nn.functional as F

torch.manual_seed(20240611)
torch.set_default_dtype(torch.float32)

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "ops_golden.json")


def enc(t):
    t = t.detach().contiguous()
    if t.dtype == torch.int64:
        data = [int(v) for v in t.reshape(-1).tolist()]
    else:
        data = [float("%.9g" % v) for v in t.float().reshape(-1).tolist()]
    return {"shape": list(t.shape), "data": data}


def randn(*shape):
    return torch.randn(tuple(shape), dtype=torch.float32)


def rand(*shape, lo=0.0, hi=1.0):
    return lo + (hi - lo) * torch.rand(tuple(shape), dtype=torch.float32)


cases = []


def add_case(name, op, params, inputs, outputs, grads=None):
    case = {"name": name, "op": op, "params": params,
            "inputs": {k: enc(v) for k, v in inputs.items()},
            "outputs": {k: enc(v) for k, v in outputs.items()}}
    if grads:
        case["grads"] = {k: enc(v) for k, v in grads.items()}
    cases.append(case)


def grads_of(out, R, leaves):
    """d/d(leaf) of sum(out * R) for each named leaf."""
    for t in leaves.values():
        t.grad = None
    (out * R).sum().backward()
    return {k: t.grad.clone() for k, t in leaves.items()}


# ---------------------------------------------------------------- conv2d
conv_configs = [
    # name, N, C, H, W, K, R, S, stride, pad, bias
    ("conv2d_3x3_s1_p0_bias", 2, 3, 7, 5, 4, 3, 3, 1, 0, True),
    ("conv2d_3x3_s2_p1_bias", 1, 2, 6, 7, 3, 3, 3, 2, 1, True),
    ("conv2d_2x3_s2_p0_nobias", 3, 1, 5, 5, 2, 2, 3, 2, 0, False),
    ("conv2d_1x1_s1_p1_bias", 2, 3, 4, 3, 2, 1, 1, 1, 1, True),
]
for name, N, C, H, W, K, R_, S, stride, pad, has_bias in conv_configs:
    x = randn(N, C, H, W).requires_grad_()
    w = (randn(K, C, R_, S) * 0.5).requires_grad_()
    b = randn(K).requires_grad_() if has_bias else None
    y = F.conv2d(x, w, b, stride=stride, padding=pad)
    R = randn(*y.shape)
    leaves = {"x": x, "weight": w}
    if has_bias:
        leaves["bias"] = b
    g = grads_of(y, R, leaves)
    inputs = dict(leaves)
    inputs["R"] = R
    add_case(name, "conv2d", {"stride": stride, "padding": pad}, inputs, {"y": y}, g)

# ---------------------------------------------------------------- pooling
pool_configs = [
    # name, N, C, H, W, kernel, stride, pad
    ("k2_s2_p0", 2, 3, 7, 5, 2, 2, 0),
    ("k3_s2_p1", 1, 2, 7, 5, 3, 2, 1),
    ("k3_s1_p1", 2, 1, 5, 6, 3, 1, 1),
    ("k2_s1_p1", 1, 3, 4, 5, 2, 1, 1),
]
for name, N, C, H, W, k, s, p in pool_configs:
    x = randn(N, C, H, W).requires_grad_()
    y = F.max_pool2d(x, k, s, p)
    R = randn(*y.shape)
    g = grads_of(y, R, {"x": x})
    add_case("max_pool2d_" + name, "max_pool2d", {"kernel": k, "stride": s, "padding": p},
             {"x": x, "R": R}, {"y": y}, g)

    x = randn(N, C, H, W).requires_grad_()
    y = F.avg_pool2d(x, k, s, p, count_include_pad=True)
    R = randn(*y.shape)
    g = grads_of(y, R, {"x": x})
    add_case("avg_pool2d_" + name, "avg_pool2d", {"kernel": k, "stride": s, "padding": p},
             {"x": x, "R": R}, {"y": y}, g)

for shape in [(2, 3, 7, 5), (1, 1, 1, 4)]:
    x = randn(*shape).requires_grad_()
    y = F.adaptive_avg_pool2d(x, 1)
    R = randn(*y.shape)
    g = grads_of(y, R, {"x": x})
    add_case("global_avg_pool2d_%dx%dx%dx%d" % shape, "global_avg_pool2d", {}, {"x": x, "R": R},
             {"y": y}, g)

# ---------------------------------------------------------------- cross entropy
for N, C in [(4, 5), (1, 3), (7, 10)]:
    logits = (randn(N, C) * 2).requires_grad_()
    labels = torch.randint(0, C, (N,), dtype=torch.int64)
    for red in ["mean", "sum", "none"]:
        y = F.cross_entropy(logits, labels, reduction=red)
        R = randn(*y.shape)
        g = grads_of(y, R, {"logits": logits})
        add_case("cross_entropy_%s_%dx%d" % (red, N, C), "cross_entropy", {"reduction": red},
                 {"logits": logits, "labels": labels, "R": R}, {"y": y}, g)

# ---------------------------------------------------------------- batch norm
for shape in [(4, 3), (2, 3, 4, 5), (1, 2, 3, 3)]:
    C = shape[1]
    x = (randn(*shape) * 1.5 + 0.5).requires_grad_()
    w = rand(C, lo=0.5, hi=1.5).requires_grad_()
    b = randn(C).requires_grad_()
    rm0 = randn(C) * 0.1
    rv0 = rand(C, lo=0.5, hi=1.5)
    tag = "x".join(str(d) for d in shape)

    rm, rv = rm0.clone(), rv0.clone()
    y = F.batch_norm(x, rm, rv, w, b, training=True, momentum=0.1, eps=1e-5)
    R = randn(*y.shape)
    g = grads_of(y, R, {"x": x, "weight": w, "bias": b})
    add_case("batch_norm_train_" + tag, "batch_norm",
             {"training": True, "momentum": 0.1, "eps": 1e-5},
             {"x": x, "weight": w, "bias": b, "running_mean": rm0, "running_var": rv0, "R": R},
             {"y": y, "running_mean": rm, "running_var": rv}, g)

    rm, rv = rm0.clone(), rv0.clone()
    y = F.batch_norm(x, rm, rv, w, b, training=False, momentum=0.1, eps=1e-5)
    R = randn(*y.shape)
    g = grads_of(y, R, {"x": x, "weight": w, "bias": b})
    add_case("batch_norm_eval_" + tag, "batch_norm",
             {"training": False, "momentum": 0.1, "eps": 1e-5},
             {"x": x, "weight": w, "bias": b, "running_mean": rm0, "running_var": rv0, "R": R},
             {"y": y, "running_mean": rm, "running_var": rv}, g)

# ---------------------------------------------------------------- linear
for N, fin, fout, has_bias in [(3, 5, 4, True), (1, 7, 2, True), (4, 3, 6, False)]:
    x = randn(N, fin).requires_grad_()
    w = randn(fout, fin).requires_grad_()
    b = randn(fout).requires_grad_() if has_bias else None
    y = F.linear(x, w, b)
    R = randn(*y.shape)
    leaves = {"x": x, "weight": w}
    if has_bias:
        leaves["bias"] = b
    g = grads_of(y, R, leaves)
    inputs = dict(leaves)
    inputs["R"] = R
    add_case("linear_%dx%d_to_%d%s" % (N, fin, fout, "_bias" if has_bias else ""), "linear", {},
             inputs, {"y": y}, g)

# ------------------------------------------- cross entropy with label smoothing
# (after every other case, so that adding them left the earlier draws as
# they were)
for N, C, eps in [(4, 5, 0.1), (7, 10, 0.3), (3, 4, 1.0)]:
    logits = (randn(N, C) * 2).requires_grad_()
    labels = torch.randint(0, C, (N,), dtype=torch.int64)
    for red in ["mean", "sum", "none"]:
        y = F.cross_entropy(logits, labels, reduction=red, label_smoothing=eps)
        R = randn(*y.shape)
        g = grads_of(y, R, {"logits": logits})
        add_case("cross_entropy_%s_%dx%d_smoothing_%g" % (red, N, C, eps), "cross_entropy",
                 {"reduction": red, "label_smoothing": eps},
                 {"logits": logits, "labels": labels, "R": R}, {"y": y}, g)

doc = {
    "generator": "tests/golden/make_golden.py",
    "torch_version": torch.__version__,
    "cases": cases,
}
with open(OUT, "w") as f:
    json.dump(doc, f, separators=(",", ":"))
    f.write("\n")
print("wrote %s: %d cases, %d bytes" % (OUT, len(cases), os.path.getsize(OUT)))
