#!/usr/bin/python3
"""Tests of tools/gpu/gpu_report.py (run by ctest): gpu-check.sh --part 3's
figure, --gpus 1's time over --device cuda:0's, from the two runs' metrics,
after the first epoch; and nothing of it when one of the two runs is missing.
Part 6's: the kernel rows with the baseline each is measured against, the
baselines that no algorithm passed and the algorithms rejected, the
headline per arithmetic, and anvil's steady epochs against PyTorch's at its
defaults and at its best."""
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


def run_report(runs, bench="", torch_runs=None, part=3):
    """figures.json and report.md of a work folder holding these files."""
    with tempfile.TemporaryDirectory() as work, tempfile.TemporaryDirectory() as out:
        with open(os.path.join(work, "steps.tsv"), "w") as f:
            f.write("a step\tok\t3\t\n")
        with open(os.path.join(work, "notes"), "w") as f:
            f.write(f"gpu=1 part={part}\n")
        with open(os.path.join(work, "nvidia-smi.txt"), "w") as f:
            f.write("GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0)\n")
        with open(os.path.join(work, "bench.log"), "w") as f:
            f.write(bench)
        for prefix, group in (("anvil", runs), ("torch", torch_runs or {})):
            for name, text in group.items():
                with open(os.path.join(work, f"{prefix}-{name}.jsonl"), "w") as f:
                    f.write(text)
        subprocess.run([sys.executable, SCRIPT, work, out], check=True)
        with open(os.path.join(out, "figures.json")) as f:
            figures = json.load(f)
        with open(os.path.join(out, "report.md")) as f:
            return figures, f.read()


# Rows as bench_cuda_kernels prints them (op, shape, impl, ms, GFLOP/s, % vendor, vendor).
BENCH = """\
gemm  4096x4096x4096 (MxNxK)                       cuBLAS BF16 heuristic 2 (algo 66)  0.2000   687194.8    100.0  -
gemm  4096x4096x4096 (MxNxK)                       v8 split-K                         3.0000    45812.9     40.0  cuBLAS-FP32
gemm  4096x4096x4096 (MxNxK)                       v12 bf16 mma ldmatrix, bf16 in memory     0.4000   343597.4     50.0  cuBLAS-BF16
REJECTED: fwd cuDNN FP32 NCHW algo 5 on resnet b1.conv N256 64->64 3x3/1 @28x28: relative error 0.01 > tolerance 0.0003; the next is tried
fwd   resnet b1.conv N256 64->64 3x3/1 @28x28          cuDNN FP32 NCHW algo 1             1.0000    14000.0    100.0  -
MISSING: bwdD cuDNN BF16 NHWC on resnet b1.conv N256 64->64 3x3/1 @28x28: none passed verification (algo 1: CUDNN_STATUS_NOT_SUPPORTED)
fwd   resnet b1.conv N256 64->64 3x3/1 @28x28          v5 split-K                         2.0000     7000.0     50.0  cuDNN-FP32-NCHW
fwd   resnet b2.conv3 N256 64->128 1x1/2 @28x28        v5 split-K                         1.0000     1000.0     80.0  cuDNN-FP32-NHWC
fwd   resnet b1.conv N256 64->64 3x3/1 @28x28          v7 bf16 mma, bf16 in memory        0.5000    28000.0     60.0  cuDNN-BF16-NHWC
fwd   r96 s1 N128 64->64 3x3/1 @24x24                  v6 tf32 mma                        1.0000    10000.0     25.0  cuDNN-TF32-NHWC
"""


class Baselines(unittest.TestCase):
    def test_rows_name_their_baseline(self):
        figures, md = run_report({}, BENCH, part=6)
        rows = figures["kernels"]
        self.assertEqual(len(rows), 8)
        self.assertEqual(rows[2]["impl"], "v12 bf16 mma ldmatrix, bf16 in memory")
        self.assertEqual(rows[2]["vendor"], "cuBLAS-BF16")
        self.assertIsNone(rows[0]["vendor"])
        self.assertEqual(rows[0]["impl"], "cuBLAS BF16 heuristic 2 (algo 66)")
        self.assertEqual(rows[3]["impl"], "cuDNN FP32 NCHW algo 1")
        self.assertEqual(len(figures["missing_baselines"]), 1)
        self.assertEqual(len(figures["rejected_algorithms"]), 1)
        self.assertIn("1 vendor baseline(s) missing", md)
        self.assertIn("| cuDNN-FP32-NCHW |", md)

    def test_headline_per_arithmetic(self):
        figures, md = run_report({}, BENCH, part=6)
        h = figures["headline"]
        self.assertEqual(h["gemm_4096"]["pct_cublas"], 40.0)
        self.assertEqual(h["gemm_4096_bf16"]["vendor"], "cuBLAS-BF16")
        # Over both ResNet-18 layers: (2 * 0.5 + 1 * 0.8) ms of cuDNN in 3 ms.
        self.assertEqual(h["conv_resnet18_fwd"]["pct_cudnn"], 60.0)
        self.assertEqual(h["conv_resnet18_fwd"]["layers"], 2)
        self.assertEqual(h["conv_resnet18_fwd_bf16"]["pct_cudnn"], 60.0)
        self.assertEqual(h["conv_r96_3x3_fwd_tf32"]["pct_cudnn"], 25.0)
        self.assertIn("GEMM 4096^3, BF16: best v12 bf16 mma ldmatrix, bf16 in memory at 50.0% of cuBLAS-BF16", md)

    def test_old_rows_still_read(self):
        old = ("gemm  4096x4096x4096 (MxNxK)  v8 split-K  3.0000  45812.9  80.5\n"
               "fwd   resnet s1 N128 64->64 3x3 @24x24  cuDNN TF32 algo 1  1.0000  1.0  100.0\n")
        figures, _ = run_report({}, old, part=1)
        self.assertEqual([r["impl"] for r in figures["kernels"]], ["v8 split-K", "cuDNN TF32 algo 1"])

    def test_steady_pairs(self):
        figures, md = run_report({"resnet18-tf32": metrics([9.0, 6.0], 0.85),
                                  "resnet18-bf16": metrics([8.0, 4.0], 0.84)},
                                 torch_runs={"resnet18-defaults": metrics([14.0, 8.0], 0.82),
                                             "resnet18-best": metrics([12.0, 2.0], 0.83)}, part=6)
        ratios = figures["training"]["ratios"]
        self.assertEqual(ratios["anvil resnet18-tf32 / pytorch resnet18-defaults"]
                         ["anvil_over_pytorch_seconds_per_epoch"], 0.75)
        self.assertEqual(ratios["anvil resnet18-bf16 / pytorch resnet18-best"]
                         ["anvil_over_pytorch_seconds_per_epoch"], 2.0)
        self.assertTrue(ratios["anvil resnet18-bf16 / pytorch resnet18-best"]["steady"])
        self.assertIn("- anvil resnet18-bf16 / pytorch resnet18-best: 2.0x the time per epoch "
                      "(after the first", md)


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
