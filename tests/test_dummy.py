"""Models with random weights (specdec.dummy_model) and the synthetic-acceptance benchmark
(specdec.dummy.synthetic_speculation), on the CPU; test_cuda.py compares the GPU's.

A dummy model's weights are rebuilt here from the fill kernel alone (tensor ids in the GGUF
order dummy.c lays them out) and run through the float64 reference forward: the model is
the tensors it claims, wired into the roles their names say."""

from __future__ import annotations

import inspect
import types

import numpy as np
import pytest

import reference
import specdec
from helpers import QWEN, QWEN_CFG, TOKENS, rebuilt_weights
from specdec import _core
from specdec.dummy import DTYPES, SHAPES, synthetic_speculation


def test_dummy_model_is_the_tensors_it_claims():
    m = specdec.dummy_model(QWEN, "f32", seed=11)
    ref = reference.forward(rebuilt_weights(QWEN, 11), QWEN_CFG, TOKENS, kv_f16=True)
    got = m.logits(TOKENS)
    assert np.max(np.abs(got - ref)) <= 1e-4 * np.max(np.abs(ref))


def test_dummy_quantized_blocks_are_valid_formats():
    """A Q8_0 and a Q4_1 dummy model (rows of 64: two blocks) against the reference over their
    dequantized weights: within the CPU's 8-bit activation rounding (a few 1e-2 of the range),
    so the fill writes blocks of those formats, with scales that make sense."""
    shape = dict(QWEN, hidden_size=64, head_dim=16, ffn_size=96)
    cfg = types.SimpleNamespace(**dict(vars(QWEN_CFG), head_dim=16))
    for dtype in ("q8_0", "q4_1"):
        got = specdec.dummy_model(shape, dtype, seed=2).logits(TOKENS)
        ref = reference.forward(rebuilt_weights(shape, 2, dtype), cfg, TOKENS, kv_f16=True)
        assert np.max(np.abs(got - ref)) <= 0.05 * np.max(np.abs(ref)), dtype


def test_dummy_model_config_seed_and_types():
    m = specdec.dummy_model("tiny", "f16", seed=1)
    c = m.config
    assert (c.vocab_size, c.hidden_size, c.n_layers, c.weight_type) == (97, 64, 2, "F16")
    assert m.tokenizer is None and m.device == "cpu"
    a = m.logits([1, 2, 3])
    assert np.array_equal(a, specdec.dummy_model("tiny", "f16", seed=1).logits([1, 2, 3]))
    assert not np.allclose(a, specdec.dummy_model("tiny", "f16", seed=2).logits([1, 2, 3]))
    for dtype in DTYPES:  # every type builds and decodes (K-quants need 256-element rows)
        shape = dict(SHAPES["tiny"], hidden_size=256, ffn_size=512, head_dim=64)
        g = specdec.generate(specdec.dummy_model(shape, dtype), [1, 2, 3], max_new_tokens=4)
        assert len(g.tokens) == 4
    big = specdec.dummy_model("smollm2-135m", "q8_0", n_layers=2)
    assert big.config.hidden_size == 576 and big.config.tied_embeddings


def test_dummy_model_bad_arguments():
    with pytest.raises(ValueError, match="unknown shape 'gpt-9'.*llama-3-8b"):
        specdec.dummy_model("gpt-9")
    with pytest.raises(ValueError, match="unknown dtype 'q3'"):
        specdec.dummy_model("tiny", "q3")
    with pytest.raises(ValueError, match="token_embd.weight' needs rows of a multiple of 256"):
        specdec.dummy_model("tiny", "q4_k")
    with pytest.raises(ValueError, match="unknown shape keys: layers"):
        specdec.dummy_model("tiny", layers=3)
    with pytest.raises(ValueError, match="the shape lacks ffn_size"):
        specdec.dummy_model({k: v for k, v in QWEN.items() if k != "ffn_size"})
    with pytest.raises(ValueError, match="not a multiple of"):
        specdec.dummy_model("tiny", n_heads=3)
    with pytest.raises(ValueError, match="seed"):
        specdec.dummy_model("tiny", seed=-1)
    if not _core.built_with_cuda():
        with pytest.raises(ValueError, match="no CUDA backend"):
            specdec.dummy_model("tiny", device="cuda")
    elif _core.cuda_probe()["devices"] == 0:
        with pytest.raises(RuntimeError, match="CUDA device 0 is not available"):
            specdec.dummy_model("tiny", device="cuda")


def test_synthetic_acceptance_follows_alpha():
    """Draft i of a step is accepted with probability alpha^(i+1) (all before it accepted):
    the per-position rates over 500 steps match within 5 standard errors, and the emitted count
    is max_new_tokens."""
    m = specdec.dummy_model("tiny", "f32", context_length=4096)
    alpha, k, n = 0.7, 4, 2000
    r = synthetic_speculation(m, [1, 2, 3], alpha=alpha, k=k, max_new_tokens=n)
    assert r.tokens == n and r.stats.new_tokens == n
    st = r.stats
    assert st.accepted + st.steps == n
    steps = st.steps
    for i, rate in enumerate(st.per_position_acceptance):
        want = alpha ** (i + 1)
        assert abs(rate - want) < 5 * np.sqrt(want * (1 - want) / steps) + 0.01, (i, rate, want)
    ends = synthetic_speculation(m, [1, 2, 3], alpha=0.0, k=k, max_new_tokens=20)
    assert ends.stats.accepted == 0 and ends.stats.steps == 20
    every = synthetic_speculation(m, [1, 2, 3], alpha=1.0, k=k, max_new_tokens=20)
    assert every.stats.steps == 4  # 5, 5, 5, then 5 more (k capped by what is left)


def test_synthetic_acceptance_cannot_be_reached_by_generate():
    """The synthetic rule is a separate entry point: generate() takes no such argument and
    refuses anything but the three speculators."""
    params = inspect.signature(specdec.generate).parameters
    assert not any("alpha" in p or "synth" in p for p in params)
    m = specdec.dummy_model("tiny", "f32")
    with pytest.raises(TypeError, match="speculator must be"):
        specdec.generate(m, [1, 2], max_new_tokens=2, speculator="synthetic")
    with pytest.raises(ValueError, match="alpha"):
        synthetic_speculation(m, [1, 2], alpha=1.5, k=2)
    with pytest.raises(ValueError, match="k must be"):
        synthetic_speculation(m, [1, 2], alpha=0.5, k=0)
