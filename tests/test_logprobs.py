"""Log-probabilities of the emitted tokens (generate's ``logprobs`` and ``top_logprobs``): each
token's log softmax of the target's logits at temperature 1, whatever the sampling settings,
and the same numbers, bit for bit, with every speculator as in plain decoding (a token's logits
do not depend on its batch). Checked against an independent log softmax of Model.logits over
the output, so that a token paired with another position's row (the wrong node of a tree, the
row after a chain's token) fails."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

import specdec
import tinymodels as tm
from helpers import perturbed
from specdec import testing

CFG = tm.TinyConfig(arch="llama", vocab=64, dim=32, n_layers=3, n_heads=4, n_kv_heads=2,
                    ffn=64, context_length=300)


def load_models(d):
    """The CFG target and a draft close to it (5 % noise), written under d and loaded."""
    w = tm.make_weights(CFG, 31)
    paths = {}
    for name, weights in (("target", w), ("close", perturbed(w, 0.05, 2))):
        paths[name] = str(d / f"{name}.gguf")
        testing.write_gguf(paths[name], CFG, weights)
    return {k: specdec.load(p, threads=2) for k, p in paths.items()}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return load_models(tmp_path_factory.mktemp("logprobs"))


def speculators(models):
    """One of each drafter kind, chains and trees (a draft model's tree has sampled children
    when sampling: the q rows of the tree rule)."""
    return {
        "lookup": specdec.PromptLookup(k=6, verify_slope=0),
        "lookup-tree": specdec.PromptLookup(k=4, branching=3, size_by_cost=False),
        "recycling": specdec.TokenRecycling(adaptive=False),
        "draft": specdec.DraftModel(models["close"], k=4, verify_slope=0),
        "draft-tree": specdec.DraftModel(models["close"], k=3, branching=2, nodes=6),
        "layerskip": specdec.LayerSkip(2, k=3, verify_slope=0),
    }


DRAFTERS = ["lookup", "lookup-tree", "recycling", "draft", "draft-tree", "layerskip"]


def prompt(seed):
    return tm.random_tokens(CFG.vocab, 10, seed) * 2  # repeats, so lookup drafts


def log_softmax(rows):
    """Each row's log softmax, in float64."""
    x = np.asarray(rows, dtype=np.float64)
    mx = x.max(1, keepdims=True)
    return x - (mx + np.log(np.exp(x - mx).sum(1, keepdims=True)))


def expected(model, g, top):
    """The log softmax of Model.logits over the prompt and output (float64), each output
    token's entry and the `top` best (ties to the lower id)."""
    toks = list(g.prompt_tokens) + list(g.tokens)
    rows = model.logits(toks)[len(g.prompt_tokens) - 1:len(toks) - 1]
    ls = log_softmax(rows)
    lp = ls[np.arange(len(g.tokens)), g.tokens]
    ids = [np.lexsort((np.arange(CFG.vocab), -r))[:top] for r in ls]
    return lp, ids, ls


def check(model, g, top):
    lp, ids, ls = expected(model, g, top)
    assert g.logprobs is not None and len(g.logprobs) == len(g.tokens)
    np.testing.assert_allclose(g.logprobs, lp, atol=1e-5, rtol=0)
    if top == 0:
        assert g.top_logprobs is None
        return
    assert len(g.top_logprobs) == len(g.tokens)
    for i, row in enumerate(g.top_logprobs):
        assert [t for t, _ in row] == list(ids[i]), i
        np.testing.assert_allclose([v for _, v in row], ls[i, ids[i]], atol=1e-5, rtol=0)


SAMPLING = [dict(temperature=0.0), dict(temperature=1.0),
            dict(temperature=0.7, top_k=8, top_p=0.9, min_p=0.05)]


@pytest.mark.parametrize("sampling", SAMPLING, ids=["greedy", "t1", "filters"])
def test_plain_logprobs_are_the_models_log_softmax(models, sampling):
    """Before the sampling settings: the same log softmax at any temperature and filter."""
    m = models["target"]
    for seed in range(2):
        g = specdec.generate(m, prompt(seed), max_new_tokens=40, stop_tokens=[], seed=seed,
                             logprobs=True, top_logprobs=20, **sampling)
        check(m, g, 20)  # the most alternatives there are
        assert all(v <= 0 for v in g.logprobs)
        # a greedy token is its row's best
        if sampling["temperature"] == 0:
            assert all(row[0][0] == t for row, t in zip(g.top_logprobs, g.tokens))


@pytest.mark.parametrize("name", DRAFTERS)
def test_speculative_logprobs_are_plain_decodings_bit_for_bit(models, name):
    m = models["target"]
    spec = speculators(models)[name]
    accepted = 0
    for seed in range(3):
        want = specdec.generate(m, prompt(seed), max_new_tokens=48, stop_tokens=[],
                                logprobs=True, top_logprobs=3)
        got = specdec.generate(m, prompt(seed), max_new_tokens=48, stop_tokens=[],
                               logprobs=True, top_logprobs=3, speculator=spec)
        assert got.tokens == want.tokens
        assert got.logprobs == want.logprobs  # the same floats, not close ones
        assert got.top_logprobs == want.top_logprobs
        accepted += got.stats.accepted
    assert accepted > 20  # steps kept several tokens, each from its own row


@pytest.mark.parametrize("name", DRAFTERS)
def test_sampled_speculative_logprobs_follow_the_output(models, name):
    """When sampling, the output differs from plain decoding's; its logprobs are still those
    of the model at the tokens it has."""
    m = models["target"]
    spec = speculators(models)[name]
    accepted = 0
    for seed in range(3):
        g = specdec.generate(m, prompt(seed), max_new_tokens=48, stop_tokens=[], seed=seed,
                             temperature=0.8, top_k=20, logprobs=True, top_logprobs=2,
                             speculator=spec)
        check(m, g, 2)
        accepted += g.stats.accepted
    assert accepted > 10


def test_long_outputs_grow_their_rows(models):
    """The rows are grown as tokens come (64, then twice the tokens so far): 200 of them,
    each still its own row's."""
    m = models["target"]
    g = specdec.generate(m, prompt(5), max_new_tokens=200, stop_tokens=[], top_logprobs=3,
                         speculator=specdec.PromptLookup())
    assert len(g.tokens) == 200
    check(m, g, 3)


def test_logprobs_alone_and_stops(models):
    m = models["target"]
    p = prompt(0)
    plain = specdec.generate(m, p, max_new_tokens=30, stop_tokens=[])
    i = next(i for i in range(3, 30) if plain.tokens[i] not in plain.tokens[:i])
    g = specdec.generate(m, p, max_new_tokens=30, stop_tokens=[plain.tokens[i]], logprobs=True)
    assert g.finish_reason == "stop_token" and len(g.logprobs) == len(g.tokens) == i + 1
    assert g.top_logprobs is None
    check(m, g, 0)
    # a cancelled call's logprobs stop with its tokens
    g = specdec.generate(m, p, max_new_tokens=30, stop_tokens=[], top_logprobs=2,
                         speculator=specdec.PromptLookup(), on_token=lambda t: True)
    assert g.finish_reason == "cancelled" and len(g.tokens) == 1
    assert len(g.logprobs) == len(g.top_logprobs) == 1  # top_logprobs alone implies logprobs
    g = specdec.generate(m, p, max_new_tokens=0, logprobs=True, top_logprobs=1)
    assert g.tokens == [] and g.logprobs == [] and g.top_logprobs == []
    assert specdec.generate(m, p, max_new_tokens=4).logprobs is None


def test_stream_and_asyncio_carry_them(models):
    m = models["target"]
    p = prompt(1)
    want = specdec.generate(m, p, max_new_tokens=20, stop_tokens=[], logprobs=True,
                            top_logprobs=2)
    it = specdec.stream(m, p, max_new_tokens=20, stop_tokens=[], logprobs=True, top_logprobs=2,
                        speculator=specdec.PromptLookup())
    try:
        while True:
            next(it)
    except StopIteration as e:
        g = e.value
    assert g.logprobs == want.logprobs and g.top_logprobs == want.top_logprobs
    g = asyncio.run(specdec.agenerate(m, p, max_new_tokens=20, stop_tokens=[], logprobs=True,
                                      top_logprobs=2))
    assert g.logprobs == want.logprobs and g.top_logprobs == want.top_logprobs


def test_bad_arguments_are_named(models):
    m = models["target"]
    with pytest.raises(TypeError, match="logprobs"):
        specdec.generate(m, [1, 2], logprobs=1)
    with pytest.raises(TypeError, match="top_logprobs"):
        specdec.generate(m, [1, 2], top_logprobs=2.0)
    for bad in (-1, 21):
        with pytest.raises(ValueError, match=r"top_logprobs must be in \[0, 20\]"):
            specdec.generate(m, [1, 2], top_logprobs=bad)
    # the core's own check (for its callers in C)
    with pytest.raises(ValueError, match="top_logprobs needs logprobs"):
        m._core.sequence([1, 2], top_logprobs=2)


def test_token_logprobs_score_a_text(models):
    """Model.token_logprobs: the log softmax of each token after the ones before it, as generate
    records them for its own tokens, over a text longer than one of its 256-token parts."""
    m = models["target"]
    g = specdec.generate(m, prompt(3), max_new_tokens=40, stop_tokens=[], logprobs=True,
                         top_logprobs=4)
    lps, tops = m.token_logprobs(g.prompt_tokens + g.tokens, top_logprobs=4)
    n = len(g.prompt_tokens)
    assert len(lps) == len(tops) == n + len(g.tokens) - 1
    np.testing.assert_allclose(lps[n - 1:], g.logprobs, atol=1e-5, rtol=0)
    assert [[t for t, _ in r] for r in tops[n - 1:]] == [[t for t, _ in r] for r in g.top_logprobs]
    text = tm.random_tokens(CFG.vocab, 280, 9)
    lps, none = m.token_logprobs(text)
    ls = log_softmax(m.logits(text))
    np.testing.assert_allclose(lps, ls[np.arange(279), text[1:]], atol=1e-5, rtol=0)
    assert none is None and m.token_logprobs([5]) == ([], None)
    with pytest.raises(TypeError, match="tokens must be a sequence of token ids"):
        m.token_logprobs("some text")
    with pytest.raises(ValueError, match="at least one token"):
        m.token_logprobs([])
    for bad in (-1, 21):
        with pytest.raises(ValueError, match=r"top_logprobs must be in \[0, 20\]"):
            m.token_logprobs([1, 2], top_logprobs=bad)
