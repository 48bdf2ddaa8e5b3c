"""The kernel checks' inputs, shared by test_twins.py (each CPU twin against a NumPy reference)
and test_cuda.py (each CUDA kernel against its twin on the very same inputs).

`run(name, device, *args)` calls specdec._core.kernel: arrays are written in place, so every
case builds fresh arrays (`case(...)` returns the argument list) and a caller runs it once per
device. Sizes are awkward on purpose: vocabularies of 97, rows of 48 or 96 elements, 1 and 37
tokens, head dimensions of 16 and 48, 5 query heads over 1 KV head.
"""

from __future__ import annotations

import numpy as np

import quantref
from specdec import _core

CPU, CUDA = 0, 1
TYPE_IDS = {"F32": 0, "F16": 1, "BF16": 30}
TYPE_IDS.update({name: tid for tid, (name, *_rest) in quantref.FORMATS.items()})


def run(name: str, device: int, args: list) -> list:
    _core.kernel(name, device, args)
    return args


def fresh(args: list) -> list:
    """A copy of a case's arguments (arrays copied), to run it again on another device."""
    return [a.copy() if isinstance(a, np.ndarray) else a for a in args]


def weights(type_name: str, rows: int, cols: int, rng) -> tuple[np.ndarray, np.ndarray]:
    """(stored bytes as uint8, dequantized float64 (rows, cols)) of a random matrix."""
    if type_name in ("F32", "F16", "BF16"):
        w = rng.standard_normal((rows, cols)).astype(np.float32)
        if type_name == "F32":
            return w.view(np.uint8).reshape(-1).copy(), w.astype(np.float64)
        if type_name == "F16":
            h = w.astype(np.float16)
            return h.view(np.uint8).reshape(-1).copy(), h.astype(np.float64)
        bits = ((w.view(np.uint32) + 0x7FFF + ((w.view(np.uint32) >> 16) & 1)) >> 16)
        bits = bits.astype(np.uint16)
        return (bits.view(np.uint8).reshape(-1).copy(),
                (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64))
    tid = TYPE_IDS[type_name]
    qk = quantref.FORMATS[tid][1]
    blocks = quantref.random_blocks(tid, rows * cols // qk, rng)
    deq = quantref.dequantize(tid, blocks).reshape(rows, cols).astype(np.float64)
    return np.frombuffer(blocks.tobytes(), dtype=np.uint8).copy(), deq


# ---- cases: (args, reference-or-None) ------------------------------------------------------------

def embed_case(type_name: str, T: int, seed: int):
    rng = np.random.default_rng(seed)
    V, D = 97, 256  # a whole K-quant super-block per row
    table, deq = weights(type_name, V, D, rng)
    tokens = rng.integers(0, V, T).astype(np.int32)
    out = np.full((T, D), np.nan, np.float32)
    return [out, table, TYPE_IDS[type_name], D, tokens, T, V], deq[tokens]


def rmsnorm_case(T: int, n: int, seed: int):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((T, n)).astype(np.float32) * 3
    w = rng.standard_normal(n).astype(np.float32)
    eps = 1e-5
    ref = x / np.sqrt(np.mean(x.astype(np.float64) ** 2, axis=1, keepdims=True) + eps) * w
    return [np.full((T, n), np.nan, np.float32), x, w, T, n, eps], ref


def rope_case(T: int, H: int, Dh: int, neox: int, seed: int):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((T, H, Dh)).astype(np.float32)
    pos = rng.integers(0, 5000, T).astype(np.int32)
    freq = 10000.0 ** (-2.0 * np.arange(Dh // 2) / Dh)
    ang = pos[:, None].astype(np.float64) * freq[None, :]
    c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    x64 = x.astype(np.float64)
    ref = x64.copy()
    if neox:
        a, b = x64[..., : Dh // 2], x64[..., Dh // 2:]
        ref[..., : Dh // 2], ref[..., Dh // 2:] = a * c - b * s, a * s + b * c
    else:
        a, b = x64[..., 0::2], x64[..., 1::2]
        ref[..., 0::2], ref[..., 1::2] = a * c - b * s, a * s + b * c
    return [x.reshape(T, H * Dh).copy(), pos, freq.astype(np.float64), T, H, Dh, neox], \
        ref.reshape(T, H * Dh)


def swiglu_case(n: int, seed: int):
    rng = np.random.default_rng(seed)
    g = rng.standard_normal(n).astype(np.float32) * 4
    u = rng.standard_normal(n).astype(np.float32)
    g64 = g.astype(np.float64)
    return [np.full(n, np.nan, np.float32), g, u, n], g64 / (1 + np.exp(-g64)) * u


def head_input_case(T: int, n: int, norm_residual: int, seed: int):
    """An EAGLE-3 head layer's input: (args, (out reference, x reference))."""
    rng = np.random.default_rng(seed)
    e = rng.standard_normal((T, n)).astype(np.float32)
    x = rng.standard_normal((T, n)).astype(np.float32) * 5
    w_in = rng.standard_normal(n).astype(np.float32)
    w_hid = rng.standard_normal(n).astype(np.float32)
    eps = 1e-6

    def norm(a, w):
        a = a.astype(np.float64)
        return a / np.sqrt(np.mean(a ** 2, axis=1, keepdims=True) + eps) * w

    out = np.concatenate([norm(e, w_in), norm(x, w_hid)], axis=1)
    x_after = out[:, n:] if norm_residual else x.astype(np.float64)
    return ([np.full((T, 2 * n), np.nan, np.float32), e, x.copy(), w_in, w_hid, T, n, eps,
             norm_residual], (out, x_after))


def silu_add_case(n: int, seed: int):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(n).astype(np.float32)
    u = rng.standard_normal(n).astype(np.float32) * 4
    u64 = u.astype(np.float64)
    return [x.copy(), u, n], x.astype(np.float64) + u64 / (1 + np.exp(-u64))


def kv_write_case(T: int, Hkv: int, Dh: int, cap: int, seed: int):
    rng = np.random.default_rng(seed)
    kc = rng.standard_normal((Hkv, cap, Dh)).astype(np.float32)
    vc = rng.standard_normal((Hkv, cap, Dh)).astype(np.float32)
    k = rng.standard_normal((T, Hkv * Dh)).astype(np.float32)
    v = rng.standard_normal((T, Hkv * Dh)).astype(np.float32)
    slots = rng.permutation(cap)[:T].astype(np.int32)
    rk, rv = kc.copy(), vc.copy()
    for t in range(T):
        rk[:, slots[t]] = k[t].reshape(Hkv, Dh)
        rv[:, slots[t]] = v[t].reshape(Hkv, Dh)
    return [kc, vc, k, v, slots, T, Hkv, Dh, cap], (rk, rv)


def attention_case(T: int, n_attn: int, H: int, Hkv: int, Dh: int, cap: int, seed: int,
                   kv_f16: bool = False, mask: np.ndarray | None = None):
    """Arguments of attention / attention_cpu (kv_f16: of attention_cpu_f16, the cache as
    halves) and the float64 reference over the values the cache holds. mask: (T, n_attn), each
    row opening a slot; by default 60 % of the slots at random."""
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((T, H * Dh)).astype(np.float32)
    kc = rng.standard_normal((Hkv, cap, Dh)).astype(np.float16 if kv_f16 else np.float32)
    vc = rng.standard_normal((Hkv, cap, Dh)).astype(np.float16 if kv_f16 else np.float32)
    if mask is None:
        mask = (rng.random((T, n_attn)) < 0.6).astype(np.uint8)
        mask[np.arange(T), rng.integers(0, n_attn, T)] = 1  # every row attends to something
    assert mask.shape == (T, n_attn) and mask.any(axis=1).all()
    mask = np.ascontiguousarray(mask, dtype=np.uint8)
    ref = np.zeros((T, H, Dh))
    q3 = q.reshape(T, H, Dh).astype(np.float64)
    for t in range(T):
        open_ = mask[t].astype(bool)
        for h in range(H):
            kv = h // (H // Hkv)
            sc = kc[kv, :n_attn][open_].astype(np.float64) @ q3[t, h] / np.sqrt(Dh)
            p = np.exp(sc - sc.max())
            p /= p.sum()
            ref[t, h] = p @ vc[kv, :n_attn][open_].astype(np.float64)
    out = np.full((T, H * Dh), np.nan, np.float32)
    return [out, q, kc, vc, mask, T, n_attn, H, Hkv, Dh, cap], ref.reshape(T, H * Dh)


def matmul_case(type_name: str, T: int, rows: int, cols: int, seed: int, bias: bool = True,
                accumulate: int = 0):
    rng = np.random.default_rng(seed)
    w, deq = weights(type_name, rows, cols, rng)
    x = rng.standard_normal((T, cols)).astype(np.float32)
    x[:, 1] *= 25.0  # an outlier column, as real activations have
    b = rng.standard_normal(rows).astype(np.float32) if bias else None
    ldy = rows + 3
    y = rng.standard_normal((T, ldy)).astype(np.float32)
    ref = x.astype(np.float64) @ deq.T + (b.astype(np.float64) if bias else 0.0)
    ref = ref + (y[:, :rows].astype(np.float64) if accumulate else 0.0)
    scale = np.abs(x.astype(np.float64)) @ np.abs(deq).T  # sum |w x| per output
    return [y, ldy, w, TYPE_IDS[type_name], rows, cols, x, T, b, accumulate], (ref, scale)


def logits_rows(rows: int, V: int, seed: int, scale: float = 3.0) -> np.ndarray:
    """Random logits with distinct values (no ties to make a kept set ambiguous)."""
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((rows, V)) * scale).astype(np.float32)


def process_case(rows: int, V: int, temperature: float, top_k: int, top_p: float,
                 min_p: float, seed: int):
    logits = logits_rows(rows, V, seed)
    probs = np.full((rows, V), np.nan, np.float32)
    return [probs, logits, rows, V, temperature, top_k, top_p, min_p]


def sample_case(rows: int, V: int, seed: int):
    rng = np.random.default_rng(seed)
    p = rng.random((rows, V)).astype(np.float32)
    p[p < 0.3] = 0.0
    p /= p.sum(axis=1, keepdims=True)
    return [np.full(rows, -1, np.int32), p.astype(np.float32), rows, V, 2**63 + seed, 1, 5]


def verify_tree_case(n: int, V: int, with_q: bool, seed: int):
    """A draft tree of n nodes (parents before children, distinct tokens among siblings, drawn
    from q without replacement when with_q, siblings sharing their parent's q row), the target
    rows p (n + 1, V), and the kernel's arguments (result, p, q, tokens, parent, n, V, seed,
    out_pos)."""
    rng = np.random.default_rng(seed)

    def dist(k):
        d = rng.random((k, V)) ** 3
        return (d / d.sum(axis=1, keepdims=True)).astype(np.float32)

    parent = np.array([int(rng.integers(-1, i)) for i in range(n)], np.int32)
    p, q = dist(n + 1), dist(n)
    tokens = np.zeros(n, np.int32)
    for node in range(-1, n):
        kids = [c for c in range(n) if parent[c] == node]
        if not kids:
            continue
        w = q[kids[0]].astype(np.float64) if with_q else np.ones(V)
        picks = rng.choice(V, size=len(kids), replace=False, p=w / w.sum())
        for c, t in zip(kids, picks):
            tokens[c] = t
            q[c] = q[kids[0]]
    return [np.full(n + 2, -1, np.int32), p, q if with_q else None, tokens, parent, n, V,
            777 + seed, 5 * seed + 1]


def rng_uniform(seed: int, stream: int, index: int) -> float:
    """util/hd.h's sd_hd_uniform: SplitMix64's finaliser over (seed, stream, index), 53 bits."""
    m = (1 << 64) - 1

    def mix(z):
        z = (z + 0x9E3779B97F4A7C15) & m
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & m
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & m
        return z ^ (z >> 31)

    return (mix(mix(mix(seed & m) ^ stream) ^ (index & m)) >> 11) / float(1 << 53)


def verify_case(K: int, V: int, with_q: bool, seed: int):
    rng = np.random.default_rng(seed)

    def dist(n):
        d = rng.random((n, V)) ** 3
        return (d / d.sum(axis=1, keepdims=True)).astype(np.float32)

    p = dist(K + 1)
    q = dist(K) if with_q else None
    draft = rng.integers(0, V, K).astype(np.int32)
    if with_q:  # drafts drawn from q, as a real drafter's are
        draft = np.array([rng.choice(V, p=q[i] / q[i].sum()) for i in range(K)], np.int32)
    return [np.full(2, -1, np.int32), p, q, draft, K, V, 12345 + seed, 7 * seed]
