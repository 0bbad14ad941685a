#!/usr/bin/python3
"""Training curves from anvil-train --metrics files, as the seeds' d2l plots
show them: train loss, train accuracy and test accuracy per epoch, one panel
each, with every run given overlaid under its label.

  scripts/plot-metrics.py RUN.jsonl [MORE.jsonl ...] -o curves.png [--labels A,B,...] [--title T]

A run's label is, unless --labels gives them, "<model> <recipe>" from its
first epoch (the file's name when that is missing). Every file is checked
before anything is drawn: an empty file, a line that is not a JSON object,
an epoch without a number the plot needs, or epochs out of order is refused
with one error naming the file and line, and no picture is written.
Needs matplotlib (Debian: python3-matplotlib; bash scripts/install-deps.sh --plot).
"""
import argparse
import json
import math
import os
import sys
import tempfile

# What each panel shows: (metrics key, panel title).
PANELS = [("train_loss", "train loss"), ("train_acc", "train accuracy"), ("test_acc", "test accuracy")]


class MetricsError(Exception):
    pass


def read_run(path):
    """The epochs of one metrics file: a list of dicts with 'epoch' and every PANELS key."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise MetricsError(f"{path}: cannot read: {e}") from None
    epochs = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{path}, line {number}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise MetricsError(f"{where}: not JSON ({e.msg} at column {e.colno})") from None
        if not isinstance(record, dict):
            raise MetricsError(f"{where}: not a JSON object but {type(record).__name__}")
        if record.get("mode") == "eval":
            raise MetricsError(f"{where}: the result of anvil-train --eval-only, not per-epoch metrics")
        epoch = record.get("epoch")
        if not isinstance(epoch, int) or isinstance(epoch, bool) or epoch < 1:
            raise MetricsError(f"{where}: 'epoch' must be a whole number >= 1, found {json.dumps(epoch)}")
        if epochs and epoch <= epochs[-1]["epoch"]:
            raise MetricsError(f"{where}: epoch {epoch} comes after epoch {epochs[-1]['epoch']}")
        for key, _ in PANELS:
            if key not in record:
                raise MetricsError(f"{where}: no '{key}'")
            value = record[key]
            # anvil writes a NaN or infinite loss as null: drawn as a gap.
            if value is None:
                record[key] = math.nan
            elif isinstance(value, bool) or not isinstance(value, (int, float)):
                raise MetricsError(f"{where}: '{key}' must be a number, found {json.dumps(value)}")
        epochs.append(record)
    if not epochs:
        raise MetricsError(f"{path}: empty: no epochs to plot (anvil-train --metrics writes one "
                           "JSON object per epoch)")
    return epochs


def labels_for(paths, runs, given):
    if given is not None:
        labels = [label.strip() for label in given.split(",")]
        if len(labels) != len(paths):
            raise MetricsError(f"--labels: {len(labels)} labels for {len(paths)} files")
        return labels
    labels = []
    for path, run in zip(paths, runs):
        first = run[0]
        named = " ".join(str(first[k]) for k in ("model", "recipe") if k in first)
        labels.append(named or os.path.splitext(os.path.basename(path))[0])
    # Two runs of one model and recipe: tell them apart by their files.
    for i, label in enumerate(labels):
        if labels.count(label) > 1:
            labels[i] = f"{label} ({os.path.basename(paths[i])})"
    return labels


def draw(runs, labels, output, title):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise MetricsError("matplotlib is not installed: apt-get install python3-matplotlib "
                           "(or bash scripts/install-deps.sh --plot)") from None
    fig, axes = plt.subplots(1, len(PANELS), figsize=(11, 3.4))
    for run, label in zip(runs, labels):
        epochs = [r["epoch"] for r in run]
        for ax, (key, _) in zip(axes, PANELS):
            ax.plot(epochs, [r[key] for r in run], marker="o", markersize=3, label=label)
    for ax, (key, name) in zip(axes, PANELS):
        ax.set_title(name)
        ax.set_xlabel("epoch")
        ax.grid(True, alpha=0.3)
        ax.xaxis.get_major_locator().set_params(integer=True)
    axes[-1].legend(loc="lower right", fontsize="small")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    # Written next to the output and renamed over it: never a half-written picture.
    folder = os.path.dirname(os.path.abspath(output))
    fd, tmp = tempfile.mkstemp(prefix=".plot-metrics-", suffix=".png", dir=folder)
    os.close(fd)
    try:
        fig.savefig(tmp, dpi=90)
        umask = os.umask(0)  # mkstemp made it private; a picture is as readable as any new file
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, output)
    except BaseException:
        os.unlink(tmp)
        raise
    finally:
        plt.close(fig)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", metavar="RUN.jsonl", help="anvil-train --metrics files")
    parser.add_argument("-o", "--output", required=True, help="the PNG to write")
    parser.add_argument("--labels", help="comma-separated labels, one per file")
    parser.add_argument("--title", help="a title above the panels")
    args = parser.parse_args()
    try:
        folder = os.path.dirname(os.path.abspath(args.output))
        if not os.path.isdir(folder):
            raise MetricsError(f"-o {args.output}: folder '{folder}' does not exist")
        runs = [read_run(path) for path in args.runs]
        draw(runs, labels_for(args.runs, runs, args.labels), args.output, args.title)
    except MetricsError as e:
        print(f"plot-metrics: error: {e}", file=sys.stderr)
        return 1
    except OSError as e:
        print(f"plot-metrics: error: -o {args.output}: cannot write: {e}", file=sys.stderr)
        return 1
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
