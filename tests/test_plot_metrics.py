#!/usr/bin/python3
"""Tests of scripts/plot-metrics.py (run by ctest): every malformed metrics
file is refused with one error naming the file and line, writing no
picture; good files, several at once, make a PNG (when matplotlib is there)."""
import json
import os
import subprocess
import sys
import tempfile
import unittest

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts", "plot-metrics.py")


def have_matplotlib():
    try:
        import matplotlib  # noqa: F401
        return True
    except ImportError:
        return False


def epoch_line(epoch, **changes):
    record = {"epoch": epoch, "train_loss": 2.0 / (epoch + 1), "train_acc": 0.5 + 0.04 * epoch,
              "test_loss": 1.0, "test_acc": 0.45 + 0.04 * epoch, "model": "lenet", "recipe": "seed"}
    record.update(changes)
    return json.dumps({k: v for k, v in record.items() if v is not ...})


class PlotMetrics(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.png = os.path.join(self.dir.name, "curves.png")

    def tearDown(self):
        self.dir.cleanup()

    def write(self, name, text):
        path = os.path.join(self.dir.name, name)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        return path

    def run_script(self, *args):
        return subprocess.run([sys.executable, SCRIPT, *args, "-o", self.png],
                              capture_output=True, text=True, timeout=120)

    def expect_error(self, text, message):
        good = self.write("good.jsonl", "\n".join(epoch_line(e) for e in (1, 2)) + "\n")
        bad = self.write("bad.jsonl", text)
        r = self.run_script(good, bad)
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertEqual(r.stderr.count("\n"), 1, r.stderr)  # one line, no traceback
        self.assertIn(f"plot-metrics: error: {bad}", r.stderr)
        self.assertIn(message, r.stderr)
        self.assertFalse(os.path.exists(self.png))
        self.assertEqual(sorted(os.listdir(self.dir.name)), ["bad.jsonl", "good.jsonl"])

    def test_empty_file(self):
        self.expect_error("", "empty: no epochs to plot")
        self.expect_error("\n  \n", "empty: no epochs to plot")

    def test_not_json(self):
        self.expect_error(epoch_line(1) + "\n{\"epoch\": 2, \"train_loss\n", ", line 2: not JSON")

    def test_not_an_object(self):
        self.expect_error("[1, 2, 3]\n", ", line 1: not a JSON object but list")

    def test_missing_key(self):
        self.expect_error(epoch_line(1) + "\n" + epoch_line(2, test_acc=...) + "\n", ", line 2: no 'test_acc'")

    def test_value_not_a_number(self):
        self.expect_error(epoch_line(1, train_acc="0.5") + "\n", "'train_acc' must be a number, found \"0.5\"")
        self.expect_error(epoch_line(1, train_loss=True) + "\n", "'train_loss' must be a number, found true")

    def test_bad_epochs(self):
        self.expect_error(epoch_line(0) + "\n", "'epoch' must be a whole number >= 1, found 0")
        self.expect_error(epoch_line(1.5) + "\n", "'epoch' must be a whole number >= 1, found 1.5")
        self.expect_error(epoch_line(2) + "\n" + epoch_line(2) + "\n", ", line 2: epoch 2 comes after epoch 2")

    def test_eval_only_result(self):
        self.expect_error(json.dumps({"mode": "eval", "test_acc": 0.8}) + "\n", "--eval-only, not per-epoch")

    def test_missing_file(self):
        r = self.run_script(os.path.join(self.dir.name, "absent.jsonl"))
        self.assertEqual(r.returncode, 1)
        self.assertIn("absent.jsonl: cannot read", r.stderr)

    def test_labels_must_match_the_files(self):
        good = self.write("good.jsonl", epoch_line(1) + "\n")
        r = self.run_script(good, "--labels", "a,b")
        self.assertEqual(r.returncode, 1)
        self.assertIn("--labels: 2 labels for 1 files", r.stderr)

    @unittest.skipUnless(have_matplotlib(), "matplotlib is not installed")
    def test_runs_overlaid_in_one_png(self):
        seed = self.write("seed.jsonl", "\n".join(epoch_line(e) for e in range(1, 4)) + "\n")
        # A NaN loss (written as null) is drawn as a gap, not refused.
        best = self.write("best.jsonl", "\n".join(epoch_line(e, recipe="best", train_loss=None if e == 2 else 1.0 / e)
                                                  for e in range(1, 4)) + "\n")
        r = self.run_script(seed, best, "--title", "LeNet")
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(self.png, "rb") as f:
            data = f.read()
        self.assertEqual(data[:8], b"\x89PNG\r\n\x1a\n")
        self.assertGreater(len(data), 5000)
        self.assertEqual([n for n in os.listdir(self.dir.name) if n.startswith(".plot-metrics")], [])
        umask = os.umask(0)
        os.umask(umask)
        self.assertEqual(os.stat(self.png).st_mode & 0o777, 0o666 & ~umask)


if __name__ == "__main__":
    unittest.main()
