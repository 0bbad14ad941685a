#!/usr/bin/env python3
"""Turns a launch audit (ANVIL_SIM_LAUNCH_AUDIT's file: one JSON object per
kernel per line, sim/launch_audit.cpp) into a Markdown table of
docs/generated/launch-audit.md, and optionally puts it there.

  launch_audit.py AUDIT.jsonl [AUDIT2.jsonl ...] --title TEXT [--note TEXT] [--write MARKER]
                  [--save MERGED.jsonl]

Several audits (runs of the same step) are merged kernel by kernel: each
kernel's work share, simulated seconds and predicted utilisation are the
median over the runs. A block's simulated time is its worker thread's CPU
time, which on a shared virtual machine also holds time the host took away
(steal): one run can mark a launch of equal blocks 0.68 and the next 0.98,
so the median of a few runs is the figure to read.

--write MARKER replaces what lies between "<!-- launch-audit MARKER: begin"
and "<!-- launch-audit MARKER: end -->" in docs/generated/launch-audit.md; without it the
table is printed. Rows are sorted by work share; a row is flagged when the
kernel has at least 1% of the step's simulated block time and a predicted
SM utilisation below 0.8, the goal for a kernel that matters to the step.
A run with CUDA graphs has a cudaGraphLaunch row: the host's graph
launches, one launch each, whose kernels' work is in the kernels' rows
(their graph_runs are the launches a graph made); the launches counted
are the host's: each kernel's own plus the graph launches.
Standard library only.
"""
import argparse
import json
import re
import statistics
import sys
from pathlib import Path

SHARE_FLOOR = 0.01
UTILISATION_GOAL = 0.8
DOC = Path(__file__).resolve().parents[2] / "docs" / "generated" / "launch-audit.md"


def read(path):
    rows = []
    for n, line in enumerate(Path(path).read_text().splitlines(), 1):
        try:
            row = json.loads(line)
            row["kernel"], row["work_share"], row["predicted_sm_utilisation"]
        except (ValueError, KeyError, TypeError) as e:
            sys.exit(f"launch_audit: {path}:{n}: not an audit line ({e})")
        rows.append(row)
    if not rows:
        sys.exit(f"launch_audit: {path}: no kernels (was the run on a simulated device?)")
    return sorted(rows, key=lambda r: -r["work_share"])


def merge(runs):
    """Kernel by kernel, the median of several runs' figures (the first run's
    other fields). Every run must have launched the same kernels."""
    if len(runs) == 1:
        return runs[0]
    ident = lambda r: r["mangled"] or r["kernel"]  # no symbol: the launch site
    names = [sorted(ident(r) for r in rows) for rows in runs]
    if any(n != names[0] for n in names[1:]):
        sys.exit("launch_audit: the runs launched different kernels; they are not the same step")
    by_name = [{ident(r): r for r in rows} for rows in runs]
    merged = []
    for row in runs[0]:
        same = [b[ident(row)] for b in by_name]
        row = dict(row)
        for key in ("work_share", "predicted_sm_utilisation", "simulated_seconds", "wave_fill"):
            if key not in row:
                continue
            row[key] = statistics.median(r[key] for r in same)
        merged.append(row)
    return sorted(merged, key=lambda r: -r["work_share"])


def short_name(name):
    """A warp_tile::Shape<...> argument as the tile it makes (128x128), as
    the kernel table names the rungs."""
    def tile(m):
        bk, wm, wn, lanes_m, sub_m, sub_n, *_ = (int(v) for v in m.group(1).split(","))
        return f"{wm * sub_m * lanes_m * 4}x{wn * sub_n * (32 // lanes_m) * 4}"
    return re.sub(r"warp_tile::Shape<([\d, ]+)>", tile, name).replace("> >", ">>")


def fill(row):
    """The untimed wave fill (audits before it existed have none)."""
    return f"{row['wave_fill']:.3f}" if "wave_fill" in row else "-"


def span(lo, hi):
    return f"{lo}" if lo == hi else f"{lo}-{hi}"


GRAPH = "cudaGraphLaunch"


def host_launches(rows):
    """The launches the host made: kernels outside graphs, and graph launches."""
    return sum(r["launches"] - r.get("graph_runs", 0) for r in rows)


def table(rows):
    out = ["| kernel | launches | blocks | threads/block | blocks/SM (limit, source) | work share | "
           "predicted SM utilisation | wave fill (untimed) |",
           "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["kernel"] == GRAPH:
            out.append(f"| `{GRAPH}` ({r['graph_nodes']} kernel launches in its graphs) | {r['launches']} "
                       f"| - | - | - | - | - | - |")
            continue
        runs = f" ({r['graph_runs']} in graphs)" if r.get("graph_runs") else ""
        source = "ptxas" if r["residency_source"].startswith("ptxas") else "assumed"
        flagged = r["work_share"] >= SHARE_FLOOR and r["predicted_sm_utilisation"] < UTILISATION_GOAL
        util = f"{r['predicted_sm_utilisation']:.3f}"
        out.append(f"| `{short_name(r['kernel'])}` | {r['launches']}{runs} | {span(r['blocks_min'], r['blocks_max'])} | "
                   f"{span(r['threads_per_block_min'], r['threads_per_block'])} | "
                   f"{span(r['blocks_per_sm'], r['blocks_per_sm_max'])} ({r['residency_limit']}, {source}) | "
                   f"{100 * r['work_share']:.2f}% | {'**' + util + '**' if flagged else util} | "
                   f"{fill(r)} |")
    return out


def summary(rows, runs=1):
    graphs = [r for r in rows if r["kernel"] == GRAPH]
    rows = [r for r in rows if r["kernel"] != GRAPH]
    flagged = [r for r in rows if r["work_share"] >= SHARE_FLOOR and r["predicted_sm_utilisation"] < UTILISATION_GOAL]
    big = [r for r in rows if r["work_share"] >= SHARE_FLOOR]
    seconds = sum(r["simulated_seconds"] for r in rows)
    sample = max(r.get("sample_blocks", 0) for r in rows)
    sampled = sum(r.get("sampled_launches", 0) for r in rows)
    launches = sum(r["launches"] for r in rows)
    weighted = sum(r["work_share"] * r["predicted_sm_utilisation"] for r in rows)
    if sample:
        how = (f"at most {sample} evenly spread blocks of each launch ran ({sampled} of {launches} launches "
               f"sampled; a skipped block counts as the mean of its launch's sampled ones), so the run's "
               f"numeric results were discarded")
    else:
        how = "every block ran (no sampling)"
    if runs > 1:
        how += f"; each kernel's figures are the median of {runs} runs"
    filled = [r for r in flagged if r.get("wave_fill", 0) >= UTILISATION_GOAL]
    untimed = ""
    if filled:
        untimed = (f" {len(filled)} of those fill >= {UTILISATION_GOAL} of their waves when every block "
                   f"counts the same (untimed): their blocks' times differ, by uneven work or by what "
                   f"the host took.")
    counted = f"{launches} launches"
    if graphs:
        counted = (f"{host_launches(rows) + graphs[0]['launches']} launches by the host, "
                   f"{graphs[0]['launches']} of them CUDA graph launches holding {graphs[0]['graph_nodes']} "
                   f"of the {launches} kernel launches")
    return (f"{len(rows)} kernels, {counted}, {seconds:.1f} s of simulated block time; {how}. "
            f"Work-weighted predicted utilisation {weighted:.3f}; {len(flagged)} of the {len(big)} kernels "
            f"with >= 1% of the work are below {UTILISATION_GOAL} (bold).{untimed}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("audit", nargs="+")
    ap.add_argument("--title", required=True)
    ap.add_argument("--note", default="")
    ap.add_argument("--write", metavar="MARKER")
    ap.add_argument("--doc", type=Path, default=DOC,
                    help="the page --write edits (default docs/generated/launch-audit.md)")
    ap.add_argument("--save", metavar="FILE", help="write the (merged) rows there, one JSON object a line")
    a = ap.parse_args()
    rows = merge([read(path) for path in a.audit])
    if a.save:
        Path(a.save).write_text("".join(json.dumps(r) + "\n" for r in rows))
    lines = [f"{a.title}: {summary(rows, len(a.audit))}{(' ' + a.note) if a.note else ''}", ""] + table(rows)
    text = "\n".join(lines)
    if not a.write:
        print(text)
        return
    begin = re.compile(rf"<!-- launch-audit {re.escape(a.write)}: begin[^>]*-->\n")
    end = f"<!-- launch-audit {a.write}: end -->"
    doc = a.doc.read_text()
    m = begin.search(doc)
    if not m or end not in doc[m.end():]:
        sys.exit(f"launch_audit: {a.doc} has no '<!-- launch-audit {a.write}: begin ... -->' ... '{end}' markers")
    tail = doc[m.end():].split(end, 1)[1]
    a.doc.write_text(doc[:m.end()] + text + "\n" + end + tail)
    print(f"launch_audit: {a.doc.name}, {a.write}: updated")


if __name__ == "__main__":
    main()
