"""Prefix reuse (Model.prefix_cache, kv_cache.c's pool): a request whose prompt starts with the
tokens a finished request's cache holds takes their keys and values instead of computing them
again. The output is the same bit for bit (plain and every drafter, greedy and sampled), the
reused cache equals a fresh forward's (check_cache), whether it is taken whole or copied into a
larger one, and the pool keeps at most prefix_cache caches, the most recently used."""

from __future__ import annotations

import pytest

import specdec
import tinymodels as tm
from specdec import testing

CFG = tm.TinyConfig(arch="llama", vocab=64, dim=32, n_layers=2, n_heads=4, n_kv_heads=2,
                    ffn=64, context_length=512)
SPECULATORS = {
    "plain": lambda m: None,
    "lookup": lambda m: specdec.PromptLookup(k=4),
    "draft": lambda m: specdec.DraftModel(m, k=3, verify_slope=0),
    "recycling": lambda m: specdec.TokenRecycling(nodes=8, adaptive=False),
}


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("prefix") / "m.gguf")
    testing.write_gguf(path, CFG, tm.make_weights(CFG, 4))
    return specdec.load(path, threads=2)


def chat(model, spec, temperature, turns=3):
    """A chat of `turns` turns: each prompt is the last prompt, its answer and a new message."""
    prompt, out = tm.random_tokens(CFG.vocab, 60, 1), []
    for i in range(turns):
        g = specdec.generate(model, prompt, max_new_tokens=24, temperature=temperature, seed=i,
                             stop_tokens=[], speculator=SPECULATORS[spec](model))
        out.append(g)
        prompt = prompt + g.tokens + tm.random_tokens(CFG.vocab, 10, 10 + i)
    return out


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("spec", list(SPECULATORS))
def test_a_chat_reuses_its_turns_with_the_same_output(model, spec, temperature):
    model.prefix_cache = 0
    try:
        fresh = chat(model, spec, temperature)
    finally:
        model.prefix_cache = 4
    reused = chat(model, spec, temperature)
    assert [g.tokens for g in reused] == [g.tokens for g in fresh]
    assert all(g.prefix_reused == 0 for g in fresh)
    # each later turn took the whole previous text but its last token (never fed back)
    for prev, g in zip(reused, reused[1:]):
        assert g.prefix_reused == len(prev.prompt_tokens) + len(prev.tokens) - 1


@pytest.mark.parametrize("spec", ["plain", "lookup", "recycling"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_reused_cache_equals_a_fresh_forward(model, spec, temperature):
    """check_cache after every step, on requests that start from a pooled cache: taken whole
    (the same prompt again, its cache large enough) and copied into a larger one (the next
    turn, which needs more slots)."""
    s = SPECULATORS[spec](model)
    drafter = None if s is None else s.drafter()
    prompt = tm.random_tokens(CFG.vocab, 50, 3)
    kw = dict(temperature=temperature, seed=5, stop_ids=[], drafter=drafter, check_cache=True)
    if drafter is None:
        kw.pop("check_cache")  # plain decoding has no self-check; the sequence's tokens do
    for n_new, grow in ((20, 0), (20, 0), (30, 40)):
        p = prompt + tm.random_tokens(CFG.vocab, grow, 7)
        want, _, _ = model._core.generate(p, max_new_tokens=n_new, **kw)  # leaves its cache
        seq = model._core.sequence(p, max_new_tokens=n_new, **kw)
        while not seq.done:
            seq.step()
        assert seq.reused == len(p) - 1
        if spec != "recycling" or temperature == 0:  # its table (and sampled trees) moved on
            assert seq.tokens == want
        seq.close()


def test_the_pool_keeps_the_most_recently_used(model):
    a, b = tm.random_tokens(CFG.vocab, 40, 20), tm.random_tokens(CFG.vocab, 40, 21)
    model.prefix_cache = 1
    try:
        specdec.generate(model, a, max_new_tokens=4, stop_tokens=[])
        specdec.generate(model, b, max_new_tokens=4, stop_tokens=[])  # evicts a's
        assert specdec.generate(model, a, max_new_tokens=4, stop_tokens=[]).prefix_reused == 0
        assert specdec.generate(model, a, max_new_tokens=4, stop_tokens=[]).prefix_reused == 39
        model.prefix_cache = 0  # frees what is kept
        model.prefix_cache = 2
        assert specdec.generate(model, a, max_new_tokens=4, stop_tokens=[]).prefix_reused == 0
    finally:
        model.prefix_cache = 4
    assert model.prefix_cache == 4


@pytest.mark.parametrize("bad", [-1, 65])
def test_prefix_cache_range_is_the_cores(model, bad):
    with pytest.raises(ValueError, match=rf"prefix_cache must be in \[0, 64\], got {bad}"):
        model.prefix_cache = bad
    with pytest.raises(TypeError, match="prefix_cache must be an integer"):
        model.prefix_cache = 1.5
    assert model.prefix_cache == 4
