"""The CPU twins of the CUDA kernels (csrc/check/twins.c) against NumPy references, on the inputs
test_cuda.py gives the CUDA kernels. These run everywhere; the CUDA comparison needs a GPU.

Tolerances: float32 results of float64 references, relative 1e-5 (RMSNorm, RoPE, SwiGLU,
attention: a few roundings per element); the matmul within 1e-6 of sum |w x| per output (the
twin sums the dequantized weights in double); copies and selections exactly."""

from __future__ import annotations

import numpy as np
import pytest

import kernels as K
from helpers import f16_cases, require_simd
from specdec import _core


@pytest.mark.parametrize("type_name", ["F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1",
                                       "Q8_0", "Q4_K", "Q5_K", "Q6_K"])
def test_embed_twin_is_the_dequantized_rows(type_name):
    args, ref = K.embed_case(type_name, 37, seed=1)
    out = K.run("embed", K.CPU, args)[0]
    np.testing.assert_allclose(out, ref, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("T,n", [(1, 48), (37, 96), (3, 1000)])
def test_rmsnorm_twin(T, n):
    args, ref = K.rmsnorm_case(T, n, seed=T)
    np.testing.assert_allclose(K.run("rmsnorm", K.CPU, args)[0], ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("neox", [0, 1])
@pytest.mark.parametrize("T,H,Dh", [(1, 5, 16), (37, 3, 48)])
def test_rope_twin(T, H, Dh, neox):
    args, ref = K.rope_case(T, H, Dh, neox, seed=T + neox)
    np.testing.assert_allclose(K.run("rope", K.CPU, args)[0], ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("T,n,norm_residual", [(1, 48, 0), (5, 96, 1), (37, 64, 0)])
def test_head_input_twin(T, n, norm_residual):
    """An EAGLE-3 head layer's input cat(rmsnorm(e) w_in, rmsnorm(x) w_hid), and the residual
    that norm_before_residual replaces (untouched without it)."""
    args, (out, x_after) = K.head_input_case(T, n, norm_residual, seed=T)
    got = K.run("head_input", K.CPU, args)
    np.testing.assert_allclose(got[0], out, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got[2], x_after, rtol=1e-5, atol=1e-6)


def test_silu_add_twin():
    args, ref = K.silu_add_case(1001, seed=3)
    np.testing.assert_allclose(K.run("silu_add", K.CPU, args)[0], ref, rtol=1e-5, atol=1e-6)


def test_swiglu_twin():
    args, ref = K.swiglu_case(1001, seed=2)
    np.testing.assert_allclose(K.run("swiglu", K.CPU, args)[0], ref, rtol=1e-5, atol=1e-6)


def test_kv_write_twin():
    args, (rk, rv) = K.kv_write_case(37, 3, 16, 53, seed=3)
    out = K.run("kv_write", K.CPU, args)
    np.testing.assert_array_equal(out[0], rk)
    np.testing.assert_array_equal(out[1], rv)


@pytest.mark.parametrize("T,n_attn,H,Hkv,Dh", [(1, 1, 4, 2, 16), (37, 61, 5, 1, 48),
                                               (9, 200, 4, 4, 64)])
def test_attention_twin(T, n_attn, H, Hkv, Dh):
    args, ref = K.attention_case(T, n_attn, H, Hkv, Dh, cap=n_attn + 7, seed=T)
    np.testing.assert_allclose(K.run("attention", K.CPU, args)[0], ref, rtol=1e-5, atol=1e-6)


ATTENTION_OPS = {"f32": "attention_cpu", "f16": "attention_cpu_f16"}  # the cache's type


F16_ROW_CHILD = """
import json
import numpy as np
import kernels as K
from helpers import f16_cases
from specdec import _core
x = f16_cases()
out = K.run("f16_row", K.CPU, [np.zeros(len(x), np.uint16), x, len(x)])[0]
print(json.dumps([_core.simd_name(), out.tolist()]))
"""


def test_f16_cache_rounding():
    """The f16 KV cache's rounding (the kernel this CPU picks, and the portable one in a child)
    is numpy's float16 conversion of the value clipped to +-65504: to nearest, ties to even,
    subnormals exact, finite values and infinities beyond the range saturating, NaN kept."""
    from helpers import child_json

    x = f16_cases()
    want = np.clip(x, -65504, 65504).astype(np.float16)
    nan = np.isnan(x)
    for simd in (None, "scalar"):
        env = {} if simd is None else {"SPECDEC_SIMD": simd}
        name, got = child_json(F16_ROW_CHILD, timeout=120, **env)
        got = np.array(got, dtype=np.uint16)
        assert (name == "scalar") == (simd == "scalar")
        np.testing.assert_array_equal(got[~nan], want[~nan].view(np.uint16), err_msg=name)
        assert np.all(np.isnan(got[nan].view(np.float16))), name


@pytest.mark.parametrize("kv", ["f32", "f16"])
def test_attention_query_alone_gives_the_batch_bits(kv):
    """A query's attention output has exactly the bits it gets in a batch of other queries
    (the kernel groups a KV head's queries to share key loads; the grouping must not change a
    query's arithmetic): greedy speculation relies on it. Head sizes 16, 48, 64 and 80 take the
    SIMD kernel's whole and partial 64-dimension passes; 37, 61 and 17 slots leave partial
    blocks of keys; 130 slots and 9 queries a head, the f16 cache's runs of widened values;
    16 and 12 tokens, groups of 16 and 12 queries. Past SD_ATTN_CHUNK (512) slots the runs of
    slots are attended apart and weighed together: 1100 slots with 9 tokens (each group goes
    over its runs) against one token (its runs on both threads), and 1030 slots (a last run of
    6)."""
    for T, n_attn, H, Hkv, Dh in ((9, 37, 6, 2, 64), (5, 61, 4, 1, 48), (3, 17, 2, 2, 16),
                                  (4, 40, 3, 1, 80), (3, 130, 9, 3, 64), (16, 90, 9, 3, 64),
                                  (12, 45, 4, 1, 64), (9, 1100, 9, 3, 64), (2, 1030, 4, 1, 64)):
        args, _ = K.attention_case(T, n_attn, H, Hkv, Dh, cap=n_attn + 3, seed=T + Dh,
                                   kv_f16=kv == "f16")
        batch = K.run(ATTENTION_OPS[kv], K.CPU, K.fresh(args))[0]
        for t in range(T):
            one = K.fresh(args)
            one[0], one[1], one[4], one[5] = one[0][t:t + 1], one[1][t:t + 1], one[4][t:t + 1], 1
            np.testing.assert_array_equal(K.run(ATTENTION_OPS[kv], K.CPU, one)[0][0], batch[t],
                                          err_msg=f"{kv} T {T} Dh {Dh} token {t}")


CHILD_ATTENTION = """
import json, sys
import numpy as np
import kernels as K
from specdec import _core
out = {}
for key, (T, n_attn, H, Hkv, Dh) in json.loads(sys.stdin.read()).items():
    for kv, op in (("f32", "attention_cpu"), ("f16", "attention_cpu_f16")):
        args, ref = K.attention_case(T, n_attn, H, Hkv, Dh, cap=n_attn + 7, seed=T,
                                     kv_f16=kv == "f16")
        y = K.run(op, K.CPU, args)[0]
        out[key + kv] = bool(np.all(np.abs(y - ref) <= 1e-6 + 1e-5 * np.abs(ref)))
print(json.dumps([_core.simd_name(), out]))
"""


@pytest.mark.parametrize("kv", ["f32", "f16"])
@pytest.mark.parametrize("T,n_attn,H,Hkv,Dh", [(1, 1, 4, 2, 16), (37, 61, 5, 1, 48),
                                               (9, 200, 4, 4, 64), (4, 40, 3, 1, 80),
                                               (8, 300, 9, 3, 64), (3, 1100, 9, 3, 64),
                                               (9, 1100, 9, 3, 64)])
def test_attention_of_the_forward_pass(T, n_attn, H, Hkv, Dh, kv):
    """The CPU forward pass's attention (the SIMD kernel this CPU picks, threaded) against the
    float64 reference over the values the cache holds (f32 or halves), within the twin's
    tolerance."""
    args, ref = K.attention_case(T, n_attn, H, Hkv, Dh, cap=n_attn + 7, seed=T,
                                 kv_f16=kv == "f16")
    np.testing.assert_allclose(K.run(ATTENTION_OPS[kv], K.CPU, args)[0], ref, rtol=1e-5,
                               atol=1e-6)


def runs_mask(n_attn: int) -> np.ndarray:
    """Mask rows whose open slots leave whole runs of SD_ATTN_CHUNK slots shut: the first run
    only (a causal prefill's early tokens), the second only (a sliding window), the last slot
    only, one slot in each run, and 60 % of all at random."""
    rng = np.random.default_rng(7)
    m = np.zeros((5, n_attn), np.uint8)
    m[0, :40] = 1
    m[1, 600:700] = 1
    m[2, n_attn - 1] = 1
    m[3, [5, 515, n_attn - 9]] = 1
    m[4] = rng.random(n_attn) < 0.6
    return m


@pytest.mark.parametrize("kv", ["f32", "f16"])
def test_attention_runs_with_shut_slots(kv):
    """Queries whose slots lie in some runs of SD_ATTN_CHUNK slots and not in others: within
    the twin's tolerance of the float64 reference, and each query alone gives its bits in the
    batch (a run no query sees is skipped, one a query does not see weighs nothing for it)."""
    n_attn, H, Hkv, Dh = 1100, 6, 2, 64
    mask = runs_mask(n_attn)
    T = len(mask)
    args, ref = K.attention_case(T, n_attn, H, Hkv, Dh, cap=n_attn + 4, seed=11,
                                 kv_f16=kv == "f16", mask=mask)
    batch = K.run(ATTENTION_OPS[kv], K.CPU, K.fresh(args))[0]
    np.testing.assert_allclose(batch, ref, rtol=1e-5, atol=1e-6)
    for t in range(T):
        one = K.fresh(args)
        one[0], one[1], one[4], one[5] = one[0][t:t + 1], one[1][t:t + 1], one[4][t:t + 1], 1
        np.testing.assert_array_equal(K.run(ATTENTION_OPS[kv], K.CPU, one)[0][0], batch[t],
                                      err_msg=f"{kv} token {t}")


@pytest.mark.parametrize("simd", ["avx2", "scalar"])
def test_attention_of_narrower_kernels(simd):
    """The forward pass's attention with the kernels this CPU does not pick by default
    (SPECDEC_SIMD caps them in a child process: AVX2 where AVX-512 exists, and the portable
    one) against the float64 reference, within the twin's tolerance."""
    import json

    from helpers import child_json

    if simd == "avx2":
        require_simd("avx2", "avx2", "this CPU has no AVX2")
    cases = {"a": (1, 1, 4, 2, 16), "b": (37, 61, 5, 1, 48), "c": (9, 200, 4, 4, 64),
             "d": (4, 40, 3, 1, 80), "e": (8, 300, 9, 3, 64), "f": (3, 1100, 9, 3, 64),
             "g": (2, 513, 4, 2, 20)}
    name, ok = child_json(CHILD_ATTENTION, stdin=json.dumps(cases), timeout=120,
                          SPECDEC_SIMD=simd)
    assert name == ("avx2+fma+f16c" if simd == "avx2" else "scalar")
    assert len(ok) == 2 * len(cases) and all(ok.values()), ok


CHILD_ATTENTION_BITS = """
import json, sys
import kernels as K
from specdec import _core
out = {}
for key, (T, n_attn, H, Hkv, Dh) in json.loads(sys.stdin.read()).items():
    for kv, op in (("f32", "attention_cpu"), ("f16", "attention_cpu_f16")):
        args, _ = K.attention_case(T, n_attn, H, Hkv, Dh, cap=n_attn + 5, seed=3 * T + Dh,
                                   kv_f16=kv == "f16")
        out[key + kv] = K.run(op, K.CPU, args)[0].tobytes().hex()
print(json.dumps([_core.simd_name(), out]))
"""

ATTENTION_BIT_CASES = {"one": (1, 1, 4, 2, 16), "decode": (1, 300, 9, 3, 64),
                       "verify": (8, 300, 9, 3, 64), "odd": (9, 37, 6, 2, 64),
                       "dh48": (5, 61, 4, 1, 48), "dh80": (4, 40, 3, 1, 80),
                       "dh128": (3, 70, 4, 2, 128), "dh16": (7, 17, 2, 2, 16),
                       "dh40": (3, 29, 4, 2, 40), "dh8": (2, 9, 2, 1, 8),
                       "runs": (4, 150, 9, 3, 64), "group16": (16, 90, 9, 3, 64),
                       "group12": (12, 45, 4, 1, 64), "chunks": (2, 1100, 9, 3, 64)}


def test_attention_avx512_gives_the_avx2_bits():
    """The AVX-512 attention (queries share key loads in pairs and value rows in fours) does
    the AVX2 kernel's arithmetic query by query: the same bits for every head size, group and
    mask, over an f32 cache and over halves (widened once per block of keys, or per run of
    value rows, when several queries read them), so which of the two a CPU picks changes no
    token."""
    import json

    from helpers import child_json

    require_simd("avx512", "avx512", "this CPU has no AVX-512")
    cases = json.dumps(ATTENTION_BIT_CASES)
    wide_name, wide = child_json(CHILD_ATTENTION_BITS, stdin=cases, timeout=120)
    narrow_name, narrow = child_json(CHILD_ATTENTION_BITS, stdin=cases, timeout=120,
                                     SPECDEC_SIMD="avx2")
    assert "avx512" in wide_name and narrow_name == "avx2+fma+f16c"
    assert len(wide) == 2 * len(ATTENTION_BIT_CASES)
    for key in wide:
        assert wide[key] == narrow[key], key


@pytest.mark.parametrize("accumulate", [0, 1])
@pytest.mark.parametrize("type_name", ["F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1",
                                       "Q8_0", "Q4_K", "Q5_K", "Q6_K"])
def test_matmul_twin(type_name, accumulate):
    for T in (1, 37):
        args, (ref, scale) = K.matmul_case(type_name, T, rows=19, cols=256, seed=T,
                                           accumulate=accumulate)
        y = K.run("matmul", K.CPU, args)[0][:, :19]
        assert np.all(np.abs(y - ref) <= 1e-6 * scale + 1e-6), type_name


def test_process_sample_verify_twins_are_the_loops_rules():
    """The sampling twins are the functions the CPU loops call (verify.c): same results as the
    direct bindings those functions have, on the same rows and uniforms."""
    args = K.process_case(3, 97, 0.8, 5, 0.9, 0.05, seed=4)
    probs = K.run("process", K.CPU, args)[0]
    logits = args[1]
    for r in range(3):
        direct = _core.process_logits(logits[r], 0.8, 5, 0.9, 0.05)
        np.testing.assert_array_equal(probs[r], direct)
    am = K.run("argmax", K.CPU, [np.zeros(3, np.int32), logits, 3, 97])[0]
    np.testing.assert_array_equal(am, logits.argmax(axis=1))


def test_sample_twin_inverts_the_cumulative_sum():
    args = K.sample_case(50, 97, seed=5)
    got = K.run("sample", K.CPU, args)[0]
    p = args[1]
    for r in range(50):
        assert p[r, got[r]] > 0


def test_verify_twin_accepts_identical_drafts_and_checks_sizes():
    """p == q: every draft is accepted (u * q < p always) and the bonus is drawn from p[K]."""
    args = K.verify_case(5, 97, True, seed=6)
    args[2] = args[1][:5].copy()  # q = p for the drafted positions
    res = K.run("verify", K.CPU, args)[0]
    assert res[0] == 5 and args[1][5, res[1]] > 0
    bad = K.verify_case(5, 97, True, seed=6)
    bad[1] = bad[1][:3].copy()
    with pytest.raises(ValueError, match="argument 1 must be an array of"):
        K.run("verify", K.CPU, bad)


@pytest.mark.parametrize("with_q", [False, True])
def test_verify_tree_twin_is_the_loops_tree_rule(with_q):
    """The twin of the CUDA tree kernel is sd_verify_tree with the uniforms the CPU loop keys by
    the step's output position (node i: stream 5, out_pos * 64 + i; the token after a accepted
    nodes: stream 2, out_pos + a): the same path and next token as the rule's direct binding
    fed those uniforms, computed here from util/hd.h's generator."""
    for seed in range(60):
        n = 1 + seed % 12
        args = K.verify_tree_case(n, 41, with_q, seed)
        res = K.run("verify_tree", K.CPU, args)[0]
        _, p, q, tokens, parent, _, _, rseed, out_pos = args
        ua = np.array([K.rng_uniform(rseed, 5, out_pos * 64 + i) for i in range(n)])
        depth = [0] * n
        for i in range(n):
            depth[i] = 1 if parent[i] < 0 else depth[parent[i]] + 1
        un = np.array([K.rng_uniform(rseed, 2, out_pos + a) for a in range(max(depth) + 1)])
        na, paths, nx = _core.verify_trees(parent, tokens[None], p[None],
                                           None if q is None else q[None], ua[None], un[None])
        assert res[0] == na[0] and res[1] == nx[0], seed
        assert list(res[2:2 + res[0]]) == list(paths[0][:na[0]]), seed
    bad = K.verify_tree_case(3, 41, False, 1)
    bad[4] = np.array([-1, 2, 0], np.int32)  # a child before its parent
    with pytest.raises(ValueError, match="node 1 has token"):
        K.run("verify_tree", K.CPU, bad)


def test_row_top_twin_orders_by_value_then_id():
    """Each row's top ids (Token Recycling's successors): the larger value first, ties to the
    lower id, -inf values still ranked, -1 past the row's length."""
    rng = np.random.default_rng(8)
    x = rng.integers(-3, 4, size=(6, 29)).astype(np.float32)  # many ties
    x[2, :] = -np.inf
    x[3, 5] = np.inf
    for top in (1, 4, 16):
        got = K.run("row_top", K.CPU, [np.zeros((6, top), np.int32), x, 6, 29, top])[0]
        want = np.argsort(-x, axis=1, kind="stable")[:, :top]
        np.testing.assert_array_equal(got, want)
    short = K.run("row_top", K.CPU, [np.zeros((1, 8), np.int32), x[:1, :5].copy(), 1, 5, 8])[0]
    assert list(short[0][5:]) == [-1, -1, -1]
    with pytest.raises(ValueError, match="top 17 outside"):
        K.run("row_top", K.CPU, [np.zeros((1, 17), np.int32), x[:1], 1, 29, 17])


def test_synthetic_accept_twin_rate():
    """Draft i is accepted while its uniform is below alpha: over many positions the number
    accepted has the truncated geometric law, mean sum_{i=1..K} alpha^i (tested at 5 sigma)."""
    K_, alpha, n = 6, 0.7, 4000
    got = [K.run("synthetic_accept", K.CPU, [np.zeros(1, np.int32), K_, alpha, 99, 10 * i])[0][0]
           for i in range(n)]
    mean = sum(alpha ** i for i in range(1, K_ + 1))
    var = np.var(np.minimum(np.random.default_rng(0).geometric(1 - alpha, 200000) - 1, K_))
    assert abs(np.mean(got) - mean) < 5 * np.sqrt(var / n)


def test_kernel_checks_refuse_bad_arguments():
    with pytest.raises(ValueError, match="no kernel named"):
        _core.kernel("nope", 0, [])
    with pytest.raises(ValueError, match="takes 6 arguments"):
        _core.kernel("rmsnorm", 0, [np.zeros(3, np.float32)])
    args, _ = K.rmsnorm_case(2, 8, seed=0)
    args[1] = args[1][:1].copy()
    with pytest.raises(ValueError, match="argument 1 must be an array of 64 bytes"):
        _core.kernel("rmsnorm", 0, args)
    args, _ = K.embed_case("F32", 2, seed=0)
    args[4] = np.array([0, 97], np.int32)
    with pytest.raises(ValueError, match="token 97 outside"):
        _core.kernel("embed", 0, args)
    args, _ = K.matmul_case("F32", 1, 4, 32, seed=0)
    args[3] = 10  # Q2_K: geometry known, no kernels
    with pytest.raises(ValueError, match="type 10 has no kernels"):
        _core.kernel("matmul", 0, args)
    if not _core.built_with_cuda():
        args, _ = K.rmsnorm_case(2, 8, seed=0)
        with pytest.raises(ValueError, match="no CUDA backend"):
            _core.kernel("rmsnorm", 1, args)


def test_bench_attention_times_and_checks_its_arguments():
    """The attention timing entry point of benchmarks/ab_builds.py --attention: a positive time
    for a small case, a ValueError naming the rule for shapes it cannot run."""
    assert _core.bench_attention(3, 40, 4, 2, 16, 2, 2, 1) > 0.0
    for bad in ((0, 40, 4, 2, 16, 2, 2, 1),    # no query
                (41, 40, 4, 2, 16, 2, 2, 1),   # more queries than slots
                (3, 40, 4, 3, 16, 2, 2, 1),    # KV heads not dividing the heads
                (3, 40, 0, 2, 16, 2, 2, 1),    # no head
                (3, 40, 4, 2, 1024, 2, 2, 1),  # head too large
                (3, 40, 4, 2, 16, 2, 0, 1)):   # no thread
        with pytest.raises(ValueError, match="bench_attention: need"):
            _core.bench_attention(*bad)
