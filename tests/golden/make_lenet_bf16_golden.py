#!/usr/bin/python3
"""Writes tests/golden/lenet_bf16.safetensors and lenet_bf16_golden.json: a
LeNet state dict in bfloat16, written by safetensors.torch.save_file, and
PyTorch's test loss and accuracy of those weights. Read by
tests/test_safetensors.cpp and tests/test_eval.cpp (anvil-train --init-from
widens the bfloat16 tensors into its float32 weights, as PyTorch's
load_state_dict does, and must then evaluate as PyTorch does).

Run with Debian's python3-torch (CPU) and the safetensors package:
  /usr/bin/python3 tests/golden/make_lenet_bf16_golden.py
Deterministic (fixed seed). The images are tests/test_util.h's
banded_images: image i has label (7 i + 3) mod 10 and a bright band of
rows that the label places, over integer noise, so that a LeNet trained on
them for a few steps classifies most of them. The weights are that LeNet's
after 40 SGD steps on 256 training images, rounded to bfloat16; the loss and
accuracy are PyTorch's on the 64 test images with those weights loaded into
a float32 LeNet (load_state_dict widens them exactly).
"""
import json
import os

import torch
from safetensors.torch import save_file
from torch.nn import functional as F

from seed_models import lenet

HERE = os.path.dirname(os.path.abspath(__file__))


def banded_images(count, first):
    """Images first .. first+count-1, as uint8 [count, 28, 28], and their labels."""
    pixels = torch.zeros(count, 28, 28, dtype=torch.int64)
    labels = torch.zeros(count, dtype=torch.int64)
    for k in range(count):
        i = first + k
        c = (7 * i + 3) % 10
        labels[k] = c
        for r in range(28):
            for col in range(28):
                noise = (((i * 784 + r * 28 + col) * 2654435761) % (1 << 32)) >> 26  # 0..63
                band = 150 if 2 * c + 3 <= r < 2 * c + 7 else 0
                pixels[k, r, col] = noise + band
    return pixels.to(torch.uint8), labels


def as_input(pixels):
    return (pixels.to(torch.float32) / 255.0).unsqueeze(1)


def main():
    torch.manual_seed(20261201)
    net = lenet()
    train_x, train_y = banded_images(256, 1000)
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    for step in range(40):
        b = slice(64 * (step % 4), 64 * (step % 4) + 64)
        opt.zero_grad()
        F.cross_entropy(net(as_input(train_x[b])), train_y[b]).backward()
        opt.step()
    state = {k: v.detach().to(torch.bfloat16).contiguous() for k, v in net.state_dict().items()}
    weights = os.path.join(HERE, "lenet_bf16.safetensors")
    save_file(state, weights)

    # PyTorch's own reading: a float32 LeNet takes the bfloat16 tensors by
    # copy_, which widens each exactly.
    model = lenet()
    model.load_state_dict(state)
    model.eval()
    test_x, test_y = banded_images(64, 0)
    with torch.no_grad():
        logits = model(as_input(test_x))
    loss = F.cross_entropy(logits, test_y, reduction="sum").item() / len(test_y)
    predicted = logits.argmax(1)
    top2 = logits.topk(2, dim=1).values
    margin = (top2[:, 0] - top2[:, 1]).min().item()
    golden = {
        "test_images": 64,
        "test_loss": loss,
        "test_acc": (predicted == test_y).float().mean().item(),
        "smallest_top2_margin": margin,
        "logits_of_image_0": logits[0].tolist(),
    }
    with open(os.path.join(HERE, "lenet_bf16_golden.json"), "w") as f:
        json.dump(golden, f, indent=1)
        f.write("\n")
    print(f"wrote {weights}: test loss {loss:.6f}, acc {golden['test_acc']:.4f}, "
          f"smallest top-2 margin {margin:.4f}")


if __name__ == "__main__":
    main()
