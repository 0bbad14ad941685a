"""The tables and pages of tools/predict/step_time.py: each step's totals,
its rows by kernel family and by part of the step, the mapping of the
baseline's kernels onto the shipped rows, and docs/generated/step-time*.md.
Standard library only.
"""
import contextlib
import io
import sys
from collections import defaultdict

import kernel_table as kt
from step_launches import PARTS
from step_predict import (BF16_PEAK, GENERATED, ISSUE_PER_CLOCK, RESOURCES_NAME, ROOT, TF32_PEAK,
                          show)

ERAS = {"ieee": ("baseline", "shipped"), "tf32": ("FP32", "TF32"), "bf16": ("TF32", "BF16"),
        "bf16-rung8": ("conv 07", "conv 08"), "tf32-rung9": ("conv 06", "conv 09")}  # the columns' names
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
       ("label_check", "the labels' min and max, which the host waited for -> the first label outside "
                       "[0, classes), kept on the device until the next wait"),
       ("pointwise_", "ReLU's kernels of its own (relu_forward_kernel, relu_backward_kernel) -> "
                      "ReLU as an op of core/pointwise.h, in the pointwise ops' template (the same loop)"),
       ("sgd_multi_tensor", "one launch per parameter tensor -> every parameter in one launch "
                            "(multi-tensor apply, a block per 4096 elements of a tensor)"),
       ("_split", "BatchNorm 1: one block per channel, one kernel a direction (its whole cost on the "
                  "stats / sums row) -> rung 2: C x S slices, stats|sums, fold, normalise|dx; the ReLU after "
                  "it, and a residual block's add before that, in the normalise and dx passes (the "
                  "baseline's relu_*_kernel and add_kernel on their rows)")]


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
    if p["mode"] != "ieee" and p["mode"] != "tf32":
        print("By part of the step (executed FLOPs: the implicit GEMMs' reductions in whole k-steps, a "
              "strided or unpadded backward-data's zero taps included; useful: 2 x the multiply-adds the "
              "result needs):\n")
        print("\n".join(parts_table(p)) + "\n")
    print("\n".join(table(p, 0.01 if a.markdown else 0.0)))
    print("\n\\* effective: roofline / predicted over the row's kernels (several kernels, or the total)"
          + (", the roofline with the issue bound" if p["issue_bound"] else "") + ".\n")
    if p["mode"] in ("bf16-rung8", "tf32-rung9"):
        before, after, env = (("07", "08", "ANVIL_CONV_BF16_RUNG=7") if p["mode"] == "bf16-rung8" else
                              ("06", "09", "ANVIL_CONV_TF32_RUNG=6"))
        print(f"Mapping (conv {before} → conv {after}): the step's convolutions on conv rung {after} "
              f"(the shipped one; `{env}` runs conv {before}): per layer `to_channels_last` of x and w, "
              "`forward_nhwc`; backward-data `to_channels_last` of dy, then per residue class of the stride "
              "with taps `flipped_to_channels_last` and `forward_nhwc` (a `cudaMemsetAsync` of dx first where "
              "a class has none: not a kernel, no audit row, its bytes and the floor counted); "
              "backward-weight `to_channels_last` of x and dy, `backward_weight_nhwc`, split over N*P*Q where "
              f"its tiles are few and summed by `add_partials`. Conv {before}'s rows and conv {after}'s are "
              "different kernels, so each has launches in one column only; every other kernel is the same "
              "in both.\n")
    elif p["mode"] == "bf16":
        print("Mapping (TF32 → BF16): each row's conv 06 or GEMM 11 kernel → the BF16 rung's kernel with "
              "the same tiles and split plan (conv 07: `mma_tile::Shape<Bf16, ...>`; GEMM 12: "
              "`mma_ldmatrix::Shape<2,2,4,2>`), bfloat16 "
              "operands, bfloat16 y and dx from the epilogue or `add_partials`, float32 weight "
              "gradients; the linear bias in the epilogue, so no `add_channel_bias_kernel`); relu, add, BatchNorm and LeNet's pooling → their bfloat16 "
              "instantiations (`<anvil::bfloat16>`), ResNet's global pooling → its kernels reading bfloat16 x "
              "into float32 y and float32 dy into bfloat16 dx; "
              "`float_to_bf16_kernel` and `bf16_to_float_kernel` are the BF16 step's alone; GEMM 11 and 12 "
              "first copy an operand that is not 16-byte aligned (the classifier's dy) to an aligned one, "
              "one `copy_rows_kernel` launch each (`<unsigned int>` for float32, `<unsigned short>` for "
              "bfloat16); every other kernel is the same in both.\n")
    elif p["tf32"]:
        print("Mapping (FP32 → TF32): each row's conv 05 or GEMM 08 kernel → the TF32 rung's kernel with "
              "the same tiles and split plan (conv 06, GEMM 11); GEMM 11 first copies an operand that is "
              "not 16-byte aligned (the classifier's dy) to an aligned one, one `copy_rows_kernel` launch "
              "each, the TF32 step's alone; every other kernel is the same in both.\n")
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


def render(preds, a):
    if a.fp32_precision == "tf32" and a.amp != "bf16" and a.conv_tf32_rung == 9:
        print(f"TF32, conv rung 06 → 09: H100 SXM5 dense TF32 {TF32_PEAK / 1e12:.1f} TFLOP/s x --tc-efficiency "
              f"{a.tc_efficiency:g} for the conv and GEMM launches of both steps.")
    elif a.amp == "bf16" and a.conv_bf16_rung == 8:
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


def write_page(preds, a):
    """docs/generated/step-time*.md of the mode: all four steps as --markdown
    prints them; rewritten with a.write, else checked (exit 1 unless the
    file holds them)."""
    a.markdown = True
    text = io.StringIO()
    with contextlib.redirect_stdout(text):
        render(preds, a)
    mode = preds[0]["mode"]
    flags = {"ieee": "", "tf32": " --fp32-precision tf32", "bf16": " --amp bf16",
             "bf16-rung8": " --amp bf16 --conv-bf16-rung 8",
             "tf32-rung9": " --fp32-precision tf32 --conv-tf32-rung 9"}[mode]
    title = {"ieee": "shipped kernels and the baseline", "tf32": "FP32 kernels and TF32 rungs",
             "bf16": "TF32 rungs and bfloat16 autocast",
             "bf16-rung8": "bfloat16 autocast on conv rung 07 and conv rung 08",
             "tf32-rung9": "TF32 convolutions on conv rung 06 and conv rung 09"}[mode]
    text = (f"# Predicted step time on one H100: {title}\n\n"
            f"<!-- Generated by `python3 tools/predict/step_time.py --docs{flags} --write`; do not edit. -->\n\n"
            "How the prediction is made: [step-model.md](../step-model.md). "
            f"Each cell with an arrow reads {' → '.join(ERAS[mode])}.\n\n" + text.getvalue().rstrip() + "\n")
    path = GENERATED / {"ieee": "step-time.md", "tf32": "step-time-tf32.md", "bf16": "step-time-bf16.md",
                        "bf16-rung8": "step-time-bf16-rung8.md", "tf32-rung9": "step-time-tf32-rung9.md"}[mode]
    if a.write:
        path.write_text(text)
        print(f"step_time: {path.relative_to(ROOT)} updated", file=sys.stderr)
    elif not path.exists() or path.read_text() != text:
        sys.exit(f"step_time: {path.relative_to(ROOT)} is not what the audit tables give; rerun "
                 f"python3 tools/predict/step_time.py --docs{flags} --write")
