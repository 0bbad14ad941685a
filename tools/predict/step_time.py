#!/usr/bin/env python3
"""Predicted time of one training step on one H100 with two kernel
configurations, from the layer shapes and the launch audits: the shipped
kernels (split-K conv 5 and GEMM 8, the split channel_sum and BatchNorm
rung 2) and a baseline of the ladders' lower rungs (conv 3, GEMM 4, one
block per channel for bias gradients and BatchNorm rung 1).

    tools/predict/step_time.py                              # LeNet, ResNet-18 at 256, 128
    tools/predict/step_time.py --model lenet --batch 128    # one step
    tools/predict/step_time.py --docs --write               # rewrite docs/generated/step-time.md
    tools/predict/step_time.py --launch-us 2                # another per-launch floor
    tools/predict/step_time.py --fp32-precision tf32        # FP32 kernels -> the TF32 rungs
    tools/predict/step_time.py --fp32-precision tf32 --tc-efficiency 0.5
    tools/predict/step_time.py --amp bf16                   # TF32 -> bfloat16 autocast
    tools/predict/step_time.py --amp bf16 --conv-bf16-rung 8   # bfloat16: conv rung 07 -> 08
    tools/predict/step_time.py --fp32-precision tf32 --conv-tf32-rung 9   # TF32: conv rung 06 -> 09
    tools/predict/step_time.py --fp32-precision tf32 --no-issue-bound   # the roofline alone

With --fp32-precision tf32 the two configurations are the shipped FP32
kernels and the same step with conv 06 and GEMM 11 (the TF32 rungs, which
keep conv 05's and GEMM 08's tiles and split plans; their audit is
docs/generated/launch-audit-tf32.md); their launches' FLOPs go at the dense
TF32 peak times --tc-efficiency. GEMM 11 (and GEMM 12 under autocast) first
copies an operand that is not 16-byte aligned (the classifier's dy) to an
aligned one, a copy_rows launch each (kernels/cuda/gemm/aligned_copy.h).

With --amp bf16 the two configurations are that TF32 step (PyTorch's
default for float32 convolutions) and the step under bfloat16 autocast
(train_step --amp bf16, docs/mixed-precision.md; its audit is
docs/generated/launch-audit-bf16.md). What it launches: step_launches.py.

With --amp bf16 --conv-bf16-rung 8 the two configurations are that
bfloat16 step on conv rung 07 (ANVIL_CONV_BF16_RUNG=7) and the same step
with every BF16 convolution on conv rung 08, the shipped rung (its audit
is docs/generated/launch-audit-bf16-rung8.md; what it launches:
step_launches.py's conv_multistage(), kernels/cuda/conv/
08_bf16_multistage.cu). With --fp32-precision tf32 --conv-tf32-rung 9 they
are the TF32 step on conv rung 06 (ANVIL_CONV_TF32_RUNG=6) and on conv
rung 09, the shipped one (docs/generated/launch-audit-tf32-rung9.md,
09_tf32_multistage.cu). The reports add a table by part of the step: each
conv direction, the multistage rungs' layout conversions, the
convolutions' split-K sums and the rest (also in the plain --amp bf16
pages).

The model, and every assumption in it:

- The step is the seed recipe's (bench/train_step.cpp, what the audit ran):
  forward, cross-entropy loss, backward, plain SGD. Its launches are
  enumerated in step_launches.py from the layer shapes of
  tools/predict/kernel_table.py's layers(batch) (LeNet's convs and linear
  layers, ResNet-18's convs; the ResNet's 512 -> 10 classifier and the
  network's wiring, from nn/models.cpp and nn/layers.cpp, are added
  there), each launch named as the audit names its kernel. The first conv's backward-data is not launched (the images
  need no gradient). The baseline runs the same work as other kernels; each
  baseline launch is put on the row of the shipped kernel that does its
  work (the "mapping" lines say which), so rows are the shipped audit's
  kernel names; a row with no baseline launches is work only the shipped
  kernels do (the split-K sums, the folds of the split reductions).
- FLOPs, executed and useful. Useful: 2 x the multiply-adds of each conv
  direction and linear GEMM, as the kernel table's shape rows
  (kernel_table.py's shape_table) count them. Executed, what the roofline
  and the issue bound take: a conv direction's implicit GEMM as its
  kernel runs it, M x N x the reduction in whole k-steps (K_STEP: 8 for
  conv 05 and 06, 16 for conv 07 and the baseline's conv 3; conv 08 32
  channels a tap), so a strided or unpadded backward-data on conv 03-07
  (the GEMM {C, N*H*W, K*R*S}) runs its zero taps (up to 4x the useful
  FLOPs at stride 2), and a C = 1 layer its padded channels; conv 08's
  backward-data runs only each residue class's taps, its backward-weight
  R*S*Cp rows. Tile edges past M and N are left out (both rungs). The
  linear GEMMs' executed FLOPs are their useful ones. Elementwise, pooling,
  normalisation, reduction and SGD kernels count bytes only: their few FLOPs
  per float are far below the ridge of 20 FLOP/byte.
- Bytes: the minimum HBM traffic of each launch, every tensor it reads or
  writes moved once (nothing from L2, no re-reads: BatchNorm rung 1's
  three passes over x count as one). A split GEMM writes its partials
  (splits x M x N floats) instead of its output; add_partials reads them
  and writes the output. Split reductions write and fold 1-3 floats a block.
  The splits are the kernels' own plans: kernel_table.split_k (split_k.h,
  conv 5's tiles at 3 or 2 blocks per SM, GEMM 8's at 2) and split_count
  (step_launches.py, channel_split.cuh); the checks compare the resulting
  blocks.
- Roofline of a launch: max(FLOPs / 66.9 TFLOP/s, bytes / 3.35 TB/s), the
  H100 SXM5 datasheet's FP32 (no tensor cores) and HBM3 figures
  (kernel_table.py's FP32_PEAK, HBM_BW).
- Issue bound of a tensor-core launch (conv 06-09, GEMM 11/12): an SM
  issues 4 warp instructions a clock and its tensor cores finish about one
  HMMA a clock at the dense peak, so a launch whose kernel's main loop
  issues I instructions per HMMA takes at least its executed FLOPs /
  dense peak x I / 4.
  I is the main loop's static count from the SASS (kernel_table.py's
  loop_hmma, stored in docs/kernel-resources.json's "main_loop"), the most
  over the kernel's instantiations; its time is max(roofline, issue bound).
  --no-issue-bound leaves it out (the pages as they were before it).
- Predicted time of a launch: max(roofline, issue bound) / predicted_sm_utilisation of its
  kernel in the audit (sim/launch_audit.cpp; shipped: build/launch-audit/
  MODEL-BATCH.jsonl, read at run time, else docs/generated/launch-audit.md;
  baseline: docs/generated/launch-audit-baseline.md). Utilisation only stretches the
  roofline: it is the share of the GPU's block slots a launch keeps busy, so
  a fully used GPU is assumed to run at the roofline (or the issue bound).
  Beyond the issue bound nothing here models how close a kernel comes to
  peak inside an SM (latency, stalls; step_model.py assumes 35% of FP32
  peak), so these are lower bounds on a GPU's time. A kernel's figure
  (the time-weighted mean over its launches) is applied to each of its
  launches.
- Per-launch floor: no launch takes less than --launch-us (default 4 us, the
  figure of tools/predict/step_model.py and docs/parallel.md, "CUDA's ~3-5 us" per
  launch when a step is launch-bound; an assumption, not a measurement).
  Totals are printed with and without it; the step
  time and images/s are the floored sum: launches run one after another on
  one stream, nothing overlaps.
- Checks: the model's launch count (and blocks, where the model knows the
  grid) of every kernel against the audit's; the step's GEMM FLOPs against
  3 x step_model.py's forward FLOPs (the useful ones).

The code: step_launches.py lists a step's launches, step_predict.py reads
the audits and predicts each launch (and checks the model against them),
step_report.py writes the tables and the generated pages; this file is
the command line. Standard library only.
"""
import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from step_predict import predict  # noqa: E402
from step_report import render, write_page  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=["lenet", "resnet18"])
    ap.add_argument("--batch", type=int, choices=[128, 256])
    ap.add_argument("--launch-us", type=float, default=4.0, help="per-launch floor (µs), default 4")
    ap.add_argument("--fp32-precision", choices=["ieee", "tf32"], default="ieee",
                    help="tf32: the shipped FP32 kernels against the same step with the TF32 rungs "
                         "(docs/generated/launch-audit-tf32.md) in place of the baseline")
    ap.add_argument("--amp", choices=["off", "bf16"], default="off",
                    help="bf16: the TF32 step (docs/generated/launch-audit-tf32.md) against the same step "
                         "under bfloat16 autocast (docs/generated/launch-audit-bf16.md)")
    ap.add_argument("--conv-bf16-rung", type=int, choices=[7, 8], default=7,
                    help="with --amp bf16: 8 compares the bfloat16 step on conv rung 07 "
                         "(docs/generated/launch-audit-bf16.md) with the same step on conv rung 08, the "
                         "shipped one (docs/generated/launch-audit-bf16-rung8.md)")
    ap.add_argument("--conv-tf32-rung", type=int, choices=[6, 9], default=6,
                    help="with --fp32-precision tf32: 9 compares the TF32 step on conv rung 06 "
                         "(docs/generated/launch-audit-tf32.md) with the same step on conv rung 09, the "
                         "shipped one (docs/generated/launch-audit-tf32-rung9.md)")
    ap.add_argument("--tc-efficiency", type=float, default=1.0,
                    help="with tf32 or bf16: the share of the tensor cores' peak the TF32 rungs reach "
                         "inside a full SM (default 1: a lower bound)")
    ap.add_argument("--no-issue-bound", dest="issue_bound", action="store_false",
                    help="leave out the issue bound (a tensor-core launch's main-loop instructions per "
                         "HMMA / 4 a clock): the roofline and utilisation alone, as before it")
    ap.add_argument("--markdown", action="store_true",
                    help="print what goes into docs/generated/step-time.md (kernels under 1%% folded)")
    ap.add_argument("--write", action="store_true",
                    help="with --docs: rewrite docs/generated/step-time.md (all four steps, as --markdown)")
    ap.add_argument("--docs", action="store_true",
                    help="shipped: docs/generated/launch-audit.md even where build/launch-audit has files")
    ap.add_argument("--check", action="store_true",
                    help="exit 1 unless the model's launches and blocks agree with the audits "
                         "(a test: a kernel change the model does not know of fails it), and, "
                         "with --docs, unless docs/generated/step-time.md is what they give")
    a = ap.parse_args()
    if a.conv_bf16_rung == 8 and a.amp != "bf16":
        ap.error("--conv-bf16-rung 8 needs --amp bf16 (the BF16 convolutions)")
    if a.conv_tf32_rung == 9 and (a.fp32_precision != "tf32" or a.amp == "bf16"):
        ap.error("--conv-tf32-rung 9 needs --fp32-precision tf32 without --amp (the TF32 convolutions)")
    runs = [(m, b) for m in ("lenet", "resnet18") for b in (256, 128)
            if (a.model in (None, m)) and (a.batch in (None, b))]
    if a.write and (a.model or a.batch or not a.docs or not a.issue_bound):
        ap.error("--write writes all four steps from the docs' tables: --docs, no --model, --batch "
                 "or --no-issue-bound")
    page = a.write or (a.check and a.docs and not (a.model or a.batch) and a.issue_bound)
    a.markdown = a.markdown or a.write
    preds = [predict(m, b, a) for m, b in runs]
    render(preds, a)
    if page:  # docs/generated/step-time.md: all four steps as --markdown prints them
        write_page(preds, a)
    failed = [f"{p['model']} {p['batch']}" for p in preds if p["checks"]]
    if a.check and failed:
        sys.exit(f"step_time: the model disagrees with the launch audit for {', '.join(failed)} "
                 f"(the checks above); update tools/predict/step_launches.py or rerun the audits")


if __name__ == "__main__":
    main()
