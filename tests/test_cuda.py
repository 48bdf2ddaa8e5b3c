"""The CUDA backend against the CPU: every kernel against its CPU twin on the same inputs
(tests/kernels.py), the forward pass and greedy decoding against the CPU backend on tiny
models, and on the GPU alone: verify batches that reproduce one-token steps bit for bit, the
speculative loops' greedy output equal to plain decoding, the cache self-check after every
step, sampled output drawing the CPU's tokens for the same seeds and distributed as the
target's. Everything here needs a GPU and is skipped, with the reason, without one; CI builds
the CUDA sources (when nvcc is there) and runs the rest of the suite.

Tolerances (float32 on both sides, different summation orders): RMSNorm, RoPE, SwiGLU and
attention 1e-5 relative; the matmul within 2e-6 of sum |w x| per output; the embedding, KV
writes, argmax, sampling draws, the chain rule's decisions and dummy weights exactly; whole
forwards 1e-4 of the logits' range."""

from __future__ import annotations

import os

import numpy as np
import pytest

import kernels as K
import specdec
import tinymodels as tm
from specdec import _core, testing

from helpers import (PAIR_CFG as CFG, PROMPT, assert_joint_matches, core_drafter, exact_joint,
                     make_v5, perturbed)


def _gpu_reason() -> str:
    if not _core.built_with_cuda():
        return "this build has no CUDA backend (nvcc was not found when it was built)"
    if _core.cuda_probe()["devices"] == 0:
        return "no CUDA device is visible (no GPU or driver here)"
    return ""


pytestmark = pytest.mark.requires("cuda", _gpu_reason())  # skips, or fails: conftest.py


def both(name: str, args: list):
    """(twin's arguments after the run, CUDA kernel's arguments after the run)."""
    cpu = K.run(name, K.CPU, K.fresh(args))
    gpu = K.run(name, K.CUDA, K.fresh(args))
    return cpu, gpu


# ---- kernels against their twins ------------------------------------------------------------------

@pytest.mark.parametrize("type_name", list(K.TYPE_IDS))
def test_embed(type_name):
    for T in (1, 37):
        args, _ = K.embed_case(type_name, T, seed=T)
        cpu, gpu = both("embed", args)
        np.testing.assert_array_equal(gpu[0], cpu[0])


@pytest.mark.parametrize("T,n", [(1, 48), (37, 96), (3, 5000)])
def test_rmsnorm(T, n):
    cpu, gpu = both("rmsnorm", K.rmsnorm_case(T, n, seed=T)[0])
    np.testing.assert_allclose(gpu[0], cpu[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("neox", [0, 1])
@pytest.mark.parametrize("T,H,Dh", [(1, 5, 16), (37, 3, 48), (4, 8, 128)])
def test_rope(T, H, Dh, neox):
    cpu, gpu = both("rope", K.rope_case(T, H, Dh, neox, seed=T)[0])
    np.testing.assert_allclose(gpu[0], cpu[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("T,n,norm_residual", [(1, 48, 0), (37, 96, 1), (3, 4096, 1)])
def test_head_input(T, n, norm_residual):
    cpu, gpu = both("head_input", K.head_input_case(T, n, norm_residual, seed=T)[0])
    np.testing.assert_allclose(gpu[0], cpu[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(gpu[2], cpu[2], rtol=1e-5, atol=1e-6)


def test_silu_add():
    cpu, gpu = both("silu_add", K.silu_add_case(100_003, seed=1)[0])
    np.testing.assert_allclose(gpu[0], cpu[0], rtol=1e-5, atol=1e-6)


def test_swiglu():
    cpu, gpu = both("swiglu", K.swiglu_case(100_003, seed=1)[0])
    np.testing.assert_allclose(gpu[0], cpu[0], rtol=1e-5, atol=1e-7)


def test_kv_write():
    cpu, gpu = both("kv_write", K.kv_write_case(37, 3, 48, 101, seed=2)[0])
    np.testing.assert_array_equal(gpu[0], cpu[0])
    np.testing.assert_array_equal(gpu[1], cpu[1])


@pytest.mark.parametrize("T,n_attn,H,Hkv,Dh", [(1, 1, 4, 2, 16), (37, 61, 5, 1, 48),
                                               (9, 700, 8, 2, 128), (2, 3000, 4, 4, 64)])
def test_attention(T, n_attn, H, Hkv, Dh):
    cpu, gpu = both("attention", K.attention_case(T, n_attn, H, Hkv, Dh, n_attn + 5, seed=T)[0])
    np.testing.assert_allclose(gpu[0], cpu[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("type_name", list(K.TYPE_IDS))
def test_matmul(type_name):
    # rows of 2304 columns: more than one chunk of staged activations (quantized rows are staged
    # by default; float rows from 2 tokens, or with SPECDEC_CUDA_STAGE=1)
    for T, rows, cols, acc in ((1, 37, 256, 0), (2, 19, 512, 1), (5, 64, 768, 0),
                               (37, 48, 256, 1), (70, 33, 512, 0), (9, 24, 2304, 1)):
        args, (_, scale) = K.matmul_case(type_name, T, rows, cols, seed=T, accumulate=acc)
        cpu, gpu = both("matmul", args)
        assert np.all(np.abs(gpu[0][:, :rows] - cpu[0][:, :rows]) <= 2e-6 * scale + 1e-6)
        np.testing.assert_array_equal(gpu[0][:, rows:], cpu[0][:, rows:])  # ldy padding kept


def test_matmul_mma_bf16():
    """The tensor-core kernel (SPECDEC_CUDA_MMA=1 for BF16): activations as two bf16 halves,
    so within 3e-5 of sum |w x| (about 2^-16 relative per product); rows of a batch equal the
    token alone bit for bit."""
    for T, rows, cols, acc in ((1, 37, 256, 0), (5, 64, 512, 1), (9, 19, 768, 0),
                               (16, 48, 256, 1), (37, 33, 512, 0)):
        args, (_, scale) = K.matmul_case("BF16", T, rows, cols, seed=T, accumulate=acc)
        cpu = K.run("matmul", K.CPU, K.fresh(args))
        gpu = K.run("matmul_mma", K.CUDA, K.fresh(args))
        assert np.all(np.abs(gpu[0][:, :rows] - cpu[0][:, :rows]) <= 3e-5 * scale + 1e-6), T
    args, _ = K.matmul_case("BF16", 20, 40, 512, seed=3, bias=False)
    w, x = args[2], args[6]
    for T in (2, 9, 20):
        batch = K.run("matmul_mma", K.CUDA, [np.zeros((T, 40), np.float32), 40, w, 30, 40, 512,
                                             x[:T].copy(), T, None, 0])[0]
        for t in range(T):
            one = K.run("matmul_mma", K.CUDA, [np.zeros((1, 40), np.float32), 40, w, 30, 40, 512,
                                               x[t:t + 1].copy(), 1, None, 0])[0]
            np.testing.assert_array_equal(batch[t], one[0], err_msg=f"T {T} t {t}")


def test_mma_models_decode_like_the_cpu_and_speculate_exactly():
    """With SPECDEC_CUDA_MMA=1 (a child process): a BF16 dummy model's greedy tokens are the
    CPU's but at near-ties, and prompt lookup's greedy output is plain greedy output."""
    import json

    from helpers import child_json

    shape = dict(specdec.dummy.SHAPES["tiny"], hidden_size=256, ffn_size=512, head_dim=64,
                 n_heads=4, n_kv_heads=2, vocab_size=301)
    prompts = [tm.random_tokens(301, 6, s) * 2 for s in range(4)]
    code = ("import json, sys, specdec\n"
            "shape, prompts = json.loads(sys.argv[1]), json.loads(sys.argv[2])\n"
            "m = specdec.dummy_model(shape, 'bf16', device='cuda', seed=7)\n"
            "out = []\n"
            "for p in prompts:\n"
            "    a = specdec.generate(m, p, max_new_tokens=24).tokens\n"
            "    b = specdec.generate(m, p, max_new_tokens=24, speculator=specdec.PromptLookup("
            "k=4, verify_slope=0)).tokens\n"
            "    out.append([a, b])\n"
            "print(json.dumps(out))")
    runs = child_json(code, json.dumps(shape), json.dumps(prompts), SPECDEC_CUDA_MMA="1")
    cpu = specdec.dummy_model(shape, "bf16", seed=7, kv_dtype="f32")
    for p, (plain, spec) in zip(prompts, runs):
        assert spec == plain
        ref = specdec.generate(cpu, p, max_new_tokens=24).tokens
        if ref != plain:
            k = next(i for i, (u, v) in enumerate(zip(ref, plain)) if u != v)
            row = cpu.logits(p + ref[:k])[-1]
            assert _margin(row) < 1e-3 * np.max(np.abs(row)), k


def test_matmul_rows_of_a_batch_equal_single_tokens_bitwise():
    """A token's bits do not depend on the batch: rows of T = 2..37 equal that token alone."""
    for type_name, cols in [(t, c) for t in ("F32", "BF16", "Q4_0", "Q4_K", "Q6_K")
                            for c in (512, 2304)]:
        args, _ = K.matmul_case(type_name, 37, 40, cols, seed=3, bias=False)
        y, ldy, w, tid, rows, cols, x = args[:7]
        for T in (2, 5, 9, 37):
            batch = K.run("matmul", K.CUDA, [np.zeros((T, rows), np.float32), rows, w, tid, rows,
                                             cols, x[:T].copy(), T, None, 0])[0]
            for t in range(T):
                one = K.run("matmul", K.CUDA, [np.zeros((1, rows), np.float32), rows, w, tid,
                                               rows, cols, x[t:t + 1].copy(), 1, None, 0])[0]
                np.testing.assert_array_equal(batch[t], one[0],
                                              err_msg=f"{type_name} cols {cols} T {T} t {t}")


@pytest.mark.parametrize("setting", [(0.0, 0, 1.0, 0.0), (1.0, 0, 1.0, 0.0), (0.7, 5, 1.0, 0.0),
                                     (1.0, 0, 0.9, 0.0), (1.0, 0, 1.0, 0.1), (0.8, 40, 0.8, 0.02)])
def test_process(setting):
    for rows, V in ((1, 97), (9, 50_000)):
        cpu, gpu = both("process", K.process_case(rows, V, *setting, seed=rows))
        np.testing.assert_array_equal(gpu[0] > 0, cpu[0] > 0)  # the same tokens kept
        np.testing.assert_allclose(gpu[0], cpu[0], rtol=1e-5, atol=1e-9)


def test_argmax_and_sample():
    logits = K.logits_rows(9, 50_000, seed=4)
    logits[3, 17] = logits[3, 4000] = logits[3].max() + 1  # a tie: the lower id wins
    cpu, gpu = both("argmax", [np.zeros(9, np.int32), logits, 9, 50_000])
    np.testing.assert_array_equal(gpu[0], cpu[0])
    assert gpu[0][3] == 17
    cpu, gpu = both("sample", K.sample_case(64, 97, seed=5))
    np.testing.assert_array_equal(gpu[0], cpu[0])


@pytest.mark.parametrize("with_q", [False, True])
def test_verify(with_q):
    for seed in range(40):
        cpu, gpu = both("verify", K.verify_case(1 + seed % 8, 97, with_q, seed))
        np.testing.assert_array_equal(gpu[0], cpu[0], err_msg=f"seed {seed}")


@pytest.mark.parametrize("with_q", [False, True])
def test_verify_tree(with_q):
    """The tree rule on the device: the same accepted path and next token as its CPU twin
    (sd_verify_tree) on the same rows and keyed uniforms."""
    for seed in range(40):
        cpu, gpu = both("verify_tree", K.verify_tree_case(1 + seed % 16, 97, with_q, seed))
        n_acc = cpu[0][0]
        np.testing.assert_array_equal(gpu[0][:2 + n_acc], cpu[0][:2 + n_acc],
                                      err_msg=f"seed {seed}")


def test_row_top():
    rng = np.random.default_rng(3)
    x = rng.integers(-5, 6, size=(9, 1000)).astype(np.float32)
    x[4] = -np.inf
    for top in (1, 3, 16):
        cpu, gpu = both("row_top", [np.zeros((9, top), np.int32), x, 9, 1000, top])
        np.testing.assert_array_equal(gpu[0], cpu[0])


def test_synthetic_accept_and_dummy_fill():
    for i in range(50):
        cpu, gpu = both("synthetic_accept", [np.zeros(1, np.int32), 6, 0.8, 3, 11 * i])
        assert gpu[0][0] == cpu[0][0]
    for type_name in K.TYPE_IDS:
        tid = K.TYPE_IDS[type_name]
        n = {0: 4, 1: 2, 30: 2}.get(tid)
        nbytes = 7 * 512 * n if n else 7 * (512 // (256 if tid in (12, 13, 14) else 32)) * \
            {2: 18, 3: 20, 6: 22, 7: 24, 8: 34, 12: 144, 13: 176, 14: 210}[tid]
        args = [np.zeros(nbytes, np.uint8), tid, 7, 512, 2**64 - 5, 3, 0.125]
        cpu, gpu = both("dummy_fill", args)
        np.testing.assert_array_equal(gpu[0], cpu[0], err_msg=type_name)


# ---- whole models ---------------------------------------------------------------------------------

@pytest.mark.parametrize("name,fmt", [("llama_gqa2", "gguf-f32-v3"), ("qwen2", "hf-f32"),
                                      ("llama_gqa2", "gguf-f16-v3-align64")])
def test_forward_matches_the_cpu(tiny, name, fmt):
    t = tiny(name, fmt)
    # the GPU keeps its caches in f32; the CPU's default f16 cache alone differs by ~4e-4
    cpu, gpu = specdec.load(t.path, kv_dtype="f32"), specdec.load(t.path, device="cuda")
    assert gpu.device == "cuda:0"
    tokens = tm.random_tokens(t.cfg.vocab, 21, 1)
    a, b = cpu.logits(tokens), gpu.logits(tokens)
    assert np.max(np.abs(a - b)) <= 1e-4 * np.max(np.abs(a))
    def steps(m):  # on a cache: a prefill, one token, a rollback and a batch of four
        c = m.new_cache(64)
        out = [m.forward(c, tokens[:10], n_logits=1), m.forward(c, tokens[10:11])]
        c.rollback(10)
        return out + [m.forward(c, tokens[10:14])]

    for x, y in zip(steps(cpu), steps(gpu)):
        assert np.max(np.abs(x - y)) <= 1e-4 * np.max(np.abs(x))


def _margin(logits_row: np.ndarray) -> float:
    s = np.sort(logits_row)
    return float(s[-1] - s[-2])


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
def test_greedy_matches_the_cpu_on_dummy_models(dtype):
    """The same dummy weights on both devices (generated on each); greedy continuations agree,
    or part only where the CPU's top-2 logits are within the float noise of each other. (Float
    weights only: for quantized ones the CPU rounds activations to 8 bits, as llama.cpp does,
    and the GPU multiplies them in f32; test_quantized_models_are_their_dequantized_weights.)"""
    shape = dict(specdec.dummy.SHAPES["tiny"], hidden_size=256, ffn_size=512, head_dim=64,
                 n_heads=4, n_kv_heads=2, vocab_size=301, n_layers=3)
    cpu = specdec.dummy_model(shape, dtype, seed=9, kv_dtype="f32")
    gpu = specdec.dummy_model(shape, dtype, device="cuda", seed=9)
    for s in range(4):
        prompt = tm.random_tokens(301, 7 + s, s)
        a = specdec.generate(cpu, prompt, max_new_tokens=24).tokens
        b = specdec.generate(gpu, prompt, max_new_tokens=24).tokens
        if a != b:
            k = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)
            row = cpu.logits(prompt + a[:k])[-1]
            assert _margin(row) < 1e-4 * np.max(np.abs(row)), (dtype, s, k)


@pytest.mark.parametrize("dtype", ["q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q4_k", "q5_k", "q6_k"])
def test_quantized_models_are_their_dequantized_weights(dtype):
    """The GPU multiplies dequantized weights with f32 activations: a quantized dummy model's
    logits equal the float64 reference over its dequantized weights to float rounding."""
    from helpers import QWEN, QWEN_CFG, TOKENS, rebuilt_weights
    import types

    import reference

    shape = dict(QWEN, hidden_size=256, head_dim=64, ffn_size=512)
    cfg = types.SimpleNamespace(**dict(vars(QWEN_CFG), head_dim=64))
    got = specdec.dummy_model(shape, dtype, device="cuda", seed=4).logits(TOKENS)
    ref = reference.forward(rebuilt_weights(shape, 4, dtype), cfg, TOKENS)
    assert np.max(np.abs(got - ref)) <= 1e-4 * np.max(np.abs(ref)), dtype


def test_long_prefill_and_cublas_prefill(tmp_path):
    """A 150-token prefill (several passes of 8 tokens, T beyond the graphs) matches the CPU;
    with SPECDEC_CUDA_CUBLAS=1 (tensor cores, activations split into two BF16 halves) it stays
    within 1e-3 of the exact kernels' logits."""
    import json

    from helpers import child_json

    shape = dict(specdec.dummy.SHAPES["tiny"], hidden_size=256, ffn_size=512, head_dim=64,
                 n_heads=4, n_kv_heads=2, vocab_size=301)
    tokens = tm.random_tokens(301, 150, 8)
    cpu = specdec.dummy_model(shape, "f32", seed=6, kv_dtype="f32").logits(tokens)
    gpu = specdec.dummy_model(shape, "f32", device="cuda", seed=6).logits(tokens)
    assert np.max(np.abs(cpu - gpu)) <= 1e-4 * np.max(np.abs(cpu))
    exact = specdec.dummy_model(shape, "bf16", device="cuda", seed=6).logits(tokens)
    code = ("import json, sys, specdec\n"
            "m = specdec.dummy_model(json.loads(sys.argv[1]), 'bf16', device='cuda', seed=6)\n"
            "print(json.dumps(m.logits(json.loads(sys.argv[2])).tolist()))")
    fast = np.array(child_json(code, json.dumps(shape), json.dumps(tokens),
                               SPECDEC_CUDA_CUBLAS="1"), dtype=np.float32)
    assert np.max(np.abs(fast - exact)) <= 1e-3 * np.max(np.abs(exact))


@pytest.mark.parametrize("dtype", ["f32", "bf16", "q4_0", "q8_0", "q6_k"])
def test_verify_batch_rows_equal_one_token_steps_bitwise(dtype):
    # ffn 1280: the down projection's rows span two chunks of staged activations
    shape = dict(specdec.dummy.SHAPES["tiny"], hidden_size=256, ffn_size=1280, head_dim=64,
                 n_heads=4, n_kv_heads=2, vocab_size=301)
    m = specdec.dummy_model(shape, dtype, device="cuda", seed=1)
    prompt = tm.random_tokens(301, 12, 2)
    batch = tm.random_tokens(301, 9, 3)
    c = m.new_cache(64)
    m.forward(c, prompt, n_logits=0)
    rows = m.forward(c, batch)
    c.rollback(len(prompt))
    for t, tok in enumerate(batch):
        one = m.forward(c, [tok])
        np.testing.assert_array_equal(rows[t], one[0], err_msg=f"{dtype} token {t}")


@pytest.fixture(scope="module")
def gpu_pair(tmp_path_factory):
    """test_draft_model's target and drafts, on the GPU and on the CPU."""
    d = tmp_path_factory.mktemp("gpu-draft")
    w = tm.make_weights(CFG, 21)
    far_cfg = tm.TinyConfig(arch="llama", vocab=40, dim=16, n_layers=1, n_heads=2, n_kv_heads=2,
                            ffn=32, context_length=64)
    out = {}
    for name, cfg, weights in [("target", CFG, w), ("close", CFG, perturbed(w, 0.05, 1)),
                               ("far", far_cfg, tm.make_weights(far_cfg, 22))]:
        p = os.path.join(d, name + ".gguf")
        testing.write_gguf(p, cfg, weights)
        out[name] = specdec.load(p, device="cuda")
        out[name + "-cpu"] = specdec.load(p, kv_dtype="f32")
    return out


def speculators(g, k):
    yield specdec.PromptLookup(k=k, max_ngram=3, verify_slope=0)
    yield specdec.DraftModel(g["close"], k=k, verify_slope=0)
    yield specdec.DraftModel(g["far"], k=k, verify_slope=0)
    yield specdec.LayerSkip(layers=1, k=k, verify_slope=0)
    yield specdec.DraftModel(g["far"], k=k, verify_slope=0.5, p_min=0.3)


@pytest.mark.parametrize("k", [1, 3, 8])
def test_speculative_greedy_is_plain_greedy(gpu_pair, k):
    target = gpu_pair["target"]
    for seed in range(3):
        prompt = tm.random_tokens(CFG.vocab, 6, seed) * 3
        plain = specdec.generate(target, prompt, max_new_tokens=40, stop_tokens=[])
        for sp in speculators(gpu_pair, k):
            got = specdec.generate(target, prompt, max_new_tokens=40, stop_tokens=[],
                                   speculator=sp)
            assert got.tokens == plain.tokens, (type(sp).__name__, seed)
            st = got.stats
            assert st.accepted + st.steps == st.new_tokens == 40


@pytest.mark.parametrize("sampling", [dict(temperature=0.0), dict(temperature=1.0, seed=3),
                                      dict(temperature=0.8, top_k=5, top_p=0.9, seed=4)])
def test_trees_on_the_gpu_are_the_cpus(gpu_pair, sampling):
    """Tree drafters (deterministic children) on a CUDA target: the tree-masked forward,
    the tree rule on the device and the compaction of its cache give the CPU's tokens (greedy:
    plain decoding's; sampled: the same keyed draws), with the cache checked after every step.
    Token Recycling's successors come from the rows' top ids found on the device; with a fresh
    table on each side, its trees (and so its tokens) are the CPU's."""
    for seed in range(3):
        prompt = tm.random_tokens(CFG.vocab, 6, seed) * 3
        for make in (lambda: specdec.PromptLookup(k=4, branching=3, verify_slope=0, size_by_cost=False),
                     lambda: specdec.TokenRecycling(nodes=12, adaptive=False)):
            got = [specdec.generate(gpu_pair[name], prompt, max_new_tokens=40, stop_tokens=[],
                                    speculator=make(), **sampling)
                   for name in ("target", "target-cpu")]
            assert got[0].tokens == got[1].tokens, (type(make()).__name__, seed)
            assert got[0].stats.drafted > 0
            if sampling["temperature"] == 0.0:
                plain = specdec.generate(gpu_pair["target"], prompt, max_new_tokens=40,
                                         stop_tokens=[]).tokens
                assert got[0].tokens == plain
        tokens, reason, _ = gpu_pair["target"]._core.generate(
            prompt, max_new_tokens=30, stop_ids=[], check_cache=True,
            drafter=specdec.PromptLookup(k=4, branching=3, verify_slope=0, size_by_cost=False).drafter(),
            **sampling)
        assert len(tokens) == 30 and reason == "length"


@pytest.mark.parametrize("sampling", [(0.0, 0, 1.0), (1.0, 0, 1.0), (0.8, 5, 0.9)])
def test_cache_check_after_every_step(gpu_pair, sampling):
    target = gpu_pair["target"]
    temperature, top_k, top_p = sampling
    prompt = tm.random_tokens(CFG.vocab, 6, 3) * 3
    kws = [dict(lookup=(8, 3, 1, 0.0)), dict(draft=(gpu_pair["close"]._core, 3, 0.0, 0.0)),
           dict(draft=(gpu_pair["far"]._core, 8, 0.0, 0.5)), dict(layerskip=(1, 3, 0.0, 0.0))]
    for kw in kws:
        for n in (1, 5, 23):
            tokens, reason, stats = target._core.generate(
                prompt, max_new_tokens=n, temperature=temperature, seed=5, stop_ids=[],
                top_k=top_k, top_p=top_p, drafter=core_drafter(**kw), check_cache=True)
            assert len(tokens) == n and reason == "length", kw


def test_sampled_draws_are_the_cpus(gpu_pair):
    """Same seed, same tokens on either device (the RNG is keyed alike and the processed
    distributions agree to float rounding): at least 99% of 200 runs identical, per drafter."""
    prompt = tm.random_tokens(CFG.vocab, 8, 1)
    for setting in ((1.0, 0, 1.0, 0.0), (0.8, 5, 0.9, 0.05)):
        T, top_k, top_p, min_p = setting
        for make in (lambda g: None, lambda g: specdec.PromptLookup(k=4, verify_slope=0),
                     lambda g: specdec.DraftModel(g["far"], k=3, verify_slope=0)):
            same = 0
            for s in range(200):
                kw = dict(max_new_tokens=12, temperature=T, top_k=top_k, top_p=top_p,
                          min_p=min_p, seed=s, stop_tokens=[])
                a = specdec.generate(gpu_pair["target-cpu"], prompt,
                                     speculator=make({"far": gpu_pair["far-cpu"]}), **kw).tokens
                b = specdec.generate(gpu_pair["target"], prompt, speculator=make(gpu_pair),
                                     **kw).tokens
                same += a == b
            assert same >= 198, (setting, same)


def test_sampled_output_is_distributed_as_the_target(v5_gpu):
    """test_draft_model's chi-square on the GPU loop (20,000 runs, alpha = 0.001)."""
    m, dm, w, _, row = v5_gpu
    setting = (1.0, 0, 1.0, 0.0)
    assert_joint_matches(m, specdec.DraftModel(dm, k=2, verify_slope=0), setting,
                         exact_joint(row, w, setting), N=20_000)


@pytest.fixture(scope="module")
def v5_gpu(tmp_path_factory):
    return make_v5(tmp_path_factory.mktemp("v5-gpu"), device="cuda")


def test_synthetic_speculation_matches_the_cpu():
    cpu = specdec.dummy_model("tiny", "f32", seed=3, kv_dtype="f32")
    gpu = specdec.dummy_model("tiny", "f32", device="cuda", seed=3)
    for alpha, k in ((0.6, 2), (0.9, 8)):
        a = specdec.dummy.synthetic_speculation(cpu, PROMPT, alpha=alpha, k=k, max_new_tokens=64)
        b = specdec.dummy.synthetic_speculation(gpu, PROMPT, alpha=alpha, k=k, max_new_tokens=64)
        assert (a.stats.steps, a.stats.accepted) == (b.stats.steps, b.stats.accepted)


def test_models_on_different_devices_are_refused(gpu_pair):
    with pytest.raises(ValueError, match="runs on the CPU and the target on the GPU"):
        specdec.generate(gpu_pair["target"], [1, 2, 3], max_new_tokens=4,
                         speculator=specdec.DraftModel(gpu_pair["far-cpu"]))


# ---- heads beside a CUDA target --------------------------------------------------------------
# An EAGLE head's layer runs on the target's GPU (its own small cache there), and Medusa's heads
# (SPECDEC_CUDA_HEAD=0: both on the CPU); the target's forwards on the GPU copy the features a
# head reads (final-normed hidden states, layer inputs) back with each step, and the head's rows
# (fc over them) are made on the host.

@pytest.fixture(scope="module")
def head_target(tmp_path_factory):
    from test_eagle import TARGET
    tiny = tm.write_model(tmp_path_factory.mktemp("head-target"), "eagle_target", "gguf-f32-v3",
                          cfg=TARGET, seed=21)
    return (specdec.load(str(tiny.path), kv_dtype="f32"), specdec.load(str(tiny.path),
                                                                       device="cuda"), TARGET)


def _close(got, want, tol=1e-3):
    finite = np.isfinite(want)
    np.testing.assert_array_equal(np.isfinite(got), finite)
    err = np.abs(got[finite] - want[finite]).max()
    assert err <= tol * max(1.0, np.abs(want[finite]).max()), err


def test_heads_read_a_cuda_targets_features_as_a_cpu_ones(tmp_path, head_target):
    """draft_logits over a CUDA target (its hidden states and layer inputs copied from the
    device) against the same over the CPU target: EAGLE-1 (the final hidden), EAGLE-3 (three
    layers' inputs) and Medusa (the final hidden)."""
    from test_eagle import write_head
    from test_medusa import write_medusa
    cpu, gpu, cfg = head_target
    toks = tm.random_tokens(cfg.vocab, 14, seed=2)
    for kind in ("eagle", "eagle3"):
        d, _, _ = write_head(tmp_path / kind, kind, "safetensors")
        spec = specdec.Eagle(d, weights="float")
        _close(spec.draft_logits(gpu, toks), spec.draft_logits(cpu, toks))
    d, _ = write_medusa(tmp_path / "medusa", heads=3)
    spec = specdec.Medusa(d, weights="float")
    _close(spec.draft_logits(gpu, toks), spec.draft_logits(cpu, toks))


@pytest.mark.parametrize("weights", ["float", "q8_0"])
def test_a_head_on_the_gpu_computes_what_it_computes_on_the_cpu(tmp_path, head_target,
                                                                       monkeypatch, weights):
    """An EAGLE head's layer on the target's GPU (sd_cuda_head_create: its input without a norm,
    EAGLE-1/2, or cat(rmsnorm(embedding), rmsnorm(feature)), EAGLE-3, with and without
    speculators' norm_before_residual; a draft vocabulary; the target's embeddings and output
    head read from the device), and Medusa's heads there (sd_cuda_medusa_logits), against the
    same heads on the CPU beside the same CUDA target (SPECDEC_CUDA_HEAD=0) and, for EAGLE,
    beside the CPU target."""
    from test_eagle import write_head
    cpu, gpu, cfg = head_target
    toks = tm.random_tokens(cfg.vocab, 14, seed=5)
    for kind, extra in (("eagle", {}), ("eagle3", {}), ("speculators", {}),
                        ("speculators", {"norm_before_residual": False})):
        d, _, _ = write_head(tmp_path / f"{kind}{len(extra)}", kind, "safetensors", **extra)
        on_gpu = specdec.Eagle(d, weights=weights).draft_logits(gpu, toks)
        monkeypatch.setenv("SPECDEC_CUDA_HEAD", "0")
        on_cpu = specdec.Eagle(d, weights=weights).draft_logits(gpu, toks)
        monkeypatch.delenv("SPECDEC_CUDA_HEAD")
        # 8-bit weights: the CPU rounds the activations to 8 bits too, the GPU does not
        tol = 1e-3 if weights == "float" else 3e-2
        _close(on_gpu, on_cpu, tol)
        _close(on_gpu, specdec.Eagle(d, weights=weights).draft_logits(cpu, toks), tol)
    from test_medusa import write_medusa  # Medusa's heads on the GPU (cuda/medusa.cu)
    d, _ = write_medusa(tmp_path / "medusa", heads=3)
    on_gpu = specdec.Medusa(d, weights=weights).draft_logits(gpu, toks)
    monkeypatch.setenv("SPECDEC_CUDA_HEAD", "0")
    on_cpu = specdec.Medusa(d, weights=weights).draft_logits(gpu, toks)
    monkeypatch.delenv("SPECDEC_CUDA_HEAD")
    _close(on_gpu, on_cpu, tol)


@pytest.mark.parametrize("kind,depth,branching,nodes,lookup", [
    ("eagle3", 4, 1, 4, 0), ("eagle3", 3, 2, 5, 0), ("eagle", 3, 2, 5, 0), ("eagle3", 2, 1, 2, 6)])
def test_heads_beside_a_cuda_target_keep_greedy_output(tmp_path, head_target, kind, depth,
                                                       branching, nodes, lookup):
    from test_eagle import assert_greedy_is_plain, write_head
    _, gpu, cfg = head_target
    d, _, _ = write_head(tmp_path / "h", kind, "safetensors")
    spec = specdec.Eagle(d, depth=depth, branching=branching, nodes=nodes, lookup=lookup)
    for seed in (1, 2):
        assert_greedy_is_plain(gpu, spec,
                               tm.random_tokens(cfg.vocab, 7, seed=seed) * (3 if lookup else 1))


def test_medusa_beside_a_cuda_target_keeps_greedy_output(tmp_path, head_target):
    from test_eagle import assert_greedy_is_plain
    from test_medusa import write_medusa
    _, gpu, cfg = head_target
    d, _ = write_medusa(tmp_path / "m", heads=3)
    for seed in (1, 2):
        assert_greedy_is_plain(gpu, specdec.Medusa(d), tm.random_tokens(cfg.vocab, 7, seed=seed))


def test_sampled_head_drafts_on_a_cuda_target_are_refused(tmp_path, head_target):
    """The drafts' distributions live on the device for CUDA targets; a head's (drawn on the
    host) cannot be verified there yet: a clear error, never a wrong answer."""
    from test_eagle import write_head
    _, gpu, cfg = head_target
    d, _, _ = write_head(tmp_path / "h", "eagle3", "safetensors")
    with pytest.raises(Exception, match="temperature 0 only"):
        specdec.generate(gpu, tm.random_tokens(cfg.vocab, 7, seed=1), max_new_tokens=8,
                         temperature=1.0, speculator=specdec.Eagle(d, depth=2))
    shape = dict(arch="llama", vocab_size=cfg.vocab, hidden_size=cfg.dim, n_layers=cfg.n_layers,
                 n_heads=cfg.n_heads, n_kv_heads=cfg.n_kv_heads, head_dim=cfg.dim // cfg.n_heads,
                 ffn_size=cfg.ffn, context_length=cfg.context_length, rope_theta=10000.0,
                 rms_eps=1e-5, tied_embeddings=False)
    dummy = specdec.dummy_model(shape, "f32", device="cuda", seed=3)
    with pytest.raises(Exception, match="made on the device"):
        specdec.generate(dummy, [1, 2, 3], max_new_tokens=4,
                         speculator=specdec.Eagle(d, depth=2))


def test_cpu_only_options_are_refused_by_name():
    """logprobs, logit_bias, penalties and min_tokens are CPU-only so far: a CUDA model refuses
    each by name rather than ignoring it."""
    m = specdec.dummy_model("tiny", "f32", device="cuda", seed=2)
    for kw, name in [(dict(logprobs=True), "logprobs"), (dict(top_logprobs=2), "logprobs"),
                     (dict(logit_bias={1: 2.0}), "logit_bias"),
                     (dict(repetition_penalty=1.2), "penalties"),
                     (dict(presence_penalty=0.5), "penalties"),
                     (dict(min_tokens=3), "min_tokens")]:
        with pytest.raises(ValueError, match=name):
            specdec.generate(m, [1, 2, 3], max_new_tokens=4, **kw)
