"""Robustness: corrupted files never crash the loader, the portable scalar kernels agree with the
SIMD ones, the GIL is released and a model shared between threads fails cleanly, and the command
line's demo runs."""

from __future__ import annotations

import itertools
import random
import subprocess
import sys
import threading

import numpy as np
import pytest

import specdec
import tinymodels as tm
from specdec import testing
from helpers import HERE, child_env, child_json

def try_load(path):
    """Load and, if that works, run a short forward: any outcome but a Python exception of the
    documented kinds (or success) is a failure; a crash kills the test process."""
    try:
        m = specdec.load(path, threads=1)
    except (ValueError, OSError):
        return "rejected"
    try:
        out = m.logits([0, 1, 2][: max(1, min(3, m.config.context_length))])
    except ValueError:
        return "rejected at forward"
    assert out.shape[1] == m.config.vocab_size
    return "loaded"


def test_gguf_corruptions_never_crash(tmp_path):
    """Every truncation inside the header and metadata, and 300 random byte corruptions of it,
    either load or raise ValueError/OSError."""
    good = tmp_path / "good.gguf"
    layout = tm.write_gguf(good, tm.CONFIGS["llama_odd"], tm.make_weights(tm.CONFIGS["llama_odd"], 1),
                           dtype="F16", alignment=64)
    data = good.read_bytes()
    rng = random.Random(0)
    head = layout.data_start
    cuts = list(range(0, head, 7)) + rng.sample(range(head, len(data)), 20)
    outcomes = {}
    p = tmp_path / "bad.gguf"
    for c in cuts:
        p.write_bytes(data[:c])
        r = try_load(p)
        outcomes[r] = outcomes.get(r, 0) + 1
        assert r != "loaded" or c >= head, f"a file cut at byte {c} of {len(data)} loaded"
    for _ in range(300):
        b = bytearray(data)
        for _ in range(rng.randint(1, 4)):
            b[rng.randrange(head)] = rng.randrange(256)
        p.write_bytes(bytes(b))
        r = try_load(p)
        outcomes[r] = outcomes.get(r, 0) + 1
    assert outcomes.get("rejected", 0) > len(cuts) // 2


def test_safetensors_corruptions_never_crash(tmp_path):
    cfg = tm.CONFIGS["qwen2_odd_tied"]
    files = tm.write_hf(tmp_path / "good", cfg, tm.make_weights(cfg, 2), dtype="BF16")
    st = files.files[0].read_bytes()
    conf = files.config.read_bytes()
    hlen = int.from_bytes(st[:8], "little")
    rng = random.Random(1)
    d = tmp_path / "bad"
    d.mkdir()
    cases = [(st[:c], conf) for c in range(0, hlen + 8, 5)]
    cases += [(st, conf[:c]) for c in range(0, len(conf), 3)]
    for _ in range(200):
        b = bytearray(st)
        for _ in range(rng.randint(1, 3)):
            b[rng.randrange(hlen + 8)] = rng.randrange(32, 127)
        cases.append((bytes(b), conf))
    for _ in range(100):
        b = bytearray(conf)
        b[rng.randrange(len(b))] = rng.randrange(32, 127)
        cases.append((st, bytes(b)))
    n_rejected = 0
    for stb, cb in cases:
        (d / "model.safetensors").write_bytes(stb)
        (d / "config.json").write_bytes(cb)
        n_rejected += try_load(d) != "loaded"
    assert n_rejected > len(cases) // 3


SCALAR_SCRIPT = r"""
import json, sys
import numpy as np
import specdec
from specdec import _core
out = {"simd": _core.simd_name(), "logits": {}}
for path in sys.argv[1:]:
    for kv in ("f16", "f32"):
        m = specdec.load(path, threads=2, kv_dtype=kv)
        toks = [t % m.config.vocab_size for t in range(0, 37 * 5, 5)]
        out["logits"][path + "|" + kv] = m.logits(toks).tolist()
print(json.dumps(out))
"""


def test_scalar_kernels_agree_with_simd_and_reference(tiny, ref_logits):
    """SPECDEC_SIMD=scalar runs the portable C kernels (the twins of the AVX2 ones): they must
    meet the same reference tolerance, and agree with the SIMD run to float32 rounding (with an
    f32 KV cache; with the f16 cache, to the half-ulp that a rounding difference can flip a key
    or value by, see test_logits.py)."""
    models = [tiny("llama_odd", "hf-f32"), tiny("llama_odd", "gguf-f16-v3-align64"),
              tiny("qwen2_odd_tied", "hf-bf16"), tiny("llama_wide_heads", "gguf-f32-v3")]
    out = child_json(SCALAR_SCRIPT, *[str(m.path) for m in models], SPECDEC_SIMD="scalar")
    assert out["simd"] == "scalar"
    for m, kv in itertools.product(models, ("f16", "f32")):
        got = np.array(out["logits"][f"{m.path}|{kv}"], dtype=np.float32)
        tokens = [t % m.cfg.vocab for t in range(0, 37 * 5, 5)]
        ref = ref_logits(m, tokens, kv_f16=kv == "f16")
        tol = 1e-3 if m.half else 5e-4 if kv == "f16" else 1e-4
        assert tm.rel_err(got, ref) <= tol, (m.name, m.fmt, kv)
        simd = specdec.load(m.path, kv_dtype=kv).logits(tokens)
        assert tm.rel_err(got, simd) <= (5e-4 if kv == "f16" else 1e-5), (m.name, m.fmt, kv)


def test_two_models_in_two_threads(tiny):
    """Calls release the GIL; two models decoding in parallel threads give the serial results."""
    a = specdec.load(tiny("llama_odd", "gguf-f32-v3").path, threads=1)
    b = specdec.load(tiny("qwen2", "hf-f32").path, threads=1)
    serial = [specdec.generate(a, [1, 2, 3], max_new_tokens=20).tokens,
              specdec.generate(b, [4, 5], max_new_tokens=20).tokens]
    results = [None, None]

    def run(i, m, prompt):
        for _ in range(20):
            results[i] = specdec.generate(m, prompt, max_new_tokens=20).tokens

    ts = [threading.Thread(target=run, args=(0, a, [1, 2, 3])),
          threading.Thread(target=run, args=(1, b, [4, 5]))]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert results == serial


def test_one_model_shared_by_threads(tiny):
    """Threads share a model: their calls take turns on it (a step at a time), and every
    result is the one a call has alone: never an error, a wrong answer or a crash."""
    m = specdec.load(tiny("llama_odd", "gguf-f32-v3").path, threads=1)
    prompt = [3, 1, 4, 1, 5]
    expected = specdec.generate(m, prompt, max_new_tokens=40).tokens
    outcomes = []
    lock = threading.Lock()

    def run():
        for _ in range(30):
            r = specdec.generate(m, prompt, max_new_tokens=40).tokens
            with lock:
                outcomes.append(r == expected)

    ts = [threading.Thread(target=run) for _ in range(3)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert len(outcomes) == 90 and all(outcomes)


def test_device_and_thread_arguments(llama_gguf):
    from specdec import _core

    if not _core.built_with_cuda():  # a CPU-only build says so
        with pytest.raises(ValueError, match="no CUDA backend"):
            specdec.load(llama_gguf.path, device="cuda")
    elif _core.cuda_probe()["devices"] == 0:  # a CUDA build on a machine without a GPU
        with pytest.raises(RuntimeError, match="CUDA device 0 is not available"):
            specdec.load(llama_gguf.path, device="cuda")
    else:
        with pytest.raises(RuntimeError, match="CUDA device 999 is not available"):
            specdec.load(llama_gguf.path, device="cuda:999")
    with pytest.raises(ValueError, match="unknown device"):
        specdec.load(llama_gguf.path, device="tpu")
    with pytest.raises(ValueError, match="unknown device"):
        specdec.load(llama_gguf.path, device="cuda:x")
    with pytest.raises(ValueError, match="threads"):
        specdec.load(llama_gguf.path, threads=0)
    m = specdec.load(llama_gguf.path, threads=3)
    assert m.threads == 3
    assert "llama" in repr(m)


def test_weight_bytes_counts_what_a_forward_reads(tiny):
    t = tiny("qwen2", "hf-bf16")
    m = specdec.load(t.path)
    c = t.cfg
    n_mat = sum(v.size for k, v in t.weights.items() if v.ndim == 2 and "embed_tokens" not in k)
    n_vec = sum(v.size for v in t.weights.values() if v.ndim == 1)
    head = 0 if not c.tied else c.vocab * c.dim  # a tied head reads the embedding table
    assert m.weight_bytes == 2 * (n_mat + head) + 4 * n_vec


def test_cli_demo_runs():
    """The README's main job on the tiny random shape: writes, loads, decodes, repeats."""
    res = subprocess.run([sys.executable, "-m", "specdec", "demo", "--max-new-tokens", "8"],
                         capture_output=True, text=True, timeout=300, cwd=HERE, env=child_env())
    assert res.returncode == 0, res.stderr
    assert "tokens/s" in res.stdout and "repeat  : identical" in res.stdout
    res = subprocess.run([sys.executable, "-m", "specdec", "run", "/nonexistent.gguf", "1 2"],
                         capture_output=True, text=True, timeout=60, cwd=HERE, env=child_env())
    assert res.returncode == 2 and "no such model file" in res.stderr


def test_gguf_metadata_values_of_every_type(tmp_path):
    """Model.gguf_metadata gives each value as the reader decodes it: the extremes of every
    integer type with their signs, floats, bools, strings (bytes when not UTF-8), nested
    arrays."""
    cfg = tm.TinyConfig(arch="llama", vocab=16, dim=16, n_layers=1, n_heads=2, n_kv_heads=1,
                        ffn=32, context_length=32)
    extra = [("x.u8", tm.GGUF_U8, 255), ("x.i8", tm.GGUF_I8, -128), ("x.u16", tm.GGUF_U16, 65535),
             ("x.i16", tm.GGUF_I16, -32768), ("x.u32", tm.GGUF_U32, 2**32 - 1),
             ("x.i32", tm.GGUF_I32, -2**31), ("x.u64", tm.GGUF_U64, 2**64 - 1),
             ("x.i64", tm.GGUF_I64, -2**63), ("x.f32", tm.GGUF_F32, 0.5),
             ("x.f64", tm.GGUF_F64, -1e300), ("x.bool", tm.GGUF_BOOL, True),
             ("x.str", tm.GGUF_STRING, "caf\u00e9"), ("x.raw", tm.GGUF_STRING, b"\xff\xfe"),
             ("x.arr", tm.GGUF_ARRAY, tm.Arr(tm.GGUF_ARRAY, [tm.Arr(tm.GGUF_I16, [-1, 2]),
                                                            tm.Arr(tm.GGUF_BOOL, [False])]))]
    path = str(tmp_path / "m.gguf")
    testing.write_gguf(path, cfg, tm.make_weights(cfg, 1), extra_kv=extra)
    meta = specdec.load(path)._core.gguf_metadata()
    got = {k: meta[k] for k, _, _ in extra}
    assert got == {"x.u8": 255, "x.i8": -128, "x.u16": 65535, "x.i16": -32768,
                   "x.u32": 2**32 - 1, "x.i32": -2**31, "x.u64": 2**64 - 1, "x.i64": -2**63,
                   "x.f32": 0.5, "x.f64": -1e300, "x.bool": True, "x.str": "caf\u00e9",
                   "x.raw": b"\xff\xfe", "x.arr": [[-1, 2], [False]]}
    assert type(meta["x.bool"]) is bool and type(meta["x.f32"]) is float
