"""Logit bias and repetition, frequency and presence penalties (spec/decode.c's
sd_emitter_penalize): plain decoding applies them as an independent NumPy statement does, and
every speculator, chains and trees, keeps plain decoding's output exactly: greedy token for
token, and when sampling the first three tokens distributed as plain sampling's (chi-square
against the exact joint computed in NumPy). A verify row must count the drafted tokens on its
own path: rows that count only the output so far fail both."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

import reference
import specdec
import tinymodels as tm
from helpers import PROMPT, SETTINGS, assert_joint_matches, make_v5
from test_logprobs import CFG, DRAFTERS, load_models, prompt, speculators

PEN = dict(repetition_penalty=1.3, frequency_penalty=0.4, presence_penalty=0.3)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return load_models(tmp_path_factory.mktemp("penalties"))


def penalize(row, prompt_ids, out, bias=None, repetition_penalty=1.0, frequency_penalty=0.0,
             presence_penalty=0.0):
    """The rule in float32, as the core computes it: bias, then repetition over the prompt's
    and output's tokens, then frequency and presence over the output's."""
    f32 = np.float32
    x = np.asarray(row, dtype=f32).copy()
    for t, b in (bias or {}).items():
        x[t] = x[t] + f32(b)
    counts = Counter(out)
    for t in set(prompt_ids) | set(out):
        v = x[t]
        if repetition_penalty != 1.0:
            v = v / f32(repetition_penalty) if v > 0 else v * f32(repetition_penalty)
        c = counts.get(t, 0)
        if c > 0:
            v = v - (f32(frequency_penalty) * f32(c) + f32(presence_penalty))
        x[t] = v
    return x


def test_plain_greedy_follows_the_rule(models):
    m = models["target"]
    for seed in range(2):
        p = prompt(seed)
        base = specdec.generate(m, p, max_new_tokens=30, stop_tokens=[])
        bias = {base.tokens[2]: -3.0, 7: 1.5}
        g = specdec.generate(m, p, max_new_tokens=30, stop_tokens=[], logit_bias=bias, **PEN)
        assert g.tokens != base.tokens  # they change the answer
        out: list = []
        for _ in range(30):  # the twin: greedy over penalised rows of Model.logits
            row = m.logits(p + out)[-1]
            out.append(int(np.argmax(penalize(row, p, out, bias, **PEN))))
        assert g.tokens == out


@pytest.mark.parametrize("name", DRAFTERS)
def test_greedy_speculation_keeps_the_penalised_output(models, name):
    m = models["target"]
    spec = speculators(models)[name]
    accepted = 0
    for seed in range(6):
        p = prompt(seed)
        kw = dict(max_new_tokens=64, stop_tokens=[], logit_bias={3: 2.0, 11: -1.0}, **PEN)
        want = specdec.generate(m, p, logprobs=True, **kw)
        got = specdec.generate(m, p, logprobs=True, speculator=spec, **kw)
        assert got.tokens == want.tokens
        assert got.logprobs == want.logprobs  # the penalised rows, bit for bit
        accepted += got.stats.accepted
    assert accepted >= 5  # steps kept drafts, whose rows counted the drafts before them


# sampling: the v5 pair of helpers, the first three tokens after PROMPT
V5_CFG = tm.TinyConfig(arch="llama", vocab=5, dim=16, n_layers=1, n_heads=2, n_kv_heads=1,
                       ffn=32, context_length=32)
SAMPLED_PEN = dict(repetition_penalty=1.8, frequency_penalty=0.9, presence_penalty=0.6)


@pytest.fixture(scope="module")
def v5(tmp_path_factory):
    return make_v5(tmp_path_factory.mktemp("pen_v5"))


def exact_penalised_joint(w, setting):
    def row(seq):
        out = seq[len(PROMPT):]
        last = reference.forward(w, V5_CFG, list(seq), kv_f16=True)[-1]
        return reference.process_ref(penalize(last, PROMPT, out, **SAMPLED_PEN), *setting)

    exact = np.zeros((5, 5, 5))
    p1 = row(PROMPT)
    for a in range(5):
        p2 = row(PROMPT + [a])
        for b in range(5):
            exact[a, b] = p1[a] * p2[b] * row(PROMPT + [a, b])
    return exact.ravel()


@pytest.mark.parametrize("setting", ["T1", "T0.7-topk3"])
@pytest.mark.parametrize("kind", ["draft", "draft-tree", "recycling"])
def test_sampled_speculation_is_distributed_as_penalised_plain_sampling(v5, kind, setting):
    target, draft, w, _, _ = v5
    spec = {"draft": lambda: specdec.DraftModel(draft, k=2, verify_slope=0),
            "draft-tree": lambda: specdec.DraftModel(draft, k=2, branching=2, nodes=4),
            "recycling": lambda: specdec.TokenRecycling(nodes=4, widths=(2, 1),
                                                        adaptive=False)}[kind]()
    exact = exact_penalised_joint(w, SETTINGS[setting])
    assert_joint_matches(target, spec, SETTINGS[setting], exact,
                         penalties=tuple(SAMPLED_PEN.values()))


def test_bad_values_are_named(models):
    m = models["target"]
    for kw, msg in [(dict(repetition_penalty=0.0), "repetition_penalty must be > 0"),
                    (dict(repetition_penalty=float("inf")), "repetition_penalty"),
                    (dict(frequency_penalty=2.5), r"frequency_penalty must be in \[-2, 2\]"),
                    (dict(presence_penalty=float("nan")), "presence_penalty"),
                    (dict(logit_bias={CFG.vocab: 1.0}), "logit_bias names token id 64"),
                    (dict(logit_bias={1: 101}), r"must be in \[-100, 100\]"),
                    (dict(logit_bias={-1: 1}), "out of range"),
                    (dict(logit_bias={1: 1e300}), r"must be in \[-100, 100\], got 1e\+300"),
                    (dict(logit_bias={2**40: 1}), "logit_bias token id must be in")]:
        with pytest.raises(ValueError, match=msg):
            specdec.generate(m, [1, 2], **kw)
    with pytest.raises(TypeError, match="logit_bias must be a mapping"):
        specdec.generate(m, [1, 2], logit_bias=[(1, 2.0)])
    with pytest.raises(TypeError, match="frequency_penalty must be a number"):
        specdec.generate(m, [1, 2], frequency_penalty="high")
    with pytest.raises(ValueError, match="names token id 5 twice"):
        m._core.sequence([1, 2], logit_bias_ids=[5, 5], logit_bias_values=[1.0, 2.0])


@pytest.mark.parametrize("name", DRAFTERS)
def test_min_tokens_hold_the_stop_tokens_back_exactly(models, name):
    """No stop token before min_tokens; with a speculator, plain decoding's output with the
    same setting (a row's position counts its path), greedy and sampled alike."""
    m = models["target"]
    spec = speculators(models)[name]
    for seed in range(4):
        p = prompt(seed)
        plain = specdec.generate(m, p, max_new_tokens=40, stop_tokens=[])
        stop = next(t for i, t in enumerate(plain.tokens) if 2 <= i and t not in plain.tokens[:i])
        first = plain.tokens.index(stop)
        kw = dict(max_new_tokens=40, stop_tokens=[stop], min_tokens=first + 6)
        want = specdec.generate(m, p, **kw)
        assert stop not in want.tokens[:first + 5] and want.tokens[:first] == plain.tokens[:first]
        assert len(want.tokens) > first + 1  # it went past where it stopped before
        got = specdec.generate(m, p, speculator=spec, **kw)
        assert got.tokens == want.tokens and got.finish_reason == want.finish_reason
        # a stop token allowed from exactly where plain decoding emits it: a step that began
        # before min_tokens may emit it too (its row counts the drafts before it)
        kw["min_tokens"] = first
        got = specdec.generate(m, p, speculator=spec, **kw)
        assert got.tokens == plain.tokens[:first + 1] and got.finish_reason == "stop_token"
        kw.update(temperature=1.0, seed=seed, min_tokens=12)
        sampled = specdec.generate(m, p, speculator=spec, **kw)
        assert stop not in sampled.tokens[:11]


def test_min_tokens_are_checked(models):
    with pytest.raises(ValueError, match="min_tokens must be >= 0"):
        specdec.generate(models["target"], [1, 2], min_tokens=-1)


def test_top_logprobs_stop_at_the_vocabulary(v5):
    """top_logprobs above a vocabulary of 5 gives its 5 tokens, no padding."""
    g = specdec.generate(v5[0], PROMPT, max_new_tokens=3, top_logprobs=7, stop_tokens=[])
    assert all(sorted(t for t, _ in r) == list(range(5)) for r in g.top_logprobs)


@pytest.mark.parametrize("kind", ["eagle", "eagle3"])
def test_eagle_heads_keep_the_penalised_output(tmp_path, kind):
    """An EAGLE head's trees (drafted from the target's features) under penalties and logprobs:
    plain decoding's tokens and numbers. A random head's drafts are almost never accepted, so
    this checks the head's path through the step (features, root rows); the rows' path counting
    is the other drafters' tests'."""
    from test_eagle import TARGET, make_target, write_head

    m, _ = make_target(tmp_path / "t")
    head, _, _ = write_head(tmp_path / kind, kind, "safetensors")
    spec = specdec.Eagle(head, depth=3, branching=2, nodes=5)
    for seed in (1, 2):
        p = tm.random_tokens(TARGET.vocab, 9, seed=seed)
        kw = dict(max_new_tokens=40, stop_tokens=[], logprobs=True, logit_bias={2: 1.0}, **PEN)
        want = specdec.generate(m, p, **kw)
        got = specdec.generate(m, p, speculator=spec, **kw)
        assert got.tokens == want.tokens and got.logprobs == want.logprobs
        assert got.stats.drafted > 0
