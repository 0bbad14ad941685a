"""The launches of one training step, as tools/predict/step_time.py models
them: each launch's kernel as the launch audit names it, the row of the
shipped kernel it is put on, its executed and useful FLOPs, minimum bytes,
blocks and part of the step, for the configurations step_time.py compares
(its docstring gives the model and its assumptions).

The step under bfloat16 autocast (--amp bf16): its launches, as the op
layer and the CUDA backend issue them (core/ops_nn.cpp, core/ops.cpp,
core/autocast.cpp, kernels/cuda/conv/conv.cpp, kernels/cuda/gemm/gemm.cpp):
- convolutions on conv rung 07 (BF16 mma.sync m16n8k16, conv 05's tiles
  and split plans) and linear layers on GEMM rung 12 (the same mma on the
  multistage mainloop, GEMM 08's tile and split plan; an operand that is
  not 16-byte aligned, the classifier's dy, first copied to an aligned one
  by a copy_rows launch, as GEMM 11 does in the TF32 step),
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

The same step with every BF16 convolution on conv rung 08
(--conv-bf16-rung 8; conv_multistage() below, kernels/cuda/conv/
08_bf16_multistage.cu), per layer
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
partials float32). The TF32 step with every convolution on conv rung 09
(--fp32-precision tf32 --conv-tf32-rung 9, 09_tf32_multistage.cu) launches
the same, with float32 operands (4 bytes), C and K padded to a multiple of
4, k-steps of 16 channels (backward-weight's chunks rounded up to 16), and
the TF32 peak. Standard library only.
"""
import math
import re
from collections import defaultdict

import kernel_table as kt

F = 4  # bytes per float
BF16 = "anvil::bfloat16"
CLASSES = 10
GEMM, CONV, RED, BN, EW, POOL, SOFT = ("gemm_kernels::", "conv_kernels::", "reduce_kernels::",
                                       "batch_norm_kernels::", "elementwise_kernels::",
                                       "pool_kernels::", "softmax_kernels::")
# Plain SGD (the seed recipe): every parameter in one multi-tensor launch
# (kernels/cuda/sgd.cu), a block per SGD_CHUNK elements of each tensor; the
# frozen baseline audit ran one launch per parameter tensor.
SGD = "sgd_kernels::sgd_multi_tensor<false,false>"
SGD_PER_TENSOR = "sgd_kernels::sgd_kernel<(sgd_kernels::Mode)0,false>"
SGD_CHUNK = 4096


# The TF32 rungs' kernels (conv 06, GEMM 11) by the FP32 kernel whose tiles
# and split plans they keep: mma_tile::Shape<Tf32, 1, 4, 3> is conv 05's
# 64x128 tile (128 threads), Shape<Tf32, 2, 4, 2> the 128x128 one (256
# threads); GEMM 11's mma_ldmatrix::ShapeOf<multistage::Tf32, 2, 2, 4, 2>
# is GEMM 08's 128x128 (in 128 threads) with its 2 blocks per SM in the
# split plan.
TF32_TILES = {"64x128": "mma_tile::Shape<mma_tile::Tf32,1,4,3>",
              "128x128": "mma_tile::Shape<mma_tile::Tf32,2,4,2>"}
TF32_GEMM = "mma_ldmatrix::ShapeOf<multistage::Tf32,2,2,4,2>"


# The BF16 rungs' kernels: conv 07's, conv 05's tiles as
# mma_tile::Shape<Bf16, ...>; GEMM 12's, GEMM 08's 128x128 (in 128 threads)
# on the multistage mainloop, 4 stages, with GEMM 10's split plan.
BF16_TILES = {"64x128": "mma_tile::Shape<mma_tile::Bf16,1,4,3>",
              "128x128": "mma_tile::Shape<mma_tile::Bf16,2,4,2>"}
BF16_GEMM = "mma_ldmatrix::Shape<2,2,4,2>"


def instance(kernel, math):
    """The kernel that runs an FP32 kernel's work (named by its family, as
    the model does: conv tiles as 64x128, no element type) in math "fp32",
    "tf32" (conv 06, GEMM 11) or "bf16" (conv 07, GEMM 12, and the other
    kernels' bfloat16 instances under autocast): its name in that audit.
    The kernels templated on their element type take it as the last
    parameter; only the conv and GEMM rungs change with tf32. GEMM 11 and
    12 run every GEMM, an operand that is not 16-byte aligned on its aligned
    copy (Step.gemm's copies)."""
    elem = BF16 if math == "bf16" else "float"
    m = re.match(r"(conv_kernels::\w+_warp_tiled)<(\d+x\d+)>$", kernel)
    if m:
        tile = {"fp32": m.group(2), "tf32": TF32_TILES[m.group(2)], "bf16": BF16_TILES[m.group(2)]}[math]
        return f"{m.group(1)}<{tile},{elem}>"
    m = re.match(r"gemm_kernels::gemm_split_k<(\w+),(\w+)>$", kernel)
    if m:
        if math == "fp32":
            return kernel
        shape = TF32_GEMM if math == "tf32" else BF16_GEMM
        return f"gemm_kernels::gemm_mma<{shape},{m.group(1)},{m.group(2)},{elem}>"
    m = re.match(r"(.*pointwise_(?:forward|backward)_kernel<[\w:]+)>$", kernel)  # core/pointwise.h's ops
    if m:
        return f"{m.group(1)},{elem}>"
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

    def __init__(self, tf32=False, amp=False, rung8=False, rung9=False):
        self.launches = {"baseline": [], "shipped": []}
        self.tf32, self.amp, self.rung8 = tf32, amp, rung8 and amp
        self.rung9 = rung9 and tf32 and not amp
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

    def gemm(self, kernel, before, m, n, k, flops, read, narrow=False, out=F, implicit=False,
             copies=()):
        """A shipped GEMM (conv 5 or GEMM 8) of an m x n result over k, its split-K
        sum, and the baseline launch (GEMM 4 / conv 3: 64x64 tiles, unsplit).
        out: bytes per element of the result (amp: 2 for a bfloat16 y or dx,
        stored by the epilogue, or by add_partials from float32 partials).
        implicit: a convolution's implicit GEMM, whose executed FLOPs are
        2 m n k with k rounded up to the kernel's k-step (K_STEP), zero taps
        included; flops are the useful ones. copies: the elements of each
        operand that is not 16-byte aligned, which GEMM 11 and 12 first copy
        to an aligned one (aligned_copy_of)."""
        def executed(math):
            return 2.0 * m * n * -(-k // K_STEP[math]) * K_STEP[math] if implicit else flops
        bm, per_sm = (64, 3) if narrow else (128, 2)
        tiles = kt.tiles(m, n, bm, 128)
        splits = kt.split_k(m, n, k, tiles, per_sm)[0]
        nbytes = read + (F * splits * m * n if splits > 1 else out * m * n)
        blocks = tiles * splits
        if self.amp or self.tf32:
            for elements in copies:
                self.aligned_copy_of(elements)
        if self.amp:  # the BF16 rungs: conv 05's and GEMM 08's tiles and split plans
            self.launches["shipped"].append(self.launch(instance(kernel, "bf16"), kernel,
                                                        executed("bf16"), nbytes, blocks, "bf16", useful=flops))
        elif self.tf32:  # the TF32 rungs: the FP32 rungs' tiles, split plans and sums
            self.launches["baseline"].append(self.launch(self.native(kernel), kernel, executed("fp32"), nbytes,
                                                         blocks, useful=flops))
            self.launches["shipped"].append(self.launch(instance(kernel, "tf32"), kernel,
                                                        executed("tf32"), nbytes, blocks, True, useful=flops))
        else:
            self.launches["shipped"].append(self.launch(self.native(kernel), kernel, executed("fp32"), nbytes,
                                                        blocks, useful=flops))
        if splits > 1:
            self.split_sum(splits, m * n, out)
        if not (self.amp or self.tf32):
            self.launches["baseline"].append(self.launch(before, kernel, executed("conv3"), read + F * m * n,
                                                         kt.tiles(m, n, 64, 64), useful=flops))

    def aligned_copy_of(self, elements):
        """GEMM 11's or 12's copy of an operand that is not 16-byte aligned
        (kernels/cuda/gemm/aligned_copy.h): one copy_rows launch
        (elementwise.cu, the flat walk, a block per 256 elements up to 2048)
        reads the operand and writes it into the workspace, rows padded to
        whole 16-byte chunks (the padding neither written nor read). In the
        TF32 or BF16 step alone: the FP32 rung reads any alignment."""
        e = 2 if self.amp else F
        # (the audit's name without its spaces, as the model keys every kernel)
        kernel = f"{EW}copy_rows_kernel<unsigned{'short' if self.amp else 'int'}>"
        self.launches["shipped"].append(self.launch(kernel, kernel, 0, 2 * e * elements,
                                                    min(math.ceil(elements / 256), 2048)))

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

    def batch_norm(self, n, c, hw, relu=False, residual=False):
        """relu: the ReLU after it fused into the normalise pass
        (forward_normalize_relu_split), and its backward into the backward's
        two passes (backward_sums_relu_split, backward_dx_relu_split), which
        read the forward's y beside dy and x and mask dy as they load it (the
        masked gradient never written); the baseline ran ReLU apart.
        residual (with relu): a residual block's end, relu(bn(x) + r)
        (batch_norm_add_relu): the normalise pass also reads the shortcut r
        (forward_normalize_add_relu_split), and the dx pass also writes the
        masked gradient as r's (backward_dx_add_relu_split); the baseline ran
        the add and ReLU apart."""
        v, s, x = (4 if hw % 4 == 0 else 1), split_count(c, n * hw), n * c * hw
        e = self.e  # x, y, dy, dx: bfloat16 under amp; statistics and parameters float32
        y = x if relu else 0  # the fused backward's read of the forward's y, in each pass
        r = x if residual else 0  # the forward's read of the shortcut, the dx pass's write of its gradient
        for d, passes, before, fold_c, split_bytes, before_bytes in (
                ("forward", ("stats", "normalize"), "forward_train_kernel", 8, (x, 2 * x + r + 4 * c),
                 2 * x + 6 * c),
                ("backward", ("sums", "dx"), "backward_train_kernel", 4, (2 * x + y, 3 * x + y + r + 4 * c),
                 3 * x + 6 * c)):
            tag = "_relu" if relu else ""
            first = f"{BN}{d}_{passes[0]}{tag if d == 'backward' else ''}_split<{v},int>"
            second = f"{BN}{d}_{passes[1]}{'_add' if residual else ''}{tag}_split<{v},int>"
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
            self.add("baseline", BN + before, 0, F * before_bytes, row=first, blocks=c)
        if relu:  # the baseline's add and ReLU passes, on the rows of the fused passes
            add = "_add" if residual else ""
            normalize, dx = (f"{BN}forward_normalize{add}_relu_split<{v},int>",
                             f"{BN}backward_dx{add}_relu_split<{v},int>")
            if residual:
                self.add("baseline", EW + "add_kernel", 0, F * 3 * x, row=normalize)
            self.add("baseline", EW + "relu_forward_kernel", 0, F * 2 * x, row=normalize)
            self.add("baseline", EW + "relu_backward_kernel", 0, F * 3 * x, row=dx)
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
    multistage = step.rung8 or step.rung9
    if multistage:
        conv_multistage(step, s, need_dx)
    for d, m, n, k, nbytes in [] if multistage else kt.conv_gemms(s):
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


# The multistage conv rungs by arithmetic: bytes an operand element, the
# channels of a 16-byte chunk (C and K are padded to a multiple), a k-step's
# channels of a tap (or positions of backward-weight's N*P*Q), the mainloop
# shapes' names as the audit has them (256 x 64 for <= 64 GEMM columns, else
# 128 x 128), the conversions' kernels and the peak their FLOPs go at.
MULTISTAGE = {
    "bf16": dict(e=2, chunk=8, kstep=32, narrow="multistage::Shape<4,1,4,2>",
                 wide="multistage::Shape<2,2,4,2>", elem=BF16, tc="bf16"),
    "tf32": dict(e=4, chunk=4, kstep=16, narrow="multistage::ShapeOf<multistage::Tf32Rounded,4,1,4,2>",
                 wide="multistage::ShapeOf<multistage::Tf32Rounded,2,2,4,2>", elem="float", tc=True),
}


def conv_multistage(step, s, need_dx):
    """The launches of conv rung 08 (amp: bfloat16 operands) or 09 (tf32:
    float32 operands rounded to TF32 by the conversions) for one layer
    (kernels/cuda/conv/nhwc_rung.cuh): every operand converted to
    channels-last (to_channels_last: NCHW -> NHWC, channels padded to a
    whole 16-byte chunk) before each direction's GEMM on the multistage
    mainloop: 256 x 64 tiles ("Narrow") where the GEMM's columns are <= 64,
    else 128 x 128 ("Wide"); 128 threads, 2 blocks an SM. Executed FLOPs:
    the reduction as the main loop steps it, whole k-steps of a tap's
    channels (32 bfloat16 or 16 float32; C = 1 runs a whole step);
    backward-weight's GEMM rows are R*S*Cp."""
    ms = MULTISTAGE["bf16" if step.rung8 else "tf32"]
    n, c, h, k, r, p = s["N"], s["C"], s["H"], s["K"], s["R"], s["P"]
    e, ks = ms["e"], ms["kstep"]
    cp, kp = up(c, ms["chunk"]), up(k, ms["chunk"])
    useful = 2.0 * n * k * p * p * c * r * r
    cast = f"{CONV}to_channels_last<{ms['elem']}>"

    def tile(cols):
        return (ms["narrow"], 256, 64) if cols <= 64 else (ms["wide"], 128, 128)

    def to_nhwc(images, chans, hw, padded):
        """[images, chans, hw] (NCHW, or KCRS) read, [images, hw, padded]
        written: tiles of 32 hw x 32 channels, one block each."""
        step.add("shipped", cast, 0, e * images * hw * (chans + padded),
                 blocks=images * math.ceil(hw / 32) * math.ceil(padded / 32))

    def gemm(kernel, flops, executed, nbytes, blocks):
        step.launches["shipped"].append(step.launch(kernel, kernel, executed, nbytes, blocks, ms["tc"],
                                                    useful=flops))

    # forward: x and w to NHWC / KRSC, then y = forward_nhwc (bias in the epilogue)
    step.part = "conversions"
    to_nhwc(n, c, h * h, cp)
    to_nhwc(k, c, r * r, cp)
    step.part = "forward"
    shape, bm, bn = tile(k)
    gemm(f"{CONV}forward_nhwc<{shape}>", useful, 2.0 * n * p * p * k * r * r * up(c, ks),
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
            step.add("shipped", f"{CONV}flipped_to_channels_last<{ms['elem']}>", 0,
                     e * (k * c * t * u + c * t * u * kp), blocks=math.ceil(c * t * u * kp / 256))
            step.part = "backward-data"
            pixels = n * rows * cols
            gemm(f"{CONV}forward_nhwc<{shape}>", useful * pixels * t * u / spans,
                 2.0 * pixels * c * t * u * up(k, ks), e * (n * p * p * kp + c * t * u * kp + pixels * c),
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
    if splits > 1:  # wgrad_plan: chunks of whole k-steps
        chunk = up(chunk, ks)
        splits = -(-npq // chunk)
    gemm(f"{CONV}backward_weight_nhwc<{shape}>", useful, 2.0 * rows * k * up(npq, ks),
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
         "backward-weight": "conv backward-weight", "conversions": "conv layout conversions (rungs 08, 09)",
         "split sums": "conv split-K sums (`add_partials`)",
         "rest": "rest of the step (bias gradients, BatchNorm, elementwise, pooling, linear layers, loss, SGD, casts)"}
MEMSET = "cudaMemsetAsync"  # not a kernel: the audit has no row for it


def linear(step, b, fin, fout, float_input=False):
    """float_input: under amp, x is float32 (ResNet's pooled features): cast
    to bfloat16, and its bfloat16 gradient cast back."""
    flops = 2.0 * b * fin * fout
    step.convert(fin * fout, True, first_step=True)  # amp: the weight's copy
    if float_input:
        step.convert(b * fin, True)
    e = step.e  # the operands' bytes; amp: y and dx bfloat16 from the epilogue, dw float32
    chunk = 16 // (2 if step.amp else F)  # elements of a 16-byte chunk
    # Each product's operands as stored, (rows, row stride) in elements, each
    # contiguous: y = x W^T (x, W), dx = dy W (dy, W), dW = dy^T x (dy, x).
    # GEMM 11 and 12 copy one whose stride is not whole chunks (the tensors'
    # bases are: the allocator rounds to 512 bytes): the classifier's dy.
    x, w, dy = (b, fin), (fout, fin), (b, fout)
    for (ta, tb), m, n, k, operands in (((0, 1), b, fout, fin, (x, w)), ((0, 0), b, fin, fout, (dy, w)),
                                        ((1, 0), fout, fin, b, (dy, x))):
        flags = f"<{'true' if ta else 'false'},{'true' if tb else 'false'}>"
        bias = F * fout if step.amp and (ta, tb) == (0, 1) else 0  # amp: the bias in the GEMM's epilogue
        read = sum(rows * ld for rows, ld in operands)
        step.gemm(f"{GEMM}gemm_split_k{flags}", f"{GEMM}gemm_register_blocked{flags}", m, n, k, flops,
                  e * read + bias, out=F if ta else e,
                  copies=[rows * ld for rows, ld in operands if ld % chunk])
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
    for n in relu:  # ReLU, an op of core/pointwise.h; the frozen baseline audit's relu_*_kernel
        for direction, nbytes in (("forward", 2 * n), ("backward", 3 * n)):
            row = f"{EW}pointwise_{direction}_kernel<anvil::Relu>"
            step.add("shipped", step.native(row), 0, e * nbytes, row=row)
            step.add("baseline", f"{EW}relu_{direction}_kernel", 0, e * nbytes, row=row)
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
    and one SGD launch for every parameter tensor."""
    logits, labels = F * b * CLASSES, 8 * b
    # The labels checked on the device (reduce/label_check.cu): one block reads
    # them; its record is written only for a bad label. The baseline's frozen
    # audit ran label_min_max_kernel there (one block, the labels' min and max).
    step.add("shipped", RED + "label_check_kernel", 0, labels, blocks=1)
    step.add("baseline", RED + "label_min_max_kernel", 0, labels, row=RED + "label_check_kernel", blocks=1)
    for kernel, nbytes in (
            (SOFT + "forward_warp_per_row", 2 * logits + F * b + labels),
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
    # amp: a conv or linear weight's bfloat16 copy, rewritten by the same launch
    step.add("shipped", SGD, 0, sum(F * 3 * p + (2 * p if step.amp and copy else 0) for p, copy in params),
             blocks=sum(math.ceil(p / SGD_CHUNK) for p, _ in params))
    for p, _ in params:
        step.add("baseline", SGD_PER_TENSOR, 0, F * 3 * p, row=SGD)


def build(model, batch, tf32=False, amp=False, rung8=False, rung9=False):
    """The launches of one training step, and the step's GEMM FLOPs. amp:
    the TF32 step ("baseline") and the bfloat16 autocast step ("shipped");
    rung8 (with amp): the bfloat16 step on conv rung 07 ("baseline") and on
    conv rung 08 ("shipped"); rung9 (with tf32): the TF32 step on conv rung
    06 ("baseline") and on conv rung 09 ("shipped")."""
    if (amp and rung8) or (tf32 and rung9 and not amp):
        before = build_one(model, batch, Step(tf32=not amp, amp=amp))
        after = build_one(model, batch, Step(tf32=not amp, amp=amp, rung8=amp, rung9=not amp))
        before.launches["baseline"] = before.launches["shipped"]
        before.launches["shipped"] = after.launches["shipped"]
        before.first_step = after.first_step
        return before
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
                # BatchNorm and the ReLU after it fused, forward and backward (nn/layers.cpp,
                # Residual and Sequential; core/ops_nn.cpp's batch_norm_op): a block's first
                # conv (and the stem) by batch_norm_relu, its second by batch_norm_add_relu,
                # the shortcut added in the same passes (no add, no ReLU of its own).
                stage = s["name"].split()[1]
                first_of_block = stage == "stem" or sum("shortcut" not in t["name"] for t in stages[stage]) % 2 == 1
                step.batch_norm(s["N"], s["K"], s["P"] ** 2, relu=True, residual=not first_of_block)
                params += [(s["K"], False), (s["K"], False)]
        for name, convs in stages.items():  # two residuals a stage, after the stem
            if name == "stem":
                continue
            first = convs[0]
            y_in = batch * first["K"] * first["P"] ** 2  # the second block's input, the first's output
            # backward: the gradient sums where a block's input forks (conv1 and the shortcut)
            elementwise(step, adds=[batch * first["C"] * first["H"] ** 2, y_in])
        top = resnet[-1]
        elementwise(step, pool=[(batch * top["K"] * top["P"] ** 2, batch * top["K"])], float_pool=True)
        linear(step, batch, top["K"], CLASSES, float_input=True)
        params += [(top["K"] * CLASSES, True), (CLASSES, False)]
    loss_and_sgd(step, batch, params)
    return step
