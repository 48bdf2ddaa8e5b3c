"""The AVX2 tile over repacked Q5_0, Q5_1, Q4_K, Q5_K and Q6_K matrices (issue 27): the copies
made at load hold every quant and scale exactly, so the tile's product is the float64 product of
the dequantized weights and the dequantized activations up to float32 rounding; a token's row
does not depend on its batch; and Gemma-3-270M (Q5_0, Q4_K, Q6_K and Q8_0 matrices) gives the
same logits on 1, 2 and 3 threads, a verify batch's rows those of one-token steps.

These copies go through the AVX2 tile, or the AVX-VNNI one where the CPU has it (with or without
AVX-512); every check runs in a child process with SPECDEC_SIMD=avx2 (or avxvnni).

The tolerance: per block the tile's integer sum is exact (16-bit partial sums stay below 32767,
the 32-bit ones below 2^24), then one product d_w * d_x, one fused multiply-add per block and
the offset's; the float32 error of a row over n / 32 blocks is below (n / 32 + 4) * 2^-24 of
sum |w| |x| (plus |m| |s| for the offsets), 4e-6 of it for n = 512 here. The offsets of Q5_1,
Q4_K and Q5_K (the min; -dmin * min) multiply s, llama.cpp's f16 rounding of the activation
block's sum, as the kernels over rows as stored and Q4_1's tiles do: the reference says so. A
swapped nibble or a wrong scale is off by about d_w |x|, orders of magnitude above that
(test_tolerance_catches_a_broken_layout)."""

from __future__ import annotations

import json

import numpy as np
import pytest

import quantref
from helpers import child_json, missing, require_simd
from specdec import _core

NAMES = ["Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K"]
ROWS, N, TMAX = 24, 512, 18
BATCHES = list(range(2, TMAX + 1))

CHILD_PRODUCTS = r"""
import json, sys
import numpy as np
from specdec import _core
args = json.loads(sys.stdin.read())
out = {"simd": _core.simd_name(), "y": {}}
for key, (type_id, data_hex, nrows, n, x, batches) in args.items():
    data, x = bytes.fromhex(data_hex), np.array(x, dtype=np.float32)
    ys = {"1-%d" % t: _core.matmul_rows(type_id, data, nrows, n, x[t:t + 1], 0)
          for t in range(len(x))}
    ys.update({"%d" % T: _core.matmul_rows(type_id, data, nrows, n, x[:T], 0) for T in batches})
    out["y"][key] = {k: v.tobytes().hex() for k, v in ys.items()}
print(json.dumps(out))
"""


def avx2_products(cases: dict, level: str = "avx2") -> dict:
    """The forward kernel's products under SPECDEC_SIMD=level (avx2 or avxvnni: the repacked
    copies): per case {"1-t": token t alone (1, nrows), "T": the first T tokens (T, nrows)}."""
    require_simd("avx2", "avx2", "this CPU has no AVX2")
    out = child_json(CHILD_PRODUCTS, stdin=json.dumps(cases), SPECDEC_SIMD=level)
    if level == "avxvnni" and "avxvnni" not in out["simd"]:
        missing("avxvnni", f"this CPU has no AVX-VNNI (kernels capped there: {out['simd']})")
    assert out["simd"] == {"avx2": "avx2+fma+f16c", "avxvnni": "avx2+fma+f16c+avxvnni"}[level]
    return {key: {k: np.frombuffer(bytes.fromhex(h), np.float32).reshape(-1, cases[key][2])
                  for k, h in ys.items()} for key, ys in out["y"].items()}


def extreme_blocks(name: str, blocks: np.ndarray) -> np.ndarray:
    """The first blocks of row 0 set to the quants and scales that make the largest integer sums:
    every 5-bit quant 31 (or 4-bit 15) with the largest 6-bit scale, and for Q6_K every quant
    -32 with scale -128, then every quant 31 with scale 127."""
    b = blocks.copy()
    if name in ("Q5_0", "Q5_1"):
        b[0, -20:] = 0xFF  # fifth bits and nibbles: 31 everywhere
        b[1, -20:] = 0x00
    elif name in ("Q4_K", "Q5_K"):
        b[0, 4:] = 0xFF  # scales and mins 63, (fifth bits and) nibbles all ones
    else:
        b[0, :192] = 0x00  # q6 = 0: every value -32
        b[0, 192:208] = 0x80
        b[1, :192] = 0xFF
        b[1, 192:208] = 0x7F
    return b


def case(name: str, seed: int):
    """(type id, blocks, activations (TMAX, N)) of one product."""
    type_id = quantref.BY_NAME[name]
    rng = np.random.default_rng(seed)
    qk = quantref.FORMATS[type_id][1]
    blocks = extreme_blocks(name, quantref.random_blocks(type_id, ROWS * N // qk, rng))
    x = rng.standard_normal((TMAX, N)).astype(np.float32)
    x[0::2, :256] = 1.0  # quantizes to +127 (the largest sums) ...
    x[1::2, :256] = -1.0  # ... and to -127
    x[:, 300] *= 30.0  # an outlier, as real activations have
    return type_id, blocks, x


def reference(type_id: int, blocks: np.ndarray, x: np.ndarray):
    """(float64 (T, rows) product of the dequantized weights and activations, its tolerance)."""
    w = quantref.dequantize(type_id, blocks).reshape(ROWS, N).astype(np.float64)
    T = x.shape[0]
    xq = np.zeros((T, N))
    s = np.zeros((T, N // 32))
    for t in range(T):
        raw = _core.quantize_q8(x[t])
        q = np.frombuffer(raw[:N], np.int8).astype(np.float64).reshape(-1, 32)
        d, s[t], _e = np.frombuffer(raw[N:], np.float32).reshape(3, N // 32).astype(np.float64)
        xq[t] = (q * d[:, None]).ravel()
    ref = xq @ w.T
    scale = np.abs(xq) @ np.abs(w).T
    name = quantref.FORMATS[type_id][0]
    if name != "Q5_0" and name != "Q6_K":  # the offset times s, not times the exact sum
        m = quantref.block_offsets(type_id, blocks).reshape(ROWS, N // 32).astype(np.float64)
        if name == "Q5_1":  # block_offsets gives |m|: Q5_1's min has a sign, -dmin * min not
            m *= np.sign(quantref._half(blocks, 2)).reshape(ROWS, N // 32)
        else:
            m = -m
        ref += (s - xq.reshape(T, -1, 32).sum(axis=2)) @ m.T
        scale += np.abs(s) @ np.abs(m).T
    return ref, 4e-6 * scale + 1e-30


@pytest.fixture(scope="module")
def product_cases():
    cases, inputs = {}, {}
    for i, name in enumerate(NAMES):
        type_id, blocks, x = case(name, seed=60 + i)
        cases[name] = (type_id, blocks.tobytes().hex(), ROWS, N, x.tolist(), BATCHES)
        inputs[name] = (type_id, blocks, x)
    return cases, inputs


@pytest.fixture(scope="module")
def products(product_cases):
    cases, inputs = product_cases
    return avx2_products(cases), inputs


@pytest.mark.parametrize("name", NAMES)
def test_repacked_product_is_the_dequantized_product(products, name):
    """Every batch size 1-18 (chunks of up to 4 tokens, 16 tokens per pass): each token's row
    within 4e-6 of sum |w| |x| of the float64 product of the dequantized matrix and activations,
    with the extreme blocks of row 0 (largest integer sums) among them."""
    ys, inputs = products
    type_id, blocks, x = inputs[name]
    ref, tol = reference(type_id, blocks, x)
    for T in [1] + BATCHES:
        if T == 1:  # every token alone
            got, want, bound = np.concatenate([ys[name][f"1-{t}"] for t in range(TMAX)]), ref, tol
        else:
            got, want, bound = ys[name][str(T)], ref[:T], tol[:T]
        err = np.abs(got - want)
        assert np.all(err <= bound), (name, T, float((err / bound).max()))


@pytest.mark.parametrize("name", NAMES)
def test_batch_rows_have_the_bits_of_single_tokens(products, name):
    """Row t of a batch of T tokens has exactly the bits of token t alone, for every T to 18."""
    ys, _ = products
    for T in BATCHES:
        for t in range(T):
            np.testing.assert_array_equal(ys[name][str(T)][t], ys[name][f"1-{t}"][0],
                                          err_msg=f"{name} T {T} t {t}")


def test_avxvnni_tile_gives_the_avx2_bits(product_cases, products):
    """With AVX-VNNI (SPECDEC_SIMD=avxvnni in a child) the same copies go through vpdpbusd: one
    instruction for four byte products and their sum where AVX2 takes maddubs, 16-bit adds and a
    widening madd, then the rows' integer scales by a 32-bit multiply. The integer sums are the
    same exact integers, the float step the same, so every product of every batch size has the
    AVX2 tile's bits (which the tests above hold to the reference and to single tokens)."""
    cases, _ = product_cases
    vnni = avx2_products(cases, "avxvnni")
    ys, _ = products
    for name in NAMES:
        for k, y in ys[name].items():
            np.testing.assert_array_equal(vnni[name][k], y, err_msg=f"{name} {k}")


def test_default_kernels_give_the_avx2_bits(product_cases, products):
    """With this CPU's own kernels (AVX-512 or AMX where it has them) the Q5 and K-quant copies
    go through the AVX-VNNI or AVX2 tile all the same: every product has the AVX2 tile's bits,
    computed here in this process for every batch size and for each token alone."""
    cases, _ = product_cases
    ys, _ = products
    for name in NAMES:
        type_id, data_hex, nrows, n, x, batches = cases[name]
        data, x = bytes.fromhex(data_hex), np.array(x, dtype=np.float32)
        for t in range(len(x)):
            got = _core.matmul_rows(type_id, data, nrows, n, x[t:t + 1], 0)
            np.testing.assert_array_equal(got, ys[name][f"1-{t}"], err_msg=f"{name} 1-{t}")
        for T in batches:
            got = _core.matmul_rows(type_id, data, nrows, n, x[:T], 0)
            np.testing.assert_array_equal(got, ys[name][str(T)], err_msg=f"{name} {T}")


def test_tolerance_catches_a_broken_layout():
    """The tolerance has power: a copy that took a block's high nibbles for its low ones (the
    swap done to the stored blocks here), or a K-quant sub-block's scale from its neighbour, is
    far outside it."""
    cases, refs = {}, {}
    for name in NAMES:
        type_id, blocks, x = case(name, seed=70)
        bad = blocks.copy()
        if name == "Q5_0":
            bad[:, 6:22] = (blocks[:, 6:22] >> 4) | ((blocks[:, 6:22] & 15) << 4)
        elif name == "Q5_1":
            bad[:, 8:24] = (blocks[:, 8:24] >> 4) | ((blocks[:, 8:24] & 15) << 4)
        elif name in ("Q4_K", "Q5_K"):
            bad[:, [4, 5]] = blocks[:, [5, 4]]  # sub-blocks 0 and 1 trade scales
        else:
            bad[:, [192, 194]] = blocks[:, [194, 192]]
        cases[name] = (type_id, bad.tobytes().hex(), ROWS, N, x[:4].tolist(), [4])
        refs[name] = reference(type_id, blocks, x[:4])
    ys = avx2_products(cases)
    for name in NAMES:
        ref, tol = refs[name]
        assert np.any(np.abs(ys[name]["4"] - ref) > 100 * tol), name


CHILD_GEMMA = r"""
import json, sys
import numpy as np
import specdec
path, = sys.argv[1:]
m = specdec.load(path)
rng = np.random.default_rng(27)
prefix = rng.integers(0, m.config.vocab_size, 64).tolist()
batch = rng.integers(0, m.config.vocab_size, 16).tolist()

def verify(threads, toks):
    m.threads = threads
    cache = m.new_cache(len(prefix) + len(toks) + 1)
    m.forward(cache, prefix, n_logits=1)
    return np.array(m.forward(cache, toks), copy=True), cache

out = {"simd": specdec._core.simd_name(), "threads": {}, "steps": []}
for T in (8, 16):
    one, _ = verify(1, batch[:T])
    out["threads"][T] = [bool(np.array_equal(verify(th, batch[:T])[0], one)) for th in (2, 3)]
rows, _ = verify(2, batch)
cache = m.new_cache(len(prefix) + len(batch) + 1)
m.forward(cache, prefix, n_logits=1)
for t, tok in enumerate(batch):
    alone = np.asarray(m.forward(cache, [tok])).reshape(-1)
    out["steps"].append(bool(np.array_equal(alone, rows[t])))
print(json.dumps(out))
"""


@pytest.mark.parametrize("level", ["avx2", "avxvnni", ""])
def test_gemma3_verify_batches_do_not_depend_on_threads_or_batch(gemma3_path, level):
    """Gemma-3-270M on the AVX2 path, on the AVX-VNNI one and with this CPU's own kernels ("":
    no cap; its Q5_0, Q4_K and Q6_K matrices repacked on all three): the logits of batches of 8
    and 16 after a 64-token prefix are bit for bit the same on 1, 2 and 3 threads, and row t of
    the 16-token batch (2 threads) is token t decoded alone."""
    require_simd("avx2", "avx2", "this CPU has no AVX2")
    out = child_json(CHILD_GEMMA, gemma3_path, timeout=600, SPECDEC_SIMD=level)
    if level == "avxvnni" and "avxvnni" not in out["simd"]:
        missing("avxvnni", f"this CPU has no AVX-VNNI (kernels capped there: {out['simd']})")
    want = {"avx2": "avx2+fma+f16c", "avxvnni": "avx2+fma+f16c+avxvnni", "": _core.simd_name()}
    assert out["simd"] == want[level]
    for T, same in out["threads"].items():
        assert same == [True, True], f"T {T}: threads 2, 3 equal to 1: {same}"
    assert out["steps"] == [True] * 16, out["steps"]
