"""Tiny random transformer models for specdec's tests.

The writers themselves live in specdec.testing (random weights in Hugging Face naming and layout,
written as an HF directory or a GGUF file the way llama.cpp lays it out). This module adds what
only the tests need: GGUF metadata of every value type for the loader to skip, small readers that
check the writers (tests/test_tinymodels.py), the named test configurations and formats, and
helpers to cut or patch files.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from specdec import testing
from specdec.testing import (  # noqa: F401  (re-exported for the tests)
    GGML_F16, GGML_F32, GGML_SIZE, GGML_TYPE, GGUF_ARRAY, GGUF_BOOL, GGUF_F32, GGUF_F64,
    GGUF_I8, GGUF_I16, GGUF_I32, GGUF_I64, GGUF_STRING, GGUF_U8, GGUF_U16, GGUF_U32, GGUF_U64,
    ST_DTYPE_SIZE, Arr, GGUFLayout, HFFiles, _SCALAR_FMT, bf16_bits_to_f32, encode,
    f32_to_bf16_bits, gguf_name, gguf_tensors, hf_config_dict, permute_qk, round_to,
    safetensors_bytes, write_hf,
)
from specdec.testing import RandomModelConfig as TinyConfig
from specdec.testing import random_weights as make_weights


def extra_metadata(cfg: TinyConfig, arch: str | None = None) -> list:
    """Metadata beyond the hyper-parameters, of every value type (string arrays, f32 array,
    nested and empty arrays, u64, bool...), which the loader must validate and skip."""
    a = arch or cfg.arch
    V = cfg.vocab
    tokens = [f"<t{i}>" for i in range(V)]
    tokens[3] = "\u2581h\u00e9llo"  # multi-byte UTF-8
    tokens[4] = ""  # empty string element
    return [
        ("tokenizer.ggml.model", GGUF_STRING, "llama" if a == "llama" else "gpt2"),
        ("tokenizer.ggml.tokens", GGUF_ARRAY, Arr(GGUF_STRING, tokens)),
        ("tokenizer.ggml.scores", GGUF_ARRAY, Arr(GGUF_F32, [float(-i) for i in range(V)])),
        ("tokenizer.ggml.token_type", GGUF_ARRAY, Arr(GGUF_I32, [1] * V)),
        ("tokenizer.ggml.bos_token_id", GGUF_U32, 1),
        ("tokenizer.ggml.eos_token_id", GGUF_U32, 2),
        ("tokenizer.ggml.add_bos_token", GGUF_BOOL, True),
        ("specdec.test.u8", GGUF_U8, 200),
        ("specdec.test.i8", GGUF_I8, -100),
        ("specdec.test.u16", GGUF_U16, 60000),
        ("specdec.test.i16", GGUF_I16, -30000),
        ("specdec.test.i32", GGUF_I32, -123456),
        ("specdec.test.u64", GGUF_U64, 2**63 + 5),
        ("specdec.test.i64", GGUF_I64, -(2**62)),
        ("specdec.test.f64", GGUF_F64, 3.25),
        ("specdec.test.bool", GGUF_BOOL, False),
        ("specdec.test.empty_string", GGUF_STRING, ""),
        ("specdec.test.empty_array", GGUF_ARRAY, Arr(GGUF_U8, [])),
        ("specdec.test.u64_array", GGUF_ARRAY, Arr(GGUF_U64, [1, 2, 2**40])),
        ("specdec.test.bool_array", GGUF_ARRAY, Arr(GGUF_BOOL, [True, False, True])),
        (
            "specdec.test.nested",
            GGUF_ARRAY,
            Arr(GGUF_ARRAY, [Arr(GGUF_I32, [1, -2, 3]), Arr(GGUF_STRING, ["x", "yz"]), Arr(GGUF_F64, [])]),
        ),
    ]




def write_gguf(path, cfg: TinyConfig, weights: dict, dtype: str = "F32", version: int = 3,
               alignment: int = 32, *, arch: str | None = None, extra_kv: list | None = None,
               **kw) -> GGUFLayout:
    """specdec.testing.write_gguf with the test metadata of extra_metadata() added."""
    return testing.write_gguf(path, cfg, weights, dtype, version, alignment, arch=arch,
                              extra_kv=extra_metadata(cfg, arch) + list(extra_kv or []), **kw)


def stored_weights(weights: dict, fmt: str, dtype: str) -> dict[str, np.ndarray]:
    """The float32 values the file written by write_hf / write_gguf actually holds.

    HF: every tensor is stored as `dtype`. GGUF: matrices (2-D) as `dtype`, 1-D tensors (norms,
    biases) always F32, as llama.cpp's converter does.
    """
    out = {}
    for k, v in weights.items():
        if fmt == "hf" or v.ndim >= 2:
            out[k] = round_to(v, dtype)
        else:
            out[k] = np.asarray(v, dtype=np.float32).copy()
    return out


def truncate_file(path, n_bytes: int) -> None:
    """Cut `path` to its first `n_bytes` bytes."""
    with open(path, "r+b") as f:
        f.truncate(n_bytes)


def patch_file(path, offset: int, data: bytes) -> None:
    """Overwrite bytes of `path` at `offset`."""
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


# ---------------------------------------------------------------------------------------------
# safetensors / Hugging Face directory
# ---------------------------------------------------------------------------------------------

def read_safetensors(path) -> dict[str, np.ndarray]:
    """Minimal reader (F32/F16/BF16) returning float32 arrays; for checking the writer."""
    data = Path(path).read_bytes()
    (n,) = struct.unpack_from("<Q", data, 0)
    header = json.loads(data[8 : 8 + n])
    base = 8 + n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        b, e = info["data_offsets"]
        raw = data[base + b : base + e]
        dt = info["dtype"]
        if dt == "F32":
            a = np.frombuffer(raw, dtype="<f4")
        elif dt == "F16":
            a = np.frombuffer(raw, dtype="<f2").astype(np.float32)
        elif dt == "BF16":
            a = bf16_bits_to_f32(np.frombuffer(raw, dtype="<u2"))
        else:
            raise ValueError(dt)
        out[name] = a.reshape(info["shape"]).astype(np.float32)
    return out


# ---------------------------------------------------------------------------------------------
# GGUF
# ---------------------------------------------------------------------------------------------

def read_gguf(path) -> tuple[dict, dict[str, np.ndarray], dict]:
    """Minimal GGUF reader for checking the writer: returns (metadata {key: python value},
    tensors {name: float32 array with numpy shape = reversed dims}, info {version, alignment,
    types {name: ggml type}})."""
    data = Path(path).read_bytes()
    pos = 0

    def take(fmt):
        nonlocal pos
        vals = struct.unpack_from(fmt, data, pos)
        pos += struct.calcsize(fmt)
        return vals[0] if len(vals) == 1 else vals

    def rstr():
        nonlocal pos
        n = take("<Q")
        s = data[pos : pos + n].decode("utf-8")
        pos += n
        return s

    def rval(t):
        if t == GGUF_STRING:
            return rstr()
        if t == GGUF_ARRAY:
            et, n = take("<I"), take("<Q")
            return [rval(et) for _ in range(n)]
        return take(_SCALAR_FMT[t])

    assert data[:4] == b"GGUF", data[:4]
    pos = 4
    version = take("<I")
    n_tensors, n_kv = take("<Q"), take("<Q")
    meta = {}
    for _ in range(n_kv):
        k = rstr()
        t = take("<I")
        meta[k] = rval(t)
    infos = []
    for _ in range(n_tensors):
        name = rstr()
        nd = take("<I")
        dims = [take("<Q") for _ in range(nd)]
        gtype = take("<I")
        off = take("<Q")
        infos.append((name, dims, gtype, off))
    alignment = meta.get("general.alignment", 32)
    pos += (-pos) % alignment
    data_start = pos
    tensors, types = {}, {}
    for name, dims, gtype, off in infos:
        n = int(np.prod(dims))
        start = data_start + off
        if gtype == GGML_F32:
            a = np.frombuffer(data, dtype="<f4", count=n, offset=start)
        elif gtype == GGML_F16:
            a = np.frombuffer(data, dtype="<f2", count=n, offset=start).astype(np.float32)
        else:
            raise ValueError(gtype)
        tensors[name] = a.reshape(list(reversed(dims))).astype(np.float32)
        types[name] = gtype
    return meta, tensors, {"version": version, "alignment": alignment, "types": types}


# ---------------------------------------------------------------------------------------------
# named test configurations
# ---------------------------------------------------------------------------------------------

CONFIGS: dict[str, TinyConfig] = {
    # multi-head attention, untied head
    "llama": TinyConfig(arch="llama", vocab=64, dim=32, n_layers=2, n_heads=4, n_kv_heads=4, ffn=64),
    # tied head
    "llama_tied": TinyConfig(arch="llama", vocab=64, dim=32, n_layers=2, n_heads=4, n_kv_heads=4, ffn=64, tied=True),
    # grouped-query attention: 4 query heads on 2 kv heads / on 1 kv head
    "llama_gqa2": TinyConfig(arch="llama", vocab=64, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn=64),
    "llama_gqa1": TinyConfig(arch="llama", vocab=64, dim=32, n_layers=2, n_heads=4, n_kv_heads=1, ffn=64,
                             rope_theta=500000.0),
    # awkward sizes: vocab 97, hidden 48 = 4 heads x 12, ffn 80, 3 layers
    "llama_odd": TinyConfig(arch="llama", vocab=97, dim=48, n_layers=3, n_heads=4, n_kv_heads=2, ffn=80,
                            rms_eps=1e-6),
    # qwen2: q/k/v biases, rotate-half in GGUF too
    "qwen2": TinyConfig(arch="qwen2", vocab=64, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn=64,
                        rope_theta=1000000.0, rms_eps=1e-6),
    # heads of 72 (the SIMD attention's 64-wide chunk plus a remainder), ffn 100 (not a multiple
    # of 8: the vector SwiGLU's masked tail)
    "llama_wide_heads": TinyConfig(arch="llama", vocab=64, dim=144, n_layers=2, n_heads=2, n_kv_heads=1,
                                   ffn=100),
    "qwen2_odd_tied": TinyConfig(arch="qwen2", vocab=97, dim=48, n_layers=2, n_heads=4, n_kv_heads=1, ffn=80,
                                 tied=True),
}

CONFIG_SEEDS = {name: 1000 + i for i, name in enumerate(CONFIGS)}

# file formats: (kind, options)
FORMATS: dict[str, dict] = {
    "hf-f32": dict(kind="hf", dtype="F32", shards=1),
    "hf-f16": dict(kind="hf", dtype="F16", shards=1),
    "hf-bf16": dict(kind="hf", dtype="BF16", shards=1),
    "hf-f32-sharded3": dict(kind="hf", dtype="F32", shards=3),
    "hf-bf16-sharded2": dict(kind="hf", dtype="BF16", shards=2),
    "gguf-f32-v3": dict(kind="gguf", dtype="F32", version=3, alignment=32),
    "gguf-f32-v2-align64": dict(kind="gguf", dtype="F32", version=2, alignment=64),
    "gguf-f16-v3-align64": dict(kind="gguf", dtype="F16", version=3, alignment=64),
    "gguf-f16-v2-reversed": dict(kind="gguf", dtype="F16", version=2, alignment=32, reverse_tensors=True),
}


@dataclass
class TinyModel:
    """A written tiny model: where it is and what it holds."""

    name: str
    fmt: str
    path: Path  # .gguf file or HF directory
    cfg: TinyConfig
    weights: dict  # the float32 weights before storage
    ref_weights: dict  # the float32 values actually stored (rounded for F16/BF16)
    dtype: str

    @property
    def half(self) -> bool:
        return self.dtype != "F32"


def write_model(root, name: str, fmt: str, cfg: TinyConfig | None = None, seed: int | None = None) -> TinyModel:
    """Write configuration `name` (or `cfg`) in format `fmt` under directory `root`."""
    cfg = cfg or CONFIGS[name]
    seed = CONFIG_SEEDS.get(name, 7) if seed is None else seed
    w = make_weights(cfg, seed)
    spec = dict(FORMATS[fmt])
    kind = spec.pop("kind")
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    if kind == "hf":
        d = root / f"{name}-{fmt}"
        write_hf(d, cfg, w, **spec)
        path = d
    else:
        path = root / f"{name}-{fmt}.gguf"
        write_gguf(path, cfg, w, **spec)
    return TinyModel(name=name, fmt=fmt, path=path, cfg=cfg, weights=w,
                     ref_weights=stored_weights(w, kind, spec["dtype"]), dtype=spec["dtype"])


def random_tokens(vocab: int, n: int, seed: int) -> list[int]:
    rng = np.random.default_rng(seed)
    return [int(x) for x in rng.integers(0, vocab, size=n)]


def rel_err(got, ref) -> float:
    """max|got - ref| / max|ref|."""
    got = np.asarray(got, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    assert got.shape == ref.shape, (got.shape, ref.shape)
    return float(np.max(np.abs(got - ref)) / np.max(np.abs(ref)))

