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
    tools/predict/step_time.py --fp32-precision tf32 --no-issue-bound   # the roofline alone

With --fp32-precision tf32 the two configurations are the shipped FP32
kernels and the same step with conv 06 and GEMM 11 (the TF32 rungs, which
keep conv 05's and GEMM 08's tiles and split plans; their audit is
docs/generated/launch-audit-tf32.md); their launches' FLOPs go at the dense
TF32 peak times --tc-efficiency.

With --amp bf16 the two configurations are that TF32 step (PyTorch's
default for float32 convolutions) and the step under bfloat16 autocast
(train_step --amp bf16, docs/mixed-precision.md; its audit is
docs/generated/launch-audit-bf16.md). Its launches, as the op layer and the
CUDA backend issue them (core/ops_nn.cpp, core/ops.cpp, core/autocast.cpp,
kernels/cuda/conv/conv.cpp, kernels/cuda/gemm/gemm.cpp):
- convolutions on conv rung 07 and linear layers on GEMM rung 10 (BF16
  mma.sync m16n8k16), with conv 05's / GEMM 08's tiles and split plans,
  reading bfloat16 operands (2 bytes an element; a bias, float32, 4) and
  storing forward y and backward dx as bfloat16 (2 bytes) from their
  epilogues, the bias added in FP32 first (a linear layer's too: no
  add_channel_bias_kernel), or float32 split-K partials that add_partials
  sums into bfloat16; weight gradients stay float32; their FLOPs go at the
  dense BF16 peak (989.4 TFLOP/s, half the datasheet's 1979 with sparsity)
  times --tc-efficiency;
- the bias gradients (channel_sum_split, column_sum_rows) read dy as
  bfloat16 (2 bytes an element), FP32 sums;
- the conversions the op layer stages (float_to_bf16_kernel: 4 bytes read,
  2 written an element; bf16_to_float_kernel: 2 read, 4 written): the
  images cast to bfloat16 before the first conv; in ResNet-18, the linear
  layer casts its float32 input to bfloat16 and the input's bfloat16
  gradient to float32;
- ResNet-18's global_avg_pool2d reads its bfloat16 input into a float32
  output (avg_pool_forward_bf16_to_float_kernel) and writes its gradient as
  bfloat16 from the float32 one (avg_pool_backward_float_to_bf16_kernel);
- cross-entropy reads the bfloat16 logits (forward_warp_per_row_bf16: 2
  bytes an element; its softmax and loss float32) and writes dlogits as
  bfloat16 (backward_bf16_kernel), as the trainer's count_correct reads them;
- relu, add, avg pooling (LeNet's) and BatchNorm read and write bfloat16
  (2 bytes an element; BatchNorm's statistics and parameters float32);
- SGD also writes the bfloat16 copy of each conv and linear weight (2 more
  bytes an element; biases and BatchNorm's parameters have none);
- the first step casts each conv and linear weight to bfloat16 once (the
  cast cache, core/autocast.h): a one-step audit has those launches, so the
  model has them too; the report prints what they cost, and the steady
  state is the step without them.
Everything else is the TF32 step's, on the same rows; a row is named by the
FP32 kernel (as in the tf32 mode) or by the float32 kernel whose bfloat16
instantiation runs.

With --amp bf16 --conv-bf16-rung 8 the two configurations are that
bfloat16 step on conv rung 07 and the same step with every BF16
convolution on conv rung 08, as ANVIL_CONV_BF16_RUNG=8 runs it (its audit
is docs/generated/launch-audit-bf16-rung8.md; conv_rung8() below,
kernels/cuda/conv/08_bf16_multistage.cu): per layer
- forward: to_channels_last of x (NCHW -> NHWC bfloat16, C padded to
  Cp = up8(C)) and of w (KCRS -> KRSC), then forward_nhwc on 256 x 64
  tiles (multistage::Shape<4,1,4,2>) for K <= 64, else 128 x 128
  (Shape<2,2,4,2>), grid ceil(N*P*Q / BM) x ceil(K / BN), never split;
- backward-data: a cudaMemsetAsync of dx where a residue class of the
  stride has no tap (not a kernel: the audit has no row for it; the model
  counts its bytes and the floor), to_channels_last of dy (K padded to
  Kp), then per class with taps flipped_to_channels_last of its taps and
  forward_nhwc (tiles by C), over the class's pixels of dx;
- backward-weight: to_channels_last of x and of dy, backward_weight_nhwc
  (tiles by K) on the GEMM of R*S*Cp rows by K columns over N*P*Q, split
  by split_k.h's plan at 2 blocks an SM with chunks rounded up to 32,
  then add_partials over K*C*R*S where split.
Every operand is read and written as bfloat16 (2 bytes; the bias and dw's
partials float32). The report adds a table by part of the step: each conv
direction, rung 08's layout conversions, the convolutions' split-K sums
and the rest (also in the plain --amp bf16 pages).

The model, and every assumption in it:

- The step is the seed recipe's (bench/train_step.cpp, what the audit ran):
  forward, cross-entropy loss, backward, plain SGD. Its launches are
  enumerated here from the layer shapes of tools/predict/kernel_table.py's
  layers(batch) (LeNet's convs and linear layers, ResNet-18's convs; the
  ResNet's 512 -> 10 classifier and the network's wiring, from nn/models.cpp
  and nn/layers.cpp, are added here), each launch named as the audit names
  its kernel. The first conv's backward-data is not launched (the images
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
  below (channel_split.cuh); the checks compare the resulting blocks.
- Roofline of a launch: max(FLOPs / 66.9 TFLOP/s, bytes / 3.35 TB/s), the
  H100 SXM5 datasheet's FP32 (no tensor cores) and HBM3 figures
  (kernel_table.py's FP32_PEAK, HBM_BW).
- Issue bound of a tensor-core launch (conv 06/07/08, GEMM 10/11): an SM
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
  3 x step_model.py's forward FLOPs (the useful ones). Standard library only.
"""
import argparse
import math
import contextlib
import io
import json
import re
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import kernel_table as kt  # noqa: E402
import launch_audit as la  # noqa: E402
import step_model as sm  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
GENERATED = ROOT / "docs" / "generated"
F = 4  # bytes per float
# H100 SXM5's dense TF32 tensor-core peak (its datasheet: 989.4 TFLOP/s with
# sparsity, half of it dense); --tc-efficiency scales it.
TF32_PEAK = 494.7e12
# H100 SXM5's dense BF16 tensor-core peak (the datasheet's 1979 TFLOP/s with
# sparsity, half of it dense); --tc-efficiency scales it.
BF16_PEAK = 989.4e12
# An SM issues 4 warp instructions a clock (one per scheduler), and its
# tensor cores finish about one HMMA a clock at the dense peaks above (one
# m16n8k8 TF32 or m16n8k16 BF16: 132 SMs x 1.83 GHz x 2048 or 4096 FLOPs).
# A tensor-core kernel whose main loop issues I instructions per HMMA can
# therefore reach at most peak x min(1, 4 / I): the issue bound.
ISSUE_PER_CLOCK = 4
RESOURCES = ROOT / "docs" / "kernel-resources.json"
RESOURCES_NAME = "docs/kernel-resources.json"
ERAS = {"ieee": ("baseline", "shipped"), "tf32": ("FP32", "TF32"), "bf16": ("TF32", "BF16"),
        "bf16-rung8": ("conv 07", "conv 08")}  # the columns' names
BF16 = "anvil::bfloat16"
CLASSES = 10
GEMM, CONV, RED, BN, EW, POOL, SOFT = ("gemm_kernels::", "conv_kernels::", "reduce_kernels::",
                                       "batch_norm_kernels::", "elementwise_kernels::",
                                       "pool_kernels::", "softmax_kernels::")
SGD = "sgd_kernels::sgd_kernel<(sgd_kernels::Mode)0,false>"
# How the shipped kernel differs from the baseline's, by a substring of its name (the first that matches).
WHY = [("warp_tiled", "conv 3's 64x64 implicit GEMM, unsplit -> conv 5 (conv 4's warp tiles, 64x128 up to "
                      "64 rows, else 128x128; split over grid.z where the tiles fill less than a wave)"),
       ("gemm_split_k", "GEMM 4 (64x64, register-blocked) -> GEMM 8 (128x128, split-K)"),
       ("add_partials", "new: the fixed-order sum of a split launch's partials (one warp per output "
                        "from 32 splits); unsplit, the GEMM kept its sums in registers"),
       ("fold", "new: merges a split reduction's per-block records, one warp per channel"),
       ("channel_sum_split", "one block per channel (conv dbias: bias_grad) -> C x S slices"),
       ("column_sum_rows", "one block per channel (linear bias: channel_sum_kernel, a column of dy "
                           "read one float per row) -> coalesced column sums over row slices"),
       ("_split", "BatchNorm 1: one block per channel, one kernel a direction (its whole cost on the "
                  "stats / sums row) -> rung 2: C x S slices, stats|sums, fold, normalise|dx")]


def norm(name):
    """An audit kernel name as a key: tiles as 64x128, no spaces."""
    return la.short_name(name).replace(" ", "")


def resource_key(demangled):
    """kernel-resources.json's demangled name as the model's key: no return
    type, no parameter list, no anvil::cuda:: qualifiers."""
    name, depth = demangled.removeprefix("void "), 0
    for i, ch in enumerate(name):
        depth += {"<": 1, ">": -1}.get(ch, 0)
        if ch == "(" and depth == 0:
            name = name[:i]
            break
    return norm(name.replace("anvil::cuda::", ""))


def main_loops(path=None):
    """kernel key -> the most instructions per HMMA in the main loop of any
    of its instantiations (kernel_table.py's loop_hmma, from the SASS), for
    the kernels that have one."""
    out = {}
    for k in json.loads((path or RESOURCES).read_text())["kernels"].values():
        if "main_loop" in k:
            key, loop = resource_key(k["name"]), k["main_loop"]
            out[key] = max(out.get(key, 0.0), loop["instructions"] / loop["hmma"])
    return out


def show(key):
    return key.split("::", 1)[-1].replace("<(sgd_kernels::Mode)0,false>", "<plain>")


# The TF32 rungs' kernels (conv 06, GEMM 11) by the FP32 kernel whose tiles
# and split plans they keep: mma_tile::Shape<Tf32, 1, 4, 3> is conv 05's
# 64x128 tile (128 threads), Shape<Tf32, 2, 4, 2> the 128x128 one (256
# threads); GEMM 11's mma_ldmatrix::ShapeOf<multistage::Tf32, 2, 2, 4, 2>
# is GEMM 08's 128x128 (in 128 threads) with its 2 blocks per SM in the
# split plan.
TF32_TILES = {"64x128": "mma_tile::Shape<mma_tile::Tf32,1,4,3>",
              "128x128": "mma_tile::Shape<mma_tile::Tf32,2,4,2>"}
TF32_GEMM = "mma_ldmatrix::ShapeOf<multistage::Tf32,2,2,4,2>"


# The BF16 rungs' kernels (conv 07, GEMM 10): conv 05's tiles as
# mma_tile::Shape<Bf16, ...>, GEMM 08's 128x128 as Shape<Bf16, 2, 4, 2>.
BF16_TILES = {"64x128": "mma_tile::Shape<mma_tile::Bf16,1,4,3>",
              "128x128": "mma_tile::Shape<mma_tile::Bf16,2,4,2>"}


def instance(kernel, math):
    """The kernel that runs an FP32 kernel's work (named by its family, as
    the model does: conv tiles as 64x128, no element type) in math "fp32",
    "tf32" (conv 06, GEMM 11) or "bf16" (conv 07, GEMM 10, and the other
    kernels' bfloat16 instances under autocast): its name in that audit.
    The kernels templated on their element type take it as the last
    parameter; only the conv and GEMM rungs change with tf32."""
    elem = BF16 if math == "bf16" else "float"
    m = re.match(r"(conv_kernels::\w+_warp_tiled)<(\d+x\d+)>$", kernel)
    if m:
        tile = {"fp32": m.group(2), "tf32": TF32_TILES[m.group(2)], "bf16": BF16_TILES[m.group(2)]}[math]
        return f"{m.group(1)}<{tile},{elem}>"
    m = re.match(r"gemm_kernels::gemm_split_k<(\w+),(\w+)>$", kernel)
    if m:
        if math == "fp32":
            return kernel
        shape = TF32_GEMM if math == "tf32" else BF16_TILES["128x128"]
        return f"gemm_kernels::gemm_mma<{shape},{m.group(1)},{m.group(2)},{elem}>"
    if math == "tf32":
        raise ValueError(f"step_time: no TF32 rung for {kernel}")
    m = re.match(r"(.*_split<\d,int)>$", kernel)  # BatchNorm's passes
    if m:
        return f"{m.group(1)},{elem}>"
    if kernel.endswith("<int>"):  # pooling
        return kernel[:-1] + f",{elem}>"
    if "<" not in kernel:  # relu, add, BatchNorm's forward fold, count_correct, scale
        return f"{kernel}<{elem}>"
    raise ValueError(f"step_time: no {math} instance of {kernel}")


class Step:
    """The launches of one step, per era ("baseline", "shipped"). With tf32,
    the eras are the shipped FP32 kernels ("baseline") and the same step with
    the TF32 rungs in the convolutions and GEMMs ("shipped"): everything
    else launches the shipped kernels in both."""

    def __init__(self, tf32=False, amp=False, rung8=False):
        self.launches = {"baseline": [], "shipped": []}
        self.tf32, self.amp, self.rung8 = tf32, amp, rung8 and amp
        self.e = 2 if amp else F  # bytes per activation element
        self.first_step = []  # with amp: the weight casts of the first step
        self.part = "rest"  # the part of the step (PARTS) the launches being added belong to

    def launch(self, kernel, row, flops, nbytes, blocks, tensor_cores=False, useful=None, part=None,
               audited=True):
        """A launch's record. flops: what it executes (zero taps, k-steps
        padded); useful: the multiply-adds the result needs (default the
        same); audited: False for a launch the audit has no row for (a
        cudaMemsetAsync)."""
        return dict(kernel=kernel, row=row, flops=flops, useful=flops if useful is None else useful,
                    bytes=nbytes, blocks=blocks, tensor_cores=tensor_cores, part=part or self.part,
                    audited=audited)

    def add(self, era, kernel, flops, nbytes, row=None, blocks=None, part=None):
        if self.amp:  # one configuration: the bfloat16 step, in "shipped"
            if era == "baseline":
                return
            era = "shipped"
        if self.tf32:  # the FP32 baseline's kernels are out; shipped ones run in both eras
            if era == "baseline":
                return
            era = "both" if era == "shipped" else era
        for e in (("baseline", "shipped") if era == "both" else (era,)):
            # The frozen baseline audit names the kernels that both eras
            # launch by their family, from before they took an element type.
            name = row or kernel if era == "both" and e == "baseline" and not self.tf32 else kernel
            self.launches[e].append(self.launch(name, row or kernel, flops, nbytes, blocks, part=part))

    def native(self, kernel):
        """The kernel of a float32 kernel's work: its float32 instance, or
        its bfloat16 one under amp."""
        return instance(kernel, "bf16" if self.amp else "fp32")

    def convert(self, n, to_bf16, first_step=False):
        """An elementwise float32 <-> bfloat16 conversion of n elements (amp only)."""
        if not self.amp:
            return
        kernel = EW + ("float_to_bf16_kernel" if to_bf16 else "bf16_to_float_kernel")
        self.add("shipped", kernel, 0, (F + 2) * n, blocks=min(math.ceil(n / 256), 2048))
        if first_step:
            self.first_step.append(self.launches["shipped"][-1])

    def gemm(self, kernel, before, m, n, k, flops, read, narrow=False, out=F, implicit=False):
        """A shipped GEMM (conv 5 or GEMM 8) of an m x n result over k, its split-K
        sum, and the baseline launch (GEMM 4 / conv 3: 64x64 tiles, unsplit).
        out: bytes per element of the result (amp: 2 for a bfloat16 y or dx,
        stored by the epilogue, or by add_partials from float32 partials).
        implicit: a convolution's implicit GEMM, whose executed FLOPs are
        2 m n k with k rounded up to the kernel's k-step (K_STEP), zero taps
        included; flops are the useful ones."""
        def executed(math):
            return 2.0 * m * n * -(-k // K_STEP[math]) * K_STEP[math] if implicit else flops
        bm, per_sm = (64, 3) if narrow else (128, 2)
        tiles = kt.tiles(m, n, bm, 128)
        splits = kt.split_k(m, n, k, tiles, per_sm)[0]
        nbytes = read + (F * splits * m * n if splits > 1 else out * m * n)
        blocks = tiles * splits
        if self.amp:  # the BF16 rungs: conv 05's and GEMM 08's tiles and split plans
            self.launches["shipped"].append(self.launch(instance(kernel, "bf16"), kernel, executed("bf16"),
                                                        nbytes, blocks, "bf16", useful=flops))
        elif self.tf32:  # the TF32 rungs: the FP32 rungs' tiles, split plans and sums
            self.launches["baseline"].append(self.launch(self.native(kernel), kernel, executed("fp32"), nbytes,
                                                         blocks, useful=flops))
            self.launches["shipped"].append(self.launch(instance(kernel, "tf32"), kernel, executed("tf32"),
                                                        nbytes, blocks, True, useful=flops))
        else:
            self.launches["shipped"].append(self.launch(self.native(kernel), kernel, executed("fp32"), nbytes,
                                                        blocks, useful=flops))
        if splits > 1:
            self.split_sum(splits, m * n, out)
        if not (self.amp or self.tf32):
            self.launches["baseline"].append(self.launch(before, kernel, executed("conv3"), read + F * m * n,
                                                         kt.tiles(m, n, 64, 64), useful=flops))

    def split_sum(self, splits, n, out):
        """split_k::sum_split_k of n outputs (out bytes each) from float32 partials."""
        warp = splits >= 32
        self.add("shipped", GEMM + ("add_partials_by_warp" if warp else "add_partials"), 0,
                 F * splits * n + out * n, blocks=math.ceil(n * (32 if warp else 1) / 256),
                 part="split sums" if self.part != "rest" else "rest")

    def channel_sum(self, outer, c, inner, before):
        if inner == 1:  # a linear layer's bias: column sums over row slices (reduce.cu)
            s = column_slices(c, outer)
            split, blocks = RED + "column_sum_rows", math.ceil(c / 256) * s
        else:
            v, s = (4 if inner % 4 == 0 else 1), split_count(c, outer * inner)
            split, blocks = f"{RED}channel_sum_split<{v},int>", c * s
        # amp: dy read as bfloat16 (the same kernel's overload), FP32 partials
        self.add("shipped", split, 0, self.e * outer * c * inner + F * c * s, blocks=blocks)
        self.add("shipped", RED + "channel_sum_fold", 0, F * (c * s + c), blocks=math.ceil(c / 8))
        self.add("baseline", before, 0, F * (outer * c * inner + c), row=split, blocks=c)

    def batch_norm(self, n, c, hw):
        v, s, x = (4 if hw % 4 == 0 else 1), split_count(c, n * hw), n * c * hw
        e = self.e  # x, y, dy, dx: bfloat16 under amp; statistics and parameters float32
        for d, passes, before, fold_c, split_bytes in (
                ("forward", ("stats", "normalize"), "forward_train_kernel", 8, (x, 2 * x + 4 * c)),
                ("backward", ("sums", "dx"), "backward_train_kernel", 4, (2 * x, 3 * x + 4 * c))):
            first = f"{BN}{d}_{passes[0]}_split<{v},int>"
            second = f"{BN}{d}_{passes[1]}_split<{v},int>"
            fold = f"{BN}{d}_fold"
            if self.amp:
                xs = split_bytes[0] // x, (split_bytes[1] - 4 * c) // x
                for kernel, nbytes, blocks in ((first, e * xs[0] * x + F * 3 * c * s, c * s),
                                               (fold, F * (3 * c * s + fold_c * c), math.ceil(c / 8)),
                                               (second, e * xs[1] * x + F * 4 * c, c * s)):
                    native = self.native(kernel) if kernel != f"{BN}backward_fold" else kernel
                    self.add("shipped", native, 0, nbytes, row=kernel, blocks=blocks)
                continue
            self.add("shipped", self.native(first), 0, F * (split_bytes[0] + 3 * c * s), row=first,
                     blocks=c * s)
            self.add("shipped", self.native(fold) if d == "forward" else fold, 0,
                     F * (3 * c * s + fold_c * c), row=fold, blocks=math.ceil(c / 8))
            self.add("shipped", self.native(second), 0, F * split_bytes[1], row=second, blocks=c * s)
            self.add("baseline", BN + before, 0, F * (split_bytes[1] + 2 * c), row=first, blocks=c)
        self.add("both", EW + "add_scalar_kernel", 0, 16)  # num_batches_tracked += 1


def split_count(c, m):
    """kernels/cuda/channel_split.cuh's split_count: slices per channel."""
    s = min(1056 // c, -(-m // 512))
    return max(s, -(-m // (1 << 24)), 1)


def column_slices(c, outer):
    """kernels/cuda/reduce.cu's column_slices: row slices of >= 8 rows, a wave of blocks."""
    return max(1, min(1056 // -(-c // 256), -(-outer // 8)))


def conv(step, s, need_dx=True):
    useful = 2.0 * s["N"] * s["K"] * s["P"] ** 2 * s["C"] * s["R"] ** 2
    sizes = {"fwd": s["N"] * s["K"] * s["P"] ** 2, "bwdD": s["N"] * s["C"] * s["H"] ** 2,
             "bwdW": s["K"] * s["C"] * s["R"] ** 2}  # each direction's output
    if not need_dx:  # amp: the images, cast to bfloat16 for the first conv
        step.convert(s["N"] * s["C"] * s["H"] ** 2, True)
    step.convert(s["K"] * s["C"] * s["R"] ** 2, True, first_step=True)  # amp: the weight's copy
    if step.rung8:
        conv_rung8(step, s, need_dx)
    for d, m, n, k, nbytes in [] if step.rung8 else kt.conv_gemms(s):
        if d == "bwdD" and not need_dx:
            continue
        step.part = PART_OF[d]
        base = {"fwd": "forward", "bwdD": "backward_data", "bwdW": "backward_weight"}[d]
        tile = "64x128" if m <= 64 else "128x128"
        read = nbytes - F * sizes[d]
        if step.amp:  # bfloat16 operands
            read = read // F * 2
        read += F * s["K"] if d == "fwd" else 0  # + the bias
        out = step.e if d != "bwdW" else F  # amp: y and dx bfloat16 from the epilogue; dw float32
        step.gemm(f"{CONV}{base}_warp_tiled<{tile}>", f"{CONV}{base}_implicit", m, n, k, useful, read,
                  narrow=m <= 64, out=out, implicit=True)
    step.part = "rest"
    step.channel_sum(s["N"], s["K"], s["P"] ** 2, CONV + "bias_grad")  # dbias


def up(v, multiple):
    return -(-v // multiple) * multiple


def dgrad_classes(s):
    """08_bf16_multistage.cu's dgrad_classes: (rows, cols, T, U) of each
    residue class (a, b) of the stride (square shapes: both axes alike)."""
    st, out = s["stride"], []
    axis = []
    for a in range(min(st, s["H"])):
        r0 = (a + s["pad"]) % st
        taps = -(-(s["R"] - r0) // st) if r0 < s["R"] else 0
        axis.append((-(-(s["H"] - a) // st), taps))
    for rows, t in axis:
        for cols, u in axis:
            out.append((rows, cols, t, u))
    return out


def conv_rung8(step, s, need_dx):
    """Conv rung 08's launches for one layer (kernels/cuda/conv/
    08_bf16_multistage.cu), amp only: every operand bfloat16, converted to
    channels-last (to_channels_last: NCHW -> NHWC, channels padded to a
    multiple of 8) before each direction's GEMM on the multistage mainloop:
    256 x 64 tiles ("Narrow", multistage::Shape<4,1,4,2>) where the GEMM's
    columns are <= 64, else 128 x 128 ("Wide", Shape<2,2,4,2>); 128
    threads, 2 blocks an SM. Executed FLOPs: the reduction as the main loop
    steps it, whole k-steps of 32 channels a tap (C = 1 runs 32 channels);
    backward-weight's GEMM rows are R*S*Cp."""
    n, c, h, k, r, p = s["N"], s["C"], s["H"], s["K"], s["R"], s["P"]
    cp, kp, e = up(c, 8), up(k, 8), 2
    useful = 2.0 * n * k * p * p * c * r * r

    def tile(cols):
        return ("Shape<4,1,4,2>", 256, 64) if cols <= 64 else ("Shape<2,2,4,2>", 128, 128)

    def to_nhwc(images, chans, hw, padded):
        """[images, chans, hw] (NCHW, or KCRS) read, [images, hw, padded]
        written: tiles of 32 hw x 32 channels, one block each."""
        step.add("shipped", NHWC_CAST, 0, e * images * hw * (chans + padded),
                 blocks=images * math.ceil(hw / 32) * math.ceil(padded / 32))

    def gemm(kernel, rows, cols, flops, executed, nbytes, blocks):
        step.launches["shipped"].append(step.launch(kernel, kernel, executed, nbytes, blocks, "bf16",
                                                    useful=flops))

    # forward: x and w to NHWC / KRSC, then y = forward_nhwc (bias in the epilogue, y bfloat16)
    step.part = "conversions"
    to_nhwc(n, c, h * h, cp)
    to_nhwc(k, c, r * r, cp)
    step.part = "forward"
    shape, bm, bn = tile(k)
    gemm(f"{CONV}forward_nhwc<multistage::{shape}>", n * p * p, k, useful, 2.0 * n * p * p * k * r * r * up(c, 32),
         e * (n * h * h * cp + k * r * r * cp + n * k * p * p) + F * k,
         math.ceil(n * p * p / bm) * math.ceil(k / bn))
    if need_dx:  # backward-data: one stride-1 forward convolution per residue class with taps
        classes = dgrad_classes(s)
        step.part = "backward-data"
        if any(t == 0 or u == 0 for _, _, t, u in classes):  # dx zeroed where no tap reaches
            step.launches["shipped"].append(step.launch(MEMSET, MEMSET, 0, e * n * c * h * h, None,
                                                        audited=False))
        step.part = "conversions"
        to_nhwc(n, k, p * p, kp)
        shape, bm, bn = tile(c)
        # A class's useful FLOPs: the layer's, shared by the classes' pixels x taps (at stride 2
        # with padding those sum to the layer's; at stride 1 unpadded, LeNet's conv2, the one
        # class also runs dy's zero border).
        spans = sum(n * rows * cols * t * u for rows, cols, t, u in classes)
        for rows, cols, t, u in classes:
            if t == 0 or u == 0:
                continue
            step.part = "conversions"  # the class's taps, flipped, as a C x T x U x Kp filter
            step.add("shipped", f"{CONV}flipped_to_channels_last<{BF16}>", 0, e * (k * c * t * u + c * t * u * kp),
                     blocks=math.ceil(c * t * u * kp / 256))
            step.part = "backward-data"
            pixels = n * rows * cols
            gemm(f"{CONV}forward_nhwc<multistage::{shape}>", pixels, c, useful * pixels * t * u / spans,
                 2.0 * pixels * c * t * u * up(k, 32), e * (n * p * p * kp + c * t * u * kp + pixels * c),
                 math.ceil(pixels / bm) * math.ceil(c / bn))
    # backward-weight: x and dy to NHWC, dw = col^T dy over N*P*Q, split where the tiles are few
    step.part = "conversions"
    to_nhwc(n, c, h * h, cp)
    to_nhwc(n, k, p * p, kp)
    step.part = "backward-weight"
    shape, bm, bn = tile(k)
    rows, npq, kcrs = r * r * cp, n * p * p, k * c * r * r
    tiles = kt.tiles(rows, k, bm, bn)
    splits, chunk = kt.split_k(rows, k, npq, tiles, 2)
    if splits > 1:  # wgrad_plan: chunks of whole k-steps of 32
        chunk = up(chunk, 32)
        splits = -(-npq // chunk)
    gemm(f"{CONV}backward_weight_nhwc<multistage::{shape}>", rows, k, useful, 2.0 * rows * k * up(npq, 32),
         e * (n * h * h * cp + npq * kp) + F * kcrs * splits, tiles * splits)
    if splits > 1:
        step.split_sum(splits, kcrs, F)
    step.part = "rest"


# The k-step of each implicit-GEMM conv rung's main loop (the reduction is
# run in whole steps, the last zero-padded): conv 05 and 06 8 (the warp
# tile's BK, one m16n8k8), conv 07 16 (one m16n8k16), the baseline's conv 3 16.
K_STEP = {"fp32": 8, "tf32": 8, "bf16": 16, "conv3": 16}
PART_OF = {"fwd": "forward", "bwdD": "backward-data", "bwdW": "backward-weight"}
# The parts of a step, as the per-direction table lists them: the
# convolutions' GEMMs by direction, conv rung 08's layout conversions, the
# split-K sums of the convolutions, and everything else.
PARTS = {"forward": "conv forward", "backward-data": "conv backward-data",
         "backward-weight": "conv backward-weight", "conversions": "conv layout conversions (rung 08)",
         "split sums": "conv split-K sums (`add_partials`)",
         "rest": "rest of the step (bias gradients, BatchNorm, elementwise, pooling, linear layers, loss, SGD, casts)"}
NHWC_CAST = f"{CONV}to_channels_last<{BF16}>"
MEMSET = "cudaMemsetAsync"  # not a kernel: the audit has no row for it


def linear(step, b, fin, fout, float_input=False):
    """float_input: under amp, x is float32 (ResNet's pooled features): cast
    to bfloat16, and its bfloat16 gradient cast back."""
    flops = 2.0 * b * fin * fout
    step.convert(fin * fout, True, first_step=True)  # amp: the weight's copy
    if float_input:
        step.convert(b * fin, True)
    e = step.e  # the operands' bytes; amp: y and dx bfloat16 from the epilogue, dw float32
    for (ta, tb), m, n, k, read in (((0, 1), b, fout, fin, b * fin + fout * fin),
                                    ((0, 0), b, fin, fout, b * fout + fout * fin),
                                    ((1, 0), fout, fin, b, b * fout + b * fin)):
        flags = f"<{'true' if ta else 'false'},{'true' if tb else 'false'}>"
        bias = F * fout if step.amp and (ta, tb) == (0, 1) else 0  # amp: the bias in GEMM 10's epilogue
        step.gemm(f"{GEMM}gemm_split_k{flags}", f"{GEMM}gemm_register_blocked{flags}", m, n, k, flops,
                  e * read + bias, out=F if ta else e)
        if (ta, tb) == (0, 0) and float_input:  # amp: the bfloat16 dx cast back to float32
            step.convert(b * fin, False)
    if not step.amp:  # the FP32 and TF32 rungs add the bias by a pass over y
        step.add("both", EW + "add_channel_bias_kernel<int>", 0, F * (2 * b * fout + fout))
    step.channel_sum(b, fout, 1, RED + "channel_sum_kernel")


# Global average pooling under amp: the kernel of each direction, reading a
# bfloat16 x into a float32 y, and a float32 dy into a bfloat16 dx.
FLOAT_POOL_BF16 = {"avg_pool_forward_kernel<int>": "avg_pool_forward_bf16_to_float_kernel<int>",
                   "avg_pool_backward_kernel<int>": "avg_pool_backward_float_to_bf16_kernel<int>"}


def elementwise(step, relu=(), pool=(), adds=(), float_pool=False):
    """float_pool: global_avg_pool2d, float32 out from either dtype (amp:
    x and dx bfloat16, y and dy float32)."""
    e = step.e
    for n in relu:
        for kernel, nbytes in (("relu_forward_kernel", 2 * n), ("relu_backward_kernel", 3 * n)):
            step.add("both", step.native(EW + kernel), 0, e * nbytes, row=EW + kernel)
    for x, y in pool:
        for kernel in ("avg_pool_forward_kernel<int>", "avg_pool_backward_kernel<int>"):
            name = POOL + kernel
            if not step.amp:
                native, nbytes = instance(name, "fp32"), F * (x + y)
            elif float_pool:
                native, nbytes = POOL + FLOAT_POOL_BF16[kernel], e * x + F * y
            else:
                native, nbytes = step.native(name), e * (x + y)
            step.add("both", native, 0, nbytes, row=name)
    for n in adds:  # residual sums; gradient sums where a tensor forks
        step.add("both", step.native(EW + "add_kernel"), 0, e * 3 * n, row=EW + "add_kernel")


def loss_and_sgd(step, b, params):
    """Cross-entropy (core/ops_nn.cpp), the trainer's bookkeeping (nn/train.cpp)
    and one SGD launch per parameter tensor."""
    logits, labels = F * b * CLASSES, 8 * b
    for kernel, nbytes in (
            (RED + "label_min_max_kernel", labels), (SOFT + "forward_warp_per_row", 2 * logits + F * b + labels),
            (RED + "sum_partials", F * b), (RED + "sum_final", 8), (EW + "scale_kernel", 8),
            (SOFT + "count_correct_kernel", logits + labels + 8), (EW + "axpy_kernel", 12),
            (EW + "fill_kernel<float>", 4), (EW + "fill_kernel<float>", 4), (EW + "fill_kernel<long>", 8),
            (EW + "broadcast_scalar_kernel", F * (b + 1)), (SOFT + "backward_kernel", 2 * logits + F * b + labels)):
        row = kernel
        if kernel == EW + "scale_kernel":  # the loss, float32 either way
            kernel = instance(kernel, "fp32")
        if kernel == SOFT + "count_correct_kernel":  # amp: reads the bfloat16 logits
            kernel, nbytes = step.native(kernel), nbytes - (logits // 2 if step.amp else 0)
        if step.amp and kernel == SOFT + "forward_warp_per_row":  # reads the bfloat16 logits
            kernel, nbytes = kernel + "_bf16", nbytes - logits // 2
        if step.amp and kernel == SOFT + "backward_kernel":  # writes a bfloat16 dlogits
            kernel, nbytes = SOFT + "backward_bf16_kernel", nbytes - logits // 2
        step.add("both", kernel, 0, nbytes, row=row)
    for p, copy in params:  # amp: a conv or linear weight's bfloat16 copy, rewritten
        step.add("both", SGD, 0, F * 3 * p + (2 * p if step.amp and copy else 0))


def build(model, batch, tf32=False, amp=False, rung8=False):
    """The launches of one training step, and the step's GEMM FLOPs. amp:
    the TF32 step ("baseline") and the bfloat16 autocast step ("shipped");
    rung8 (with amp): the bfloat16 step on conv rung 07 ("baseline") and on
    conv rung 08 ("shipped")."""
    if amp and rung8:
        step = build_one(model, batch, Step(amp=True))
        eight = build_one(model, batch, Step(amp=True, rung8=True))
        step.launches["baseline"] = step.launches["shipped"]
        step.launches["shipped"] = eight.launches["shipped"]
        step.first_step = eight.first_step
        return step
    if amp:
        step = build(model, batch, tf32=True)
        bf16 = build_one(model, batch, Step(amp=True))
        step.launches["baseline"] = step.launches["shipped"]
        step.launches["shipped"] = bf16.launches["shipped"]
        step.first_step = bf16.first_step
        return step
    return build_one(model, batch, Step(tf32))


def build_one(model, batch, step):
    lenet, lenet_fc, resnet = kt.layers(batch)
    params = []  # (elements, whether autocast keeps a bfloat16 copy)
    if model == "lenet":  # conv, ReLU, avg pool x2; 800-128-10 (nn/models.cpp)
        for i, s in enumerate(lenet):
            conv(step, s, need_dx=i > 0)
            y = s["N"] * s["K"] * s["P"] ** 2
            elementwise(step, relu=[y], pool=[(y, s["N"] * s["K"] * (s["P"] // 2) ** 2)])
            params += [(s["K"] * s["C"] * s["R"] ** 2, True), (s["K"], False)]
        for name, b, fin, fout in lenet_fc:
            linear(step, b, fin, fout)
            params += [(fin * fout, True), (fout, False)]
        elementwise(step, relu=[batch * lenet_fc[0][3]])
    else:  # ResNet-18: every conv but the shortcuts is followed by BatchNorm and a ReLU
        stages = defaultdict(list)
        for i, s in enumerate(s for s in resnet for _ in range(s["count"])):
            conv(step, s, need_dx=i > 0)
            params += [(s["K"] * s["C"] * s["R"] ** 2, True), (s["K"], False)]
            stages[s["name"].split()[1]].append(s)
            if "shortcut" not in s["name"]:
                step.batch_norm(s["N"], s["K"], s["P"] ** 2)
                elementwise(step, relu=[s["N"] * s["K"] * s["P"] ** 2])
                params += [(s["K"], False), (s["K"], False)]
        for name, convs in stages.items():  # two residuals a stage, after the stem
            if name == "stem":
                continue
            first, last = convs[0], [s for s in convs if "shortcut" not in s["name"]][-1]
            x_in, y_out = batch * first["C"] * first["H"] ** 2, batch * last["K"] * last["P"] ** 2
            elementwise(step, adds=[y_out, y_out, x_in, y_out])  # forward, backward
        top = resnet[-1]
        elementwise(step, pool=[(batch * top["K"] * top["P"] ** 2, batch * top["K"])], float_pool=True)
        linear(step, batch, top["K"], CLASSES, float_input=True)
        params += [(top["K"] * CLASSES, True), (CLASSES, False)]
    loss_and_sgd(step, batch, params)
    return step


def parse_table(text, model, batch, where):
    """kernel key -> dict(launches, util, blocks) from a launch-audit table in Markdown."""
    m = re.search(rf"<!-- launch-audit {model} {batch}: begin[^>]*-->\n(.*?)<!-- launch-audit {model} "
                  rf"{batch}: end -->", text, re.S)
    if not m:
        sys.exit(f"step_time: no launch-audit {model} {batch} table in {where}")
    out = {}
    for line in m.group(1).splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not cells[0].startswith("`"):
            continue
        lo, _, hi = cells[2].partition("-")
        # the 7th column: predicted utilisation (later tables add the untimed wave fill after it)
        out[norm(cells[0].strip("`"))] = dict(launches=int(cells[1]), util=float(cells[6].strip("*")),
                                              blocks=(int(lo), int(hi or lo)))
    return out


def shipped_audit(model, batch, docs_only, tag=""):
    """The audit of the shipped kernels (tag "-tf32": with the TF32 rungs):
    build/launch-audit's merged runs, else the docs' table."""
    path = ROOT / "build" / "launch-audit" / f"{model}-{batch}{tag}.jsonl"
    if path.exists() and not docs_only:
        table = {norm(r["kernel"]): dict(launches=r["launches"], util=r["predicted_sm_utilisation"],
                                         blocks=(r["blocks_min"], r["blocks_max"])) for r in la.read(path)}
        return table, str(path.relative_to(ROOT))
    doc = GENERATED / f"launch-audit{tag}.md"
    return (parse_table(doc.read_text(), model, batch, str(doc.relative_to(ROOT))),
            str(doc.relative_to(ROOT)) + " (no " + str(path.relative_to(ROOT)) + ")")


def audits(model, batch, docs_only=False, tf32=False, amp=False, rung8=False):
    if amp and rung8:  # the bfloat16 step on conv rung 07 against conv rung 08
        seven, seven_source = shipped_audit(model, batch, docs_only, "-bf16")
        eight, eight_source = shipped_audit(model, batch, docs_only, "-bf16-rung8")
        return {"baseline": seven, "shipped": eight}, f"conv 07 {seven_source}; conv 08 {eight_source}"
    if amp:  # the TF32 step against the bfloat16 autocast step
        tc, tc_source = shipped_audit(model, batch, docs_only, "-tf32")
        bf, bf_source = shipped_audit(model, batch, docs_only, "-bf16")
        return {"baseline": tc, "shipped": bf}, f"TF32 {tc_source}; BF16 {bf_source}"
    after, source = shipped_audit(model, batch, docs_only)
    if tf32:  # FP32's shipped kernels against the TF32 step
        tc, tc_source = shipped_audit(model, batch, docs_only, "-tf32")
        return {"baseline": after, "shipped": tc}, f"FP32 {source}; TF32 {tc_source}"
    baseline = GENERATED / "launch-audit-baseline.md"
    before = parse_table(baseline.read_text(), model, batch, str(baseline.relative_to(ROOT)))
    return {"baseline": before, "shipped": after}, source


def predict(model, batch, a):
    amp = a.amp == "bf16"
    rung8 = amp and getattr(a, "conv_bf16_rung", 7) == 8
    tf32 = a.fp32_precision == "tf32" and not amp
    mode = "bf16-rung8" if rung8 else "bf16" if amp else "tf32" if tf32 else "ieee"
    step = build(model, batch, tf32, amp, rung8)
    audit, source = audits(model, batch, a.docs, tf32, amp, rung8)
    peaks = {False: kt.FP32_PEAK, True: TF32_PEAK * a.tc_efficiency, "bf16": BF16_PEAK * a.tc_efficiency}
    hmma_rate = {True: TF32_PEAK, "bf16": BF16_PEAK}  # one HMMA a clock an SM, as FLOP/s
    loops = main_loops() if a.issue_bound else {}
    rows = defaultdict(lambda: {e: defaultdict(float, kernels=set()) for e in ("baseline", "shipped")})
    parts = {part: {e: defaultdict(float) for e in ("baseline", "shipped")} for part in PARTS}
    checks, totals = [], {}
    for era, launches in step.launches.items():
        seen = defaultdict(list)
        for x in launches:
            if x["audited"]:
                seen[x["kernel"]].append(x)
        for kernel, au in audit[era].items():
            xs, blocks = seen.get(kernel), [x["blocks"] for x in seen.get(kernel, []) if x["blocks"]]
            if not xs:  # a kernel the model does not know: its launches at the floor
                checks.append(f"{era}: `{show(kernel)}` ({au['launches']} launches) is not in the model")
                launches += [step.launch(kernel, kernel, 0, 0, None, part="rest")] * au["launches"]
            elif len(xs) != au["launches"]:
                checks.append(f"{era}: `{show(kernel)}` {len(xs)} launches in the model, {au['launches']} in the audit")
            if blocks and (min(blocks), max(blocks)) != au["blocks"]:
                checks.append(f"{era}: `{show(kernel)}` blocks {min(blocks)}-{max(blocks)} in the model, "
                              f"{au['blocks'][0]}-{au['blocks'][1]} in the audit")
        checks += [f"{era}: `{show(k)}` is not in the audit (utilisation 1)" for k in seen if k not in audit[era]]
        tc_kernels = {x["kernel"] for x in launches if x["tensor_cores"]}
        checks += [f"{era}: `{show(k)}` has no main loop in {RESOURCES_NAME} (no issue bound)"
                   for k in sorted(tc_kernels) if a.issue_bound and k not in loops]
        t = totals[era] = defaultdict(float)
        for x in launches:
            util = audit[era].get(x["kernel"], {"util": 1.0})["util"]
            compute, memory = x["flops"] / peaks[x["tensor_cores"]], x["bytes"] / kt.HBM_BW
            roof = max(compute, memory)
            # The issue bound: the launch's HMMA (its FLOPs at one HMMA a clock
            # an SM) x the main loop's instructions per HMMA / 4 a clock.
            per_hmma = loops.get(x["kernel"], 0.0) if x["tensor_cores"] else 0.0
            issue = x["flops"] / hmma_rate[x["tensor_cores"]] * per_hmma / ISSUE_PER_CLOCK if per_hmma else 0.0
            bound = max(roof, issue)
            binds = ("issue" if issue > roof else "HBM" if memory >= compute else
                     "TC" if x["tensor_cores"] else "FP32")
            x["floored"] = max(bound / util, a.launch_us * 1e-6)
            r = rows[x["row"]][era]
            r["kernels"].add(x["kernel"])
            pt = parts[x["part"]][era]
            for key, v in (("launches", 1), ("flops", x["flops"]), ("useful", x["useful"]),
                           ("bytes", x["bytes"]), ("roof", roof),
                           ("issue", issue), ("bound", bound), ("bind:" + binds, bound),
                           ("pred", bound / util), ("floored", max(bound / util, a.launch_us * 1e-6))):
                r[key] += v
                t[key] += v
                pt[key] += v
    reference = 3 * batch * (sm.lenet_forward_flops() if model == "lenet" else sm.resnet18_forward_flops())
    first = dict(launches=len(step.first_step), floored=sum(x["floored"] for x in step.first_step),
                 bytes=sum(x["bytes"] for x in step.first_step))
    return dict(model=model, batch=batch, rows=rows, parts=parts, totals=totals, audit=audit, source=source,
                checks=checks, reference=reference, tf32=tf32, mode=mode, first_step=first,
                issue_bound=a.issue_bound)


def pair(b, a, fmt):
    return fmt.format(a) if fmt.format(b) == fmt.format(a) else f"{fmt.format(b)} → {fmt.format(a)}"


def util_cell(r, audit):
    if not r["launches"]:
        return "-"
    if len(r["kernels"]) == 1:
        return f"{audit[next(iter(r['kernels']))]['util']:.3f}" if next(iter(r["kernels"])) in audit else "1*"
    return f"{r['bound'] / r['pred']:.3f}*"


def fold(p, share):
    """The rows, those under `share` of the step's predicted time (both eras)
    merged into one "other" row."""
    rows = dict(p["rows"])
    limit = share * min(p["totals"][e]["pred"] for e in ("baseline", "shipped"))
    small = [k for k, r in rows.items() if max(r[e]["pred"] for e in ("baseline", "shipped")) < limit]
    if len(small) < 2:
        return rows
    other = {e: defaultdict(float, kernels=set()) for e in ("baseline", "shipped")}
    for key in small:
        for e, r in rows.pop(key).items():
            other[e]["kernels"] |= r["kernels"]
            for k, v in r.items():
                if k != "kernels":
                    other[e][k] += v
    rows[f"{len(small)} other kernels, each under {100 * share:g}% of the step"] = other
    return rows


def binds(r, shares=False):
    """What binds a row's launches (FP32, TC: the tensor cores' peak, HBM,
    issue: the issue bound), the most time first; shares: with each one's %."""
    kinds = sorted((k for k in r if k.startswith("bind:")), key=lambda k: -r[k])
    if not kinds:
        return "-"
    if shares:
        return ", ".join(f"{k[5:]} {100 * r[k] / r['bound']:.0f}%" for k in kinds)
    return ", ".join(k[5:] for k in kinds)


def line(label, b, a, util_b, util_a, gflop="{:.3f}", issue=False, shares=False):
    cells = ""
    if issue:  # the issue bound's µs and what binds, by era
        sides = [f"{r['issue'] * 1e6:.1f}" if r["issue"] else "-" for r in (b, a)]
        issue_cell = sides[1] if sides[0] == sides[1] else " → ".join(sides)
        bb, ba = binds(b, shares), binds(a, shares)
        cells = f"{issue_cell} | {ba if bb == ba else f'{bb} → {ba}'} | "
    flops = pair(b['flops'] / 1e9, a['flops'] / 1e9, gflop)
    if any(gflop.format(r["flops"] / 1e9) != gflop.format(r["useful"] / 1e9) for r in (b, a)):
        flops += f" (useful {pair(b['useful'] / 1e9, a['useful'] / 1e9, gflop)})"
    return (f"| {label} | {pair(b['launches'], a['launches'], '{:.0f}')} | "
            f"{flops} | {pair(b['bytes'] / 1e6, a['bytes'] / 1e6, '{:.2f}')} | "
            f"{pair(b['roof'] * 1e6, a['roof'] * 1e6, '{:.1f}')} | {cells}{util_b} | {util_a} | "
            f"{b['pred'] * 1e6:.1f} | {a['pred'] * 1e6:.1f} |")


def table(p, share=0.0):
    rows, audit, issue = fold(p, share) if share else p["rows"], p["audit"], p["issue_bound"]
    b, a = ERAS[p["mode"]]
    extra = "issue bound µs | binds | " if issue else ""
    out = [f"| family (shipped kernels) | launches | GFLOP | MB | roofline µs | {extra}utilisation {b} | {a} | "
           f"predicted µs {b} | {a} |", "|---|---|---|---|---|---|---|---|---|" + ("---|---|" if issue else "")]
    for key in sorted(rows, key=lambda k: ("::" not in k, -max(rows[k][e]["pred"] for e in ("baseline", "shipped")))):
        b, a = rows[key]["baseline"], rows[key]["shipped"]
        out.append(line(f"`{show(key)}`" if "::" in key else key, b, a, util_cell(b, audit["baseline"]),
                        util_cell(a, audit["shipped"]), issue=issue))
    tb, ta = p["totals"]["baseline"], p["totals"]["shipped"]
    out.append(line("**total**", tb, ta, f"{tb['bound'] / tb['pred']:.3f}*", f"{ta['bound'] / ta['pred']:.3f}*",
                    issue=issue, shares=True))
    return out


def parts_table(p):
    """The step by part (PARTS): the convolutions' directions, rung 08's
    layout conversions and the split-K sums, and the rest; FLOPs executed
    and useful, the bounds, and the predicted time with and without the floor."""
    b, a = ERAS[p["mode"]]
    out = [f"| part | launches | GFLOP executed | GFLOP useful | MB | bound µs | predicted µs {b} | {a} | "
           f"with the floor, µs {b} | {a} |", "|---|---|---|---|---|---|---|---|---|---|"]
    for key, label in list(PARTS.items()) + [("total", "**total**")]:
        if key == "total":
            rb, ra = p["totals"]["baseline"], p["totals"]["shipped"]
        else:
            rb, ra = p["parts"][key]["baseline"], p["parts"][key]["shipped"]
        if not (rb["launches"] or ra["launches"]):
            continue
        out.append(f"| {label} | {pair(rb['launches'], ra['launches'], '{:.0f}')} | "
                   f"{pair(rb['flops'] / 1e9, ra['flops'] / 1e9, '{:.3f}')} | "
                   f"{pair(rb['useful'] / 1e9, ra['useful'] / 1e9, '{:.3f}')} | "
                   f"{pair(rb['bytes'] / 1e6, ra['bytes'] / 1e6, '{:.2f}')} | "
                   f"{pair(rb['bound'] * 1e6, ra['bound'] * 1e6, '{:.1f}')} | {rb['pred'] * 1e6:.1f} | "
                   f"{ra['pred'] * 1e6:.1f} | {rb['floored'] * 1e6:.1f} | {ra['floored'] * 1e6:.1f} |")
    return out


def mapping(p):
    """One line per kind of difference: the shipped rows, and the baseline kernels put on them."""
    groups = defaultdict(lambda: (set(), set()))
    for key, r in p["rows"].items():
        why = next((w for k, w in WHY if k in key), None)
        if why and r["baseline"]["kernels"] != {key}:
            groups[why][0].add(show(key))
            groups[why][1].update(show(k) for k in r["baseline"]["kernels"])
    return [f"- {', '.join(f'`{k}`' for k in sorted(after))} ← "
            f"{', '.join(f'`{k}`' for k in sorted(before)) or 'nothing'}: {why}"
            for why, (after, before) in groups.items()]


def summary(p, launch_us):
    tb, ta, b = p["totals"]["baseline"], p["totals"]["shipped"], p["batch"]
    issue = (f"; with the issue bound {pair(tb['bound'] * 1e3, ta['bound'] * 1e3, '{:.3f}')} ms before "
             f"utilisation" if p["issue_bound"] else "")
    return (f"step {tb['floored'] * 1e3:.3f} → {ta['floored'] * 1e3:.3f} ms with the {launch_us:g} µs floor "
            f"({b / tb['floored']:,.0f} → {b / ta['floored']:,.0f} images/s); without it "
            f"{tb['pred'] * 1e3:.3f} → {ta['pred'] * 1e3:.3f} ms ({b / tb['pred']:,.0f} → "
            f"{b / ta['pred']:,.0f} images/s); roofline alone {ta['roof'] * 1e3:.3f} ms; "
            f"{ta['launches']:.0f} launches x {launch_us:g} µs = {ta['launches'] * launch_us / 1e3:.3f} ms{issue}")


def report(p, a):
    name = {"lenet": "LeNet", "resnet18": "ResNet-18"}[p["model"]]
    print(f"### {name}, batch {p['batch']}\n")
    where = (p["source"] if p["mode"] != "ieee" else
             f"Shipped: {p['source']}; baseline: docs/generated/launch-audit-baseline.md")
    print(f"{where}. {summary(p, a.launch_us)}.\n")
    if p["mode"].startswith("bf16"):
        f, ta, b = p["first_step"], p["totals"]["shipped"], p["batch"]
        steady = ta["floored"] - f["floored"]
        print(f"First step only: the {f['launches']} casts of the conv and linear weights to bfloat16 "
              f"({f['bytes'] / 1e6:.2f} MB, {f['floored'] * 1e6:.1f} µs with the floor), in the audit and "
              f"in the BF16 column; later steps' SGD rewrites the copies, so the steady-state step is "
              f"{steady * 1e3:.3f} ms ({b / steady:,.0f} images/s) with the floor.\n")
    if p["mode"].startswith("bf16"):
        print("By part of the step (executed FLOPs: the implicit GEMMs' reductions in whole k-steps, a "
              "strided or unpadded backward-data's zero taps included; useful: 2 x the multiply-adds the "
              "result needs):\n")
        print("\n".join(parts_table(p)) + "\n")
    print("\n".join(table(p, 0.01 if a.markdown else 0.0)))
    print("\n\\* effective: roofline / predicted over the row's kernels (several kernels, or the total)"
          + (", the roofline with the issue bound" if p["issue_bound"] else "") + ".\n")
    if p["mode"] == "bf16-rung8":
        print("Mapping (conv 07 → conv 08): the BF16 step's convolutions on conv rung 08 "
              "(`ANVIL_CONV_BF16_RUNG=8`): per layer `to_channels_last` of x and w, `forward_nhwc`; "
              "backward-data `to_channels_last` of dy, then per residue class of the stride with taps "
              "`flipped_to_channels_last` and `forward_nhwc` (a `cudaMemsetAsync` of dx first where a class "
              "has none: not a kernel, no audit row, its bytes and the floor counted); backward-weight "
              "`to_channels_last` of x and dy, `backward_weight_nhwc`, split over N*P*Q where its tiles are "
              "few and summed by `add_partials`. Conv 07's rows and conv 08's are different kernels, so "
              "each has launches in one column only; every other kernel is the same in both.\n")
    elif p["mode"] == "bf16":
        print("Mapping (TF32 → BF16): each row's conv 06 or GEMM 11 kernel → the BF16 rung's kernel with "
              "the same tiles and split plan (conv 07, GEMM 10: `mma_tile::Shape<Bf16, ...>`, bfloat16 "
              "operands, bfloat16 y and dx from the epilogue or `add_partials`, float32 weight "
              "gradients; the linear bias in the epilogue, so no `add_channel_bias_kernel`); relu, add, BatchNorm and LeNet's pooling → their bfloat16 "
              "instantiations (`<anvil::bfloat16>`), ResNet's global pooling → its kernels reading bfloat16 x "
              "into float32 y and float32 dy into bfloat16 dx; "
              "`float_to_bf16_kernel` and `bf16_to_float_kernel` are the BF16 step's alone; every other "
              "kernel is the same in both.\n")
    elif p["tf32"]:
        print("Mapping (FP32 → TF32): each row's conv 05 or GEMM 08 kernel → the TF32 rung's kernel with "
              "the same tiles and split plan (conv 06, GEMM 11); every other kernel is the same in both.\n")
    else:
        print("Mapping (baseline → shipped):\n\n" + "\n".join(mapping(p)) + "\n")
    if a.markdown:
        return
    ta = p["totals"]["shipped"]
    print(f"Sanity: the step's useful GEMM FLOPs {ta['useful'] / 1e9:.3f} G against 3 x step_model.py's forward "
          f"{p['reference'] / 1e9:.3f} G ({p['reference'] / 3 / p['batch'] / 1e6:.1f} MFLOP per image): "
          f"ratio {ta['useful'] / p['reference']:.3f} (the first conv's backward-data is not launched)")
    print("Checks against the audit: " + ("every kernel's launches and blocks agree" if not p["checks"]
                                          else "\n- " + "\n- ".join(p["checks"])) + "\n")


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
                         "(docs/generated/launch-audit-bf16.md) with the same step on conv rung 08, as "
                         "ANVIL_CONV_BF16_RUNG=8 runs it (docs/generated/launch-audit-bf16-rung8.md)")
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
        a.markdown = True
        text = io.StringIO()
        with contextlib.redirect_stdout(text):
            render(preds, a)
        mode = preds[0]["mode"]
        flags = {"ieee": "", "tf32": " --fp32-precision tf32", "bf16": " --amp bf16",
                 "bf16-rung8": " --amp bf16 --conv-bf16-rung 8"}[mode]
        title = {"ieee": "shipped kernels and the baseline", "tf32": "FP32 kernels and TF32 rungs",
                 "bf16": "TF32 rungs and bfloat16 autocast",
                 "bf16-rung8": "bfloat16 autocast on conv rung 07 and conv rung 08"}[mode]
        text = (f"# Predicted step time on one H100: {title}\n\n"
                f"<!-- Generated by `python3 tools/predict/step_time.py --docs{flags} --write`; do not edit. -->\n\n"
                "How the prediction is made: [kernels.md](../kernels.md), \"Predicted step time\". "
                f"Each cell with an arrow reads {' → '.join(ERAS[mode])}.\n\n" + text.getvalue().rstrip() + "\n")
        path = GENERATED / {"ieee": "step-time.md", "tf32": "step-time-tf32.md", "bf16": "step-time-bf16.md",
                            "bf16-rung8": "step-time-bf16-rung8.md"}[mode]
        if a.write:
            path.write_text(text)
            print(f"step_time: {path.relative_to(ROOT)} updated", file=sys.stderr)
        elif not path.exists() or path.read_text() != text:
            sys.exit(f"step_time: {path.relative_to(ROOT)} is not what the audit tables give; rerun "
                     f"python3 tools/predict/step_time.py --docs{flags} --write")
    failed = [f"{p['model']} {p['batch']}" for p in preds if p["checks"]]
    if a.check and failed:
        sys.exit(f"step_time: the model disagrees with the launch audit for {', '.join(failed)} "
                 f"(the checks above); update tools/predict/step_time.py or rerun the audits")


def render(preds, a):
    if a.amp == "bf16" and a.conv_bf16_rung == 8:
        print(f"BF16, conv rung 07 → 08: H100 SXM5 dense BF16 {BF16_PEAK / 1e12:.1f} TFLOP/s x --tc-efficiency "
              f"{a.tc_efficiency:g} for the conv and GEMM launches of both steps.")
    elif a.amp == "bf16":
        print(f"BF16: H100 SXM5 dense BF16 {BF16_PEAK / 1e12:.1f} TFLOP/s x --tc-efficiency {a.tc_efficiency:g} "
              f"for the conv and GEMM launches of the bfloat16 step; dense TF32 {TF32_PEAK / 1e12:.1f} TFLOP/s x "
              f"{a.tc_efficiency:g} for the TF32 step's.")
    elif a.fp32_precision == "tf32":
        print(f"TF32: H100 SXM5 dense TF32 {TF32_PEAK / 1e12:.1f} TFLOP/s x --tc-efficiency "
              f"{a.tc_efficiency:g} for the conv and GEMM launches of the TF32 step.")
    print(f"Assumptions: H100 SXM5 FP32 {kt.FP32_PEAK / 1e12:.1f} TFLOP/s, HBM {kt.HBM_BW / 1e12:.2f} TB/s; "
          f"minimum bytes (each tensor once); predicted = "
          f"{'max(roofline, issue bound)' if a.issue_bound else 'roofline'} / the audit's predicted SM utilisation; "
          f"floor {a.launch_us:g} µs per launch (see the docstring).\n")
    if a.issue_bound:
        print(f"Issue bound: each tensor-core launch takes at least its FLOPs at one HMMA a clock an SM "
              f"(the dense peak) x the main loop's instructions per HMMA / {ISSUE_PER_CLOCK} issued a clock "
              f"({RESOURCES_NAME}, from the SASS; the worst instantiation); "
              f"--no-issue-bound leaves it out.\n")
    issue = a.issue_bound
    print("| step | launches | roofline ms | " + ("with the issue bound ms | " if issue else "")
          + "predicted ms, no floor | with the floor | images/s |")
    print("|---|---|---|---|---|---|" + ("---|" if issue else ""))
    for p in preds:
        tb, ta, b = p["totals"]["baseline"], p["totals"]["shipped"], p["batch"]
        bound = f"{pair(tb['bound'] * 1e3, ta['bound'] * 1e3, '{:.3f}')} | " if issue else ""
        print(f"| {p['model']} {b} | {tb['launches']:.0f} → {ta['launches']:.0f} | "
              f"{pair(tb['roof'] * 1e3, ta['roof'] * 1e3, '{:.3f}')} | {bound}{tb['pred'] * 1e3:.3f} → "
              f"{ta['pred'] * 1e3:.3f} | {tb['floored'] * 1e3:.3f} → {ta['floored'] * 1e3:.3f} | "
              f"{b / tb['floored']:,.0f} → {b / ta['floored']:,.0f} |")
    print()
    for p in preds:
        report(p, a)


if __name__ == "__main__":
    main()
