#!/usr/bin/python3
"""Tests of tools/gpu/gpu_report.py (run by ctest): gpu-check.sh --part 3's
figure, --gpus 1's time over --device cuda:0's, from the two runs' metrics,
after the first epoch; and nothing of it when one of the two runs is missing."""
import json
import os
import subprocess
import sys
import tempfile
import unittest

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools", "gpu", "gpu_report.py")


def metrics(seconds, test_acc):
    return "".join(json.dumps({"epoch": i + 1, "train_loss": 1.0, "train_acc": 0.5, "test_acc": test_acc,
                               "epoch_seconds": s, "images_per_second": 60000 / s, "device": "cuda:0"}) + "\n"
                   for i, s in enumerate(seconds))


class DataParallelOverhead(unittest.TestCase):
    def report(self, runs):
        with tempfile.TemporaryDirectory() as work, tempfile.TemporaryDirectory() as out:
            with open(os.path.join(work, "steps.tsv"), "w") as f:
                f.write("anvil: LeNet\tok\t3\t\n")
            with open(os.path.join(work, "notes"), "w") as f:
                f.write("gpu=1 part=3\n")
            for name, text in runs.items():
                with open(os.path.join(work, f"anvil-{name}.jsonl"), "w") as f:
                    f.write(text)
            subprocess.run([sys.executable, SCRIPT, work, out], check=True)
            with open(os.path.join(out, "figures.json")) as f:
                figures = json.load(f)
            with open(os.path.join(out, "report.md")) as f:
                return figures["training"]["data_parallel_overhead"], f.read()

    def test_ratio_after_the_first_epoch(self):
        # The first epoch (warm-up, cuDNN-free autotuning, allocations) is left out.
        overhead, md = self.report({"lenet-dp-device": metrics([9.0, 2.0, 2.0], 0.81),
                                    "lenet-dp-gpus1": metrics([5.0, 2.2, 2.4], 0.82)})
        self.assertEqual(overhead, {"lenet": {"gpus1_over_device_seconds_per_epoch": 1.15,
                                              "test_acc_device": 0.81, "test_acc_gpus1": 0.82}})
        self.assertIn("- lenet: --gpus 1 takes 1.15x the time of --device cuda:0", md)

    def test_one_epoch_runs_use_that_epoch(self):
        overhead, _ = self.report({"resnet18-dp-device": metrics([40.0], 0.7),
                                   "resnet18-dp-gpus1": metrics([42.0], 0.7)})
        self.assertEqual(overhead["resnet18"]["gpus1_over_device_seconds_per_epoch"], 1.05)

    def test_no_figure_without_both_runs(self):
        overhead, md = self.report({"lenet-dp-gpus1": metrics([5.0, 2.2], 0.8), "lenet": metrics([3.0], 0.8)})
        self.assertEqual(overhead, {})
        self.assertNotIn("--gpus 1 takes", md)


if __name__ == "__main__":
    unittest.main()
