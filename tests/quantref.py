"""An independent NumPy description of ggml's quantized block formats, for the kernel tests:
random blocks with sane scales, and their dequantized values computed from the layouts
(ggml-common.h) without any of specdec's code."""

from __future__ import annotations

import numpy as np

# ggml type id: (name, elements per block, bytes per block)
FORMATS = {
    2: ("Q4_0", 32, 18),
    3: ("Q4_1", 32, 20),
    6: ("Q5_0", 32, 22),
    7: ("Q5_1", 32, 24),
    8: ("Q8_0", 32, 34),
    12: ("Q4_K", 256, 144),
    13: ("Q5_K", 256, 176),
    14: ("Q6_K", 256, 210),
}
BY_NAME = {v[0]: k for k, v in FORMATS.items()}


def _f16(a) -> np.ndarray:
    return np.asarray(a, dtype=np.float16).view(np.uint8).reshape(-1, 2)


def random_blocks(type_id: int, n_blocks: int, rng: np.random.Generator) -> np.ndarray:
    """(n_blocks, bytes per block) uint8: random quants, scales of a plausible size."""
    name, _, size = FORMATS[type_id]
    b = rng.integers(0, 256, size=(n_blocks, size), dtype=np.uint8)
    d = rng.uniform(0.002, 0.02, n_blocks)
    m = rng.uniform(-0.05, 0.05, n_blocks)
    if name == "Q6_K":
        b[:, 208:210] = _f16(d)
    else:
        b[:, 0:2] = _f16(d)
        if name in ("Q4_1", "Q5_1", "Q4_K", "Q5_K"):
            b[:, 2:4] = _f16(m if name in ("Q4_1", "Q5_1") else np.abs(m))
    return b


def _half(b: np.ndarray, off: int) -> np.ndarray:
    return b[:, off:off + 2].copy().view(np.float16).astype(np.float32)[:, 0]


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """(nb, 16) bytes -> (nb, 32): low nibbles are elements 0-15, high nibbles 16-31."""
    return np.concatenate([qs & 15, qs >> 4], axis=1).astype(np.int32)


def _bits(qh: np.ndarray) -> np.ndarray:
    """(nb, 4) bytes as a little-endian u32 -> (nb, 32) bits, bit j for element j."""
    u = qh.copy().view("<u4")[:, 0].astype(np.int64)
    return ((u[:, None] >> np.arange(32)[None, :]) & 1).astype(np.int32)


def _k4_scale_min(sc: np.ndarray):
    """(nb, 12) packed bytes -> scales (nb, 8), mins (nb, 8) as in ggml's get_scale_min_k4."""
    sc = sc.astype(np.int32)
    s = np.zeros((sc.shape[0], 8), np.int32)
    m = np.zeros((sc.shape[0], 8), np.int32)
    for j in range(8):
        if j < 4:
            s[:, j] = sc[:, j] & 63
            m[:, j] = sc[:, j + 4] & 63
        else:
            s[:, j] = (sc[:, j + 4] & 15) | ((sc[:, j - 4] >> 6) << 4)
            m[:, j] = (sc[:, j + 4] >> 4) | ((sc[:, j] >> 6) << 4)
    return s, m


def dequantize(type_id: int, blocks: np.ndarray) -> np.ndarray:
    """(nb, bytes) -> float32 (nb * elements,), value by value as the layouts define them."""
    name, qk, _ = FORMATS[type_id]
    f32 = np.float32
    if name == "Q4_0":
        return ((_nibbles(blocks[:, 2:18]) - 8).astype(f32) * _half(blocks, 0)[:, None]).ravel()
    if name == "Q4_1":
        q = _nibbles(blocks[:, 4:20]).astype(f32)
        return (q * _half(blocks, 0)[:, None] + _half(blocks, 2)[:, None]).ravel()
    if name == "Q5_0":
        q = _nibbles(blocks[:, 6:22]) | (_bits(blocks[:, 2:6]) << 4)
        return ((q - 16).astype(f32) * _half(blocks, 0)[:, None]).ravel()
    if name == "Q5_1":
        q = (_nibbles(blocks[:, 8:24]) | (_bits(blocks[:, 4:8]) << 4)).astype(f32)
        return (q * _half(blocks, 0)[:, None] + _half(blocks, 2)[:, None]).ravel()
    if name == "Q8_0":
        q = blocks[:, 2:34].copy().view(np.int8).astype(f32)
        return (q * _half(blocks, 0)[:, None]).ravel()
    nb = blocks.shape[0]
    out = np.zeros((nb, 256), f32)
    if name in ("Q4_K", "Q5_K"):
        d, dmin = _half(blocks, 0), _half(blocks, 2)
        s, m = _k4_scale_min(blocks[:, 4:16])
        qs = blocks[:, 16:144] if name == "Q4_K" else blocks[:, 48:176]
        qh = blocks[:, 16:48].astype(np.int32) if name == "Q5_K" else None
        for sub in range(8):
            byte = qs[:, 32 * (sub // 2): 32 * (sub // 2) + 32].astype(np.int32)
            q = (byte >> (4 * (sub % 2))) & 15
            if qh is not None:
                q = q + 16 * ((qh >> sub) & 1)
            out[:, 32 * sub: 32 * sub + 32] = ((d * s[:, sub].astype(f32))[:, None] * q.astype(f32)
                                               - (dmin * m[:, sub].astype(f32))[:, None])
        return out.ravel()
    # Q6_K: ql[128] qh[64] scales int8[16] d
    ql = blocks[:, 0:128].astype(np.int32)
    qh = blocks[:, 128:192].astype(np.int32)
    sc = blocks[:, 192:208].copy().view(np.int8).astype(f32)
    d = _half(blocks, 208)
    for half in range(2):
        for l in range(32):
            lo, hi = ql[:, 64 * half + l], ql[:, 64 * half + l + 32]
            h = qh[:, 32 * half + l]
            q = [(lo & 15) | (((h >> 0) & 3) << 4), (hi & 15) | (((h >> 2) & 3) << 4),
                 (lo >> 4) | (((h >> 4) & 3) << 4), (hi >> 4) | (((h >> 6) & 3) << 4)]
            for k in range(4):
                scale = sc[:, 8 * half + 2 * k + l // 16]
                out[:, 128 * half + 32 * k + l] = (d * scale) * (q[k] - 32).astype(f32)
    return out.ravel()


def block_offsets(type_id: int, blocks: np.ndarray) -> np.ndarray:
    """|offset| of each 32-element sub-block (the m of Q4_1/Q5_1, dmin*min of K-quants, else 0):
    the part of a weight that multiplies the activation block's sum in the integer kernels."""
    name, qk, _ = FORMATS[type_id]
    nb = blocks.shape[0]
    if name in ("Q4_1", "Q5_1"):
        return np.abs(_half(blocks, 2))
    if name in ("Q4_K", "Q5_K"):
        _, m = _k4_scale_min(blocks[:, 4:16])
        return (np.abs(_half(blocks, 2))[:, None] * m).ravel()
    return np.zeros(nb * qk // 32, np.float32)
