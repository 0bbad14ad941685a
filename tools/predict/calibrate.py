#!/usr/bin/env python3
"""The step model beside what the H200 measured: every kernel time and step
time that docs/results.md ("GPU runs", 2026-11-26) records for anvil's own
kernels, with the model's prediction without and with the issue bound
(tools/predict/step_time.py) and measured / predicted.

    python3 tools/predict/calibrate.py          # the table in docs/step-model.md, "Calibration"
    python3 tools/predict/calibrate.py --check  # exit 1 unless docs/step-model.md holds it

The measured figures are copied here from docs/results.md (each row says
where); nothing is measured by this script. The model is the H100 SXM5's
(132 SMs, the datasheet's peaks, HBM3 3.35 TB/s). The H200 has the same
SMs and clocks and faster HBM3e (4.8 TB/s); the predictions keep the
H100's bandwidth, so where a launch is memory-bound they overstate the
H200's time (of the kernel rows, only LeNet conv1's is). A single kernel is predicted as
the step model predicts a launch: max(executed FLOPs / peak, minimum bytes / HBM,
issue bound) / the wave fill of its blocks (kernel_table.fill, with the
resident blocks of the kernel table and its split plan, kernel_table.split_k),
plus the split's add_partials pass at the bandwidth; a step as step_time.py
predicts it (with the 4 µs floor). Standard library only.
"""
import argparse
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import kernel_table as kt  # noqa: E402
import step_launches as sl  # noqa: E402
import step_predict as sp  # noqa: E402

F = 4
STEPS_PER_EPOCH = {256: math.ceil(60000 / 256), 128: math.ceil(60000 / 128)}  # Fashion-MNIST's 60,000


def resident(file, kernel):
    """Blocks per SM of a kernel-table row (file, kernel cell)."""
    lines = (sp.GENERATED / "kernel-table.md").read_text().splitlines()
    head = next(l for l in lines if l.startswith("| file |"))
    col = [c.strip() for c in head.strip("|").split("|")].index("blocks/SM (limit)")
    for l in lines:
        cells = [c.strip() for c in l.strip().strip("|").split("|")]
        if len(cells) > col and cells[0] == file and cells[1] == kernel:
            return int(cells[col].split()[0])
    sys.exit(f"calibrate: no kernel-table row {file} {kernel}")


def per_hmma(prefix, suffix=""):
    """The most instructions per HMMA over the instantiations whose key starts with prefix."""
    loops = {k: v for k, v in sp.main_loops().items() if k.startswith(prefix) and k.endswith(suffix)}
    if not loops:
        sys.exit(f"calibrate: no main loop for {prefix}...{suffix} in docs/kernel-resources.json")
    return max(loops.values())


def launch_us(m, n, k, flops, nbytes, peak, per_sm, bm=128, bn=128, hmma_peak=None, instr=0.0):
    """(without, with the issue bound) µs of one GEMM-shaped launch on its split plan."""
    tiles = kt.tiles(m, n, bm, bn)
    splits = kt.split_k(m, n, k, tiles, per_sm)[0]
    fill = kt.fill(tiles * splits, per_sm)
    out = F * (splits * m * n if splits > 1 else m * n)
    roof = max(flops / peak, (nbytes + out) / kt.HBM_BW)
    issue = flops / hmma_peak * instr / sp.ISSUE_PER_CLOCK if instr else 0.0
    partials = F * (splits + 1) * m * n / kt.HBM_BW if splits > 1 else 0.0
    return (roof / fill + partials) * 1e6, (max(roof, issue) / fill + partials) * 1e6, splits, fill


def gemm_rows():
    tf32 = per_hmma("gemm_kernels::gemm_mma<mma_tile::Shape<mma_tile::Tf32,2,4,2>", ",float>")
    bf16 = per_hmma("gemm_kernels::gemm_mma<mma_tile::Shape<mma_tile::Bf16,2,4,2>", ",float>")
    rungs = [  # (rung, kernel-table row, peak, HMMA rate, instructions per HMMA, {size: TFLOP/s measured})
        ("GEMM 08 split-K (FP32)", ("gemm/08_split_k.cu", "`gemm_split_k`"), kt.FP32_PEAK, None, 0.0,
         {1024: (0.997, 30.9), 4096: (0.805, 51.0)}),
        ("GEMM 09 TF32 mma", ("gemm/09_tf32_mma.cu", "`gemm_mma` tf32 128x128"), sp.TF32_PEAK, sp.TF32_PEAK, tf32,
         {1024: (0.566, 75.2), 2048: (0.314, 266), 4096: (0.228, 392)}),
        ("GEMM 10 BF16 mma", ("gemm/10_bf16_mma.cu", "`gemm_mma` bf16 128x128"), sp.BF16_PEAK, sp.BF16_PEAK, bf16,
         {1024: (0.704, 74.8), 2048: (0.500, 267), 4096: (0.380, 392)}),
    ]
    out = []
    for name, row, peak, rate, instr, sizes in rungs:
        per_sm = resident(*row)
        for size, (share, vendor) in sizes.items():
            flops, nbytes = 2.0 * size ** 3, F * 2 * size * size
            before, after, splits, fill = launch_us(size, size, size, flops, nbytes, peak, per_sm,
                                                    hmma_peak=rate, instr=instr)
            measured = flops / (share * vendor * 1e12) * 1e6
            what = f"{name}, {size}^3 ({splits} split{'s' if splits > 1 else ''}, fill {fill:.2f}" + (
                f", {instr:.1f} instr./HMMA)" if instr else ")")
            src = (f"{100 * share:.1f}% of cuBLAS {'SGEMM' if peak == kt.FP32_PEAK else 'TF32' if rate == sp.TF32_PEAK else 'BF16'}"
                   f" {vendor:g} TFLOP/s = {share * vendor:.1f}")
            out.append((what, measured, "µs", src, before, after))
    return out


def conv_rows():
    out = []
    # ResNet-18 at 96x96, stage 4 (bench_cuda_kernels --conv-set resnet18-96): N 128, C = K = 512, 3x3 at 3x3, pad 1.
    s4 = kt.conv("r96 s4", 128, 512, 3, 512, 3, 1, 1)
    # LeNet conv1 (C = 1): 1 -> 20, 3x3 at 28x28, batch 256 (the training shapes).
    l1 = kt.conv("LeNet conv1", 256, 1, 28, 20, 3, 1, 0)
    tf32 = per_hmma("conv_kernels::backward_data_warp_tiled<mma_tile::Shape<mma_tile::Tf32,2,4,2>")
    for name, s, row, peak, rate, instr, measured in (
            ("conv 05 backward-data, ResNet-96 stage 4", s4,
             ("conv/05_split_k.cu", "`backward_data_warp_tiled` 128x128"), kt.FP32_PEAK, None, 0.0, 430),
            ("conv 06 TF32 backward-data, ResNet-96 stage 4", s4,
             ("conv/06_tf32_mma.cu", "`backward_data_warp_tiled` tf32 128x128"), sp.TF32_PEAK, sp.TF32_PEAK,
             tf32, 335),
            ("conv 05 backward-data, LeNet conv1 (C = 1)", l1,
             ("conv/05_split_k.cu", "`backward_data_warp_tiled` 64x128"), kt.FP32_PEAK, None, 0.0, 444)):
        _, m, n, k, nbytes = kt.conv_gemms(s)[1]
        # The FLOPs the implicit GEMM executes (step_time.py's): its reduction
        # in whole k-steps, the zero taps of an unpadded conv's border included.
        step = sl.K_STEP["tf32" if rate else "fp32"]
        executed = 2.0 * m * n * -(-k // step) * step
        bm = 64 if m <= 64 else 128
        before, after, splits, fill = launch_us(m, n, k, executed, nbytes - F * m * n, peak,
                                                resident(*row), bm=bm, hmma_peak=rate, instr=instr)
        what = f"{name} ({m} x {n} x {k}, {splits} split{'s' if splits > 1 else ''}, fill {fill:.2f}" + (
            f", {instr:.1f} instr./HMMA)" if instr else ")")
        rung = name.split()[1]
        out.append((what, measured, "µs", f"v{int(rung)} {measured / 1000:.3f} ms", before, after))
    return out


def step_rows():
    out = []
    for label, model, batch, precision, seconds, note in (
            ("ResNet-18 step, batch 256, FP32", "resnet18", 256, "ieee", 10.99, "10.99 s/epoch, seed recipe"),
            ("ResNet-18 step, batch 256, TF32 convolutions", "resnet18", 256, "tf32", 8.94,
             "8.94 s/epoch, seed recipe, `--part 4` (FP32 matmuls; the model's TF32 step also puts the "
             "linear layer on GEMM 11)"),
            ("ResNet-18 step, batch 128, TF32", "resnet18", 128, "tf32", 9.66,
             "9.66 s/epoch, `--recipe best` (momentum and weight decay; the model's is plain SGD)"),
            ("LeNet step, batch 256, FP32", "lenet", 256, "ieee", 0.336, "0.336 s/epoch, seed recipe, 10 epochs")):
        preds = []
        for issue in (False, True):
            a = argparse.Namespace(amp="off", fp32_precision=precision, docs=True, tc_efficiency=1.0,
                                   launch_us=4.0, issue_bound=issue)
            p = sp.predict(model, batch, a)
            preds.append(p["totals"]["shipped"]["floored"] * 1e3)
        steps = STEPS_PER_EPOCH[batch]
        out.append((label, seconds / steps * 1e3, "ms", f"{note} / {steps} steps", *preds))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true",
                    help="exit 1 unless docs/step-model.md holds this table as printed")
    a = ap.parse_args()
    lines = table()
    print("\n".join(lines))
    if a.check and "\n".join(lines) not in (sp.ROOT / "docs" / "step-model.md").read_text():
        sys.exit("calibrate: docs/step-model.md's calibration table is not what the model gives; "
                 "paste python3 tools/predict/calibrate.py's table into it")


def table():
    out = ["| what the H200 measured | measured | from docs/results.md, \"GPU runs\" | predicted, no issue bound "
           "| with it | measured / predicted, no issue bound | with it |", "|---|---|---|---|---|---|---|"]
    for what, measured, unit, src, before, after in gemm_rows() + conv_rows() + step_rows():
        fmt = "{:.1f}" if unit == "µs" else "{:.2f}"
        out.append(f"| {what} | {fmt.format(measured)} {unit} | {src} | {fmt.format(before)} {unit} | "
                   f"{fmt.format(after)} {unit} | {measured / before:.2f} | {measured / after:.2f} |")
    return out


if __name__ == "__main__":
    main()
