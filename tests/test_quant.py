"""The quantized row kernels against an independent NumPy description of the formats
(tests/quantref.py): dequantization is exact, and a matmul differs from the float64 product of
the dequantized weights by no more than the activation quantization can explain.

The bound, per output: the activations are quantized in blocks of 32 as x ~ d * q with
q = round(x / d_true), d_true = max|x| / 127 and d the f16 rounding of d_true, so each element
is off by at most d_true / 2 (rounding) + 127 * 2^-11 * d_true (the f16 scale), i.e. 0.563 d_true;
it is multiplied by |d_w q_w| <= |w| + |offset|. Formats with a per-block offset m add m * s
with s the f16 rounding of d_true * sum(q): off from m * sum(x) by |m| (16 d_true + 2^-11 *
32 * 127 d_true). Float summation adds at most 1e-5 of sum |w x|."""

from __future__ import annotations

import json

import numpy as np
import pytest

import quantref
from helpers import child_json, missing, require_simd
from specdec import _core

TYPES = sorted(quantref.FORMATS)


def make_row_data(type_id, nrows, n, seed):
    rng = np.random.default_rng(seed)
    qk = quantref.FORMATS[type_id][1]
    blocks = quantref.random_blocks(type_id, nrows * n // qk, rng)
    return blocks, rng


@pytest.mark.parametrize("type_id", TYPES, ids=[quantref.FORMATS[t][0] for t in TYPES])
def test_dequantize_exact(type_id):
    blocks, _ = make_row_data(type_id, 1, 1024, seed=type_id)
    got = _core.dequantize(type_id, blocks.tobytes(), 1024)
    ref = quantref.dequantize(type_id, blocks)
    np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-7)


def activation_bound(type_id, blocks, w, x):
    """Per (t, r) bound on |kernel - float64 product| (see the module docstring)."""
    T, n = x.shape
    nrows = w.shape[0]
    xb = x.reshape(T, n // 32, 32).astype(np.float64)
    d_true = np.abs(xb).max(axis=2) / 127.0                          # (T, nb32)
    off = quantref.block_offsets(type_id, blocks).reshape(nrows, n // 32).astype(np.float64)
    wabs = np.abs(w.astype(np.float64)).reshape(nrows, n // 32, 32)
    per_elem = (wabs + off[:, :, None]).sum(axis=2)                  # (nrows, nb32)
    b = 0.563 * d_true @ per_elem.T                                  # (T, nrows)
    b += (d_true * (16 + 32 * 127 / 2048)) @ off.T
    b += 1e-5 * np.abs(x.astype(np.float64)) @ np.abs(w.astype(np.float64)).T
    return b + 1e-6


@pytest.mark.parametrize("nrows", [7, 16])
@pytest.mark.parametrize("T", [1, 3, 4, 9])
@pytest.mark.parametrize("type_id", TYPES, ids=[quantref.FORMATS[t][0] for t in TYPES])
def test_matmul_within_activation_quantization(type_id, T, nrows):
    """Every kernel — the forward pass's (repacked 8-row copies where this CPU uses them; 16
    rows can be repacked, 7 cannot), the portable one, and the SIMD one over rows as stored —
    stays within the bound and agrees with the others to float rounding."""
    n = 512
    blocks, rng = make_row_data(type_id, nrows, n, seed=100 + type_id + T + nrows)
    w = quantref.dequantize(type_id, blocks).reshape(nrows, n)
    x = rng.standard_normal((T, n)).astype(np.float32)
    x[:, 5] *= 20.0  # an outlier, as real activations have
    ref = x.astype(np.float64) @ w.astype(np.float64).T
    bound = activation_bound(type_id, blocks, w, x)
    outs = []
    for kernel in (0, 1, 2):
        got = _core.matmul_rows(type_id, blocks.tobytes(), nrows, n, x, kernel)
        err = np.abs(got - ref)
        assert np.all(err <= bound), (kernel, float((err / bound).max()))
        # the bound is a worst case; typical errors are far below it
        assert float(np.median(err / bound)) < 0.2
        outs.append(got)
    for got in outs[1:]:
        np.testing.assert_allclose(got, outs[0], rtol=1e-5,
                                   atol=1e-5 * float(np.abs(outs[0]).max()))


def test_bound_catches_a_wrong_layout():
    """The matmul check has power: a kernel reading Q4_1 nibbles in the wrong order (elements
    0-15 from the high nibbles) is far outside the bound."""
    type_id = quantref.BY_NAME["Q4_1"]
    nrows, n = 5, 256
    blocks, rng = make_row_data(type_id, nrows, n, seed=7)
    x = rng.standard_normal((2, n)).astype(np.float32)
    w = quantref.dequantize(type_id, blocks).reshape(nrows, n)
    swapped = blocks.copy()
    swapped[:, 4:20] = (blocks[:, 4:20] >> 4) | ((blocks[:, 4:20] & 15) << 4)
    got = _core.matmul_rows(type_id, swapped.tobytes(), nrows, n, x, 0)
    ref = x.astype(np.float64) @ w.astype(np.float64).T
    assert np.any(np.abs(got - ref) > activation_bound(type_id, blocks, w, x))


@pytest.mark.parametrize("type_id", [0, 1, 30], ids=["F32", "F16", "BF16"])
def test_float_types_matmul(type_id):
    rng = np.random.default_rng(type_id)
    nrows, n, T = 6, 80, 5
    w = rng.standard_normal((nrows, n)).astype(np.float32)
    if type_id == 1:
        data, wv = w.astype(np.float16).tobytes(), w.astype(np.float16).astype(np.float64)
    elif type_id == 30:
        bits = (w.view(np.uint32) + 0x7FFF + ((w.view(np.uint32) >> 16) & 1)) >> 16
        data = bits.astype(np.uint16).tobytes()
        wv = (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    else:
        data, wv = w.tobytes(), w.astype(np.float64)
    x = rng.standard_normal((T, n)).astype(np.float32)
    ref = x.astype(np.float64) @ wv.T
    for kernel in (0, 1, 2):
        got = _core.matmul_rows(type_id, data, nrows, n, x, kernel)
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)


def test_kernel_argument_errors():
    with pytest.raises(ValueError, match="bytes"):
        _core.dequantize(3, b"\0" * 19, 32)
    with pytest.raises(ValueError, match="multiple"):
        _core.dequantize(3, b"\0" * 20, 31)
    with pytest.raises(ValueError, match="no kernels"):
        _core.dequantize(10, b"\0" * 84, 256)


CHILD_MATMULS = r"""
import json, sys
import numpy as np
from specdec import _core
args = json.loads(sys.stdin.read())
out = {"simd": _core.simd_name(), "y": {}}
for key, (type_id, data_hex, nrows, n, x) in args.items():
    y = _core.matmul_rows(type_id, bytes.fromhex(data_hex), nrows, n,
                          np.array(x, dtype=np.float32), 0)
    out["y"][key] = y.tobytes().hex()
print(json.dumps(out))
"""


def matmul_case(type_id, blocks, nrows, n, x):
    """One product for child_matmuls, in a form JSON carries."""
    return (type_id, blocks.tobytes().hex(), nrows, n, x.tolist())


def matmul_here(case, kernel):
    """The same product computed in this process with `kernel`."""
    type_id, data_hex, nrows, n, x = case
    return _core.matmul_rows(type_id, bytes.fromhex(data_hex), nrows, n,
                             np.array(x, dtype=np.float32), kernel)


def child_matmuls(cases: dict, simd: str):
    """The forward-pass kernel's products of `cases` ({key: (type_id, data hex, nrows, n, x)})
    computed by a child process whose kernels SPECDEC_SIMD=simd caps: (its kernel name,
    {key: float32 array (T, nrows)})."""
    import json

    from helpers import child_json

    out = child_json(CHILD_MATMULS, stdin=json.dumps(cases), SPECDEC_SIMD=simd)
    ys = {k: np.frombuffer(bytes.fromhex(h), dtype=np.float32).reshape(len(cases[k][4]),
                                                                         cases[k][2])
          for k, h in out["y"].items()}
    return out["simd"], ys


def test_avx2_kernels_where_wider_ones_exist():
    """On CPUs with AVX512-VNNI the forward pass uses those kernels; SPECDEC_SIMD=avx2 keeps the
    AVX2 ones, which every other x86-64 CPU runs: they must agree with the portable kernels."""
    require_simd("avx2", "avx2", "this CPU has no AVX2")
    rng = np.random.default_rng(3)
    cases = {}
    for type_id in TYPES:
        for nrows in (9, 16):  # 16 rows are repacked (Q4_0, Q4_1, Q8_0), 9 are not
            n = 512
            qk = quantref.FORMATS[type_id][1]
            blocks = quantref.random_blocks(type_id, nrows * n // qk, rng)
            for T in (1, 5):
                x = rng.standard_normal((T, n)).astype(np.float32)
                cases[f"{type_id}-{nrows}-{T}"] = matmul_case(type_id, blocks, nrows, n, x)
    simd, ys = child_matmuls(cases, "avx2")
    assert simd == "avx2+fma+f16c"
    for key, case in cases.items():
        port = matmul_here(case, 1)
        np.testing.assert_allclose(ys[key], port, rtol=1e-5,
                                   atol=1e-5 * float(np.abs(port).max()), err_msg=key)


@pytest.mark.parametrize("nrows", [7, 16, 24])
@pytest.mark.parametrize("type_id", [0, 1, 30] + TYPES,
                         ids=["F32", "F16", "BF16"] + [quantref.FORMATS[t][0] for t in TYPES])
def test_batch_rows_match_single_token_bitwise(type_id, nrows):
    """Row t of a batched matmul has exactly the bits of token t multiplied alone, for the
    forward pass's kernel and the portable one: the kernels may pick tiles by batch size, but
    not change a token's arithmetic with it. Greedy speculative decoding relies on this (its
    verify batch must reproduce one-token decoding). On CPUs with AMX, batches of 9 or more
    tokens of repacked matrices (16 and 24 rows: one 16-row AMX group, then one 8-row group
    left to the VNNI tile) take the AMX tile, 16 tokens per tile multiply (T = 17, 33). The
    VNNI tiles take up to 16 tokens per pass in groups as even as can be (T = 17: 9 and 8) and
    keep a long batch's groups interleaved only while they fit their buffer (T = 200 does not)."""
    n = 512
    rng = np.random.default_rng(7 + type_id + nrows)
    if type_id in (0, 1, 30):
        w = rng.standard_normal((nrows, n)).astype(np.float32)
        data = {0: w, 1: w.astype(np.float16), 30: (w.view(np.uint32) >> 16).astype(np.uint16)}
        data = data[type_id].tobytes()
    else:
        blocks, rng = make_row_data(type_id, nrows, n, seed=300 + type_id + nrows)
        data = blocks.tobytes()
    x = rng.standard_normal((200, n)).astype(np.float32)
    x[:, 3] *= 20.0
    for kernel in (0, 1):
        for T in (2, 3, 4, 5, 8, 9, 11, 16, 17, 33, 200):
            batch = _core.matmul_rows(type_id, data, nrows, n, x[:T], kernel)
            for t in range(T):
                alone = _core.matmul_rows(type_id, data, nrows, n, x[t:t + 1], kernel)
                np.testing.assert_array_equal(batch[t], alone[0], err_msg=f"kernel {kernel} T {T} t {t}")


@pytest.mark.parametrize("name", ["Q4_0", "Q4_1", "Q8_0"])
def test_sixteen_row_tile_gives_the_eight_row_bits(name):
    """With AVX512-VNNI, repacked rows go through the tile sixteen at a time, and a last group
    of eight (rows % 16 == 8) through the eight-row tile. Moving groups of 8 rows around moves
    each row from one tile to the other: its output must keep its bits."""
    require_simd("vnni", "avx512vnni", f"this CPU has no AVX512-VNNI (kernels: {_core.simd_name()})")
    type_id = quantref.BY_NAME[name]
    n = 192
    rng = np.random.default_rng(17 + type_id)
    blocks = quantref.random_blocks(type_id, 24 * n // 32, rng)
    data = blocks.tobytes()
    row = len(data) // 24
    groups = [data[g * 8 * row:(g + 1) * 8 * row] for g in range(3)]
    moved = groups[2] + groups[0] + groups[1]  # rows 16-23 first: group 1 ends last
    x = rng.standard_normal((16, n)).astype(np.float32)
    x[:, 5] *= 25.0
    # on AMD CPUs small groups take the 8-row tile alone: below 8 tokens on Zen 4, below 3 on
    # Zen 5 (dispatch.c)
    for T in (1, 2, 3, 4, 5, 8, 12, 16):
        y = _core.matmul_rows(type_id, data, 24, n, x[:T], 0)
        ym = _core.matmul_rows(type_id, moved, 24, n, x[:T], 0)
        np.testing.assert_array_equal(ym[:, 16:], y[:, 8:16], err_msg=f"T {T}: 16-row -> 8-row")
        np.testing.assert_array_equal(ym[:, :8], y[:, 16:], err_msg=f"T {T}: 8-row -> 16-row")
        np.testing.assert_array_equal(ym[:, 8:16], y[:, :8], err_msg=f"T {T}")


def repacked_cases(rng, batch_sizes) -> dict:
    """Products of random repacked-format rows (Q4_0, Q4_1, Q8_0: 16-row groups, an 8-row group
    left over, short and long rows) with batches of every size in batch_sizes, one activation
    column large, keyed "format-rows-n-T", for child_matmuls."""
    cases = {}
    for name in ("Q4_0", "Q4_1", "Q8_0"):
        type_id = quantref.BY_NAME[name]
        for nrows, n in ((16, 512), (24, 96), (40, 1536)):
            blocks = quantref.random_blocks(type_id, nrows * n // 32, rng)
            for T in batch_sizes:
                x = rng.standard_normal((T, n)).astype(np.float32)
                x[:, 1] *= 30.0
                cases[f"{name}-{nrows}-{n}-{T}"] = matmul_case(type_id, blocks, nrows, n, x)
    return cases


def test_amx_tiles_give_the_vnni_bits():
    """On CPUs with AMX-INT8, batches of repacked Q4_0/Q4_1/Q8_0 rows go through AMX tiles;
    SPECDEC_SIMD=avx512vnni keeps the VNNI tiles. Both must give the same bits for every batch
    size (the AMX tile does the VNNI tile's float work in its order; the integer sums are
    exact), row count (16-row AMX groups, an 8-row group left over) and row length."""
    require_simd("amx", "amx",
                 f"this CPU has no AMX-INT8 the OS lets us use (kernels: {_core.simd_name()})")
    cases = repacked_cases(np.random.default_rng(5), (1, 3, 4, 7, 8, 9, 16, 17, 40))
    simd, ys = child_matmuls(cases, "avx512vnni")
    assert simd == "avx2+fma+f16c+avx512vnni"
    for key, case in cases.items():
        np.testing.assert_array_equal(matmul_here(case, 0), ys[key], err_msg=key)


CHILD_BATCH_AND_ALONE = r"""
import json, sys
import numpy as np
from specdec import _core
args = json.loads(sys.stdin.read())
out = {"simd": _core.simd_name(), "y": {}, "alone": {}}
for key, (type_id, data_hex, nrows, n, x) in args.items():
    data, x = bytes.fromhex(data_hex), np.array(x, dtype=np.float32)
    out["y"][key] = _core.matmul_rows(type_id, data, nrows, n, x, 0).tobytes().hex()
    rows = [_core.matmul_rows(type_id, data, nrows, n, x[t:t + 1], 0) for t in range(len(x))]
    out["alone"][key] = np.concatenate(rows).tobytes().hex()
print(json.dumps(out))
"""


def test_avxvnni_tile_gives_the_vnni_bits():
    """With AVX-VNNI (vpdpbusd on 256-bit registers, without AVX-512: Intel's client cores),
    batches of repacked Q4_0/Q4_1/Q8_0 rows take the AVX-VNNI tile; SPECDEC_SIMD=avxvnni keeps
    it on a CPU that has AVX-512 too. In a child capped there, for every batch size (passes of
    up to 6 tokens, as even as can be), row count and row length: each token's row of a batch
    has the bits of that token alone, the products agree with the portable kernel, and where
    this CPU has AVX512-VNNI they are its tiles' bits (exact integer sums, the same float step
    in the same order)."""
    cases = repacked_cases(np.random.default_rng(23), (1, 2, 5, 6, 7, 8, 12, 13, 16, 17, 40))
    out = child_json(CHILD_BATCH_AND_ALONE, stdin=json.dumps(cases), SPECDEC_SIMD="avxvnni")
    if "avxvnni" not in out["simd"]:
        missing("avxvnni", f"this CPU has no AVX-VNNI (kernels capped there: {out['simd']})")
    assert out["simd"] == "avx2+fma+f16c+avxvnni"
    vnni = "avx512vnni" in _core.simd_name()
    for key, case in cases.items():
        shape = (len(case[4]), case[2])
        y = np.frombuffer(bytes.fromhex(out["y"][key]), dtype=np.float32).reshape(shape)
        alone = np.frombuffer(bytes.fromhex(out["alone"][key]), dtype=np.float32).reshape(shape)
        np.testing.assert_array_equal(y, alone, err_msg=f"{key}: batch against alone")
        port = matmul_here(case, 1)
        np.testing.assert_allclose(y, port, rtol=1e-5, atol=1e-5 * float(np.abs(port).max()),
                                   err_msg=key)
        if vnni:
            np.testing.assert_array_equal(y, matmul_here(case, 0), err_msg=f"{key}: VNNI bits")


def _activation_rows():
    """Rows that probe the quantizer: scales from tiny to large, exact ties (x / d = k + 0.5),
    zero blocks, one huge outlier, block counts from 1 to 23."""
    rng = np.random.default_rng(11)
    rows = [rng.standard_normal(512).astype(np.float32) * s for s in (1e-30, 1e-6, 1.0, 300.0, 3e4)]
    ties = np.tile(np.float32([127.0, 0.5, 1.5, 2.5, -0.5, -1.5, 63.5, -126.5]), 64)
    rows.append(ties)  # amax 127 -> d = 1: every half-integer is a tie
    z = rng.standard_normal(512).astype(np.float32)
    z[32:96] = 0.0
    z[200] = 1e5
    rows.append(z)
    # block counts that are not multiples of 8 (the SIMD quantizer takes eight blocks at a time,
    # then the rest one by one), with a zero block among the eight
    for nb in (1, 3, 9, 18, 23):
        r = rng.standard_normal(32 * nb).astype(np.float32) * np.float32(10.0) ** rng.integers(
            -3, 4, 32 * nb).astype(np.float32)
        r[32 * (nb // 2):32 * (nb // 2 + 1)] = 0.0
        rows.append(r)
    return rows


def _decode_q8(b: bytes, n: int):
    q = np.frombuffer(b[:n], dtype=np.int8).astype(np.int64)
    d, s, e = np.frombuffer(b[n:], dtype=np.float32).reshape(3, n // 32)
    return q, d, s, e


def test_activation_quantization_matches_its_definition():
    """quantize_q8 (this CPU's kernel): q = round-half-even(x / d) with d = amax / 127 per block
    of 32, d and s = d * sum(q) rounded to f16 as llama.cpp's Q8_0/Q8_1 activations, e unrounded."""
    for x in _activation_rows():
        n = x.size
        q, d, s, e = _decode_q8(_core.quantize_q8(x), n)
        xb = x.reshape(-1, 32)
        db = np.abs(xb).max(axis=1) / np.float32(127.0)
        inv = np.where(db != 0, np.float32(1.0) / np.where(db != 0, db, 1), 0).astype(np.float32)
        want_q = np.rint(xb * inv[:, None]).astype(np.int64)  # rint: ties to even
        np.testing.assert_array_equal(q.reshape(-1, 32), want_q)
        np.testing.assert_array_equal(d, db.astype(np.float16).astype(np.float32))
        sums = want_q.sum(axis=1).astype(np.float32)
        with np.errstate(over="ignore"):  # beyond f16's range both sides hold inf
            np.testing.assert_array_equal(s, (db * sums).astype(np.float16).astype(np.float32))
        np.testing.assert_array_equal(e, d * sums)
    with pytest.raises(ValueError, match="multiple of 32"):
        _core.quantize_q8(np.zeros(40, np.float32))


QUANT_SCRIPT = r"""
import json, sys
import numpy as np
from specdec import _core
rows = json.loads(sys.stdin.read())
print(json.dumps({"simd": _core.simd_name(),
                  "q": [_core.quantize_q8(np.array(r, dtype=np.float32)).hex() for r in rows]}))
"""


def test_activation_quantization_portable_twin_gives_the_same_bytes():
    """SPECDEC_SIMD=scalar runs the portable quantizer: byte for byte the SIMD one's output."""
    import json

    from helpers import child_json

    rows = _activation_rows()
    out = child_json(QUANT_SCRIPT, stdin=json.dumps([r.tolist() for r in rows]),
                     SPECDEC_SIMD="scalar")
    assert out["simd"] == "scalar"
    for r, hexed in zip(rows, out["q"]):
        assert _core.quantize_q8(r) == bytes.fromhex(hexed)


@pytest.mark.parametrize("name", ["Q4_0", "Q4_1", "Q8_0"])
def test_repacked_tiles_every_chunk_of_a_batch(name):
    """The AVX2 tiles over repacked rows take a batch of up to 16 tokens per pass over the
    weights, in chunks of at most 5 tokens (9 tokens: 5 and 4; 16: four of 4), and add the
    eight groups of a nibble block in 16-bit lanes before widening. Every batch size from 1 to
    18 and rows of one block (n = 32), of an odd count of blocks (n = 96), and of 8192 (one
    group of tokens interleaved at a time): each token's row has the bits it gets alone, and
    stays within float rounding of the portable kernel; weights and activations at the ends of
    their ranges (every nibble 15 or 0, Q8_0 bytes -128 and 127, activations +-127) probe the
    16-bit sums."""
    type_id = quantref.BY_NAME[name]
    rng = np.random.default_rng(41 + type_id)
    for nrows, n in ((8, 32), (24, 96), (16, 8192)):
        blocks = quantref.random_blocks(type_id, nrows * n // 32, rng)
        raw = blocks.view(np.uint8).reshape(nrows * n // 32, -1).copy()
        if name == "Q8_0":
            raw[0, 2:] = 0x80  # -128 everywhere in the first block of row 0
            raw[1, 2:] = 0x7F
        else:
            raw[0, -16:] = 0xFF  # all nibbles 15
            raw[1, -16:] = 0x00
        data = raw.tobytes()
        x = rng.standard_normal((18, n)).astype(np.float32)
        x[:, :32] = np.where(np.arange(32) % 2 == 0, 1.0, -1.0)  # quantizes to +-127
        x[3, :32] = 1.0
        x[:, 7 % n] *= 30.0
        for T in range(1, 19):
            batch = _core.matmul_rows(type_id, data, nrows, n, x[:T], 0)
            port = _core.matmul_rows(type_id, data, nrows, n, x[:T], 1)
            np.testing.assert_allclose(batch, port, rtol=1e-5,
                                       atol=1e-5 * float(np.abs(port).max()),
                                       err_msg=f"{name} n {n} T {T}")
            for t in (0, T // 2, T - 1):
                alone = _core.matmul_rows(type_id, data, nrows, n, x[t:t + 1], 0)
                np.testing.assert_array_equal(batch[t], alone[0],
                                              err_msg=f"{name} n {n} T {T} t {t}")
