#!/usr/bin/python3
"""Writes the fuzz targets' seed corpus (corpus/) and the inputs of known
parser bugs (regressions/), next to this script. The files are in the
repository; run this again only to change them (the output is the same
byte for byte: gzip streams carry no time stamp).

Seeds are small well-formed files plus a few near misses, so that libFuzzer
starts from inputs that reach every check. The checkpoints are for the
fuzz_checkpoint target's model: Conv2d(1, 2, 3), BatchNorm2d(2), ReLU,
Flatten, Linear(8, 3), with SGD momentum.
"""
import gzip
import json
import shutil
import struct
from pathlib import Path

HERE = Path(__file__).resolve().parent


def idx(dims, data, type_code=0x08):
    return bytes([0, 0, type_code, len(dims)]) + b"".join(struct.pack(">I", d) for d in dims) + bytes(data)


def gz(data):
    return gzip.compress(data, mtime=0)


def safetensors(tensors, metadata=True):
    """tensors: list of (name, dtype, shape, raw bytes); laid out as
    save_safetensors lays them out (8-byte aligned header)."""
    header = {"__metadata__": {"format": "pt"}} if metadata else {}
    offset, blobs = 0, []
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
        blobs.append(raw)
    return safetensors_text(json.dumps(header, separators=(",", ":")), b"".join(blobs))


def safetensors_text(header_text, data):
    text = header_text.encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    return struct.pack("<Q", len(text)) + text + data


def f32(*values):
    return struct.pack(f"<{len(values)}f", *values)


def f32_range(n, start=0.0):
    return f32(*[start + 0.125 * i for i in range(n)])


MODEL = [  # (key, dtype, shape): the fuzz_checkpoint model's state_dict
    ("0.weight", "F32", [2, 1, 3, 3]), ("0.bias", "F32", [2]),
    ("1.weight", "F32", [2]), ("1.bias", "F32", [2]),
    ("1.running_mean", "F32", [2]), ("1.running_var", "F32", [2]),
    ("1.num_batches_tracked", "I64", []),
    ("4.weight", "F32", [3, 8]), ("4.bias", "F32", [3]),
]
PARAMETERS = ["0.weight", "0.bias", "1.weight", "1.bias", "4.weight", "4.bias"]


def numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def model_tensors(prefix="model."):
    out = []
    for key, dtype, shape in MODEL:
        if dtype == "I64":
            out.append((prefix + key, dtype, shape, struct.pack("<q", 4)))
        else:
            out.append((prefix + key, dtype, shape, f32_range(numel(shape), 0.5)))
    return out


def checkpoint(epochs_done, steps_done, momentum=True, info=None):
    tensors = model_tensors()
    if momentum:
        shapes = {key: shape for key, _, shape in MODEL}
        for key in PARAMETERS:
            tensors.append(("optimizer.momentum." + key, "F32", shapes[key],
                            f32_range(numel(shapes[key]), -0.25)))
    state = {"format": "anvil-train-checkpoint", "version": 1, "epochs_done": epochs_done,
             "steps_done": steps_done, "info": info if info is not None else {}}
    text = json.dumps(state, separators=(",", ":")).encode()
    tensors.append(("trainer.state", "U8", [len(text)], text))
    return safetensors(tensors)


def write(folder, name, data):
    path = HERE / folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def main():
    for folder in ("corpus", "regressions"):
        shutil.rmtree(HERE / folder, ignore_errors=True)

    raw_idx = {
        "labels-10": idx([10], range(10)),
        "images-3x4x4": idx([3, 4, 4], [(i * 37) % 256 for i in range(48)]),
        "matrix-2x5": idx([2, 5], range(10)),
        "labels-out-of-range": idx([4], [1, 9, 10, 255]),
        "truncated": idx([5], [1, 2, 3]),
        "trailing-garbage": idx([2], [1, 2, 3, 4]),
        "float32-type": idx([1], [0, 0, 0, 0], type_code=0x0D),
    }
    for name, data in raw_idx.items():
        write("corpus/idx", name, data)
        write("corpus/idx_gz", name, data)
    write("corpus/idx", "labels-10.gz", gz(raw_idx["labels-10"]))
    write("corpus/idx", "images-3x4x4.gz", gz(raw_idx["images-3x4x4"]))

    write("corpus/safetensors", "mixed", safetensors([
        ("w", "F32", [2, 2], f32(1, 2, 3, 4)),
        ("steps", "I64", [3], struct.pack("<3q", 1, 2, 3)),
        ("empty", "U8", [0, 4], b""),
        ("scalar", "F32", [], f32(0.5)),
        ("bytes", "U8", [5], b"hello"),
    ]))
    write("corpus/safetensors", "one-tensor", safetensors([("x", "F32", [3], f32(1, 2, 3))], False))
    write("corpus/safetensors", "weights", safetensors(model_tensors(prefix="")))

    history = [{"epoch": 1, "train_loss": 1.5, "train_acc": 0.5, "test_acc": 0.6}]
    write("corpus/checkpoint", "epoch-1", checkpoint(1, 4, info={"settings": {"lr": 0.1}, "history": history}))
    write("corpus/checkpoint", "epoch-0-no-momentum", checkpoint(0, 0, momentum=False))
    write("corpus/checkpoint", "weights-only", safetensors(model_tensors()))

    # Known parser bugs, found by hand and by fuzzing (docs/fuzzing.md).
    declares_2g = idx([1 << 31], [7] * 8)  # 16 bytes declaring 2^31 elements
    write("regressions/idx", "declares-2g-raw", declares_2g)
    write("regressions/idx", "declares-2g.gz", gz(declares_2g))
    write("regressions/idx", "labels-10-short", idx([100], [i % 10 for i in range(90)]))
    write("regressions/idx", "gzip-trailer-cut.gz", gz(raw_idx["labels-10"])[:-4])
    write("regressions/idx_gz", "declares-2g", declares_2g)
    entry = '{{"dtype":"F32","shape":{},"data_offsets":{}}}'
    for name, shape, offsets in [("shape-1e30", "[1e30]", "[0,16]"),
                                 ("shape-minus-1.5", "[-1.5]", "[0,16]"),
                                 ("shape-1.5", "[1.5]", "[0,16]"),
                                 ("offsets-float", "[4]", "[0,16.0]"),
                                 ("shape-zero-then-huge", "[0,4294967296,4294967296]", "[0,0]")]:
        write("regressions/safetensors", name,
              safetensors_text('{"w":' + entry.format(shape, offsets) + "}", f32(1, 2, 3, 4)))
    one = entry.format("[4]", "[0,16]")
    write("regressions/safetensors", "duplicate-name",
          safetensors_text('{"w":' + one + ',"w":' + one + "}", f32(1, 2, 3, 4)))
    write("regressions/checkpoint", "duplicate-tensor-name",
          checkpoint(1, 4).replace(b'"trainer.state"', b'"model.0.bias"', 1))


if __name__ == "__main__":
    main()
