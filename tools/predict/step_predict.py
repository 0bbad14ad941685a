"""The prediction of tools/predict/step_time.py: the launch audits read
(build/launch-audit's merged runs, else docs/generated/'s tables), the
main loops' instructions per HMMA (docs/kernel-resources.json), and each
launch of a step (step_launches.py) at max(roofline, issue bound) over its
kernel's predicted SM utilisation, with the per-launch floor; the checks of
the model's launches and blocks against the audit's. Standard library only.
"""
import json
import re
import sys
from collections import defaultdict
from pathlib import Path

import kernel_table as kt
import launch_audit as la
import step_model as sm
from step_launches import PARTS, build

ROOT = Path(__file__).resolve().parents[2]
GENERATED = ROOT / "docs" / "generated"
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


def audits(model, batch, docs_only=False, tf32=False, amp=False, rung8=False, rung9=False):
    if tf32 and rung9:  # the TF32 step on conv rung 06 against conv rung 09
        six, six_source = shipped_audit(model, batch, docs_only, "-tf32")
        nine, nine_source = shipped_audit(model, batch, docs_only, "-tf32-rung9")
        return {"baseline": six, "shipped": nine}, f"conv 06 {six_source}; conv 09 {nine_source}"
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
    rung9 = tf32 and getattr(a, "conv_tf32_rung", 6) == 9
    mode = ("bf16-rung8" if rung8 else "bf16" if amp else "tf32-rung9" if rung9 else "tf32" if tf32
            else "ieee")
    step = build(model, batch, tf32, amp, rung8, rung9)
    audit, source = audits(model, batch, a.docs, tf32, amp, rung8, rung9)
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
