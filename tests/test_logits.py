"""specdec.load + Model.logits against the float64 reference, over every tiny configuration and
file format; config fields; GGUF/HF agreement; thread-count independence."""

from __future__ import annotations

import math

import numpy as np
import pytest

import specdec
from tinymodels import CONFIGS, FORMATS, random_tokens, rel_err

F32_TOL = 1e-4  # max|d| / max|ref|, float32 weights and an f32 KV cache
# float32 weights and the default f16 KV cache: the reference rounds its float64 keys and values
# to halves as specdec rounds its float32 ones, and where the two straddle a rounding boundary
# they land one half-ulp (2^-11, 4.9e-4 relative) apart, which moves the logits by up to about
# as much (measured: at most 1.1e-4 over the tiny models)
F16_KV_TOL = 5e-4
HALF_TOL = 1e-3  # F16 / BF16 weights; the reference uses the same rounded values


def tol(model, kv_dtype="f16"):
    return HALF_TOL if model.half else F16_KV_TOL if kv_dtype == "f16" else F32_TOL


def load(model, **kw):
    return specdec.load(str(model.path), **kw)


@pytest.mark.parametrize("fmt", ["hf-f32", "gguf-f32-v3", "hf-bf16-sharded2", "gguf-f16-v2-reversed"])
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_config_fields(tiny, name, fmt):
    """m.config reports the hyper-parameters that were written, in either format."""
    t = tiny(name, fmt)
    c = load(t).config
    cfg = t.cfg
    assert c.arch == cfg.arch
    assert c.vocab_size == cfg.vocab
    assert c.hidden_size == cfg.dim
    assert c.n_layers == cfg.n_layers
    assert c.n_heads == cfg.n_heads
    assert c.n_kv_heads == cfg.n_kv_heads
    assert c.head_dim == cfg.head_dim
    assert c.ffn_size == cfg.ffn
    assert c.context_length == cfg.context_length
    assert math.isclose(c.rope_theta, cfg.rope_theta, rel_tol=1e-6)
    assert math.isclose(c.rms_eps, cfg.rms_eps, rel_tol=1e-6)
    assert isinstance(c.tied_embeddings, bool)
    assert c.tied_embeddings == cfg.tied


@pytest.mark.parametrize("kv_dtype", ["f16", "f32"])
@pytest.mark.parametrize("n_tokens", [1, 37])
@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_logits_match_reference(tiny, ref_logits, name, fmt, n_tokens, kv_dtype):
    """logits(tokens) equals the float64 reference over the stored weight values (and the KV
    cache's rounding): max|d|/max|ref| <= 1e-4 (F32 files, f32 cache), 5e-4 (F32 files, f16
    cache) or 1e-3 (F16/BF16 files)."""
    t = tiny(name, fmt)
    m = load(t, kv_dtype=kv_dtype)
    assert m.kv_dtype == kv_dtype
    tokens = random_tokens(t.cfg.vocab, n_tokens, seed=n_tokens * 31 + 5)
    got = m.logits(tokens)
    assert isinstance(got, np.ndarray)
    assert got.dtype == np.float32
    assert got.shape == (n_tokens, t.cfg.vocab)
    assert np.all(np.isfinite(got))
    ref = ref_logits(t, tokens, kv_f16=kv_dtype == "f16")
    assert rel_err(got, ref) <= tol(t, kv_dtype), f"{name}/{fmt}: rel err {rel_err(got, ref):.3g}"


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_gguf_and_hf_agree(tiny, name):
    """The same float32 weights as HF safetensors (single and sharded) and as GGUF (v3/32 and
    v2/64, llama q/k permuted) give the same logits within 1e-5 relative (with an f32 KV cache:
    the permuted rows sum in another order, and an f16 cache could round such a difference up
    to a half-ulp)."""
    tokens = random_tokens(CONFIGS[name].vocab, 37, seed=99)
    base = load(tiny(name, "hf-f32"), kv_dtype="f32").logits(tokens)
    for fmt in ["hf-f32-sharded3", "gguf-f32-v3", "gguf-f32-v2-align64"]:
        other = load(tiny(name, fmt), kv_dtype="f32").logits(tokens)
        assert rel_err(other, base) <= 1e-5, f"{name}: {fmt} vs hf-f32: {rel_err(other, base):.3g}"


@pytest.mark.parametrize("alignment,key", [(32, True), (16, True), (128, True)],
                         ids=["explicit-32", "16", "128"])
def test_gguf_alignment_variants(tmp_path, ref_logits, tiny, alignment, key):
    """general.alignment is honoured whatever its value, also when it states the default 32."""
    import tinymodels as tm

    t = tiny("llama_odd", "gguf-f32-v3")
    p = tmp_path / "m.gguf"
    layout = tm.write_gguf(p, t.cfg, t.weights, alignment=alignment, write_alignment_key=key)
    assert layout.data_start % alignment == 0
    tokens = random_tokens(t.cfg.vocab, 20, seed=77)
    got = specdec.load(str(p)).logits(tokens)
    assert rel_err(got, ref_logits(t, tokens)) <= F16_KV_TOL


def test_logits_prefix_consistency(llama_gguf):
    """Causality: the logits of a prefix are the first rows of the logits of the whole."""
    m = load(llama_gguf)
    tokens = random_tokens(64, 30, seed=3)
    full = m.logits(tokens)
    for k in (1, 7, 29):
        assert rel_err(m.logits(tokens[:k]), full[:k]) <= 1e-5


def test_logits_full_context(tiny, ref_logits):
    """A sequence of exactly context_length tokens is accepted and correct (the bound is
    inclusive)."""
    t = tiny("llama_odd", "gguf-f32-v3")
    m = load(t)
    n = t.cfg.context_length
    tokens = random_tokens(t.cfg.vocab, n, seed=12)
    got = m.logits(tokens)
    assert got.shape == (n, t.cfg.vocab)
    assert rel_err(got, ref_logits(t, tokens)) <= F16_KV_TOL


def test_logits_accepts_numpy_tokens(llama_hf):
    """Token ids may also be given as numpy integer arrays (int32 or int64)."""
    m = load(llama_hf)
    tokens = random_tokens(64, 9, seed=4)
    base = m.logits(tokens)
    for dt in (np.int32, np.int64):
        np.testing.assert_array_equal(m.logits(np.array(tokens, dtype=dt)), base)


def test_threads_setting_and_independence(llama_gguf, tiny):
    """threads: load(threads=n) sets it, the attribute is settable, and 1 vs 2 threads give the
    same logits within 1e-6 relative (asserted: <= 1e-6, not bit-exactness)."""
    m = load(llama_gguf, threads=1)
    assert m.threads == 1
    assert isinstance(load(llama_gguf).threads, int) and load(llama_gguf).threads >= 1
    for t in (llama_gguf, tiny("qwen2_odd_tied", "hf-bf16")):
        m = load(t, threads=1)
        tokens = random_tokens(t.cfg.vocab, 37, seed=8)
        one = m.logits(tokens)
        m.threads = 2
        assert m.threads == 2
        two = m.logits(tokens)
        assert rel_err(two, one) <= 1e-6
        m2 = load(t, threads=2)
        assert m2.threads == 2
        assert rel_err(m2.logits(tokens), one) <= 1e-6


def test_threads_invalid(llama_gguf):
    """threads must be >= 1."""
    m = load(llama_gguf, threads=1)
    with pytest.raises(ValueError):
        m.threads = 0
    assert m.threads == 1
