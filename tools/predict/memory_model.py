#!/usr/bin/python3
"""Memory per GPU of data-, pipeline- and tensor-parallel ResNet-18 at stage
widths times w (docs/parallel.md, "When one GPU no longer holds the model"):
the width at which one GPU can no longer hold a replica, and what pipeline or
tensor parallelism then fits.

A GPU's memory for a layout dp x pp x tp, global batch B, M micro-batches:

    trained    12 bytes per parameter it trains: the float32 weight, its
               gradient and its SGD momentum (a stage's parameters; of a
               split layer, 1/tp); with micro-batches, 4 more: a micro-batch's
               gradients beside their running sum
    activations  what the forward keeps for the backward, per image:
               k x 4 bytes x the convolutions' output elements (those of
               each block's conv1, whose channels tensor parallelism splits,
               divided by tp), for the images in flight: the replica's
               B / dp, or with a pipeline B / dp / M per micro-batch, of
               which 1F1B holds at most pp - s at stage s (GPipe: all M)
    whole copy  anvil also holds the whole model's float32 weights on every
               rank of a pipeline or tensor-parallel run (what --save and
               --checkpoint gather into): 4 bytes per parameter, less those
               of the tensors the GPU trains as they are (a stage's unsplit
               layers; a split layer's parts are tensors of their own)

k is measured, not assumed: bench_model_parallel's one-device step peak for
ResNet-18 at batch 32 (docs/parallel.md: 147.1 MB, of which 44.7 MB are the
gradients) is 102.4 MB of activations and temporaries, 3.20 MB per image,
over 480,000 convolution output elements per image: k = 1.67. The first
table checks the model against bench_model_parallel at widths 1 and 2.

    tools/predict/memory_model.py                 # H100 80 GB, 8 GPUs, 256 images per GPU
    tools/predict/memory_model.py --widths 1,8,16,18,20-22,24-28,32,33,40,44   # docs/parallel.md's
    tools/predict/memory_model.py --gpu-gb 40 --per-gpu-batch 128
"""
import argparse
import sys

import step_model as sm

# bench_model_parallel's ResNet-18 runs, 4 micro-batches for a pipeline
# (1F1B): (width, global batch, layout dp pp tp, the largest rank's step
# peak MB, the parameters it trains MB). Width 1 at batch 32: docs/parallel.md,
# "Data, pipeline and tensor parallelism side by side"; batch 16 at widths 1
# and 2: the check of the width (docs/parallel.md, "When one GPU no longer
# holds the model").
MEASURED = [(1, 32, (1, 1, 1), 147.1, 44.7), (1, 32, (2, 1, 1), 95.0, 44.7),
            (1, 32, (1, 2, 1), 67.5, 42.0), (1, 32, (1, 1, 2), 103.9, 22.4),
            (1, 32, (4, 1, 1), 68.1, 44.7), (1, 32, (1, 4, 1), 69.5, 33.6),
            (1, 32, (1, 1, 4), 82.8, 11.2), (1, 32, (2, 2, 1), 64.2, 42.0),
            (1, 32, (2, 1, 2), 61.7, 22.4), (1, 32, (1, 2, 2), 39.5, 21.0),
            (1, 16, (1, 1, 1), 93.0, 44.7), (1, 16, (2, 1, 1), 70.0, 44.7),
            (1, 16, (1, 2, 1), 64.1, 42.0), (1, 16, (1, 1, 2), 61.6, 22.4),
            (2, 16, (1, 1, 1), 272.2, 178.7), (2, 16, (2, 1, 1), 222.4, 178.7),
            (2, 16, (1, 2, 1), 249.9, 167.9), (2, 16, (1, 1, 2), 165.1, 89.4)]
MEASURED_MICRO = 4


def copies_per_element():
    """k: the one-device measurement's activations per image over its convolution output elements."""
    layers = sm.resnet18_layers(1)
    _, batch, _, peak, trained = MEASURED[0]  # one device, width 1, batch 32
    per_image = (peak - trained) * 1e6 / batch
    return per_image / (4 * sum(l["acts"] for l in layers))


def per_gpu(width, batch, dp, pp, tp, micro, k, schedule="1f1b"):
    """The fullest GPU's memory, bytes: a dict of its parameters trained
    (`params`), `trained` (their 12 or 16 bytes each), `acts` and `whole`."""
    layers = sm.resnet18_layers(width)
    total = sum(l["params"] for l in layers)
    m = micro if pp > 1 else 1
    bounds = sm.balance([l["flops"] for l in layers], pp)  # cut by FLOPs, as parallel/stages.h
    worst = None
    for s in range(pp):
        part = layers[bounds[s]:bounds[s + 1]]
        params = sum(l["params"] / tp if l["split"] else l["params"] for l in part)
        # The whole model's tensors this GPU trains as they are (a split layer's parts are apart).
        shared = sum(l["params"] for l in part if not (l["split"] and tp > 1))
        elements = sum(l["acts"] - l["split_acts"] + l["split_acts"] / tp for l in part)
        in_flight = min(pp - s, m) if schedule == "1f1b" else m
        mem = dict(params=params,
                   trained=(16 if m > 1 else 12) * params,  # a micro-batch's gradients beside their sum
                   acts=k * 4 * elements * batch / dp / m * in_flight,
                   whole=4 * (total - shared) if pp > 1 or tp > 1 else 0)
        if worst is None or mem["trained"] + mem["acts"] > worst["trained"] + worst["acts"]:
            worst = mem
    return worst


def check(k):
    """The --check: 0 when it holds, 1 (with the failures printed) when not."""
    failures = []
    if sm.resnet18_params(1) != 11_175_818:  # PyTorch's (tests/golden/resnet_golden.json)
        failures.append(f"width 1 has {sm.resnet18_params(1):,} parameters, PyTorch's ResNet-18 11,175,818")
    for width, batch, (dp, pp, tp), peak, _ in MEASURED:
        g = per_gpu(width, batch, dp, pp, tp, MEASURED_MICRO, k)
        ratio = (g["trained"] - 8 * g["params"] + g["acts"]) / 1e6 / peak
        if not (ratio >= 0.99 if pp > 1 else abs(ratio - 1) <= 0.05):
            failures.append(f"width {width}, batch {batch}, {label(dp, pp, tp)}: predicted {ratio:.2f}x the "
                            f"measured step peak")
    for f in failures:
        print(f"memory_model.py --check: {f}")
    return 1 if failures else 0


def label(dp, pp, tp):
    return " x ".join(f"{n} {v}" for n, v in [("dp", dp), ("pp", pp), ("tp", tp)] if v > 1) or "one device"


def parse_widths(text):
    """"1-48" or "1,8,16-24" -> the widths, in order."""
    out = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gpu-gb", type=float, default=80.0, help="memory per GPU, 1e9 bytes (H100 SXM: 80)")
    p.add_argument("--gpus", type=int, default=8)
    p.add_argument("--per-gpu-batch", type=int, default=256, help="images per GPU (global batch: times --gpus)")
    p.add_argument("--micro-batches", type=int, default=32, help="a pipeline's micro-batches per step")
    p.add_argument("--widths", default="1-48", help="width multipliers: 1-48, or 1,8,16-24")
    p.add_argument("--check", action="store_true",
                   help="exit 1 unless width 1 has PyTorch's 11,175,818 parameters and every check row holds "
                        "(within 5% without a pipeline; with one, at least 0.99x the measurement: an upper bound)")
    a = p.parse_args()
    k = copies_per_element()
    if a.check:
        sys.exit(check(k))

    print(f"k = {k:.2f} float32 copies of each convolution output element per image "
          f"(activations and temporaries), from the one-device measurement")
    print(f"\ncheck against bench_model_parallel (ResNet-18, {MEASURED_MICRO} micro-batches): the "
          f"largest rank's step peak (its gradients, a pipeline's second copy, activations), MB")
    print(f"{'width':>5} {'batch':>5} {'layout':>14} {'predicted':>10} {'measured':>9} {'ratio':>6}")
    for width, batch, (dp, pp, tp), peak, _ in MEASURED:
        g = per_gpu(width, batch, dp, pp, tp, MEASURED_MICRO, k)
        predicted = (g["trained"] - 8 * g["params"] + g["acts"]) / 1e6  # less weights and momentum
        print(f"{width:>5} {batch:>5} {label(dp, pp, tp):>14} {predicted:>10.1f} {peak:>9.1f} "
              f"{predicted / peak:>6.2f}")

    n, batch, limit = a.gpus, a.gpus * a.per_gpu_batch, a.gpu_gb * 1e9
    layouts = [(n, 1, 1), (1, n, 1), (1, 1, n), (n // 2, 1, 2), (n // 2, 2, 1), (1, 2, n // 2)]
    print(f"\nGB per GPU on {n} GPUs of {a.gpu_gb:g} GB, global batch {batch} ({a.per_gpu_batch} per GPU), "
          f"pipelines of {a.micro_batches} micro-batches (1F1B); ✗ = does not fit; "
          f"in brackets: with anvil's whole-model copy")
    print("| width | parameters | " + " | ".join(label(*l) for l in layouts) + " |")
    print("|---|---|" + "---|" * len(layouts))
    for w in parse_widths(a.widths):
        cells = []
        for lay in layouts:
            g = per_gpu(w, batch, *lay, a.micro_batches, k)
            lean, held = g["trained"] + g["acts"], g["trained"] + g["acts"] + g["whole"]
            cell = f"{lean / 1e9:.1f}" + (" ✗" if lean > limit else "")
            if g["whole"]:
                cell += f" ({held / 1e9:.1f}{' ✗' if held > limit else ''})"
            cells.append(cell)
        print(f"| {w} | {sm.resnet18_params(w) / 1e6:,.0f} M | " + " | ".join(cells) + " |")
    print("\nthe first width that does not fit (without anvil's whole-model copy; with it):")
    for lay in layouts:
        firsts = []
        for key in [("trained", "acts"), ("trained", "acts", "whole")]:
            w = 1
            while w <= 1000 and sum(per_gpu(w, batch, *lay, a.micro_batches, k)[x] for x in key) <= limit:
                w += 1
            firsts.append(str(w))
        print(f"  {label(*lay):>14}: {firsts[0]}; {firsts[1]}")
    # Data parallelism at any batch: 12 bytes per parameter and one image.
    w = 1
    while sum(per_gpu(w, 1, 1, 1, 1, 1, k)[key] for key in ("trained", "acts")) <= limit:
        w += 1
    print(f"  a whole replica on one GPU at one image per step: width {w} "
          f"({12 * sm.resnet18_params(w) / 1e9:.1f} GB of weights, gradients and momentum)")


if __name__ == "__main__":
    main()
