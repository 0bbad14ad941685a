#!/usr/bin/python3
"""Writes tests/golden/bf16_torch.safetensors: bfloat16 tensors written by
PyTorch through the safetensors package, read by tests/test_bfloat16.cpp.

Run with Debian's python3-torch (CPU) and the safetensors package:
  /usr/bin/python3 tests/golden/make_bf16_golden.py
Deterministic (fixed seed). The file holds
  source    F32 [N]       values chosen to exercise rounding: specials (zeros,
                          Inf, NaN, the largest float), ties between two
                          bfloat16 values, denormals, and random values over
                          the whole exponent range
  rounded   BF16 [N]      source.to(torch.bfloat16): PyTorch's rounding
  patterns  BF16 [16, 16] bit patterns 257 * i, i = 0..255 (all exponents,
                          signs and mantissas, NaNs and Infs among them)
"""
import os
import struct

import torch
from safetensors.torch import save_file

torch.manual_seed(20240321)
HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "bf16_torch.safetensors")


def from_bits(bits):
    return [struct.unpack("<f", struct.pack("<I", b))[0] for b in bits]


special_bits = [
    0x00000000, 0x80000000,  # +-0
    0x7F800000, 0xFF800000,  # +-Inf
    0x7FC00000, 0xFFC00000, 0x7F800001,  # NaNs (the last one signalling)
    0x7F7FFFFF, 0xFF7FFFFF,  # the largest floats: round to +-Inf
    0x7F7F7FFF, 0x7F7F8000,  # just below the tie to Inf, and the tie
    0x3F808000, 0x3F818000, 0x3F808001, 0x3F80FFFF,  # ties to even, above a tie
    0x00000001, 0x00008000, 0x00018000, 0x00008001, 0x007FFFFF,  # denormals
    0x80018000, 0x807FFFFF,
]
ties = []
for exponent in (1, 60, 127, 200, 254):
    for mantissa_hi in (0x00, 0x01, 0x7E, 0x7F):
        ties.append((exponent << 23) | (mantissa_hi << 16) | 0x8000)
values = from_bits(special_bits + ties)
random = torch.randn(400, dtype=torch.float64) * torch.pow(
    2.0, torch.randint(-140, 128, (400,), dtype=torch.float64))
source = torch.cat([torch.tensor(values, dtype=torch.float32), random.float()])

patterns = (torch.arange(256, dtype=torch.int32) * 257).to(torch.int16)  # wraps to the same bits
tensors = {
    "source": source,
    "rounded": source.to(torch.bfloat16),
    "patterns": patterns.view(torch.bfloat16).reshape(16, 16),
}
save_file(tensors, OUT, metadata={"format": "pt"})
print(f"wrote {OUT}: {len(source)} values")
