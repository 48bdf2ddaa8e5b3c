"""Helpers the test files share: what a missing requirement does (skip, or fail when
SPECDEC_REQUIRE names it), child Python processes, a tiny byte-level BPE tokenizer stored as GGUF
metadata, the draft-model test pair and its exact joint distributions, dummy weights rebuilt from
the fill kernel, and f16 rounding cases. Fixtures stay in conftest.py; statistics (and the
power calculation that sizes the distribution tests) are in stats.py, the float64 references in
reference.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import types
from typing import NoReturn

import numpy as np
import pytest
import tokenizers
from tokenizers import AddedToken, decoders, models, pre_tokenizers, trainers

import quantref
import reference
import specdec
import tinymodels as tm
from specdec import _core, testing
from specdec.dummy import DTYPES
from stats import chi2_critical, chi2_stat, runs_for

HERE = os.path.dirname(os.path.abspath(__file__))


# ---------------------------------------------------------------------------------------------
# Requirements: SPECDEC_REQUIRE turns a skip into a failure
# ---------------------------------------------------------------------------------------------

#: What SPECDEC_REQUIRE may name (comma-separated): things some tests need, and skip without
#: where they may well be missing. A machine that has one names it, so that its tests fail
#: instead of skipping when it goes missing (a CUDA build without a GPU, the model offline).
REQUIRABLE = {
    "cuda": "a CUDA build of specdec and a visible GPU",
    "smollm2": "the SmolLM2-135M-Instruct GGUF (cached, downloaded, or $SPECDEC_SMOLLM2_GGUF)",
    "gemma3": "the Gemma-3-270M Q4_K_M GGUF (cached, assembled, downloaded, or "
              "$SPECDEC_GEMMA3_GGUF)",
    "avx2": "a CPU with AVX2 (and FMA, F16C) kernels",
    "avxvnni": "a CPU with AVX-VNNI (256-bit vpdpbusd: Intel's cores from Alder Lake on, Zen 5)",
    "avx512": "a CPU with AVX-512 kernels",
    "vnni": "a CPU with AVX512-VNNI kernels",
    "amx": "a CPU with AMX-INT8 tiles the OS lets specdec use",
}


def required() -> frozenset:
    """The names in $SPECDEC_REQUIRE (comma-separated; case and spaces ignored). Raises
    ValueError naming any that REQUIRABLE does not know, so a typo cannot pass silently."""
    names = {n.strip().lower() for n in os.environ.get("SPECDEC_REQUIRE", "").split(",")}
    names.discard("")
    unknown = sorted(names - set(REQUIRABLE))
    if unknown:
        raise ValueError(f"SPECDEC_REQUIRE names {', '.join(unknown)}, which the tests do not "
                         f"know; known: {', '.join(sorted(REQUIRABLE))}")
    return frozenset(names)


def missing(thing: str, reason: str) -> NoReturn:
    """Skip the calling test because `thing` (a key of REQUIRABLE) is missing, for `reason`;
    or fail it with the same reason when SPECDEC_REQUIRE names `thing`. Every skip for a
    missing requirement goes through here (the `requires` marker of conftest.py too)."""
    if thing not in REQUIRABLE:
        raise ValueError(f"unknown requirement {thing!r}; known: {', '.join(sorted(REQUIRABLE))}")
    if thing in required():
        pytest.fail(f"{reason} (SPECDEC_REQUIRE names {thing})", pytrace=False)
    try:  # reported at the test, as a skip marker is, rather than at this line
        from _pytest.outcomes import Skipped

        skip = Skipped(reason, _use_item_location=True)
    except (ImportError, TypeError):  # pragma: no cover - pytest before 7
        pytest.skip(reason)
    raise skip


def require_simd(thing: str, feature: str, reason: str) -> None:
    """missing(thing, reason) unless `feature` is in the name of the kernels this CPU runs
    (_core.simd_name(), e.g. "avx2+fma+f16c")."""
    if feature not in _core.simd_name():
        missing(thing, reason)


# ---------------------------------------------------------------------------------------------
# Child Python processes
# ---------------------------------------------------------------------------------------------

def child_env(**extra) -> dict:
    """Environment for a child Python that imports the same specdec as this process."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(specdec.__file__)))
    path = os.pathsep.join([root] + [p for p in [os.environ.get("PYTHONPATH")] if p])
    return dict(os.environ, PYTHONPATH=path, **extra)


def child_json(code: str, *args: str, stdin: str = None, timeout: int = 300, **env):
    """Run `code` in a child Python (child_env(**env), in this folder) with arguments and
    standard input, check that it exited cleanly, and return the JSON it printed."""
    res = subprocess.run([sys.executable, "-c", code, *args], input=stdin, env=child_env(**env),
                         capture_output=True, text=True, timeout=timeout, cwd=HERE)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


# ---------------------------------------------------------------------------------------------
# A tiny byte-level BPE, stored the way a GGUF file stores it
# ---------------------------------------------------------------------------------------------

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<reponame>"]
USER_TOKEN = "<tool>"  # a user-defined token (GGUF token type 4)

CORPUS = [
    "Hello world! The quick brown fox jumps over the lazy dog.",
    "I don't think they'll say it's fine; we've seen it, you're right, I'm sure.",
    "Numbers: 12345, 3.14159 and 1,000,000 apples in 2024.",
    "def main():\n    return x ** 2  # comment\n\tindented\n",
    "Caf\u00e9 na\u00efve r\u00e9sum\u00e9 \u2014 \u4f60\u597d\uff0c\u4e16\u754c "
    "\U0001F642 \U0001F916",
    "<|im_start|>user\nhello there<|im_end|>\n<|im_start|>assistant\nhi!<|im_end|>",
] * 4

CHATML = (
    "{% for message in messages %}"
    "{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

def train_bpe() -> tokenizers.Tokenizer:
    """A byte-level BPE with SmolLM2's pre-tokenizer (individual digits, then GPT-2's regex)."""
    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS, trainer)
    tok.add_tokens([AddedToken(USER_TOKEN, special=False, normalized=False)])
    return tok


def gguf_meta(hf: tokenizers.Tokenizer, pre: str | None = "smollm", **extra) -> dict:
    """The GGUF metadata of `hf`, as llama.cpp's converter writes it: tokens in id order (added
    tokens as raw text), token types, merges as "a b" strings."""
    spec = json.loads(hf.to_str())
    vocab = dict(spec["model"]["vocab"])
    for at in spec["added_tokens"]:
        vocab[at["content"]] = at["id"]
    tokens = [""] * len(vocab)
    for t, i in vocab.items():
        tokens[i] = t
    special = {at["content"]: at["special"] for at in spec["added_tokens"]}
    types = [1 if t not in special else (3 if special[t] else 4) for t in tokens]
    merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]]
    meta = {
        "general.architecture": "llama",
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.merges": merges,
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
        "tokenizer.ggml.unknown_token_id": 0,
        "tokenizer.ggml.padding_token_id": 2,
        "tokenizer.ggml.add_bos_token": False,
        "tokenizer.ggml.add_space_prefix": False,
        "tokenizer.chat_template": CHATML,
    }
    if pre is not None:
        meta["tokenizer.ggml.pre"] = pre
    meta.update(extra)
    return meta


def gguf_kv(meta: dict) -> list:
    """A metadata dict as GGUF key/value entries for the test writer."""
    out = []
    for k, v in meta.items():
        if k == "general.architecture":
            continue
        if isinstance(v, bool):
            out.append((k, tm.GGUF_BOOL, v))
        elif isinstance(v, int):
            out.append((k, tm.GGUF_U32, v))
        elif isinstance(v, str):
            out.append((k, tm.GGUF_STRING, v))
        elif all(isinstance(x, str) for x in v):
            out.append((k, tm.GGUF_ARRAY, tm.Arr(tm.GGUF_STRING, list(v))))
        elif any(isinstance(x, float) for x in v):
            out.append((k, tm.GGUF_ARRAY, tm.Arr(tm.GGUF_F32, [float(x) for x in v])))
        else:
            out.append((k, tm.GGUF_ARRAY, tm.Arr(tm.GGUF_I32, list(v))))
    return out


def write_text_model(path, meta: dict | None = None, seed: int = 5) -> specdec.Model:
    """A tiny random llama (2 layers, dim 32, context 256) over the vocabulary of `meta` (GGUF
    tokenizer metadata; default: gguf_meta(train_bpe())), carrying that tokenizer, written to
    `path` and loaded."""
    meta = gguf_meta(train_bpe()) if meta is None else meta
    cfg = tm.TinyConfig(arch="llama", vocab=len(meta["tokenizer.ggml.tokens"]), dim=32,
                        n_layers=2, n_heads=4, n_kv_heads=2, ffn=64, context_length=256)
    testing.write_gguf(str(path), cfg, tm.make_weights(cfg, seed), extra_kv=gguf_kv(meta))
    return specdec.load(str(path))


def sentencepiece_meta() -> dict:
    """A hand-built SentencePiece-style ("llama") vocabulary as GGUF metadata: the 256 byte
    tokens (byte fallback), pieces with U+2581 for a space, a user-defined token."""
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [2, 3, 3] + [6] * 256
    scores = [0.0] * len(tokens)
    pieces = [("\u2581", -100.0), ("h", -100.0), ("e", -100.0), ("l", -100.0), ("o", -100.0),
              ("w", -100.0), ("r", -100.0), ("d", -100.0),
              ("ll", -1.0), ("he", -2.0), ("llo", -3.0), ("hello", -4.0),
              ("\u2581hello", -5.0), ("or", -6.0), ("ld", -6.5), ("wor", -7.0), ("world", -8.0),
              ("\u2581world", -9.0), ("<|user|>", 0.0)]
    for p, s in pieces:
        tokens.append(p)
        types.append(4 if p == "<|user|>" else 1)
        scores.append(s)
    return {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.scores": scores,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
        "tokenizer.ggml.unknown_token_id": 0,
    }


# ---------------------------------------------------------------------------------------------
# The draft-model pair: a target, a close draft (perturbed weights), a far one
# ---------------------------------------------------------------------------------------------

PAIR_CFG = tm.TinyConfig(arch="llama", vocab=40, dim=32, n_layers=2, n_heads=4, n_kv_heads=2,
                         ffn=64, context_length=96)
# a draft of another shape: one layer, narrower, multi-head attention, shorter context
PAIR_DRAFT_CFG = tm.TinyConfig(arch="llama", vocab=40, dim=16, n_layers=1, n_heads=2,
                               n_kv_heads=2, ffn=32, context_length=64)


def write_pair(d) -> dict:
    """The pair under folder d, loaded: {"target": PAIR_CFG weights of seed 21, "close": the
    same plus 5 % noise, "far": a PAIR_DRAFT_CFG model of other weights}."""
    w = tm.make_weights(PAIR_CFG, 21)
    paths = {}
    for name, cfg, weights in [("target", PAIR_CFG, w), ("close", PAIR_CFG, perturbed(w, 0.05, 1)),
                               ("far", PAIR_DRAFT_CFG, tm.make_weights(PAIR_DRAFT_CFG, 22))]:
        paths[name] = os.path.join(d, name + ".gguf")
        testing.write_gguf(paths[name], cfg, weights)
    return {k: specdec.load(p) for k, p in paths.items()}

def perturbed(w: dict, scale: float, seed: int) -> dict:
    """The weights plus relative Gaussian noise: a draft that mostly agrees with the target."""
    rng = np.random.default_rng(seed)
    return {k: (v + scale * np.std(v) * rng.standard_normal(v.shape)).astype(v.dtype)
            for k, v in w.items()}


def assert_stops_like_plain(target, make_speculator) -> None:
    """Stop tokens and length limits that fall inside a draft end the run exactly where plain
    greedy decoding ends it."""
    prompt = tm.random_tokens(target.config.vocab_size, 12, 5)
    plain = specdec.generate(target, prompt, max_new_tokens=30, stop_tokens=[])
    for i in (2, 10, 17):
        stop = plain.tokens[i]
        want = specdec.generate(target, prompt, max_new_tokens=30, stop_tokens=[stop])
        got = specdec.generate(target, prompt, max_new_tokens=30, stop_tokens=[stop],
                               speculator=make_speculator())
        assert got.tokens == want.tokens and got.finish_reason == want.finish_reason
    for n in (0, 1, 2, 7):
        got = specdec.generate(target, prompt, max_new_tokens=n, stop_tokens=[],
                               speculator=make_speculator())
        assert got.tokens == plain.tokens[:n]


# ---------------------------------------------------------------------------------------------
# Vocabulary-5 models whose joint distributions are enumerated exactly
# ---------------------------------------------------------------------------------------------

SETTINGS = {"T1": (1.0, 0, 1.0, 0.0), "T0.7-topk3": (0.7, 3, 1.0, 0.0),
            "top_p0.9": (1.0, 0, 0.9, 0.0), "min_p0.1": (1.0, 0, 1.0, 0.1)}
PROMPT = [1, 2, 3, 4]


def make_v5(d, device: str = "cpu"):
    """A target and a draft of other random weights over a vocabulary of 5, written under d and
    loaded on `device`, with the reference forward of each: (target, draft, target weights,
    draft weights, row(weights, prefix, setting) -> processed row)."""
    cfg = tm.TinyConfig(arch="llama", vocab=5, dim=16, n_layers=1, n_heads=2, n_kv_heads=1,
                        ffn=32, context_length=32)
    w, wd = tm.make_weights(cfg, 11), tm.make_weights(cfg, 12)
    testing.write_gguf(str(d / "t.gguf"), cfg, w)
    testing.write_gguf(str(d / "d.gguf"), cfg, wd)
    cache: dict = {}

    def row(weights, seq, setting):
        key = (id(weights), tuple(seq), setting)
        if key not in cache:
            last = reference.forward(weights, cfg, list(seq), kv_f16=True)[-1]
            cache[key] = reference.process_ref(last, *setting)
        return cache[key]

    return (specdec.load(str(d / "t.gguf"), device=device),
            specdec.load(str(d / "d.gguf"), device=device), w, wd, row)


def exact_joint(row, w, setting, prompt: list = PROMPT) -> np.ndarray:
    """P(first three tokens = a, b, c) after `prompt` under plain sampling of the processed
    target rows."""
    exact = np.zeros((5, 5, 5))
    p1 = row(w, prompt, setting)
    for a in range(5):
        p2 = row(w, prompt + [a], setting)
        for b in range(5):
            exact[a, b] = p1[a] * p2[b] * row(w, prompt + [a, b], setting)
    return exact.ravel()


def twin_generate(row, w, wd, setting, k, rng, broken):
    """The speculative loop in NumPy over the reference rows: three tokens, drafts of k sampled
    from the draft's rows, the chain rule with (broken=True) the correction drawn from p instead
    of norm(max(0, p - q))."""
    out: list = []
    while len(out) < 3:
        kk = min(k, 3 - len(out) - 1)
        drafts, qs = [], []
        for i in range(kk):
            q = row(wd, PROMPT + out + drafts, setting)
            qs.append(q)
            drafts.append(int(rng.choice(5, p=q)))
        base = PROMPT + out
        for i in range(kk + 1):
            p = row(w, base + drafts[:i], setting)
            if i == kk:
                out.append(int(rng.choice(5, p=p)))
                break
            d, q = drafts[i], qs[i]
            if rng.random() * q[d] < p[d]:
                out.append(d)
                continue
            res = p if broken else np.maximum(0.0, p - q)
            out.append(int(rng.choice(5, p=res / res.sum())))
            break
    return out[:3]


def assert_joint_matches(m, speculator, setting, exact, N: int | None = None,
                         prompt: list = PROMPT, penalties: tuple = (1.0, 0.0, 0.0)) -> None:
    """Chi-square (at stats.ALPHA) of the first three tokens of N seeded runs against `exact`
    (125 cells); N by default from stats.runs_for: enough to catch a deviation of stats.TV in
    total variation with probability stats.POWER (about 13,000 runs for the v5 target).
    penalties: (repetition, frequency, presence), as generate's."""
    from specdec import _core

    T, top_k, top_p, min_p = setting
    N = runs_for(exact) if N is None else N
    # the runs of specdec.generate(m, prompt, max_new_tokens=3, seed=s, stop_tokens=[], ...),
    # s = 0 .. N - 1, counted in C
    counts, drafted, accepted = _core.joint_counts(m._core, speculator.drafter(), prompt, N, T,
                                                   top_k, top_p, min_p, *penalties)
    assert drafted - accepted > N // 10  # the residual path is exercised
    stat, df = chi2_stat(counts, exact)
    assert stat < chi2_critical(df), (stat, df)


# ---------------------------------------------------------------------------------------------
# Dummy models rebuilt from the fill kernel
# ---------------------------------------------------------------------------------------------

QWEN = dict(arch="qwen2", vocab_size=61, hidden_size=48, n_layers=2, n_heads=4, n_kv_heads=2,
            head_dim=12, ffn_size=80, context_length=64, rope_theta=10000.0, rms_eps=1e-6,
            tied_embeddings=False)


def fill(rows, cols, seed, tid, scale, dtype: str = "f32"):
    """A dummy tensor's values (float64), from the fill kernel: dequantized with quantref's
    independent description of the block formats, or read as floats."""
    tid_type = DTYPES[dtype]
    if tid_type in quantref.FORMATS:
        _, qk, size = quantref.FORMATS[tid_type]
        raw = np.zeros(rows * cols // qk * size, np.uint8)
        _core.kernel("dummy_fill", 0, [raw, tid_type, rows, cols, seed, tid, scale])
        vals = quantref.dequantize(tid_type, raw.reshape(-1, size))
        return np.asarray(vals, np.float64).reshape(rows, cols)
    if dtype in ("f16", "bf16"):
        raw = np.zeros(rows * cols, np.uint16)
        _core.kernel("dummy_fill", 0, [raw, tid_type, rows, cols, seed, tid, scale])
        if dtype == "f16":
            return raw.view(np.float16).astype(np.float64).reshape(rows, cols)
        return (raw.astype(np.uint32) << 16).view(np.float32).astype(np.float64).reshape(rows, cols)
    out = np.zeros(rows * cols, np.float32)
    _core.kernel("dummy_fill", 0, [out, 0, rows, cols, seed, tid, scale])
    return out.reshape(rows, cols).astype(np.float64)


def rebuilt_weights(shape: dict, seed: int, dtype: str = "f32") -> dict:
    """The dummy weights in HF names (matrices of `dtype` as the values they stand for), from
    the fill kernel and dummy.c's tensor order: token_embd, output_norm, output, then per layer
    attn_norm, q, k, v, o, ffn_norm, gate, up, down, q/k/v biases."""
    D, F, V = shape["hidden_size"], shape["ffn_size"], shape["vocab_size"]
    QD = shape["n_heads"] * shape["head_dim"]
    KVD = shape["n_kv_heads"] * shape["head_dim"]
    w = {"model.embed_tokens.weight": fill(V, D, seed, 0, D ** -0.5, dtype),
         "model.norm.weight": np.ones(D),
         "lm_head.weight": fill(V, D, seed, 2, D ** -0.5, dtype)}
    tid = 3
    for i in range(shape["n_layers"]):
        p = f"model.layers.{i}."
        parts = [("input_layernorm.weight", None), ("self_attn.q_proj.weight", (QD, D)),
                 ("self_attn.k_proj.weight", (KVD, D)), ("self_attn.v_proj.weight", (KVD, D)),
                 ("self_attn.o_proj.weight", (D, QD)), ("post_attention_layernorm.weight", None),
                 ("mlp.gate_proj.weight", (F, D)), ("mlp.up_proj.weight", (F, D)),
                 ("mlp.down_proj.weight", (D, F)), ("self_attn.q_proj.bias", QD),
                 ("self_attn.k_proj.bias", KVD), ("self_attn.v_proj.bias", KVD)]
        for name, dims in parts:
            if dims is None:
                w[p + name] = np.ones(D)
            elif isinstance(dims, int):
                w[p + name] = fill(1, dims, seed, tid, 0.02)[0]
            else:
                w[p + name] = fill(dims[0], dims[1], seed, tid, dims[1] ** -0.5, dtype)
            tid += 1
    return w


QWEN_CFG = types.SimpleNamespace(n_layers=2, n_heads=4, n_kv_heads=2, head_dim=12,
                                 rope_theta=10000.0, rms_eps=1e-6, tied=False)
TOKENS = [3, 1, 4, 1, 5, 9, 2, 6]


# ---------------------------------------------------------------------------------------------
# f16 rounding cases
# ---------------------------------------------------------------------------------------------

def f16_cases() -> np.ndarray:
    """Floats for the cache's rounding to halves: random ones at every scale, exact midpoints
    between neighbouring halves (ties, normal and subnormal), the edges of the range, the
    non-finite values; 1005 of them, so the SIMD kernel has a tail."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal(600) * 10.0 ** rng.uniform(-9, 6, 600)
    h = rng.integers(0, 0x7BFF, 300).astype(np.uint16)  # finite halves below the largest
    lo, hi = h.view(np.float16).astype(np.float64), (h + 1).view(np.float16).astype(np.float64)
    ties = (lo + hi) / 2 * rng.choice([-1.0, 1.0], 300)
    edges = [65504, 65519, 65520, 1e6, -65520, -1e9, 2.0 ** -24, 2.0 ** -25, 3 * 2.0 ** -26,
             2.0 ** -14, -0.0, 0.0, np.inf, -np.inf, np.nan]
    out = np.concatenate([x, ties, edges, rng.standard_normal(1005 - 600 - 300 - len(edges))])
    return out.astype(np.float32)


# ---- the speculative loop with its cache self-check ------------------------------------------

def core_drafter(lookup=None, draft=None, layerskip=None):
    """The C drafter of a (k, ...) tuple in the order of its _core constructor, or None."""
    from specdec import _core

    if lookup is not None:
        return _core.prompt_lookup(*lookup)
    if draft is not None:
        return _core.draft_model(*draft)
    return None if layerskip is None else _core.layerskip(*layerskip)


def run_checked(target, prompt, n, temperature, top_k, top_p, *, stop_ids=(), seed=5, **drafter):
    """Model.generate with the cache self-check on (a test hook, not in the public API);
    returns (tokens, reason, stats)."""
    return target._core.generate(prompt, max_new_tokens=n, temperature=temperature, seed=seed,
                                 stop_ids=list(stop_ids), top_k=top_k, top_p=top_p,
                                 drafter=core_drafter(**drafter), check_cache=True)


def without_and_with_the_pool(model, run, pool: int = 4):
    """run() with prefix reuse off (an empty pool), then again with a pool of `pool` caches;
    the model's setting is restored after. (without, with)."""
    before = model.prefix_cache
    model.prefix_cache = 0
    try:
        alone = run()
        model.prefix_cache = pool
        return alone, run()
    finally:
        model.prefix_cache = before


def in_threads(fns, timeout: float = 180):
    """Runs the callables in threads at once (a barrier starts them together); their results,
    after asserting that none raised."""
    barrier, results, errors = threading.Barrier(len(fns)), [None] * len(fns), []

    def work(i):
        try:
            barrier.wait()
            results[i] = fns[i]()
        except BaseException as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(fns))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    assert not errors, errors
    return results
