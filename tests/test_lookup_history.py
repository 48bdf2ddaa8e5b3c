"""Prompt lookup with a history (PromptLookup(history=h), spec/lookup_history.c): where the text
itself has no match of two or more tokens, the drafter proposes what followed the text's last 4,
3 or 2 tokens in its earlier requests' outputs. The store is held against a plain Python
statement of it (the latest occurrence wins, a draft ends with the request it came from, tokens
pushed out of the ring are forgotten); the drafts are verified like any other, so greedy output
is plain decoding's and sampled output is distributed as the target's (chi-square over 100,000
seeded runs, each run's drafts drawn from the runs before it)."""

from __future__ import annotations

import numpy as np
import pytest

import specdec
import tinymodels as tm
from specdec import _core, testing
from helpers import SETTINGS, assert_joint_matches, exact_joint, make_v5

CFG = tm.TinyConfig(arch="llama", vocab=40, dim=32, n_layers=2, n_heads=4, n_kv_heads=2,
                    ffn=64, context_length=400)
CHEAP = [1 + (T - 1) / 8 for T in range(1, 66)]  # given verify costs: the same trees anywhere


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("lh") / "m.gguf")
    testing.write_gguf(path, CFG, tm.make_weights(CFG, 21))
    return specdec.load(path, threads=2)


def reference_drafts(cap, outputs, query, k):
    """The history in Python: the last `cap` tokens of the outputs with an end mark after each;
    for n = 4, 3, 2 the latest occurrence of the query's last n tokens whose n-gram is still
    whole in the window, and up to k tokens after it, up to the next end mark."""
    ring: list = []
    for out in outputs:
        ring += list(out[-(cap - 1):]) + [-1]
    first = max(0, len(ring) - cap + 1)  # n-grams starting here or later are held
    for n in (4, 3, 2):
        if len(query) < n:
            continue
        tail = list(query[-n:])
        for i in range(len(ring) - n - 1, first - 1, -1):
            if ring[i:i + n] == tail:
                draft = []
                for t in ring[i + n:]:
                    if t < 0 or len(draft) == k:
                        break
                    draft.append(t)
                if draft:
                    return draft, n
    return [], 0


def test_store_matches_its_python_statement():
    """Random outputs over a vocabulary of 3 (every n-gram recurs, so later occurrences must
    win; 117 n-grams of 2 to 4 tokens, too few to fill a probe run of the table), a ring far
    smaller than their total (old tokens forgotten): every query's draft as stated."""
    rng = np.random.default_rng(5)
    for cap, n_out in ((64, 6), (256, 30), (1024, 12)):
        outputs = [rng.integers(0, 3, int(rng.integers(1, 90))).tolist() for _ in range(n_out)]
        queries = [rng.integers(0, 3, int(rng.integers(1, 7))).tolist() for _ in range(300)]
        got = _core.lookup_history_drafts(cap, outputs, queries, 7)
        for q, g in zip(queries, got):
            assert tuple(g) == tuple(reference_drafts(cap, outputs, q, 7)), (cap, q)


@pytest.mark.parametrize("vocab", [6, 50, 5000])
def test_store_drafts_are_true_continuations(vocab):
    """Over larger vocabularies the table is a cache (a probe run full of other n-grams still in
    the history loses the one seen longest ago): every draft is still what followed an
    occurrence of the query's last n tokens in the window, and nearly every query the statement
    answers gets the statement's draft."""
    rng = np.random.default_rng(vocab)
    cap = 1024
    outputs = [rng.integers(0, vocab, int(rng.integers(1, 200))).tolist() for _ in range(40)]
    ring: list = []
    for out in outputs:
        ring += list(out) + [-1]
    window = ring[-(cap - 1):]
    # queries: n-grams from the window (most found) and random ones
    queries = []
    for _ in range(400):
        i = int(rng.integers(0, len(window) - 4))
        queries.append(window[i:i + int(rng.integers(1, 5))] if -1 not in window[i:i + 4]
                       else rng.integers(0, vocab, 3).tolist())
    got = _core.lookup_history_drafts(cap, outputs, queries, 7)
    same = answered = 0
    for q, (draft, n) in zip(queries, got):
        want = reference_drafts(cap, outputs, q, 7)
        answered += bool(want[0])
        same += bool(want[0]) and (draft, n) == want
        if draft:
            tail = list(q[-n:])
            assert any(window[i:i + n] == tail and window[i + n:i + n + len(draft)] == draft and
                       (len(draft) == 7 or window[i + n + len(draft)] == -1)
                       for i in range(len(window) - n)), (q, draft)
    assert answered > 100 and same >= 0.97 * answered, (same, answered)


def test_store_edges():
    # a draft stops at the end of the output it came from
    assert _core.lookup_history_drafts(64, [[1, 2, 3, 4], [9, 9]], [[2, 3]], 8) == [([4], 2)]
    # the longest n-gram first, then the latest occurrence
    assert _core.lookup_history_drafts(64, [[5, 1, 2, 7], [1, 2, 8]], [[5, 1, 2]], 8) == \
        [([7], 3)]
    assert _core.lookup_history_drafts(64, [[5, 1, 2, 7], [1, 2, 8]], [[6, 1, 2]], 8) == \
        [([8], 2)]
    # one token is no match; an n-gram at an output's end has nothing after it
    assert _core.lookup_history_drafts(64, [[1, 2, 3]], [[2], [2, 3], [1]], 8) == \
        [([], 0), ([], 0), ([], 0)]
    # an output longer than the ring keeps its last tokens
    long = list(range(100, 300))
    got = _core.lookup_history_drafts(64, [long], [[150, 151], [280, 281]], 4)
    assert got == [([], 0), ([282, 283, 284, 285], 2)]
    with pytest.raises(ValueError, match=r"history must be in \[1, 16777216\] tokens, got 0"):
        _core.lookup_history_drafts(0, [], [], 4)


def prompts(n):
    return [tm.random_tokens(CFG.vocab, 10, 100 + i) for i in range(n)]


@pytest.mark.parametrize("kw", [dict(), dict(branching=3, size_by_cost=True),
                                dict(min_ngram=2, verify_slope=0.0)],
                         ids=["chain", "tree", "whole"])
def test_greedy_equals_plain(model, kw):
    """Requests one after another on one speculator, each drafted from the outputs before it: all
    equal to plain greedy decoding; asked again, the same prompts take more drafts than on a
    speculator without a history."""
    spec = specdec.PromptLookup(history=4096, **kw)
    bare = specdec.PromptLookup(**kw)
    for s in (spec, bare):
        if kw.get("size_by_cost"):
            s.set_verify_costs(CHEAP)
    accepted = two_rounds(model, spec, bare)
    assert accepted["spec"] > accepted["bare"] + 40, accepted


def two_rounds(model, spec, bare) -> dict:
    """The same four prompts twice on spec (with a history) and bare (without): every output
    plain decoding's; the drafts accepted in the second round, by speculator."""
    accepted = {"spec": 0, "bare": 0}
    for rnd in range(2):
        for p in prompts(4):
            plain = specdec.generate(model, p, max_new_tokens=40, stop_tokens=[])
            for name, s in (("spec", spec), ("bare", bare)):
                g = specdec.generate(model, p, max_new_tokens=40, stop_tokens=[], speculator=s)
                assert g.tokens == plain.tokens, (rnd, name)
                assert g.stats.accepted + g.stats.steps == g.stats.new_tokens
                if rnd == 1:
                    accepted[name] += g.stats.accepted
    return accepted


@pytest.mark.parametrize("name", ["T1", "T0.7-topk3", "top_p0.9", "min_p0.1"])
def test_sampled_output_is_distributed_as_the_target(tmp_path, name):
    """The prompt repeats no token, so the first step's draft comes from the history (the
    outputs of the runs before: 3 tokens each over a vocabulary of 5, so their 2-grams recur),
    and so does every later one the text matches by one token only."""
    m, _, w, _, row = make_v5(tmp_path)
    setting = SETTINGS[name]
    prompt = [1, 2, 3, 4]
    assert_joint_matches(m, specdec.PromptLookup(k=2, history=256), setting,
                         exact_joint(row, w, setting, prompt), N=100_000, prompt=prompt)
    T, top_k, top_p, min_p = setting
    drafted = [_core.joint_counts(m._core, s.drafter(), prompt, 2_000, T, top_k, top_p,
                                  min_p)[1]
               for s in (specdec.PromptLookup(k=2, history=256), specdec.PromptLookup(k=2))]
    assert drafted[0] > 1.2 * drafted[1]  # the history drafted where the text could not


@pytest.mark.parametrize("kw,error,match", [
    (dict(history=-1), ValueError, r"history must be in \[0, 16777216\] tokens, got -1"),
    (dict(history=(1 << 24) + 1), ValueError, r"history must be in \[0, 16777216\] tokens"),
    (dict(history=1 << 40), ValueError, r"history must be in \[0, 16777216\] tokens"),
    (dict(history=1.5), TypeError, "history"), (dict(history=True), TypeError, "history"),
])
def test_bad_arguments(kw, error, match):
    with pytest.raises(error, match=match):
        specdec.PromptLookup(**kw)


def test_concurrent_requests_share_it(model):
    """Threads generating at once on one speculator (the history under its lock): every output
    is plain decoding's."""
    import threading

    spec = specdec.PromptLookup(history=128)
    ps = prompts(6)
    want = [specdec.generate(model, p, max_new_tokens=30, stop_tokens=[]).tokens for p in ps]
    got: dict = {}

    def run(i):
        for _ in range(3):
            got[i] = specdec.generate(model, ps[i], max_new_tokens=30, stop_tokens=[],
                                      speculator=spec).tokens

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(ps))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [got[i] for i in range(len(ps))] == want


# ---- the history beside Token Recycling's table and an EAGLE head ----------------------------

def test_recycling_greedy_equals_plain_and_drafts_from_it(model):
    """TokenRecycling(lookup=8, history=h): the lookup branch comes from the history where the
    text has no match of two or more tokens; two rounds of requests, all plain decoding's, and
    the second round accepts more than without the history."""
    spec = specdec.TokenRecycling(lookup=8, history=4096, adaptive=False)
    bare = specdec.TokenRecycling(lookup=8, adaptive=False)
    accepted = two_rounds(model, spec, bare)
    assert accepted["spec"] > accepted["bare"], accepted


@pytest.mark.parametrize("name", ["T1", "T0.7-topk3"])
def test_recycling_sampled_output_is_distributed_as_the_target(tmp_path, name):
    m, _, w, _, row = make_v5(tmp_path)
    setting = SETTINGS[name]
    prompt = [1, 2, 3, 4]
    spec = specdec.TokenRecycling(nodes=6, widths=(2, 2), top=3, lookup=2, history=256,
                                  adaptive=False)
    assert_joint_matches(m, spec, setting, exact_joint(row, w, setting, prompt), N=100_000,
                         prompt=prompt)
    T, top_k, top_p, min_p = setting
    bare = specdec.TokenRecycling(nodes=6, widths=(2, 2), top=3, lookup=2, adaptive=False)
    drafted = [_core.joint_counts(m._core, s.drafter(), prompt, 2_000, T, top_k, top_p,
                                  min_p)[1] for s in (spec, bare)]
    assert drafted[0] != drafted[1]  # the history's drafts took the place of lookup's


def test_eagle_greedy_equals_plain_with_it(tmp_path):
    """Eagle(lookup=6, history=h) over two rounds of requests: plain decoding's output."""
    from test_eagle import make_target, write_head, TARGET

    m, _ = make_target(tmp_path / "t")
    d, _, _ = write_head(tmp_path / "h", "eagle3", "safetensors")
    spec = specdec.Eagle(d, depth=1, lookup=6, history=4096)
    bare = specdec.Eagle(d, depth=1, lookup=6)
    for s in (spec, bare):
        s.set_verify_costs([1.0, 1.02, 1.05, 1.1, 1.15, 1.2, 1.3])
    assert "history=4096" in repr(spec)
    steps = {"spec": 0, "bare": 0}
    for rnd in range(2):
        for seed in (1, 2, 3):
            prompt = tm.random_tokens(TARGET.vocab, 9, seed=seed)
            plain = specdec.generate(m, prompt, max_new_tokens=40, stop_tokens=[])
            for name, s in (("spec", spec), ("bare", bare)):
                got = specdec.generate(m, prompt, max_new_tokens=40, stop_tokens=[],
                                       speculator=s)
                assert got.tokens == plain.tokens, (rnd, seed, name)
                if rnd == 1:
                    steps[name] += got.stats.steps
    assert steps["spec"] < steps["bare"], steps  # the history's drafts took steps off


@pytest.mark.parametrize("make", [lambda h: specdec.TokenRecycling(lookup=4, history=h),
                                  lambda h: specdec.PromptLookup(history=h)],
                         ids=["recycling", "lookup"])
def test_bad_history_elsewhere(make):
    with pytest.raises(ValueError, match=r"history must be in \[0, 16777216\] tokens, got -2"):
        make(-2)
    with pytest.raises(TypeError, match="history"):
        make(2.5)
    d = specdec.PromptLookup().drafter()
    with pytest.raises(ValueError, match=r"history must be in \[0, 16777216\] tokens, got -1"):
        _core.drafter_set_history(d, -1)
    _core.drafter_set_history(d, 100)
    _core.drafter_set_history(d, 0)  # dropped again
