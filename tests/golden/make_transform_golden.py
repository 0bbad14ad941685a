#!/usr/bin/python3
"""Writes tests/golden/transforms_golden.json: PyTorch's bilinear resize of
small images, read by tests/test_transforms.cpp to check
anvil::data::resize_bilinear.

Run with Debian's python3-torch (CPU):
    /usr/bin/python3 tests/golden/make_transform_golden.py
Deterministic: fixed seed, float32 values written with 9 significant digits
(which round-trip float32 exactly).

The reference is
    torch.nn.functional.interpolate(x, size=(out_h, out_w), mode="bilinear",
                                    align_corners=False, antialias=False)
on a float32 [1, C, H, W] tensor: half-pixel centres, source coordinates below
0 clamped to 0, the last row/column repeated at the far edge, no antialiasing
when shrinking. (torchvision's Resize on a PIL uint8 image, which the seed
recipes use, rounds to uint8 and antialiases when shrinking; anvil resizes the
float image, as interpolate does.)

torch rounds differently depending on its code path: with one channel a
[1, 1, H, W] tensor is also channels-last contiguous and takes the
channels-last kernel, which sums the four weighted pixels in another order
than the generic kernel used for several channels. The two differ by up to
1 float ulp; the test allows 2 (weights rounded unlike torch's give ~8).

Each case is {name, channels, in_h, in_w, out_h, out_w, input, output} with
input/output flat CHW lists. Inputs are mostly pixel-like values k/255 (what
the DataLoader produces); one case uses arbitrary floats, negative included.
"""
import json
import os

import torch
import torch.nn.functional as F

torch.manual_seed(20240612)

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "transforms_golden.json")


def flat(t):
    return [float("%.9g" % v) for v in t.contiguous().reshape(-1).tolist()]


def pixel_image(c, h, w):
    return torch.randint(0, 256, (1, c, h, w)).float() / 255.0


cases = []


def add(name, x):
    def case(out_h, out_w, tag=""):
        y = F.interpolate(x, size=(out_h, out_w), mode="bilinear", align_corners=False,
                          antialias=False)
        _, c, h, w = x.shape
        cases.append({
            "name": "%s_%dx%d_to_%dx%d_c%d%s" % (name, h, w, out_h, out_w, c, tag),
            "channels": c, "in_h": h, "in_w": w, "out_h": out_h, "out_w": out_w,
            "input": flat(x), "output": flat(y),
        })
    return case


# The Fashion-MNIST sizes: up to the ResNet input (96), a ragged upsample
# (33: the source step 28/33 is not a simple fraction), and two downsamples.
grey = pixel_image(1, 28, 28)
colour = pixel_image(3, 28, 28)
add("up", grey)(96, 96)
add("up", colour)(33, 33)
add("down", grey)(14, 14)
add("down", colour)(20, 20)
# Different factors per axis: up in one, down in the other.
add("mixed", grey)(40, 17)
# A non-square source, arbitrary (negative) values, and degenerate 1-pixel axes.
odd = torch.randn(1, 2, 7, 5)
add("odd", odd)(3, 11, "_randn")
add("odd", odd)(1, 1, "_randn")
add("odd", odd)(7, 1, "_randn")
# A single-pixel source is broadcast.
add("dot", pixel_image(1, 1, 1))(4, 3)

doc = {
    "generator": "tests/golden/make_transform_golden.py",
    "torch_version": torch.__version__,
    "cases": cases,
}
with open(OUT, "w") as f:
    json.dump(doc, f, separators=(",", ":"))
    f.write("\n")
print("wrote %s: %d cases, %d bytes" % (OUT, len(cases), os.path.getsize(OUT)))
