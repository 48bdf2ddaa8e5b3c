"""Pack an EAGLE head directory (config.json + model.safetensors, the published layout) into
specdec's compact form: every matrix whose rows are whole 32-element blocks stored as U8 rows of
ggml's Q8_0 blocks (an f16 scale d = max|x| / 127, then 32 int8 round(x / d)), the rest as it
is. It is what specdec computes with by default (``Eagle(..., weights="q8_0")`` quantizes the
same way at load), at a little over half the bytes of F16: the form a head ships in inside the
package. Other tools read the published layout, which ``python -m specdec.train`` writes.

    python tools/pack_head.py HEAD_DIR OUT_DIR
"""

from __future__ import annotations

import argparse
import json
import shutil
import struct
from pathlib import Path

import numpy as np

DTYPES = {"F32": np.float32, "F16": np.float16, "I64": np.int64, "BOOL": np.bool_,
          "U8": np.uint8}
NAMES = {np.dtype(v): k for k, v in DTYPES.items()}


def read_safetensors(path: Path) -> dict:
    data = path.read_bytes()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        b, e = info["data_offsets"]
        if info["dtype"] == "BF16":
            bits = np.frombuffer(data[8 + n + b:8 + n + e], np.uint16).astype(np.uint32) << 16
            arr = bits.view(np.float32)
        else:
            arr = np.frombuffer(data[8 + n + b:8 + n + e], DTYPES[info["dtype"]])
        out[name] = arr.reshape(info["shape"])
    return out


def write_safetensors(path: Path, tensors: dict) -> None:
    header, blobs, off = {}, [], 0
    for name, a in tensors.items():
        a = np.ascontiguousarray(a)
        header[name] = {"dtype": NAMES[a.dtype], "shape": list(a.shape),
                        "data_offsets": [off, off + a.nbytes]}
        blobs.append(a.tobytes())
        off += a.nbytes
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    path.write_bytes(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def q8_0(w: np.ndarray) -> np.ndarray:
    """(rows, cols) float -> (rows, cols / 32 * 34) uint8 Q8_0 blocks, in float32 arithmetic
    as specdec's own quantizer does it (so both give the same bytes)."""
    x = np.asarray(w, np.float32).reshape(w.shape[0], -1, 32)
    amax = np.abs(x).max(axis=2, keepdims=True)
    d = amax / np.float32(127.0)
    inv = np.where(d > 0, np.float32(1.0) / np.where(d > 0, d, 1), np.float32(0.0))
    q = np.rint(x * inv.astype(np.float32)).astype(np.int8)
    out = np.empty((w.shape[0], x.shape[1], 34), np.uint8)
    out[:, :, :2] = d.astype(np.float16).view(np.uint8).reshape(w.shape[0], x.shape[1], 2)
    out[:, :, 2:] = q.view(np.uint8)
    return out.reshape(w.shape[0], -1)


def pack(src: Path, dst: Path) -> None:
    dst.mkdir(parents=True, exist_ok=True)
    shutil.copy(src / "config.json", dst / "config.json")
    tensors = read_safetensors(src / "model.safetensors")
    packed = {}
    for name, a in tensors.items():
        if a.ndim == 2 and a.dtype.kind == "f" and a.shape[1] % 32 == 0:
            packed[name] = q8_0(a)
        else:
            packed[name] = a
    write_safetensors(dst / "model.safetensors", packed)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("src", type=Path)
    p.add_argument("dst", type=Path)
    a = p.parse_args()
    pack(a.src, a.dst)


if __name__ == "__main__":
    main()
