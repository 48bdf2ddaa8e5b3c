"""Pack an EAGLE head directory (config.json + model.safetensors, the published layout) into
specdec's compact form, the form a head ships in inside the package: every matrix whose rows
are whole 32-element blocks stored as U8 rows of ggml's blocks, the rest as it is.

- ``--blocks q8_0`` (default): (rows, cols / 32 * 34), an f16 scale d = max|x| / 127 and 32 int8
  round(x / d): what specdec computes with by default (``Eagle(..., weights="q8_0")`` quantizes
  the same way at load), a little over half the bytes of F16.
- ``--blocks q4_1``: (rows, cols / 32, 20), an f16 scale d = (max - min) / 15, an f16 minimum m
  and 32 nibbles round((x - m) / d); element j of a block in the low nibble of byte j, element
  j + 16 in the high one. 0.625 bytes a weight.
- ``--blocks q4_0``: (rows, cols / 32, 18), an f16 scale d = x* / -8 (x* the element of largest
  magnitude) and 32 nibbles round(x / d) + 8, the same nibble order. 0.5625 bytes a weight.
- ``--lm-head-blocks``: another choice for EAGLE-3's ``lm_head`` (the draft's choice of token is
  its argmax, the matrix most sensitive to rounding).
- ``--draft-vocab N --counts FILE``: keep only the N draft tokens most frequent in ``counts``
  (an array over the target's vocabulary, e.g. the ``counts`` of the ``vocab.npz`` that
  ``python -m specdec.train eagle3`` leaves in its work directory): ``lm_head``'s rows, ``d2t``
  and ``t2d`` shrink to them.

Other tools read the published layout, which ``python -m specdec.train`` writes.

    python tools/pack_head.py HEAD_DIR OUT_DIR [--blocks q4_1] [--draft-vocab 4096 --counts F]
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


def _f16_bytes(a: np.ndarray) -> np.ndarray:
    return a.astype(np.float16)[..., None].view(np.uint8).reshape(a.shape + (2,))


def _nibbles(q: np.ndarray) -> np.ndarray:
    """(..., 32) values 0..15 -> (..., 16) bytes: element j low, element j + 16 high."""
    q = q.astype(np.uint8)
    return q[..., :16] | (q[..., 16:] << 4)


def q4_1(w: np.ndarray) -> np.ndarray:
    """(rows, cols) float -> (rows, cols / 32, 20) uint8 Q4_1 blocks."""
    x = np.asarray(w, np.float32).reshape(w.shape[0], -1, 32)
    lo, hi = x.min(axis=2), x.max(axis=2)
    d = (hi - lo) / np.float32(15.0)
    inv = np.where(d > 0, np.float32(1.0) / np.where(d > 0, d, 1), np.float32(0.0))
    q = np.clip(np.rint((x - lo[..., None]) * inv[..., None]), 0, 15)
    return np.concatenate([_f16_bytes(d), _f16_bytes(lo), _nibbles(q)], axis=2)


def q4_0(w: np.ndarray) -> np.ndarray:
    """(rows, cols) float -> (rows, cols / 32, 18) uint8 Q4_0 blocks."""
    x = np.asarray(w, np.float32).reshape(w.shape[0], -1, 32)
    far = np.take_along_axis(x, np.abs(x).argmax(axis=2)[..., None], axis=2)[..., 0]
    d = far / np.float32(-8.0)
    inv = np.where(d != 0, np.float32(1.0) / np.where(d != 0, d, 1), np.float32(0.0))
    q = np.clip(np.rint(x * inv[..., None]) + 8, 0, 15)
    return np.concatenate([_f16_bytes(d), _nibbles(q)], axis=2)


PACKERS = {"q8_0": q8_0, "q4_1": q4_1, "q4_0": q4_0}


def shrink_vocab(tensors: dict, config: dict, n: int, counts: np.ndarray) -> None:
    """Keep the n draft tokens most frequent in counts (over the target's vocabulary)."""
    d2t = tensors["d2t"].astype(np.int64)
    ids = np.arange(len(d2t)) + d2t
    if not 0 < n <= len(ids):
        raise ValueError(f"--draft-vocab {n}: the head drafts over {len(ids)} tokens")
    if len(counts) != config["vocab_size"]:
        raise ValueError(f"counts cover {len(counts)} tokens, the target has "
                         f"{config['vocab_size']}")
    keep = np.sort(np.argsort(-counts[ids], kind="stable")[:n])
    tensors["lm_head.weight"] = tensors["lm_head.weight"][keep]
    tensors["d2t"] = ids[keep] - np.arange(n)
    if "t2d" in tensors:
        t2d = np.zeros(config["vocab_size"], np.bool_)
        t2d[ids[keep]] = True
        tensors["t2d"] = t2d
    config["draft_vocab_size"] = n


def pack(src: Path, dst: Path, blocks: str = "q8_0", lm_head_blocks: str = "",
         draft_vocab: int = 0, counts=None) -> None:
    dst.mkdir(parents=True, exist_ok=True)
    config = json.loads((src / "config.json").read_text())
    tensors = read_safetensors(src / "model.safetensors")
    if draft_vocab:
        shrink_vocab(tensors, config, draft_vocab, np.asarray(counts))
    packed = {}
    for name, a in tensors.items():
        if a.ndim == 2 and a.dtype.kind == "f" and a.shape[1] % 32 == 0:
            kind = lm_head_blocks if name == "lm_head.weight" and lm_head_blocks else blocks
            packed[name] = PACKERS[kind](a)
        else:
            packed[name] = a
    if draft_vocab:
        (dst / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    else:
        shutil.copy(src / "config.json", dst / "config.json")
    write_safetensors(dst / "model.safetensors", packed)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("src", type=Path)
    p.add_argument("dst", type=Path)
    p.add_argument("--blocks", choices=sorted(PACKERS), default="q8_0")
    p.add_argument("--lm-head-blocks", choices=sorted(PACKERS), default="")
    p.add_argument("--draft-vocab", type=int, default=0)
    p.add_argument("--counts", type=Path,
                   help="a .npz with 'counts' (or a .npy): token counts over the target's vocabulary")
    a = p.parse_args()
    counts = None
    if a.draft_vocab:
        if a.counts is None:
            p.error("--draft-vocab needs --counts")
        counts = np.load(a.counts)
        counts = counts["counts"] if hasattr(counts, "files") else counts
    pack(a.src, a.dst, a.blocks, a.lm_head_blocks, a.draft_vocab, counts)


if __name__ == "__main__":
    main()
