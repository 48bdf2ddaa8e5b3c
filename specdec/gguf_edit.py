"""Derive a smaller GGUF model from a larger one by keeping its first layers.

A model truncated to its first N layers (plus the embeddings, final norm and output head) is the
cheapest draft model there is for a target that has no small sibling sharing its tokenizer: it
is what self-speculation (:class:`specdec.LayerSkip`) computes, as a separate file with its own
cache, usable as a :class:`specdec.DraftModel`. The tensors are copied byte for byte (quantized
blocks included); only the layer count in the metadata changes.

    python -m specdec.gguf_edit truncate SRC.gguf DST.gguf --layers 20
"""

from __future__ import annotations

import argparse
import re
import struct
from typing import BinaryIO, List, Tuple

_MAGIC = b"GGUF"
_STRING, _ARRAY = 8, 9
# byte sizes of the scalar value types (GGUF spec: u8 i8 u16 i16 u32 i32 f32 bool _ _ u64 i64 f64)
_SCALAR_SIZE = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_LAYER = re.compile(r"^blk\.(\d+)\.")


class _Reader:
    def __init__(self, f: BinaryIO):
        self.f = f

    def take(self, n: int) -> bytes:
        b = self.f.read(n)
        if len(b) != n:
            raise ValueError("truncated GGUF file")
        return b

    def u32(self) -> int:
        return struct.unpack("<I", self.take(4))[0]

    def u64(self) -> int:
        return struct.unpack("<Q", self.take(8))[0]

    def string(self) -> bytes:
        return self.take(self.u64())

    def value(self, vtype: int) -> bytes:
        """The raw bytes of one value of type vtype (so it can be written back unchanged)."""
        if vtype == _STRING:
            n = self.u64()
            return struct.pack("<Q", n) + self.take(n)
        if vtype == _ARRAY:
            etype, n = self.u32(), self.u64()
            head = struct.pack("<IQ", etype, n)
            if etype in _SCALAR_SIZE:
                return head + self.take(_SCALAR_SIZE[etype] * n)
            return head + b"".join(self.value(etype) for _ in range(n))
        if vtype not in _SCALAR_SIZE:
            raise ValueError(f"unknown GGUF value type {vtype}")
        return self.take(_SCALAR_SIZE[vtype])


def truncate_layers(src: str, dst: str, n_layers: int) -> None:
    """Write to ``dst`` the model in GGUF file ``src`` cut to its first ``n_layers`` layers.

    Raises ValueError when ``src`` is not a GGUF file this function can read, has no layer
    count, or ``n_layers`` is not in [1, its layer count].
    """
    with open(src, "rb") as f:
        r = _Reader(f)
        if r.take(4) != _MAGIC:
            raise ValueError(f"{src} is not a GGUF file")
        version = r.u32()
        if version not in (2, 3):
            raise ValueError(f"GGUF version {version} is not supported")
        n_tensors, n_kv = r.u64(), r.u64()
        kvs: List[Tuple[bytes, int, bytes]] = []
        for _ in range(n_kv):
            key = r.string()
            vtype = r.u32()
            kvs.append((key, vtype, r.value(vtype)))
        infos = []  # (name, dims, type, offset)
        for _ in range(n_tensors):
            name = r.string().decode("utf-8")
            dims = [r.u64() for _ in range(r.u32())]
            infos.append((name, dims, r.u32(), r.u64()))
        align = 32
        block_key = None
        for key, vtype, raw in kvs:
            if key == b"general.alignment" and vtype == 4:
                align = struct.unpack("<I", raw)[0]
            if key.endswith(b".block_count") and vtype in (4, 5):
                block_key = key
        if block_key is None:
            raise ValueError(f"{src} has no <arch>.block_count")
        have = struct.unpack("<I", dict((k, v) for k, _, v in kvs)[block_key])[0]
        if not 1 <= n_layers <= have:
            raise ValueError(f"n_layers must be in [1, {have}] (the model's layers), got {n_layers}")
        data_start = (f.tell() + align - 1) // align * align
        # a tensor's size: up to the next offset in file order (data is laid out contiguously,
        # with padding to the alignment that the copy re-creates anyway)
        f.seek(0, 2)
        end = f.tell() - data_start
        by_offset = sorted(infos, key=lambda t: t[3])
        size = {t[0]: (by_offset[i + 1][3] if i + 1 < len(by_offset) else end) - t[3]
                for i, t in enumerate(by_offset)}
        keep = [t for t in infos
                if not (m := _LAYER.match(t[0])) or int(m.group(1)) < n_layers]

        head = bytearray(_MAGIC + struct.pack("<IQQ", version, len(keep), len(kvs)))
        for key, vtype, raw in kvs:
            if key == block_key:
                raw = struct.pack("<I", n_layers)
            head += struct.pack("<Q", len(key)) + key + struct.pack("<I", vtype) + raw
        offset = 0
        placed = []
        for name, dims, ttype, off in keep:
            nb = name.encode("utf-8")
            head += struct.pack("<Q", len(nb)) + nb + struct.pack("<I", len(dims))
            head += b"".join(struct.pack("<Q", d) for d in dims)
            head += struct.pack("<IQ", ttype, offset)
            placed.append((off, offset, size[name]))
            offset = (offset + size[name] + align - 1) // align * align
        with open(dst, "wb") as out:
            out.write(head)
            out.write(b"\0" * (-len(head) % align))
            base = out.tell()
            for off, new_off, n in placed:
                out.write(b"\0" * (base + new_off - out.tell()))
                f.seek(data_start + off)
                left = n
                while left > 0:
                    chunk = f.read(min(left, 1 << 24))
                    if not chunk:
                        raise ValueError("truncated GGUF file")
                    out.write(chunk)
                    left -= len(chunk)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m specdec.gguf_edit", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("truncate", help="keep the first --layers layers")
    t.add_argument("src")
    t.add_argument("dst")
    t.add_argument("--layers", type=int, required=True)
    args = p.parse_args(argv)
    truncate_layers(args.src, args.dst, args.layers)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
