#!/usr/bin/python3
"""The step-time model of data-parallel training (docs/parallel.md).

A data-parallel step on N GPUs takes the compute of B/N images on one GPU,
plus the part of the gradient all-reduce that backward does not hide:

    T(N) = T_compute(B / N) + T_exposed(N)
    T_compute(b) = max(FLOPs(b) / (peak * fraction), launches * t_launch)
    T_allreduce(bytes, N) = bytes * 2(N-1)/N / busbw + steps * latency
    T_exposed = the last bucket's all-reduce (the first layers' gradients,
                final only when backward ends) + one synchronisation,
                or the whole all-reduce without overlap.

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


MODELS = {
    # params (nn/models.h), forward FLOPs per image, and kernel launches per
    # step (forward, backward, loss, SGD: an estimate from anvil's op layer,
    # ~3 per layer forward and backward plus one per parameter tensor)
    "resnet18": dict(params=11_172_810, flops=resnet18_forward_flops(), launches=300),
    "lenet": dict(params=129_068, flops=lenet_forward_flops(), launches=45),
}


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


if __name__ == "__main__":
    main()
