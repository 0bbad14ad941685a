#!/usr/bin/python3
"""Writes tests/golden/schedule_golden.json: the learning rate that torch's
schedulers give each optimizer step, read by tests/test_schedule.cpp.

Run with Debian's python3-torch (CPU):  /usr/bin/python3 tests/golden/make_schedule_golden.py

Each case is a run of `epochs` epochs of `batches` batches, with the
scheduler stepped after every optimizer step (per iteration), as anvil does:
  StepLR(step_size = step_epochs * batches, gamma)
  CosineAnnealingLR(T_max = iterations after the warmup, eta_min = min_lr)
  a warmup is LinearLR(start_factor, total_iters = warmup_epochs * batches)
  followed by the shape through SequentialLR(milestones=[warmup iterations]).
`lrs[i]` is the rate the optimizer used for step i.
"""
import json
import os
import warnings

import torch
from torch.optim.lr_scheduler import (CosineAnnealingLR, LambdaLR, LinearLR, SequentialLR,
                                      StepLR)

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "schedule_golden.json")

# SequentialLR restarts the next scheduler with step(0), which torch 1.13 warns about.
warnings.filterwarnings("ignore", message="The epoch parameter")

CASES = [
    dict(name="constant", shape="constant", lr=0.2, epochs=4, batches=5),
    dict(name="constant with warmup", shape="constant", lr=0.1, epochs=4, batches=5,
         warmup_epochs=2, warmup_start_factor=0.1),
    dict(name="step", shape="step", lr=0.1, epochs=7, batches=3, step_epochs=2, gamma=0.5),
    dict(name="step with warmup", shape="step", lr=0.4, epochs=7, batches=4, step_epochs=3,
         gamma=0.1, warmup_epochs=1, warmup_start_factor=0.25),
    dict(name="cosine", shape="cosine", lr=0.1, epochs=5, batches=7, min_lr=0.0),
    dict(name="cosine to a minimum", shape="cosine", lr=0.05, epochs=3, batches=9,
         min_lr=0.001),
    dict(name="cosine with warmup", shape="cosine", lr=0.1, epochs=10, batches=6,
         min_lr=0.0005, warmup_epochs=1, warmup_start_factor=0.1),
    dict(name="cosine with a long warmup", shape="cosine", lr=0.3, epochs=4, batches=5,
         min_lr=0.0, warmup_epochs=3, warmup_start_factor=1.0 / 3),
]


def lrs_for(case):
    param = torch.zeros(1, requires_grad=True)
    opt = torch.optim.SGD([param], lr=case["lr"])
    per_epoch = case["batches"]
    total = case["epochs"] * per_epoch
    warmup = case.get("warmup_epochs", 0) * per_epoch
    shape = case["shape"]
    if shape == "constant":
        main = LambdaLR(opt, lambda _: 1.0)
    elif shape == "step":
        main = StepLR(opt, step_size=case["step_epochs"] * per_epoch, gamma=case["gamma"])
    else:
        main = CosineAnnealingLR(opt, T_max=total - warmup, eta_min=case["min_lr"])
    if warmup:
        ramp = LinearLR(opt, start_factor=case["warmup_start_factor"], total_iters=warmup)
        sched = SequentialLR(opt, [ramp, main], milestones=[warmup])
    else:
        sched = main
    out = []
    for _ in range(total):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return out


def main():
    cases = []
    for case in CASES:
        c = dict(case)
        c["lrs"] = lrs_for(case)
        cases.append(c)
    with open(OUT, "w") as f:
        json.dump({"torch": torch.__version__, "cases": cases}, f, indent=1)
        f.write("\n")
    print(f"wrote {len(cases)} cases to {OUT}")


if __name__ == "__main__":
    main()
