#!/usr/bin/env python3
"""Writes report.md and figures.json for tools/gpu/gpu-check.sh.

    python3 tools/gpu/gpu_report.py WORKDIR OUTDIR

WORKDIR holds what gpu-check.sh's steps left: steps.tsv (name, status,
seconds, note per step), notes, nvidia-smi.txt, tests-cuda.log and
tests-other.log (anvil-tests), tests-nccl.log (anvil-parallel-tests), tests.log, bench.log (bench_cuda_kernels),
anvil-*.jsonl (anvil-train --metrics), torch-*.jsonl
(scripts/torch_gpu_recipes.py), sanitizer.log. Anything missing is reported
as not run. Standard library only (it runs under the GPU image's Python).
"""
import json
import os
import re
import sys
import time
from pathlib import Path


def read(path):
    try:
        return Path(path).read_text(errors="replace")
    except OSError:
        return ""


def steps(work):
    out = []
    for line in read(work / "steps.tsv").splitlines():
        name, status, seconds, note = (line.split("\t") + ["", "", ""])[:4]
        out.append({"name": name, "status": status, "seconds": int(seconds or 0), "note": note})
    return out


def gpu_info(work):
    text = "\n".join(line for line in read(work / "nvidia-smi.txt").splitlines()
                     if not re.match(r"== |   (ok|failed|timed out)", line))
    names = re.findall(r"^GPU \d+: (.+?) \(UUID", text, re.M)
    driver = re.search(r"Driver Version: ([\d.]+)", text)
    cuda = re.search(r"CUDA Version: ([\d.]+)", text)
    cpu = re.search(r"Model name:\s*(.+)", text)
    cpus = re.search(r"^CPU\(s\):\s*(\d+)", text, re.M)
    return {"present": bool(names), "names": names, "driver": driver.group(1) if driver else None,
            "cuda": cuda.group(1) if cuda else None, "cpu": cpu.group(1).strip() if cpu else None,
            "cpus": int(cpus.group(1)) if cpus else None, "nvidia_smi": text.strip()}


def catch_summary(text):
    """Catch2's closing line, and how many CUDA or NCCL tests said they did
    not run (too few GPUs)."""
    r = {"ran": bool(text), "passed": None, "failed": None, "assertions": None,
         # The skips' warnings ("...): CUDA kernel test not run"), not the
         # failures ANVIL_REQUIRE_CUDA=1 makes of them ("(CUDA kernel test not run)").
         # Catch's console reporter wraps messages at 80 columns: any
         # whitespace between the words.
         "cuda_not_run": len(re.findall(
             r"(?<!\()(?:CUDA\s+kernel\s+test|CUDA\s+test|CUDA\s+part|cuda:0\s+part|NCCL\s+test)"
             r"\s+not\s+run", text)),
         "cuda_required_failures": len(re.findall(
             r"ANVIL_REQUIRE_CUDA=1\s+and\s+no\s+usable\s+CUDA\s+device", text)),
         "cuda_banner": next(iter(re.findall(r"^CUDA: .*$", text, re.M)), None)}
    m = re.search(r"All tests passed \((\d+) assertions? in (\d+) test cases?\)", text)
    if m:
        r.update(assertions=int(m.group(1)), passed=int(m.group(2)), failed=0)
    m = re.search(r"test cases:\s*(\d+) \|\s*(\d+) passed(?: \|\s*(\d+) failed)?", text)
    if m:
        r.update(passed=int(m.group(2)), failed=int(m.group(3) or 0))
    m = re.search(r"test cases:\s*(\d+) \|\s*(\d+) failed", text)  # none passed
    if m:
        r.update(passed=0, failed=int(m.group(2)))
    m = re.search(r"No tests ran", text)
    if m:
        r.update(passed=0, failed=0)
    return r


# A benchmark row: op, shape, impl, ms, GFLOP/s, % vendor, and (since the
# baselines name themselves) the baseline the percentage is of.
IMPL = (r"v\d+ .+?|cuBLAS (?:FP32|TF32|BF16) heuristic \d+ \(algo -?\d+\)"
        r"|cuDNN (?:FP32|TF32|BF16) (?:NCHW|NHWC) algo \d+"
        r"|cuBLAS (?:SGEMM|TF32|BF16)|cuDNN (?:TF32 )?algo \d+")  # the last two: earlier logs
ROW = re.compile(r"^(gemm|fwd|bwdD|bwdW)\s+(.+?)\s+(" + IMPL + r")\s+"
                 r"([\d.]+)\s+(\S+)\s+(\S+)(?:\s+(\S+))?\s*$")


def bench_rows(text):
    """The rows, the FAIL lines (a wrong result), the MISSING lines (a
    baseline none of whose algorithms passed the check) and the REJECTED
    lines (an algorithm that failed it, the next one taken)."""
    rows, fails, missing, rejected = [], [], [], []
    for line in text.splitlines():
        for prefix, bucket in (("FAIL:", fails), ("MISSING:", missing), ("REJECTED:", rejected)):
            if line.startswith(prefix):
                bucket.append(line)
                break
        else:
            m = ROW.match(line)
            if not m:
                continue
            num = lambda s: None if s == "-" else float(s)  # noqa: E731
            rows.append({"op": m.group(1), "shape": m.group(2), "impl": m.group(3),
                         "ms": float(m.group(4)), "gflops": num(m.group(5)),
                         "pct_vendor": num(m.group(6)),
                         "vendor": None if m.group(7) in (None, "-") else m.group(7)})
    return rows, fails, missing, rejected


def math_of(row):
    """A rung's arithmetic: its baseline's ("cuBLAS-TF32", "cuDNN-BF16-NHWC"),
    which the benchmark picks by the rung's own; in logs without that column,
    from its name (the tensor-core rungs, and they alone, have "mma" in it:
    kernels/cuda/gemm/gemm.h holds the table to that; "tf32 mma", "bf16 mma
    ldmatrix", ...)."""
    vendor = row.get("vendor") or ""
    for math in ("FP32", "TF32", "BF16"):
        if f"-{math}" in vendor:
            return math.lower()
    impl = row["impl"]
    if "mma" not in impl:
        return "fp32"
    return "bf16" if "bf16" in impl else "tf32"


# Headline keys: FP32 rungs bare, the tensor-core rungs by arithmetic.
MATHS = (("fp32", ""), ("tf32", "_tf32"), ("bf16", "_bf16"))


def headline(rows):
    """Best anvil rung against the vendor in the same arithmetic: GEMM at
    4096^3 (goal 85%), and per conv direction over ResNet-18's convolutions
    as training runs them (28x28, batch 256; goal 70%) and over its 3x3
    stages on 96x96 inputs."""
    h = {}
    for math, suffix in MATHS:
        gemm = [r for r in rows if r["op"] == "gemm" and r["shape"].startswith("4096x4096x4096")
                and r["impl"].startswith("v") and math_of(r) == math
                and r["pct_vendor"] is not None]
        if gemm:
            best = max(gemm, key=lambda r: r["pct_vendor"])
            h["gemm_4096" + suffix] = {"best": best["impl"], "pct_cublas": best["pct_vendor"],
                                       "vendor": best.get("vendor"), "goal": 85,
                                       "by_variant": {r["impl"]: r["pct_vendor"] for r in gemm}}
        for op in ("fwd", "bwdD", "bwdW"):
            conv_headline(rows, op, math, "resnet ", h, f"conv_resnet18_{op}" + suffix)
            conv_headline(rows, op, math, "r96 ", h, f"conv_r96_3x3_{op}" + suffix)
    return h


def conv_headline(rows, op, math, prefix, h, key):
    conv = [r for r in rows if r["op"] == op and r["shape"].startswith(prefix)
            and r["impl"].startswith("v") and math_of(r) == math
            and r["pct_vendor"] is not None]
    if not conv:
        return
    # A rung's figure: its time over all the layers against the baselines'.
    total = {}
    for r in conv:
        vendor_ms = r["ms"] * r["pct_vendor"] / 100
        t = total.setdefault(r["impl"], [0.0, 0.0, 0])
        t[0] += r["ms"]
        t[1] += vendor_ms
        t[2] += 1
    pct = {impl: 100 * v / ms for impl, (ms, v, _) in total.items()}
    best = max(pct, key=pct.get)
    h[key] = {"best": best, "pct_cudnn": round(pct[best], 1), "goal": 70,
              "layers": total[best][2],
              "by_variant": {k: round(v, 1) for k, v in pct.items()}}


def runs(work, prefix):
    out = {}
    for f in sorted(work.glob(f"{prefix}-*.jsonl")):
        epochs = []
        for line in read(f).splitlines():
            try:
                epochs.append(json.loads(line))
            except json.JSONDecodeError:
                pass
        if not epochs:
            continue
        secs = [e["epoch_seconds"] for e in epochs]
        later = secs[1:] or secs
        out[f.stem.split("-", 1)[1]] = {
            "epochs": len(epochs), "device": epochs[-1].get("device"),
            "test_acc": epochs[-1]["test_acc"], "train_loss": epochs[-1]["train_loss"],
            "seconds_per_epoch": round(sum(secs) / len(secs), 3),
            "seconds_per_epoch_after_first": round(sum(later) / len(later), 3),
            "images_per_second": epochs[-1].get("images_per_second"),
            "per_epoch": [{"epoch": e["epoch"], "test_acc": e["test_acc"], "seconds": e["epoch_seconds"]}
                          for e in epochs]}
    return out


# Part 6's comparisons: (anvil run, PyTorch run), from anvil-NAME.jsonl and
# torch-NAME.jsonl.
STEADY_PAIRS = (("resnet18-tf32", "resnet18-defaults"), ("resnet18-tf32", "resnet18-best"),
                ("resnet18-bf16", "resnet18-defaults"), ("resnet18-bf16", "resnet18-best"))


def ratio(a, t):
    """anvil's time over PyTorch's, per epoch after the first (the first, if
    only one ran), with both test accuracies."""
    return {"anvil_over_pytorch_seconds_per_epoch":
            round(a["seconds_per_epoch_after_first"] / t["seconds_per_epoch_after_first"], 2),
            "steady": a["epochs"] > 1 and t["epochs"] > 1,
            "test_acc_anvil": a["test_acc"], "test_acc_pytorch": t["test_acc"]}


def sanitizer_summary(text):
    out = {}
    for tool, body in re.findall(r"== compute-sanitizer (\w+)[^\n]*\n(.*?)(?=\n== |\Z)", text, re.S):
        errors = re.findall(r"ERROR SUMMARY: (\d+) error", body)
        hazards = re.findall(r"RACECHECK SUMMARY: (\d+) hazard", body)
        # One summary per shard (gpu-check.sh runs the tests in several processes).
        out[tool] = {"errors": sum(map(int, errors)) if errors else None,
                     "hazards": sum(map(int, hazards)) if hazards else None,
                     "processes": len(errors)}
    return out


def fmt(v, spec="", none="-"):
    return none if v is None else format(v, spec)


def main():
    work, out = Path(sys.argv[1]), Path(sys.argv[2])
    st = steps(work)
    gpu = gpu_info(work)
    notes = read(work / "notes")
    manifest = read(Path(os.environ.get("ANVIL_GPU_PACK", ".gpu")) / "MANIFEST")
    commit = re.search(r"^commit: (.+)$", manifest, re.M)
    part = re.search(r"part=(\S+)", notes)
    tests = {half: catch_summary(read(work / f"tests-{half}.log")) for half in ("cuda", "nccl", "other")}
    rows, fails, missing, rejected = bench_rows(read(work / "bench.log"))
    head = headline(rows)
    anvil, torch = runs(work, "anvil"), runs(work, "torch")
    ratios = {}
    for model in anvil:
        if model in torch and gpu["present"]:
            ratios[model] = ratio(anvil[model], torch[model])
    # Part 6: anvil in TF32 (its default) and with --amp bf16, against
    # PyTorch at its defaults and at its best, each pair by name.
    for a_name, t_name in STEADY_PAIRS:
        if a_name in anvil and t_name in torch and gpu["present"]:
            ratios[f"anvil {a_name} / pytorch {t_name}"] = ratio(anvil[a_name], torch[t_name])
    # Part 3: the data-parallel path with one replica (--gpus 1) against the
    # plain one (--device cuda:0), the same run through each.
    overhead = {}
    for model in anvil:
        if model.endswith("-dp-device") and model.replace("-device", "-gpus1") in anvil:
            d, g = anvil[model], anvil[model.replace("-device", "-gpus1")]
            overhead[model[:-len("-dp-device")]] = {
                "gpus1_over_device_seconds_per_epoch":
                    round(g["seconds_per_epoch_after_first"] / d["seconds_per_epoch_after_first"], 3),
                "test_acc_device": d["test_acc"], "test_acc_gpus1": g["test_acc"]}
    san = sanitizer_summary(read(work / "sanitizer.log"))
    figures = {"generated": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
               "part": part.group(1) if part else None,
               "bundle_commit": commit.group(1) if commit else None,
               "gpu": {k: v for k, v in gpu.items() if k != "nvidia_smi"},
               "steps": st, "tests": tests, "kernel_failures": fails,
               "missing_baselines": missing, "rejected_algorithms": rejected, "headline": head,
               "kernels": rows, "training": {"anvil": anvil, "pytorch": torch, "ratios": ratios,
                            "data_parallel_overhead": overhead},
               "sanitizer": san}
    (out / "figures.json").write_text(json.dumps(figures, indent=1) + "\n")

    bad = [s for s in st if s["status"].startswith(("failed", "timed out"))]
    md = ["# anvil GPU check", "",
          f"{figures['generated']}, part {figures['part']}, bundle {figures['bundle_commit'] or '?'}; "
          f"`tools/gpu/gpu-check.sh` (docs/gpu.md).", "", "## Summary", ""]
    if gpu["present"]:
        md.append(f"- GPU: {', '.join(gpu['names'])}, driver {gpu['driver']}, CUDA {gpu['cuda']}; "
                  f"CPU {gpu['cpu']} ({gpu['cpus']} CPUs).")
    else:
        md.append(f"- **No GPU present** (nvidia-smi lists none): the GPU steps did not run; CPU "
                  f"{gpu['cpu']} ({gpu['cpus']} CPUs).")
    for half, label in (("other", "tests without [cuda]"), ("cuda", "CUDA tests ([cuda])"),
                        ("nccl", "NCCL tests (anvil-parallel-tests [nccl])")):
        t = tests[half]
        if t["ran"]:
            skipped = (f", {t['cuda_not_run']} said they found no usable GPU (or too few) and did not run"
                       if t["cuda_not_run"] else "")
            if t["cuda_required_failures"]:
                skipped += (f", {t['cuda_required_failures']} failed for want of a usable CUDA "
                            f"device (ANVIL_REQUIRE_CUDA=1)")
            md.append(f"- {label}: {fmt(t['passed'])} test cases passed, {fmt(t['failed'])} failed{skipped}.")
            if half == "cuda" and t["cuda_banner"]:
                md.append(f"  - {t['cuda_banner']}")
    if "ANVIL_REQUIRE_CUDA=1" in notes:
        md.append("- ANVIL_REQUIRE_CUDA=1 (nvidia-smi lists a GPU): a CUDA test without a usable "
                  "device fails instead of skipping.")
    for math, suffix in MATHS:
        label = math.upper()
        if "gemm_4096" + suffix in head:
            g = head["gemm_4096" + suffix]
            md.append(f"- GEMM 4096^3, {label}: best {g['best']} at {g['pct_cublas']:.1f}% of "
                      f"{g['vendor'] or 'cuBLAS'} (goal 85%).")
        for op in ("fwd", "bwdD", "bwdW"):
            for key, where in ((f"conv_resnet18_{op}", "ResNet-18's convolutions at 28x28, batch 256"),
                               (f"conv_r96_3x3_{op}", "ResNet-18's 3x3 stages at 96x96, batch 128")):
                c = head.get(key + suffix)
                if c:
                    md.append(f"- conv {op}, {label}, {where} ({c['layers']} layers): best "
                              f"{c['best']} at {c['pct_cudnn']:.1f}% of cuDNN {label}'s best "
                              f"layout (goal 70%).")
    if missing:
        unmatched = sum(1 for r in rows if r["impl"].startswith("v") and r["pct_vendor"] is None)
        md.append(f"- **{len(missing)} vendor baseline(s) missing: no algorithm passed the check** "
                  f"(one arithmetic and layout each; listed under Kernels); {unmatched} anvil "
                  f"row(s) have no baseline in any layout.")
    if rejected:
        md.append(f"- {len(rejected)} vendor algorithm(s) failed the check and the next was taken "
                  f"(listed under Kernels).")
    if fails:
        md.append(f"- **{len(fails)} kernel result(s) differ from the CPU** (bench.log).")
    for model, r in anvil.items():
        t = torch.get(model)
        line = (f"- {model}: anvil {r['epochs']} epoch(s) on {r['device']}: test acc {r['test_acc']:.4f}, "
                f"{r['seconds_per_epoch']:.2f} s/epoch")
        if t:
            line += (f"; PyTorch {t['epochs']} on {t['device']}: {t['test_acc']:.4f}, "
                     f"{t['seconds_per_epoch']:.2f} s/epoch")
        if model in ratios:
            line += f"; anvil/PyTorch time {ratios[model]['anvil_over_pytorch_seconds_per_epoch']}x"
        md.append(line + ".")
    for name, r in ratios.items():
        if name.startswith("anvil "):
            md.append(f"- {name}: {r['anvil_over_pytorch_seconds_per_epoch']}x the time per epoch "
                      f"({'after the first' if r['steady'] else 'a single first epoch: not steady'}; "
                      f"test acc {r['test_acc_anvil']:.4f} against {r['test_acc_pytorch']:.4f}).")
    for model, o in overhead.items():
        md.append(f"- {model}: --gpus 1 takes {o['gpus1_over_device_seconds_per_epoch']}x the time of "
                  f"--device cuda:0 (test acc {o['test_acc_gpus1']:.4f} against {o['test_acc_device']:.4f}).")
    for tool, s in san.items():
        md.append(f"- compute-sanitizer {tool}: {fmt(s['errors'])} errors"
                  + (f", {s['hazards']} hazards" if s["hazards"] is not None else "") + ".")
    md.append(f"- Steps: {sum(s['status'] == 'ok' for s in st)} passed, {len(bad)} failed or timed out, "
              f"{sum(s['status'] == 'not run' for s in st)} not run.")
    md += ["", "## Steps", "", "| step | status | s | note |", "|---|---|---|---|"]
    md += [f"| {s['name']} | {s['status']} | {s['seconds']} | {s['note']} |" for s in st]
    md += ["", "## nvidia-smi", "", "```", gpu["nvidia_smi"] or "(not run)", "```"]
    if rows:
        md += ["", "## Kernels (bench_cuda_kernels)", "",
               "| op | shape | impl | ms | GFLOP/s | % vendor | vendor |", "|---|---|---|---|---|---|---|"]
        md += [f"| {r['op']} | {r['shape']} | {r['impl']} | {r['ms']:.4f} | {fmt(r['gflops'], '.1f')} | "
               f"{fmt(r['pct_vendor'], '.1f')} | {r['vendor'] or '-'} |" for r in rows]
        md += [f"- {f}" for f in fails + missing + rejected]
    if anvil or torch:
        md += ["", "## Training", "", "| framework | model | device | epochs | test acc | s/epoch | "
               "s/epoch after the first | img/s (last) |", "|---|---|---|---|---|---|---|---|"]
        for name, group in (("anvil", anvil), ("PyTorch", torch)):
            for model, r in group.items():
                md.append(f"| {name} | {model} | {r['device']} | {r['epochs']} | {r['test_acc']:.4f} | "
                          f"{r['seconds_per_epoch']:.3f} | {r['seconds_per_epoch_after_first']:.3f} | "
                          f"{fmt(r['images_per_second'], '.0f')} |")
    md += ["", "## Environment", "", "```", notes.strip(), "```", ""]
    (out / "report.md").write_text("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
