#!/usr/bin/python3
"""PyTorch reads anvil's BF16 safetensors with the same bits.

Usage: test_bf16_interop.py ANVIL_TESTS_BINARY
Runs the Catch2 test "safetensors writes BF16 tensors that read back bit for
bit" with ANVIL_BF16_EXPORT pointing into a temporary directory, then reads
that file twice: with a parser of the format written here (8-byte length,
JSON header, raw little-endian bytes) into torch tensors, and with the
safetensors package (safetensors.torch.load_file). Checks, bit for bit:
  patterns  all 65536 bfloat16 patterns, in order
  rounded   anvil's rounding of `source` equals torch's .to(torch.bfloat16)
            (NaN where the source is NaN: torch 1.13 gives NaN bits of its own)
  arange    torch.arange(300).to(torch.bfloat16)
  scalar    -0.333 as bfloat16, a 0-d tensor
Exits 77 (ctest's SKIP_RETURN_CODE) when torch cannot be imported; without
the safetensors package only the format-level reader runs, and it says so.
"""
import json
import os
import struct
import subprocess
import sys
import tempfile

try:
    import torch
except ImportError:
    print("SKIP: torch is not importable by", sys.executable)
    sys.exit(77)

try:
    from safetensors.torch import load_file
except ImportError:
    load_file = None

TORCH_DTYPES = {"BF16": torch.bfloat16, "F32": torch.float32, "I64": torch.int64}


def read_by_format(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    body = data[8 + n:]
    out = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        begin, end = entry["data_offsets"]
        raw = bytearray(body[begin:end])
        t = torch.frombuffer(raw, dtype=TORCH_DTYPES[entry["dtype"]]) if raw else \
            torch.empty(0, dtype=TORCH_DTYPES[entry["dtype"]])
        out[name] = (entry["dtype"], t.reshape(entry["shape"]))
    return out


def bits(t):
    return t.contiguous().view(torch.int16).to(torch.int32) & 0xFFFF


def check(tensors, reader):
    failures = []

    def expect(ok, what):
        if not ok:
            failures.append(f"{reader}: {what}")

    patterns = tensors["patterns"]
    expect(patterns.dtype == torch.bfloat16 and list(patterns.shape) == [256, 256],
           f"patterns is {patterns.dtype} {list(patterns.shape)}")
    expect(torch.equal(bits(patterns).reshape(-1), torch.arange(65536, dtype=torch.int32)),
           "patterns are not the 65536 bfloat16 patterns in order")

    source, rounded = tensors["source"], tensors["rounded"]
    expect(source.dtype == torch.float32 and rounded.dtype == torch.bfloat16,
           f"source/rounded are {source.dtype}/{rounded.dtype}")
    theirs = source.to(torch.bfloat16)
    nan = torch.isnan(source)
    expect(torch.equal(torch.isnan(rounded), nan), "NaN positions differ")
    differ = (bits(rounded) != bits(theirs)) & ~nan
    if differ.any():
        i = int(differ.nonzero()[0])
        failures.append(f"{reader}: {int(differ.sum())} values rounded unlike torch, first "
                        f"float32 {source[i].item()!r}: anvil 0x{int(bits(rounded)[i]):04x}, "
                        f"torch 0x{int(bits(theirs)[i]):04x}")

    arange = tensors["arange"]
    expect(torch.equal(bits(arange), bits(torch.arange(300).to(torch.bfloat16))),
           "arange differs from torch.arange(300).to(torch.bfloat16)")
    scalar = tensors["scalar"]
    expect(scalar.dim() == 0 and int(bits(scalar)) == 0xBEAA,
           f"scalar is {scalar!r}, want -0.3320 (0xbeaa)")
    return failures


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "anvil_bf16.safetensors")
        run = subprocess.run(
            [sys.argv[1], "safetensors writes BF16 tensors that read back bit for bit"],
            env=dict(os.environ, ANVIL_BF16_EXPORT=path), capture_output=True, text=True)
        if run.returncode != 0 or not os.path.exists(path):
            print(run.stdout, run.stderr)
            sys.exit("FAIL: anvil did not write the BF16 file")

        by_format = read_by_format(path)
        expect_dtypes = {"patterns": "BF16", "source": "F32", "rounded": "BF16",
                         "arange": "BF16", "scalar": "BF16"}
        failures = [f"header: {name} is {by_format.get(name, ('missing',))[0]}, want {d}"
                    for name, d in expect_dtypes.items()
                    if by_format.get(name, ("missing",))[0] != d]
        if not failures:
            failures += check({k: t for k, (_, t) in by_format.items()}, "format reader")
        if load_file is None:
            print("note: the safetensors package is not installed; read with the format reader only")
        else:
            failures += check(load_file(path), "safetensors.torch.load_file")
    if failures:
        print("FAIL:\n  " + "\n  ".join(failures))
        sys.exit(1)
    readers = "the format reader" + ("" if load_file is None else " and safetensors.torch")
    print(f"ok: torch {torch.__version__} reads anvil's BF16 file bit for bit ({readers})")


if __name__ == "__main__":
    main()
