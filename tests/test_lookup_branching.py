"""Prompt lookup with sibling branches (PromptLookup(branching=b)): the continuations of other
earlier occurrences, starting with other tokens, drafted as a tree and verified in one forward.
Greedy output equals plain decoding; the caches equal a fresh forward after every step; sampled
output is distributed as the target's (chi-square of the first three tokens); branching=1 is
the chain, token for token."""

from __future__ import annotations

import numpy as np
import pytest

import specdec
import tinymodels as tm
from helpers import SETTINGS, assert_joint_matches, exact_joint, make_v5
from specdec import _core, testing

CFG = tm.TinyConfig(arch="llama", vocab=24, dim=32, n_layers=2, n_heads=4, n_kv_heads=2,
                    ffn=64, context_length=600)
# the last token, 1, occurred three times before, followed by 2, 3 and 4: three branches
BRANCHY = [1, 2, 1, 3, 1, 4, 1]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("lb") / "m.gguf")
    testing.write_gguf(path, CFG, tm.make_weights(CFG, 6))
    return specdec.load(path, threads=2)


def prompts():
    return [BRANCHY * 3, tm.random_tokens(CFG.vocab, 6, 1) * 5,
            [(i * i) % 7 for i in range(40)]]


@pytest.mark.parametrize("b,k", [(2, 4), (3, 3), (8, 8)])
def test_greedy_equals_plain_and_trees_are_drafted(model, b, k):
    trees = 0
    for prompt in prompts():
        plain = specdec.generate(model, prompt, max_new_tokens=40, stop_tokens=[])
        spec = specdec.PromptLookup(k=k, branching=b, verify_slope=0, size_by_cost=False)
        got = specdec.generate(model, prompt, max_new_tokens=40, stop_tokens=[], speculator=spec)
        assert got.tokens == plain.tokens
        chain = specdec.generate(model, prompt, max_new_tokens=40, stop_tokens=[],
                                 speculator=specdec.PromptLookup(k=k, verify_slope=0))
        trees += got.stats.drafted > chain.stats.drafted
    assert trees > 0  # sibling branches were proposed


def test_branching_one_is_the_chain(model):
    for prompt in prompts():
        for t in (0.0, 1.0):
            a = specdec.generate(model, prompt, max_new_tokens=30, stop_tokens=[], seed=3,
                                 temperature=t, speculator=specdec.PromptLookup(k=5))
            b = specdec.generate(model, prompt, max_new_tokens=30, stop_tokens=[], seed=3,
                                 temperature=t,
                                 speculator=specdec.PromptLookup(k=5, branching=1))
            assert a.tokens == b.tokens and a.stats.drafted == b.stats.drafted


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_caches_equal_fresh_forward_after_every_step(model, temperature):
    d = _core.prompt_lookup(4, 3, 1, 0.0, 3)
    for prompt in (BRANCHY * 3, (BRANCHY * 80)[:520]):  # the second crosses 512 slots
        tokens, reason, stats = model._core.generate(
            prompt, max_new_tokens=50, temperature=temperature, seed=2, stop_ids=[],
            drafter=d, check_cache=True)
        assert len(tokens) == 50 and stats["drafted"] > 0


@pytest.mark.parametrize("name", ["T1", "T0.7-topk3"])
def test_sampled_output_is_distributed_as_the_target(tmp_path, name):
    m, _, w, _, row = make_v5(tmp_path)
    setting = SETTINGS[name]
    spec = specdec.PromptLookup(k=2, branching=3, verify_slope=0, size_by_cost=False)
    assert_joint_matches(m, spec, setting, exact_joint(row, w, setting, BRANCHY), N=40_000,
                         prompt=BRANCHY)


@pytest.mark.parametrize("kw,match", [
    (dict(branching=0), r"branching must be in \[1, 8\], got 0"),
    (dict(branching=9), r"branching must be in \[1, 8\], got 9"),
    (dict(k=16, branching=5), r"k \* branching must be <= 64 \(the nodes of a tree\), got 16 \* 5"),
])
def test_bad_branching(kw, match):
    with pytest.raises(ValueError, match=match):
        specdec.PromptLookup(**kw)
    with pytest.raises(TypeError, match="branching"):
        specdec.PromptLookup(branching=2.0)


@pytest.mark.parametrize("make", [lambda: specdec.PromptLookup(k=4, verify_slope=0),
                                  lambda: specdec.PromptLookup(k=4, branching=3, verify_slope=0,
                                                                size_by_cost=False),
                                  lambda: specdec.TokenRecycling(nodes=10, adaptive=False)],
                         ids=["chain", "lookup-tree", "recycling"])
def test_stats_count_steps_by_tree_size_and_accepted_path(model, make):
    """Generation.stats' per-step counts: steps by the nodes drafted and by the drafts accepted
    add up to the steps, the drafts and the accepted drafts."""
    g = specdec.generate(model, BRANCHY * 3, max_new_tokens=60, stop_tokens=[],
                         speculator=make())
    st = g.stats
    assert sum(st.steps_by_nodes.values()) == st.steps
    assert sum(n * c for n, c in st.steps_by_nodes.items()) == st.drafted
    assert sum(st.steps_by_accepted.values()) == st.steps
    assert sum(a * c for a, c in st.steps_by_accepted.items()) == st.accepted
    assert st.accepted > 0 and max(st.steps_by_nodes) >= 2


# verify costs by tokens in the batch (1, 2, ...): every node pays; no node pays; some do
FLAT = [1.0] * 65
STEEP = [float(t) for t in range(1, 66)]
MIXED = [1.0, 1.05, 1.15, 1.3, 1.5, 1.75, 2.0, 2.3, 2.6, 2.9, 3.2, 3.5, 3.8, 4.1, 4.4, 4.7, 5.0]


def run(model, prompt, spec):
    return specdec.generate(model, prompt, max_new_tokens=40, stop_tokens=[], speculator=spec)


def whole_tree(k, b):
    return specdec.PromptLookup(k=k, branching=b, verify_slope=0, size_by_cost=False)


def sized(k, b, costs=None):
    spec = specdec.PromptLookup(k=k, branching=b, verify_slope=0, size_by_cost=True)
    if costs is not None:
        spec.set_verify_costs(costs)
    return spec


@pytest.mark.parametrize("b,k", [(1, 4), (3, 3), (8, 2), (3, 16)])
@pytest.mark.parametrize("costs", [FLAT, STEEP, MIXED, None], ids=["flat", "steep", "mixed",
                                                                    "measured"])
def test_trees_sized_by_cost_keep_greedy_output(model, b, k, costs):
    # (3, 16): the drafter has room for 48 nodes, a branch for 16 (k)
    for prompt in prompts() + [(BRANCHY * 12)[:80]]:
        plain = specdec.generate(model, prompt, max_new_tokens=40, stop_tokens=[])
        got = specdec.generate(model, prompt, max_new_tokens=40, stop_tokens=[],
                               speculator=sized(k, b, costs))
        assert got.tokens == plain.tokens


def test_trees_sized_by_cost_follow_the_costs(model):
    """Where a verify batch costs what one token does, every candidate pays: the sized tree is
    the whole tree, step for step. Where it costs as many tokens as it holds, none does: one
    draft every fourth step (to keep measuring), no more. Between, the tree is smaller than the
    whole tree and larger than nothing, and its sibling branches come and go."""
    for prompt in prompts():
        whole = run(model, prompt, whole_tree(3, 3))
        flat = run(model, prompt, sized(3, 3, FLAT))
        assert flat.stats.steps_by_nodes == whole.stats.steps_by_nodes
        steep = run(model, prompt, sized(3, 3, STEEP))
        assert set(steep.stats.steps_by_nodes) <= {0, 1}
        assert 0 < steep.stats.drafted <= (steep.stats.steps + 3) // 4
    mixed = run(model, BRANCHY * 3, sized(3, 3, MIXED))
    whole = run(model, BRANCHY * 3, whole_tree(3, 3))
    sizes = mixed.stats.steps_by_nodes
    assert len([n for n in sizes if n > 0]) >= 2  # sizes change within the run
    assert mixed.stats.drafted < whole.stats.drafted and mixed.stats.accepted > 0


def test_a_sized_chain_drafts_by_the_costs(model):
    """branching=1 with size_by_cost: flat costs draft all k every step (as verify_slope=0);
    steep ones one draft every fourth step."""
    prompt = BRANCHY * 3
    every = run(model, prompt, specdec.PromptLookup(k=4, verify_slope=0))
    flat = run(model, prompt, sized(4, 1, FLAT))
    assert flat.stats.steps_by_nodes == every.stats.steps_by_nodes
    steep = run(model, prompt, sized(4, 1, STEEP))
    assert set(steep.stats.steps_by_nodes) <= {0, 1}


def test_trees_are_sized_by_cost_by_default():
    assert specdec.PromptLookup(branching=1).size_by_cost is None
    assert _core.drafter_costs(specdec.PromptLookup(k=4, branching=3).drafter()) == []
    with pytest.raises(TypeError, match="size_by_cost must be a bool"):
        specdec.PromptLookup(k=4, branching=3, size_by_cost=1)


def test_the_measured_costs_are_kept(model):
    spec = specdec.PromptLookup(k=4, branching=3)
    specdec.generate(model, BRANCHY, max_new_tokens=4, stop_tokens=[], speculator=spec)
    costs = spec.verify_costs
    assert len(costs) == 13 and costs[0] == 1.0
    assert all(b >= a for a, b in zip(costs, costs[1:]))
    plain = specdec.PromptLookup(k=4)
    specdec.generate(model, BRANCHY, max_new_tokens=4, stop_tokens=[], speculator=plain)
    assert plain.verify_costs == []  # a chain with its verify_slope measures nothing


def test_the_model_keeps_the_measured_costs_for_later_speculators(tmp_path):
    """A speculator made for each call (the inline speculator=PromptLookup(...)) reads the
    curve the model kept from the first measurement instead of measuring for about a second
    again: the same floats, where a second measurement's timings would differ. Another thread
    count or cache type measures anew; a smaller ask is served by a larger measurement."""
    path = str(tmp_path / "m.gguf")
    testing.write_gguf(path, CFG, tm.make_weights(CFG, 6))
    m = specdec.load(path, threads=2)

    def measured(**kw):
        spec = specdec.PromptLookup(**kw)
        specdec.generate(m, BRANCHY, max_new_tokens=2, stop_tokens=[], speculator=spec)
        return spec.verify_costs, spec.verify_costs_after(2000)

    first = measured(k=4, branching=3)
    assert len(first[0]) == 13
    assert measured(k=4, branching=3) == first
    assert measured(k=2, branching=3)[0] == first[0][:7]  # 7 of the 13 measured
    bigger = measured(k=8, branching=3)  # 25 tokens: more than measured, so measured again
    assert len(bigger[0]) == 25 and bigger[0][:13] != first[0]
    assert measured(k=4, branching=3)[0] == bigger[0][:13]
    m.threads = 1
    one = measured(k=4, branching=3)
    assert one[0] != bigger[0][:13]
    m.kv_dtype = "f32"
    assert measured(k=4, branching=3)[0] != one[0]


def test_warm_up_measures_the_costs_before_a_request(tmp_path, monkeypatch):
    """warm_up serves one short request, so the curve is measured (and kept by the model)
    before any user's request: the next speculator's first request reads the same floats.
    specdec serve warms its speculator up before it listens."""
    path = str(tmp_path / "m.gguf")
    testing.write_gguf(path, CFG, tm.make_weights(CFG, 6))
    m = specdec.load(path, threads=2)
    spec = specdec.PromptLookup(k=4, branching=3)
    assert spec.verify_costs == []
    assert spec.warm_up(m) > 0.0
    costs = spec.verify_costs
    assert len(costs) == 13 and costs[0] == 1.0
    later = specdec.PromptLookup(k=4, branching=3)
    specdec.generate(m, BRANCHY, max_new_tokens=2, stop_tokens=[], speculator=later)
    assert later.verify_costs == costs
    with pytest.raises(ValueError, match="tokens must be >= 1"):
        spec.warm_up(m, tokens=0)
    with pytest.raises(TypeError, match="tokens"):
        spec.warm_up(m, tokens=2.5)

    uvicorn = pytest.importorskip("uvicorn", reason="the serve extra is not installed")
    from specdec import serve

    served = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: served.append(app))
    monkeypatch.setattr(serve, "create_app", lambda model, spec, name: (model, spec))
    third = specdec.PromptLookup(k=4, branching=3)
    m2 = specdec.load(path, threads=2)
    serve.serve(m2, third)
    assert served == [(m2, third)] and len(third.verify_costs) == 13  # measured before serving


@pytest.mark.parametrize("name", ["T1", "T0.7-topk3"])
def test_sampled_sized_trees_are_distributed_as_the_target(tmp_path, name):
    """The tree's size is fixed from the acceptance seen in earlier steps, before the step's
    draws, so the rule stays exact while the size changes from step to step."""
    m, _, w, _, row = make_v5(tmp_path)
    setting = SETTINGS[name]
    spec = sized(2, 3, MIXED[:7])
    assert_joint_matches(m, spec, setting, exact_joint(row, w, setting, BRANCHY), N=40_000,
                         prompt=BRANCHY)


def test_costs_by_the_length_of_the_text(model):
    """The measured costs hold after the text's length (timed after several lengths, since
    attention grows with the text): after a short text they are verify_costs themselves, after
    any length they rise with the batch; given costs hold after every length."""
    spec = specdec.PromptLookup(k=4, branching=3)
    specdec.generate(model, BRANCHY, max_new_tokens=4, stop_tokens=[], speculator=spec)
    short = spec.verify_costs
    assert spec.verify_costs_after(0) == short == spec.verify_costs_after(64)
    for n in (100, 320, 2000):
        after = spec.verify_costs_after(n)
        assert len(after) == len(short) and after[0] == 1.0
        assert all(b >= a for a, b in zip(after, after[1:]))
    given = sized(4, 3, MIXED[:13])
    assert given.verify_costs_after(5000) == given.verify_costs == pytest.approx(MIXED[:13])
    with pytest.raises(TypeError, match="length must be an integer"):
        spec.verify_costs_after(1.5)


def test_the_cost_fit_behind_the_costs_after_a_long_text():
    """What a longer text adds to a verify forward of T tokens is fitted over all the timings
    after the longer lengths as length * (b0 + b1 (T - 1)): attention reads the cached rows once
    for the batch and computes each token against them. Exact points give the slopes back;
    noisy ones (timings on a busy machine) an estimate near them, where extrapolating from two
    single timings would carry one timing's error several times over; a fit that would make a
    slope negative keeps it at 0."""
    def points(b0, b1, noise=0.0, sizes=(1, 2, 4, 8, 13), seed=0):
        rng = np.random.default_rng(seed)
        return [(float(n), T, n * (b0 + b1 * (T - 1)) * (1 + noise * rng.standard_normal()))
                for n in (256, 960) for T in sizes]

    assert _core.cost_fit(points(7e-7, 3e-7)) == pytest.approx((7e-7, 3e-7), rel=1e-9)
    fit, two = [], []  # relative errors of the slope of 4 and of 8 tokens
    for seed in range(200):
        pts = points(7e-7, 3e-7, noise=0.1, seed=seed)
        b0, b1 = _core.cost_fit(pts)
        one, most = pts[0][2] / pts[0][0], pts[4][2] / pts[4][0]  # 1 and 13 tokens after 256
        for T in (4, 8):
            true = 7e-7 + 3e-7 * (T - 1)
            fit.append(abs(b0 + b1 * (T - 1) - true) / true)
            two.append(abs(one + (most - one) * (T - 1) / 12 - true) / true)
    assert np.median(fit) < 0.8 * np.median(two)  # two timings interpolated: the old estimate
    assert _core.cost_fit(points(7e-7, 0.0, sizes=(1,))) == pytest.approx((7e-7, 0.0))
    b0, b1 = _core.cost_fit(points(5e-6, -2e-7))  # falls with the batch: one slope for all
    assert b1 == 0.0 and b0 > 0.0
    b0, b1 = _core.cost_fit([(100.0, 1, -1e-5), (100.0, 9, 8e-5), (300.0, 5, 1e-4)])
    assert b0 == 0.0 and b1 > 0.0
    assert _core.cost_fit([]) == (0.0, 0.0)
    with pytest.raises(TypeError):
        _core.cost_fit([(1.0, 2)])
    with pytest.raises(ValueError, match="at most 64 points"):
        _core.cost_fit([(1.0, 1, 1.0)] * 65)
