#!/usr/bin/env python3
"""Builds the kernel table (docs/generated/kernel-table.md) from what nvcc made for sm_90.

Called by tools/predict/kernel-table.sh with the folder holding, for every
kernels/cuda/NAME.cu (a family folder's FAMILY/FILE.cu as FAMILY__FILE), NAME.ptxas (nvcc -Xptxas -v), NAME.sass (cuobjdump
--dump-sass) and NAME.names (the mangled kernel names, demangled, one
"mangled<TAB>demangled" per line). Prints the table's Markdown, and writes FOLDER/kernel-resources.json (each kernel's
registers and static shared memory, for the simulator's launch audit, and a
tensor-core kernel's main loop, for tools/predict/step_time.py's issue bound).
Standard library only.

Occupancy uses the documented limits of one H100 SM (compute capability 9.0,
CUDA C++ Programming Guide, "Technical Specifications per Compute
Capability"); the roofline uses the H100 SXM5 datasheet's FP32 peak and HBM3
bandwidth. Nothing here is measured: see docs/kernels.md for what each figure
means, and bench_cuda_kernels for times on a GPU.
"""
import json
import math
import re
import sys
from pathlib import Path

# ---- one H100 SM (compute capability 9.0) and the whole H100 SXM5 ----
SM_THREADS = 2048
SM_WARPS = 64
SM_BLOCKS = 32
SM_REGS = 65536
REG_UNIT = 256            # registers are allocated per warp in units of 256
SM_SMEM = 228 * 1024      # shared memory per SM (bytes), the largest carveout
SMEM_RESERVED = 1024      # per block, reserved by the system
SMEM_UNIT = 128
SMS = 132
FP32_PEAK = 66.9e12       # 132 SMs x 128 FP32 lanes x 2 x 1.98 GHz
HBM_BW = 3.35e12          # bytes/s
RIDGE = FP32_PEAK / HBM_BW

# ---- what each kernel is: ladder rung, threads per block (as launched) ----
# kernel base name -> (family and rung, threads per block or None when the
# block size comes from a warp_tile::Shape template argument)
KERNELS = {
    "gemm_naive": ("gemm 1", 1024),
    "gemm_coalesced": ("gemm 2", 1024),
    "gemm_tiled": ("gemm 3", 1024),
    "gemm_register_blocked": ("gemm 4", 256),
    "gemm_vectorised": ("gemm 5", 256),
    "gemm_warp_tiled": ("gemm 6", 256),
    "gemm_double_buffered": ("gemm 7", 256),
    "gemm_split_k": ("gemm 8", 256),
    "gemm_mma": ("gemm 9, 10, 11, 12", None),  # by its tile: MMA_RUNGS
    "add_partials": ("split-K sum", 256),
    "add_partials_by_warp": ("split-K sum", 256),
    "forward_naive": ("conv 1", 256),
    "backward_data_naive": ("conv 1", 256),
    "backward_weight_naive": ("conv 1", 256),
    "im2col": ("conv 2", 256),
    "col2im": ("conv 2", 256),
    "gather_dy": ("conv 2", 256),
    "to_nchw": ("conv 2", 256),
    "forward_implicit": ("conv 3", 256),
    "backward_data_implicit": ("conv 3", 256),
    "backward_weight_implicit": ("conv 3", 256),
    "forward_warp_tiled": ("conv 4, 5", None),
    "backward_data_warp_tiled": ("conv 4, 5", None),
    "backward_weight_warp_tiled": ("conv 4, 5", None),
    "sum_atomic": ("sum 1", 256),
    "sum_tree": ("sum 2", 256),
    "sum_shuffle": ("sum 3", 256),
    "sum_partials": ("sum 4", 256),
    "sum_final": ("sum 4", 256),
    "channel_sum_kernel": ("channel_sum 1", 256),
    "channel_sum_split": ("channel_sum 2", 256),
    "channel_sum_fold": ("channel_sum 2", 256),
    "column_sum_rows": ("channel_sum 2", 256),
    "forward_train_kernel": ("batchnorm 1", 256),
    "backward_train_kernel": ("batchnorm 1", 256),
    "forward_stats_split": ("batchnorm 2", 256),
    "forward_fold": ("batchnorm 2", 256),
    "forward_normalize_split": ("batchnorm 2", 256),
    "backward_sums_split": ("batchnorm 2", 256),
    "backward_fold": ("batchnorm 2", 256),
    "backward_dx_split": ("batchnorm 2", 256),
    "forward_thread_per_row": ("softmax 1", 128),
    "forward_block_per_row": ("softmax 2", 256),
    "forward_warp_per_row": ("softmax 3", 256),
}

# Split reductions (channel_split.cuh): a row per instantiation, named by its
# unit width and index type ("V4 int"), as they differ in registers and in
# the 16-byte loads that only V = 4 makes.
SPLIT_KERNELS = {"channel_sum_split", "forward_stats_split", "forward_normalize_split",
                 "backward_sums_split", "backward_dx_split"}

# What the explanations at the top of the kernel files claim, checked in the
# SASS: 16-byte global loads (LDG.E.128), 16-byte shared loads (LDS.128).
# Every kernel also claims no local memory (no LDL/STL, no stack frame).
CLAIMS = {
    "gemm_vectorised": {"ldg128", "lds128"},
    "gemm_warp_tiled": {"ldg128", "lds128"},
    "gemm_double_buffered": {"ldg128", "lds128"},
    "gemm_split_k": {"ldg128", "lds128"},
    "forward_warp_tiled": {"ldg128", "lds128"},
    "backward_data_warp_tiled": {"lds128"},
    "backward_weight_warp_tiled": {"lds128"},
    # (a bfloat16 unit of 4 is two 32-bit loads: the "bf16 in memory" rows claim none)
    **{(base, f"V4 {index}"): {"ldg128"} for base in SPLIT_KERNELS for index in ("int", "long")},
}
# The tensor-core tiles (mma_tile.cuh, tile "tf32 ..." or "bf16 ..."): their
# fragment loads are 32-bit (no LDS.128 claimed); the global loads of a
# strided float32 operand are 16-byte where aligned (a bfloat16 one's, the
# rows "bf16 in memory", 8-byte). Every one also claims HMMA and
# no FFMA in its main loop (checked below). The tiles on the multistage
# mainloop copy global to shared memory with 16-byte cp.async (LDGSTS.128)
# instead and claim LDSM in their main loops: GEMM rung 12's
# (mma_ldmatrix.cuh, "bf16 ... ldmatrix N"), conv rung 08's ("bf16 ...
# multistage N") and GEMM rung 11's ("tf32 ... multistage N", whose main
# loop with both operands contiguous along j reads them by LDS instead: the
# one the table shows has LDSM).
MMA_CLAIMS = {"gemm_mma": {"ldg128"}, "forward_warp_tiled": {"ldg128"}}
PIPELINED_CLAIMS = {"ldgsts128"}
# What a kernel on a tensor-core tile is, by its tile's math (and pipeline):
# GEMM rung 9, 10 or 11; the convolution kernels are rung 6 (TF32) or 7
# (BF16), not 4 and 5.
CONV_WARP_TILED = ("forward_warp_tiled", "backward_data_warp_tiled", "backward_weight_warp_tiled")
MMA_RUNGS = {("gemm_mma", "tf32"): "gemm 9", ("gemm_mma", "bf16"): "gemm 10",
                ("gemm_mma", "tf32 multistage"): "gemm 11",
                ("gemm_mma", "bf16 ldmatrix"): "gemm 12",
                ("forward_nhwc", "bf16 multistage"): "conv 8",
                ("backward_weight_nhwc", "bf16 multistage"): "conv 8",
                ("forward_nhwc", "tf32 multistage"): "conv 9",
                ("backward_weight_nhwc", "tf32 multistage"): "conv 9",
                **{(base, "tf32"): "conv 6" for base in CONV_WARP_TILED},
                **{(base, "bf16"): "conv 7" for base in CONV_WARP_TILED}}


def base_and_tile(demangled):
    """('gemm_double_buffered', '') or ('forward_warp_tiled', '64x128'), and
    the warp_tile::Shape's threads per block (or None)."""
    name = demangled.removeprefix("void ")
    depth, params = 0, ""
    for i, ch in enumerate(name):  # cut the parameter list (at template depth 0)
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif ch == "(" and depth == 0:
            name, params = name[:i], name[i:]
            break
    shape = re.search(r"warp_tile::Shape<([\d, ]+)>", name)
    mma = re.search(r"mma_tile::Shape<[\w:]*mma_tile::(Tf32|Bf16), (\d+), (\d+), \d+>", name)
    tf32 = re.search(r"(?:mma_ldmatrix|multistage)::ShapeOf<[\w:]*multistage::Tf32(?:Rounded)?, (\d+), (\d+), "
                     r"(\d+), \d+>", name)
    ldmatrix = re.search(r"mma_ldmatrix::Shape<(\d+), (\d+), (\d+), \d+>", name)
    multistage = re.search(r"multistage::Shape<(\d+), (\d+), (\d+), \d+>", name)
    base = re.sub(r"<.*", "", name).split("::")[-1]
    if tf32:  # GEMM rung 11, conv rung 09: 64 x 64 per warp, dynamic shared memory
        wm, wn, stages = (int(tf32.group(i)) for i in (1, 2, 3))
        return base, f"tf32 {64 * wm}x{64 * wn} multistage {stages}", 32 * wm * wn
    if multistage:  # 64 x 64 per warp, dynamic shared memory (multistage_shared_bytes)
        wm, wn, stages = (int(multistage.group(i)) for i in (1, 2, 3))
        return base, f"bf16 {64 * wm}x{64 * wn} multistage {stages}", 32 * wm * wn
    if ldmatrix:  # GEMM rung 12: 64 x 64 per warp, bfloat16 operands only
        wm, wn, stages = (int(ldmatrix.group(i)) for i in (1, 2, 3))
        return base, f"bf16 {64 * wm}x{64 * wn} ldmatrix {stages}", 32 * wm * wn
    if mma:  # 64 x 32 per warp; the instantiation that reads bfloat16 operands from memory apart
        wm, wn = int(mma.group(2)), int(mma.group(3))
        operands = ", bf16 in memory" if name.endswith("anvil::bfloat16>") else ""
        return base, f"{mma.group(1).lower()} {64 * wm}x{32 * wn}{operands}", 32 * wm * wn
    split = re.search(r"<(\d+), (\w+)>$", name)
    if base in SPLIT_KERNELS and split:  # channel_sum_split's overload on a bfloat16 dy apart
        operands = ", bf16 in memory" if "anvil::bfloat16 const*" in params else ""
        return base, f"V{split.group(1)} {split.group(2)}{operands}", None
    if not shape:
        return base, "", None
    bk, wm, wn, lanes_m, sub_m, sub_n, _stages, _min_blocks = (int(v) for v in shape.group(1).split(","))
    bm = wm * sub_m * lanes_m * 4
    bn = wn * sub_n * (32 // lanes_m) * 4
    return base, f"{bm}x{bn}", 32 * wm * wn


def multistage_shared_bytes(tile, base=""):
    """The dynamic shared memory a multistage kernel is launched with
    (mma_multistage.cuh's ShapeOf::kSharedBytes): bf16, stages x (BM + BN) x
    32 of k x 2 bytes (conv rung 08: always dynamic; GEMM rung 12, "ldmatrix N",
    only past 48 KB); tf32, stages x 16 of k
    x (BM + 8 + BN + 8) x 4 bytes (each operand's room that of its padded
    layout), dynamic only past 48 KB for GEMM rung 11 (its 2 stages are
    static, in ptxas's report), always for conv rung 09 (a kernel `base`
    ending in _nhwc); 0 for another tile."""
    m = re.match(r"bf16 (\d+)x(\d+) multistage (\d+)$", tile)
    if m:
        return int(m.group(3)) * (int(m.group(1)) + int(m.group(2))) * 32 * 2
    m = re.match(r"bf16 (\d+)x(\d+) ldmatrix (\d+)$", tile)
    if m:
        nbytes = int(m.group(3)) * (int(m.group(1)) + int(m.group(2))) * 32 * 2
        return nbytes if nbytes > 48 * 1024 else 0
    m = re.match(r"tf32 (\d+)x(\d+) multistage (\d+)$", tile)
    if m:
        nbytes = int(m.group(3)) * 16 * (int(m.group(1)) + 8 + int(m.group(2)) + 8) * 4
        return nbytes if nbytes > 48 * 1024 or base.endswith("_nhwc") else 0
    return 0


def source_file(stem):
    """kernel-table.sh's name of a file back to its path under kernels/cuda."""
    return stem.replace("__", "/") + ".cu"


def parse_ptxas(text):
    """mangled name -> dict(regs, smem, stack, spill_st, spill_ld)."""
    out, cur = {}, None
    for line in text.splitlines():
        m = re.search(r"Compiling entry function '([^']+)' for 'sm_90'", line)
        if m:
            cur = out.setdefault(m.group(1), {"regs": 0, "smem": 0, "stack": 0, "spill": 0})
            continue
        if cur is None:
            continue
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m:
            cur["stack"] = int(m.group(1))
            cur["spill"] = int(m.group(2)) + int(m.group(3))
        m = re.search(r"Used (\d+) registers", line)
        if m:
            cur["regs"] = int(m.group(1))
            s = re.search(r"(\d+) bytes smem", line)
            cur["smem"] = int(s.group(1)) if s else 0
    return out


INSTR = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)([^;]*);")


def parse_sass(text):
    """mangled name -> list of (address, opcode, operands)."""
    out, cur = {}, None
    for line in text.splitlines():
        m = re.search(r"Function : (\S+)", line)
        if m:
            cur = out.setdefault(m.group(1), [])
            continue
        m = INSTR.search(line)
        if m and cur is not None:
            cur.append((int(m.group(1), 16), m.group(3), m.group(4)))
    return out


def sass_facts(instrs):
    """Counts over the whole kernel, and the FFMA share of its main loop: the
    backward branch whose loop body holds the most FFMAs (static count)."""
    ops = [op for _, op, _ in instrs]
    facts = {
        "ldg128": sum(op.startswith("LDG.") and ".128" in op for op in ops),
        "lds128": sum(op.startswith("LDS") and ".128" in op for op in ops),
        "ldgsts128": sum(op.startswith("LDGSTS") and ".128" in op for op in ops),
        "local": sum(op.startswith(("LDL", "STL")) for op in ops),
        "ffma": sum(op == "FFMA" for op in ops),
        "loop_ffma": 0,
        "loop_len": 0,
        # The loop with the most HMMA, the shortest of those (a kernel with a
        # fast path and a fallback loop: the fast one): (HMMA, FFMA, instructions, LDSM).
        "loop_hmma": (0, 0, 0, 0),
    }
    # Basic blocks: a block starts at a branch target and after a branch.
    targets = {int(t.group(1), 16) for _, op, args in instrs if op == "BRA"
               for t in [re.search(r"0x([0-9a-f]+)", args)] if t}
    block, blocks = [], []
    for addr, op, _ in instrs:
        if addr in targets and block:
            blocks.append(block)
            block = []
        block.append(op)
        if op in ("BRA", "EXIT", "RET", "BAR"):
            blocks.append(block)
            block = []
    blocks.append(block)
    densest = max(blocks, key=lambda b: sum(o == "FFMA" for o in b))
    facts["block_ffma"] = sum(o == "FFMA" for o in densest)
    facts["block_len"] = len(densest)
    for i, (addr, op, args) in enumerate(instrs):
        if op != "BRA":
            continue
        t = re.search(r"0x([0-9a-f]+)", args)
        if not t or int(t.group(1), 16) >= addr:
            continue
        target = int(t.group(1), 16)
        body = [o for a, o, _ in instrs if target <= a <= addr]
        ffma = sum(o == "FFMA" for o in body)
        if ffma > facts["loop_ffma"]:
            facts["loop_ffma"], facts["loop_len"] = ffma, len(body)
        hmma = sum(o.startswith("HMMA") for o in body)
        best = facts["loop_hmma"]
        if hmma > best[0] or (hmma == best[0] and hmma > 0 and len(body) < best[2]):
            facts["loop_hmma"] = (hmma, ffma, len(body), sum(o.startswith("LDSM") for o in body))
    return facts


def occupancy(threads, regs, smem):
    """Resident blocks per SM and the limiting resource."""
    warps = math.ceil(threads / 32)
    regs_per_warp = math.ceil(max(regs, 1) * 32 / REG_UNIT) * REG_UNIT
    by_regs = (SM_REGS // regs_per_warp) // warps
    smem_block = math.ceil((smem + SMEM_RESERVED) / SMEM_UNIT) * SMEM_UNIT
    limits = {
        "threads": SM_THREADS // threads,
        "registers": by_regs,
        "shared memory": SM_SMEM // smem_block,
        "blocks": SM_BLOCKS,
    }
    blocks = min(limits.values())
    limiter = min(limits, key=lambda k: (limits[k], k != "threads"))
    return blocks, blocks * warps / SM_WARPS, limiter


def kernel_rows(folder):
    rows = {}
    for ptxas in sorted(folder.glob("*.ptxas")):
        name = ptxas.stem
        res = parse_ptxas(ptxas.read_text())
        sass = parse_sass((folder / f"{name}.sass").read_text())
        names = dict(line.split("\t", 1) for line in (folder / f"{name}.names").read_text().splitlines() if "\t" in line)
        for mangled, r in res.items():
            base, tile, shape_threads = base_and_tile(names.get(mangled, mangled))
            rung, threads = KERNELS.get(base, ("", 256))
            if tile.startswith(("tf32", "bf16")):
                math_key = tile[:4] + next((" " + w for w in ("ldmatrix", "multistage")
                                            if w in tile), "")
                rung = MMA_RUNGS.get((base, math_key), rung)
            threads = shape_threads or threads
            facts = sass_facts(sass.get(mangled, []))
            key = (source_file(name), base, tile)
            row = rows.setdefault(key, {"rung": rung, "threads": threads, "count": 0, "regs": [],
                                        "smem": 0, "stack": 0, "spill": 0, "ldg128": [], "lds128": [],
                                        "ldgsts128": [],
                                        "local": 0, "loop": [], "block": [], "hmma": []})
            row["count"] += 1
            row["regs"].append(r["regs"])
            row["smem"] = max(row["smem"], r["smem"] + multistage_shared_bytes(tile, base))
            row["stack"] = max(row["stack"], r["stack"])
            row["spill"] = max(row["spill"], r["spill"])
            row["ldg128"].append(facts["ldg128"])
            row["lds128"].append(facts["lds128"])
            row["ldgsts128"].append(facts["ldgsts128"])
            row["local"] = max(row["local"], facts["local"])
            if facts["loop_len"]:
                row["loop"].append((facts["loop_ffma"], facts["loop_len"]))
            if facts["block_ffma"]:
                row["block"].append((facts["block_ffma"], facts["block_len"]))
            row["hmma"].append(facts["loop_hmma"])
    return rows


def kernel_table(rows):
    out = ["| file | kernel | rung | inst. | threads | registers | spills | stack | smem | "
           "blocks/SM (limit) | occupancy | LDG.128 | LDS.128 | LDGSTS.128 | local mem | FFMA, densest block | "
           "FFMA / instr., main loop |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    problems = []
    for (cu, base, tile), r in sorted(rows.items(), key=lambda kv: (kv[0][0], kv[1]["rung"], kv[0][1], kv[0][2])):
        regs = f"{min(r['regs'])}" if min(r["regs"]) == max(r["regs"]) else f"{min(r['regs'])}-{max(r['regs'])}"
        blocks, occ, limiter = occupancy(r["threads"], max(r["regs"]), r["smem"])
        mma = tile.startswith(("tf32", "bf16"))
        claims = MMA_CLAIMS.get(base, set()) if mma else CLAIMS.get((base, tile), CLAIMS.get(base, set()))
        if tile.endswith("bf16 in memory"):  # a quad of bfloat16 is one 8-byte load
            claims = claims - {"ldg128"}
        if "ldmatrix" in tile or "multistage" in tile:
            claims = PIPELINED_CLAIMS
        cells = []
        for what in ("ldg128", "lds128", "ldgsts128"):
            n = min(r[what])
            cell = str(n) if n == max(r[what]) else f"{n}-{max(r[what])}"
            if what in claims:
                cell += "" if n > 0 else " **claimed, absent**"
                if n == 0:
                    problems.append(f"{base} {tile}: no {what.upper()} in the SASS, though its explanation claims them")
            cells.append(cell)
        no_local = r["local"] == 0 and r["stack"] == 0
        if not no_local:
            problems.append(f"{base} {tile}: local memory (stack {r['stack']} B, {r['local']} LDL/STL)")
        if r["spill"]:
            problems.append(f"{base} {tile}: {r['spill']} bytes of spills")
        local_cell = "none" if no_local else f"**stack {r['stack']} B, {r['local']} LDL/STL**"
        loop = max(r["loop"], default=None)
        loop_cell = f"{loop[0]} / {loop[1]}" if loop else "-"
        if mma:  # main loop: the one with the HMMA; it must hold no FFMA
            fewest = min(h for h, _, _, _ in r["hmma"])
            worst_ffma = max(f for _, f, _, _ in r["hmma"])
            longest = max(n for _, _, n, _ in r["hmma"])
            ldsm = min(m for _, _, _, m in r["hmma"])
            per_hmma = longest / fewest if fewest else float("inf")
            loop_cell = f"HMMA {fewest}, FFMA {worst_ffma} / {longest} ({per_hmma:.2f} per HMMA)"
            if "ldmatrix" in tile or "multistage" in tile:
                loop_cell = (f"HMMA {fewest}, LDSM {ldsm}, FFMA {worst_ffma} / {longest} "
                             f"(**{per_hmma:.2f}** per HMMA)")
                # (GEMM rung 11 reads operands contiguous along j by LDS: with
                # both so, its main loop has no LDSM.)
                if ldsm == 0 and not tile.startswith("tf32"):
                    problems.append(f"{base} {tile}: no LDSM in its main loop ({loop_cell})")
                # The multistage mainloop's bound: an SM issues 4 instructions a
                # clock and finishes about one HMMA a clock (docs/kernels.md).
                if per_hmma > 4:
                    problems.append(f"{base} {tile}: {per_hmma:.2f} instructions per HMMA in its "
                                    "main loop, over the 4 an SM issues per HMMA")
            if fewest == 0 or worst_ffma > 0:
                problems.append(f"{base} {tile}: main loop without HMMA or with FFMA ({loop_cell})")
        block = max(r["block"], default=None)
        block_cell = f"{block[0]} / {block[1]} ({100 * block[0] / block[1]:.0f}%)" if block else "-"
        name = f"`{base}`" + (f" {tile}" if tile else "")
        out.append(f"| {cu} | {name} | {r['rung']} | {r['count']} | {r['threads']} | {regs} | {r['spill']} | "
                   f"{r['stack']} | {r['smem']} | {blocks} ({limiter}) | {100 * occ:.0f}% | {cells[0]} | "
                   f"{cells[1]} | {cells[2]} | {local_cell} | {block_cell} | {loop_cell} |")
    return out, problems, rows


# ---- the shapes LeNet and ResNet-18 train on ----

def conv(name, n, c, h, k, r, stride, pad, count=1):
    p = (h + 2 * pad - r) // stride + 1
    return {"name": name, "N": n, "C": c, "H": h, "K": k, "R": r, "stride": stride, "pad": pad, "P": p,
            "count": count}


def layers(batch=256):
    """The conv layers of LeNet and ResNet-18 (with repeat counts) and LeNet's
    linear layers, at `batch` images (shape_table uses 256; tools/predict/step_time.py
    imports this for other batches)."""
    lenet = [conv("LeNet conv1 1->20 3x3 @28", batch, 1, 28, 20, 3, 1, 0),
             conv("LeNet conv2 20->50 5x5 @13", batch, 20, 13, 50, 5, 1, 0)]
    lenet_fc = [("LeNet fc1 800->128", batch, 800, 128), ("LeNet fc2 128->10", batch, 128, 10)]
    resnet = [conv("ResNet stem 1->64 3x3 @28", batch, 1, 28, 64, 3, 1, 1),
              conv("ResNet s1 64->64 3x3 @28", batch, 64, 28, 64, 3, 1, 1, 4),
              conv("ResNet s2 64->128 3x3/2 @28", batch, 64, 28, 128, 3, 2, 1),
              conv("ResNet s2 128->128 3x3 @14", batch, 128, 14, 128, 3, 1, 1, 3),
              conv("ResNet s2 shortcut 1x1/2 @28", batch, 64, 28, 128, 1, 2, 0),
              conv("ResNet s3 128->256 3x3/2 @14", batch, 128, 14, 256, 3, 2, 1),
              conv("ResNet s3 256->256 3x3 @7", batch, 256, 7, 256, 3, 1, 1, 3),
              conv("ResNet s3 shortcut 1x1/2 @14", batch, 128, 14, 256, 1, 2, 0),
              conv("ResNet s4 256->512 3x3/2 @7", batch, 256, 7, 512, 3, 2, 1),
              conv("ResNet s4 512->512 3x3 @4", batch, 512, 4, 512, 3, 1, 1, 3),
              conv("ResNet s4 shortcut 1x1/2 @7", batch, 256, 7, 512, 1, 2, 0)]
    return lenet, lenet_fc, resnet


def conv_gemms(s):
    """(direction, M, N, K, bytes) of the three implicit GEMMs of a layer."""
    x = s["N"] * s["C"] * s["H"] * s["H"]
    w = s["K"] * s["C"] * s["R"] * s["R"]
    y = s["N"] * s["K"] * s["P"] * s["P"]
    npq, crs = s["N"] * s["P"] * s["P"], s["C"] * s["R"] * s["R"]
    return [("fwd", s["K"], npq, crs, 4 * (x + w + y)),
            ("bwdD", s["C"], s["N"] * s["H"] * s["H"], s["K"] * s["R"] * s["R"], 4 * (y + w + x)),
            ("bwdW", s["K"], crs, npq, 4 * (x + y + w))]


def tiles(m, n, bm, bn):
    return math.ceil(m / bm) * math.ceil(n / bn)


def chunk_length(k, splits):
    """split_k.h's chunk_length: ceil(k / splits), rounded up to 16."""
    return -(-(-(-k // splits)) // 16) * 16


def max_splits(k):
    """split_k.h's max_splits: the most chunks of k with every chunk but the
    last at least 128 long (the aligned chunk, not k / 128: 500 -> 4)."""
    s = k // 128
    while s >= 1:
        nxt = chunk_length(k, s + 1)
        if nxt < 128 or -(-k // nxt) != s + 1:
            break
        s += 1
    return s


def split_k(m, n, k, tiles, per_sm):
    """kernels/cuda/gemm/split_k.h's plan: (splits, chunk) of a reduction of k."""
    wave = SMS * per_sm
    if tiles >= wave:
        return 1, k
    most = min(max_splits(k), 1024, (1 << 26) // max(1, m * n))
    splits, best = 1, tiles / wave
    for s in range(2, most + 1):
        blocks = tiles * s
        waves = -(-blocks // wave)
        if waves > 4:
            break
        if blocks / (waves * wave) > best:
            splits, best = s, blocks / (waves * wave)
    if splits <= 1:
        return 1, k
    chunk = chunk_length(k, splits)
    return -(-k // chunk), chunk


def fill(blocks, per_sm):
    """Share of the SMs' block slots that the launch's last wave leaves busy,
    averaged over its waves: blocks / (waves * SMs * per_sm)."""
    slots = SMS * per_sm
    return blocks / (math.ceil(blocks / slots) * slots)


def shape_table(rows):
    def resident(base, tile):
        for (cu, b, t), r in rows.items():
            if b == base and t == tile:
                return occupancy(r["threads"], max(r["regs"]), r["smem"])[0]
        return 1

    lenet, lenet_fc, resnet = layers()
    out = ["| layer (batch 256) | dir | GEMM M x N x K | GFLOP | MB (min) | FLOP/B | roofline us | bound | "
           "conv 3 blocks (SM fill) | conv 4 tile, blocks (SM fill) | conv 5 blocks (SM fill) |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    totals = {}
    for model, convs in (("LeNet", lenet), ("ResNet-18", resnet)):
        for s in convs:
            useful = 2.0 * s["N"] * s["K"] * s["P"] ** 2 * s["C"] * s["R"] ** 2
            for d, m, n, k, nbytes in conv_gemms(s):
                flop = useful
                extra = 2.0 * m * n * k / useful  # backward-data's zero taps on strided layers
                t = max(flop / FP32_PEAK, nbytes / HBM_BW)
                bound = "FP32" if flop / FP32_PEAK >= nbytes / HBM_BW else "HBM"
                base3 = {"fwd": "forward_implicit", "bwdD": "backward_data_implicit",
                         "bwdW": "backward_weight_implicit"}[d]
                base4 = base3.replace("implicit", "warp_tiled")
                b3 = tiles(m, n, 64, 64)
                tile4 = "64x128" if m <= 64 else "128x128"
                bm4 = 64 if m <= 64 else 128
                b4 = tiles(m, n, bm4, 128)
                f3 = fill(b3, resident(base3, ""))
                f4 = fill(b4, resident(base4, tile4))
                b5 = b4 * split_k(m, n, k, b4, 3 if m <= 64 else 2)[0]
                f5 = fill(b5, resident(base4, tile4))
                times = f" (x{s['count']})" if s["count"] > 1 else ""
                work = f" ({extra:.1f}x the useful work)" if extra > 1.01 else ""
                out.append(f"| {s['name']}{times} | {d} | {m} x {n} x {k}{work} | {flop / 1e9:.2f} | {nbytes / 1e6:.1f} | "
                           f"{flop / nbytes:.0f} | {t * 1e6:.1f} | {bound} | {b3} ({100 * f3:.0f}%) | "
                           f"{tile4}, {b4} ({100 * f4:.0f}%) | {b5} ({100 * f5:.0f}%) |")
                tot = totals.setdefault(model, [0.0, 0.0])
                tot[0] += s["count"] * flop
                tot[1] += s["count"] * t
    for name, batch, fin, fout in lenet_fc:
        for d, m, n, k in (("fwd", batch, fout, fin), ("bwdD", batch, fin, fout), ("bwdW", fout, fin, batch)):
            flop = 2.0 * m * n * k
            nbytes = 4 * (m * k + k * n + m * n)
            t = max(flop / FP32_PEAK, nbytes / HBM_BW)
            bound = "FP32" if flop / FP32_PEAK >= nbytes / HBM_BW else "HBM"
            out.append(f"| {name} | {d} | {m} x {n} x {k} | {flop / 1e9:.3f} | {nbytes / 1e6:.2f} | "
                       f"{flop / nbytes:.0f} | {t * 1e6:.1f} | {bound} | - | - | - |")
            totals["LeNet"][0] += flop
            totals["LeNet"][1] += t
    m = n = k = 4096
    flop, nbytes = 2.0 * m * n * k, 4 * 3 * m * n
    out.append(f"| GEMM 4096^3 (bench) | - | 4096 x 4096 x 4096 | {flop / 1e9:.1f} | {nbytes / 1e6:.0f} | "
               f"{flop / nbytes:.0f} | {flop / FP32_PEAK * 1e6:.0f} | FP32 | - | 128x128, {tiles(m, n, 128, 128)} "
               f"({100 * fill(tiles(m, n, 128, 128), resident('gemm_double_buffered', '')):.0f}%) | - |")
    summary = [f"- {model}: {tot[0] / 1e9:.1f} GFLOP of convolution and linear layers per training step "
               f"(forward + both backward GEMMs), at least {tot[1] * 1e3:.3f} ms on one H100 at the roofline "
               f"(each GEMM at max(FLOP / FP32 peak, minimum bytes / HBM bandwidth))." for model, tot in totals.items()]
    return out, summary


def write_resources(folder, compiler):
    """FOLDER/kernel-resources.json: every kernel instantiation's registers
    and static shared memory for sm_90, by mangled name (g++ mangles the
    simulator build's kernels alike), for the simulator's launch audit
    (sim/launch_audit.cpp); and, for a kernel whose SASS has a loop with
    HMMA, that main loop's HMMA and instructions (sass_facts' loop_hmma,
    static counts), for the step model's issue bound
    (tools/predict/step_time.py)."""
    kernels = {}
    for ptxas in sorted(folder.glob("*.ptxas")):
        names = dict(line.split("\t", 1) for line in (folder / f"{ptxas.stem}.names").read_text().splitlines()
                     if "\t" in line)
        sass = parse_sass((folder / f"{ptxas.stem}.sass").read_text())
        for mangled, r in parse_ptxas(ptxas.read_text()).items():
            kernels[mangled] = {"name": names.get(mangled, mangled), "file": source_file(ptxas.stem),
                                "registers": r["regs"], "static_shared_bytes": r["smem"]}
            hmma, _, instructions, _ = sass_facts(sass.get(mangled, []))["loop_hmma"]
            if hmma > 0:
                kernels[mangled]["main_loop"] = {"hmma": hmma, "instructions": instructions}
    doc = {"source": f"ptxas -v of nvcc -O3 -arch=sm_90 ({compiler}), by tools/predict/kernel-table.sh",
           "kernels": dict(sorted(kernels.items()))}
    (folder / "kernel-resources.json").write_text(json.dumps(doc, indent=1) + "\n")


def main():
    folder = Path(sys.argv[1])
    write_resources(folder, sys.argv[2] if len(sys.argv) > 2 else "nvcc")
    rows = kernel_rows(folder)
    table, problems, rows = kernel_table(rows)
    shapes, summary = shape_table(rows)
    print(f"Built for sm_90 by {sys.argv[2] if len(sys.argv) > 2 else 'nvcc'}; "
          f"H100 SM limits: {SM_THREADS} threads, {SM_WARPS} warps, {SM_BLOCKS} blocks, {SM_REGS} registers "
          f"(allocated per warp in units of {REG_UNIT}), {SM_SMEM // 1024} KB shared memory "
          f"({SMEM_RESERVED} B reserved per block); {SMS} SMs, FP32 peak {FP32_PEAK / 1e12:.1f} TFLOP/s, "
          f"HBM {HBM_BW / 1e12:.2f} TB/s (ridge {RIDGE:.0f} FLOP/byte).")
    print()
    print("\n".join(table))
    print()
    if problems:
        print("Checks that fail:")
        print()
        print("\n".join(f"- {p}" for p in problems))
    else:
        print("Every kernel: no spills, no stack frame, no local-memory instructions; every 16-byte "
              "access an explanation claims is in the SASS.")
    print()
    print("\n".join(shapes))
    print()
    print("\n".join(summary))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
