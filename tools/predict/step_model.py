#!/usr/bin/python3
"""The step-time model of data-, pipeline- and tensor-parallel training (docs/parallel.md).

A data-parallel step on N GPUs takes the compute of B/N images on one GPU,
plus the part of the gradient all-reduce that backward does not hide:

    T(N) = T_compute(B / N) + T_exposed(N)
    T_compute(b) = max(FLOPs(b) / (peak * fraction), launches * t_launch)
    T_allreduce(bytes, N) = bytes * 2(N-1)/N / busbw + steps * latency
    T_exposed = the last bucket's all-reduce (the first layers' gradients,
                final only when backward ends) + one synchronisation,
                or the whole all-reduce without overlap.

A pipeline of N stages and M micro-batches (GPipe or 1F1B, the same
bubble) takes M + N - 1 slots of its slowest stage's forward and backward
of one micro-batch, each with that stage's exchange of an activation and
its gradient (not overlapped with compute, as in parallel/pipeline.cpp):

    T_pp = (M + N - 1) * (T_compute(slowest stage, B / M) + 2 * T_p2p)

Tensor parallelism over N GPUs (parallel/tensor_parallel.h, ResNet-18's
plan) computes 1/N of every residual block's convolutions and the rest whole,
launches every kernel on every GPU, and waits for each block's all-reduces
(conv2's output forward, the block's input gradient backward) and, in the
three blocks with a 1x1 shortcut, an all-gather of its output:

    T_tp = T_compute(split / N + whole) + sum over blocks of T_allreduce(activations) + T_gather

Combined with data parallelism, each replica's step is that of its share of
the batch, plus the exposed part of the all-reduce of the gradients it holds
(its stage's, its parts) over the replicas.

FLOPs come from the models' layer shapes below (multiply-adds x 2; a
training step is about 3x the forward). The inputs with their sources are
the defaults of the flags; every figure printed says which it used.

    tools/predict/step_model.py                        # predictions for H100s
    tools/predict/step_model.py --fraction 0.5 --busbw-gbps 365   # other assumptions
"""
import argparse
import math


def conv(cin, cout, k, hw_out):
    return 2 * cin * cout * k * k * hw_out * hw_out


def resnet18_forward_flops():
    """d2l's ResNet-18 for 28x28 inputs (nn/models.h): 3x3 stem, four stages."""
    f = conv(1, 64, 3, 28)
    f += 4 * conv(64, 64, 3, 28)  # stage 1: two residuals of two 3x3 convs
    for cin, cout, hw in [(64, 128, 14), (128, 256, 7), (256, 512, 4)]:
        f += conv(cin, cout, 3, hw) + conv(cout, cout, 3, hw) + conv(cin, cout, 1, hw)
        f += 2 * conv(cout, cout, 3, hw)
    return f + 2 * 512 * 10


def lenet_forward_flops():
    """The seeds' LeNet: conv 1->20 3x3, avg pool, conv 20->50 5x5, avg pool, 800-128-10."""
    return conv(1, 20, 3, 26) + conv(20, 50, 5, 9) + 2 * 800 * 128 + 2 * 128 * 10


def step(model, batch, gpus, a, overlap=True):
    m = MODELS[model]
    per_gpu = batch / gpus
    flops = 3 * m["flops"] * per_gpu
    compute = max(flops / (a.peak_tflops * 1e12 * a.fraction), m["launches"] * a.launch_us * 1e-6)
    grad_bytes = 4 * m["params"]
    if gpus == 1:
        return compute, 0.0
    busbw = a.busbw_gbps * 1e9 if gpus <= a.gpus_per_node else a.net_busbw_gbps * 1e9
    factor = 2 * (gpus - 1) / gpus
    buckets = max(1, math.ceil(grad_bytes / a.bucket_bytes))
    latency = (2 * (gpus - 1)) * a.latency_us * 1e-6 + a.sync_us * 1e-6
    whole = grad_bytes * factor / busbw + buckets * latency
    last_bucket = min(grad_bytes, grad_bytes - (buckets - 1) * a.bucket_bytes)
    exposed = (last_bucket * factor / busbw + latency) if overlap else whole
    return compute, exposed


def resnet18_layers(width=1):
    """ResNet-18's layers as a pipeline cuts them (parallel/stages.h), its
    stage widths times `width` (64w, 128w, 256w, 512w; bench_model_parallel
    --width-multiplier): (name, forward FLOPs per image, output bytes per
    image in float32, parameters as PyTorch counts them: 3x3 and 1x1 convs
    with bias, BatchNorm's weight and bias), the stem as one layer. Each
    residual block: its convolutions; what tensor parallelism moves per image:
    conv2's output (the forward all-reduce), the block's input (the backward
    one) and, with a 1x1 shortcut, conv3's output (the all-gather); and its
    convolutions' output elements per image (`acts`; tools/predict/memory_model.py),
    those of conv1, whose channels tensor parallelism splits, in `split_acts`."""
    c0 = 64 * width
    layers = [dict(name="stem", flops=conv(1, c0, 3, 28), out=c0 * 28 * 28 * 4, params=9 * c0 + c0 + 2 * c0,
                   split=0, acts=c0 * 28 * 28, split_acts=0)]
    cin, hw_in = c0, 28
    for b, (cout, hw) in enumerate([(64 * width, 28), (128 * width, 14), (256 * width, 7), (512 * width, 4)]):
        for i in range(2):
            shortcut = b > 0 and i == 0
            c_in = cin if i == 0 else cout
            f = conv(c_in, cout, 3, hw) + conv(cout, cout, 3, hw) + (conv(c_in, cout, 1, hw) if shortcut else 0)
            p = (9 * c_in * cout + cout) + (9 * cout * cout + cout) + 4 * cout + (c_in * cout + cout if shortcut else 0)
            layers.append(dict(name=f"resnet_block{b + 1}.{i}", flops=f, out=cout * hw * hw * 4, params=p,
                               split=f, reduce=cout * hw * hw * 4,
                               input=c_in * (hw_in if i == 0 else hw) ** 2 * 4,
                               gather=cout * hw * hw * 4 if shortcut else 0,
                               acts=(3 if shortcut else 2) * cout * hw * hw, split_acts=cout * hw * hw))
        cin, hw_in = cout, hw
    layers.append(dict(name="fc", flops=2 * cin * 10, out=10 * 4, params=cin * 10 + 10, split=0,
                       acts=0, split_acts=0))
    return layers


def resnet18_params(width=1):
    """ResNet-18's parameters at stage widths times `width`: 11,175,818 at width 1 (PyTorch's count,
    tests/golden/resnet_golden.json); tests/test_resnet.cpp holds models::resnet18 to the same formula."""
    return sum(l["params"] for l in resnet18_layers(width))


MODELS = {
    # params (nn/models.h), forward FLOPs per image, and kernel launches per
    # step (forward, backward, loss, SGD: an estimate from anvil's op layer,
    # ~3 per layer forward and backward plus one per parameter tensor)
    "resnet18": dict(params=resnet18_params(), flops=resnet18_forward_flops(), launches=300),
    "lenet": dict(params=129_068, flops=lenet_forward_flops(), launches=45),
}


def balance(costs, stages):
    """The least largest stage total of `costs` cut into `stages` runs (balance_stages)."""
    n = len(costs)
    prefix = [0]
    for c in costs:
        prefix.append(prefix[-1] + c)
    inf = float("inf")
    best = [[inf] * (n + 1) for _ in range(stages + 1)]
    cut = [[0] * (n + 1) for _ in range(stages + 1)]
    best[0][0] = 0
    for s in range(1, stages + 1):
        for i in range(s, n + 1):
            for j in range(s - 1, i):
                w = max(best[s - 1][j], prefix[i] - prefix[j])
                if w < best[s][i]:
                    best[s][i], cut[s][i] = w, j
    bounds = [n]
    for s in range(stages, 0, -1):
        bounds.append(cut[s][bounds[-1]])
    return bounds[::-1]


def collective(nbytes, n, a, factor, steps):
    """One collective over n GPUs in a machine: bytes * factor / busbw, its ring steps' latency, the sync."""
    if n == 1:
        return 0.0
    return nbytes * factor / (a.busbw_gbps * 1e9) + steps * a.latency_us * 1e-6 + a.sync_us * 1e-6


def allreduce(nbytes, n, a):
    return collective(nbytes, n, a, 2 * (n - 1) / n, 2 * (n - 1))


def compute_time(flops, launches, a):
    return max(3 * flops / (a.peak_tflops * 1e12 * a.fraction), launches * a.launch_us * 1e-6)


def grad_exposed(grad_bytes, n, a):
    """The part of a gradient all-reduce over n replicas that backward does not hide (the last bucket)."""
    if n == 1:
        return 0.0
    last = grad_bytes - (max(1, math.ceil(grad_bytes / a.bucket_bytes)) - 1) * a.bucket_bytes
    return allreduce(min(grad_bytes, last), n, a)


def hybrid_step(batch, dp, pp, tp, micro, a):
    """ResNet-18's step on dp x pp x tp GPUs of one machine, global batch `batch`:
    (compute, communication) seconds of the slowest stage, and the most
    parameters a GPU trains (its stage's; of a split layer, its 1/tp)."""
    layers = resnet18_layers()
    launches = MODELS["resnet18"]["launches"]
    b = batch / dp  # each replica's share
    m = micro if pp > 1 else 1
    bounds = balance([l["flops"] for l in layers], pp)
    worst, most = (0.0, 0.0), 0.0
    for s in range(pp):
        part = layers[bounds[s]:bounds[s + 1]]
        per_image = sum(l["flops"] - l["split"] + l["split"] / tp for l in part)
        compute = compute_time(per_image * b / m, launches * len(part) / len(layers), a)
        comm = 0.0
        for l in part:  # tensor parallelism's collectives, per micro-batch
            if tp > 1 and l["split"]:
                comm += allreduce(l["reduce"] * b / m, tp, a) + allreduce(l["input"] * b / m, tp, a)
                if l["gather"]:
                    comm += collective(l["gather"] * b / m, tp, a, (tp - 1) / tp, tp - 1)
        # With each neighbour: an activation one way and its gradient back, per micro-batch.
        for boundary in ([bounds[s] - 1] if s > 0 else []) + ([bounds[s + 1] - 1] if s + 1 < pp else []):
            comm += 2 * (layers[boundary]["out"] * b / m / (a.busbw_gbps * 1e9) + a.latency_us * 1e-6
                         + a.sync_us * 1e-6)
        params = sum(l["params"] / tp if l["split"] else l["params"] for l in part)
        most = max(most, params)
        slots = m + pp - 1
        if slots * (compute + comm) > sum(worst):
            worst = (slots * compute, slots * comm)
    compute, comm = worst
    return compute, comm + grad_exposed(4 * most, dp, a), most


def print_model_parallel(a):
    """ResNet-18 on the 8 GPUs of one machine, every layout, at 256 images per GPU."""
    gpus, batch = 8, 2048
    one = sum(hybrid_step(256, 1, 1, 1, 1, a)[:2])
    print(f"\nresnet18 on {gpus} GPUs of one machine, global batch {batch} (256 per GPU); "
          f"one GPU: {one * 1e3:.2f} ms for 256 images")
    print(f"{'layout':>16} {'M':>3} {'compute ms':>11} {'comm ms':>8} {'step ms':>8} {'img/s':>8} "
          f"{'efficiency':>10} {'params/GPU':>11}")
    for dp, pp, tp, micro in [(8, 1, 1, 1), (1, 8, 1, 8), (1, 8, 1, 32), (1, 1, 8, 1), (4, 2, 1, 8),
                              (4, 1, 2, 1), (2, 2, 2, 8), (2, 4, 1, 16), (1, 2, 4, 8)]:
        compute, comm, params = hybrid_step(batch, dp, pp, tp, micro, a)
        t = compute + comm
        label = " x ".join(f"{k} {v}" for k, v in [("dp", dp), ("pp", pp), ("tp", tp)] if v > 1)
        print(f"{label:>16} {micro if pp > 1 else '':>3} {compute * 1e3:>11.2f} {comm * 1e3:>8.2f} "
              f"{t * 1e3:>8.2f} {batch / t:>8.0f} {batch / t / (gpus * 256 / one):>10.2f} "
              f"{params / 1e6:>9.2f} M")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--peak-tflops", type=float, default=66.9,
                   help="FP32 peak, no tensor cores: H100 SXM 66.9 (NVIDIA datasheet)")
    p.add_argument("--fraction", type=float, default=0.35,
                   help="fraction of the FP32 peak anvil's handwritten kernels reach on these layers "
                        "(an assumption until the first GPU run measures it)")
    p.add_argument("--launch-us", type=float, default=4.0,
                   help="time per kernel launch when a step is launch-bound (CUDA's ~3-5 us)")
    p.add_argument("--busbw-gbps", type=float, default=300.0,
                   help="all-reduce busbw within a machine: NVLink 4, 32 MiB messages ~300 GB/s "
                        "(anchors: nccl issue 1455, Mooncake PR 3484)")
    p.add_argument("--net-busbw-gbps", type=float, default=380.0,
                   help="busbw across machines: 2x8 H100, 8 NDR NICs, 380-400 GB/s "
                        "(nccl-tests issues 290, 309)")
    p.add_argument("--gpus-per-node", type=int, default=8)
    p.add_argument("--latency-us", type=float, default=8.0, help="per ring step (NVLink)")
    p.add_argument("--sync-us", type=float, default=30.0,
                   help="per collective: the host-side agreement between ranks and stream events")
    p.add_argument("--bucket-bytes", type=float, default=25 * 2**20)
    a = p.parse_args()

    print(f"assumptions: FP32 peak {a.peak_tflops} TFLOP/s at {a.fraction:.0%}, {a.launch_us} us per "
          f"launch, busbw {a.busbw_gbps} GB/s in a machine ({a.gpus_per_node} GPUs), "
          f"{a.net_busbw_gbps} GB/s across, {a.latency_us} us per ring step, {a.sync_us} us per "
          f"collective, buckets of {a.bucket_bytes / 2**20:.0f} MiB")
    # ResNet-18 as the seeds scale it: 256 images per GPU (batch 512 on 2);
    # LeNet as they do: batch 256 whatever the GPU count.
    for model, per_gpu, weak in [("resnet18", 256, True), ("lenet", 256, False)]:
        m = MODELS[model]
        print(f"\n{model}: {m['params']:,} parameters ({4 * m['params'] / 1e6:.1f} MB of "
              f"gradients), {m['flops'] / 1e6:.1f} MFLOP forward per image; "
              + (f"{per_gpu} images per GPU" if weak else f"global batch {per_gpu}"))
        print(f"{'GPUs':>6} {'compute ms':>11} {'exposed ms':>11} {'step ms':>8} {'img/s':>10} "
              f"{'s/epoch':>8} {'efficiency':>10} {'no overlap':>10}")
        for gpus in [1, 2, 4, 8, 16]:
            batch = per_gpu * gpus if weak else per_gpu
            compute, exposed = step(model, batch, gpus, a)
            t = compute + exposed
            plain = sum(step(model, batch, gpus, a, overlap=False))
            t1 = sum(step(model, batch if not weak else per_gpu, 1, a))
            # Efficiency: images/s on N GPUs over N times one GPU's.
            ips1 = (per_gpu if weak else batch) / t1
            label = "2x8" if gpus == 16 else str(gpus)
            print(f"{label:>6} {compute * 1e3:>11.3f} {exposed * 1e3:>11.3f} {t * 1e3:>8.3f} "
                  f"{batch / t:>10.0f} {60000 / (batch / t):>8.2f} {batch / t / (gpus * ips1):>10.2f} "
                  f"{batch / plain / (gpus * ips1):>10.2f}")
    print_model_parallel(a)


if __name__ == "__main__":
    main()
