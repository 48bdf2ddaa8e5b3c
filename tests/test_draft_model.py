"""Speculative decoding with a separate draft model (sd_generate_draft): at temperature 0 the
output is the plain greedy output token for token, whatever the draft and k, however the run
ends; when sampling (temperature, top-k, top-p, min-p), the first three tokens are distributed as
the target's (chi-square against exact enumeration, with a broken rule shown to fail) although
the draft's distribution differs; a draft with another vocabulary or
tokenizer is refused by name."""

from __future__ import annotations

import os

import numpy as np
import pytest

import specdec
import tinymodels as tm
from helpers import (PAIR_CFG as CFG, SETTINGS, assert_joint_matches, assert_stops_like_plain,
                     exact_joint, gguf_kv, gguf_meta, make_v5, train_bpe, twin_generate)
from specdec import testing
from stats import chi2_critical, chi2_stat, runs_for


@pytest.mark.parametrize("k", [1, 3, 8, 32])
@pytest.mark.parametrize("which", ["close", "far", "target"])
def test_greedy_identical_to_plain_decoding(pair, which, k):
    target, draft = pair["target"], specdec.DraftModel(pair[which], k=k, verify_slope=0)
    for seed in range(3):
        prompt = tm.random_tokens(CFG.vocab, 5 + 7 * seed, seed)
        plain = specdec.generate(target, prompt, max_new_tokens=40, stop_tokens=[])
        spec = specdec.generate(target, prompt, max_new_tokens=40, stop_tokens=[],
                                speculator=draft)
        assert spec.tokens == plain.tokens
        assert spec.finish_reason == "length"
        st = spec.stats
        assert 0 <= st.accepted <= st.drafted and st.accepted + st.steps == st.new_tokens == 40
        if which == "target":  # the target drafting for itself agrees with itself
            assert st.accepted == st.drafted > 0


def test_close_draft_is_accepted_more_than_far(pair):
    """The acceptance rate tracks how close the draft is: the loop really uses the draft."""
    rates = {}
    for which in ("close", "far"):
        acc = dr = 0
        for seed in range(4):
            g = specdec.generate(pair["target"], tm.random_tokens(CFG.vocab, 9, seed),
                                 max_new_tokens=30, stop_tokens=[],
                                 speculator=specdec.DraftModel(pair[which], k=4, verify_slope=0))
            acc, dr = acc + g.stats.accepted, dr + g.stats.drafted
        rates[which] = acc / dr
    assert rates["close"] > 0.5 and rates["close"] > rates["far"] + 0.2, rates


def test_stops_in_the_middle_of_a_draft(pair):
    assert_stops_like_plain(pair["target"], lambda: specdec.DraftModel(pair["close"], k=6, verify_slope=0))


def test_sampled_is_reproducible_and_self_draft_accepts_all(pair):
    target = pair["target"]
    prompt = tm.random_tokens(CFG.vocab, 6, 3)
    a, b = (specdec.generate(target, prompt, max_new_tokens=20, temperature=0.9, seed=7,
                             stop_tokens=[], speculator=specdec.DraftModel(pair["far"], k=3, verify_slope=0))
            for _ in range(2))
    assert a.tokens == b.tokens
    g = specdec.generate(target, prompt, max_new_tokens=20, temperature=1.0, seed=7,
                         stop_tokens=[], speculator=specdec.DraftModel(target, k=3, verify_slope=0))
    assert g.stats.accepted == g.stats.drafted  # p == q: min(1, p/q) = 1


@pytest.fixture(scope="module")
def v5(tmp_path_factory):
    return make_v5(tmp_path_factory.mktemp("v5"))


@pytest.mark.parametrize("name", list(SETTINGS))
def test_sampled_output_is_distributed_as_the_target(v5, name):
    """The joint distribution of the first three emitted tokens (temperature and filters as
    named), enumerated exactly from the reference forward, against seeded runs with a draft of
    other weights and k = 2, so that drafts are rejected and the residual norm(max(0, p - q))
    is sampled (chi-square at stats.ALPHA, as many runs as catch a total variation of stats.TV
    with probability stats.POWER: stats.runs_for)."""
    m, dm, w, wd, row = v5
    setting = SETTINGS[name]
    assert_joint_matches(m, specdec.DraftModel(dm, k=2, verify_slope=0), setting, exact_joint(row, w, setting))


def test_the_end_to_end_test_catches_a_broken_rule(v5):
    """Power: the same statistic, over as many runs, on a NumPy twin of the loop over the same
    rows passes with the correct rule and fails with the correction drawn from p (which
    favours the draft: about 0.2 from the target in total variation, five times stats.TV)."""
    _, _, w, wd, row = v5
    setting = SETTINGS["T1"]
    exact = exact_joint(row, w, setting)
    rng = np.random.default_rng(0)
    for broken, should_pass in ((False, True), (True, False)):
        counts = np.zeros(125)
        for _ in range(runs_for(exact)):
            a, b, c = twin_generate(row, w, wd, setting, 2, rng, broken)
            counts[a * 25 + b * 5 + c] += 1
        stat, df = chi2_stat(counts, exact)
        assert (stat < chi2_critical(df)) == should_pass, (broken, stat, chi2_critical(df))


def test_vocabulary_size_mismatch_is_refused(pair, tmp_path):
    cfg = tm.TinyConfig(arch="llama", vocab=41, dim=16, n_layers=1, n_heads=2, n_kv_heads=2,
                        ffn=32, context_length=64)
    path = str(tmp_path / "v41.gguf")
    testing.write_gguf(path, cfg, tm.make_weights(cfg, 3))
    with pytest.raises(ValueError, match=r"vocabulary \(41 tokens\) differs"):
        specdec.generate(pair["target"], [1, 2, 3], max_new_tokens=4,
                         speculator=specdec.DraftModel(specdec.load(path)))


def test_different_tokenizer_is_refused(tmp_path):
    meta = gguf_meta(train_bpe())
    V = len(meta["tokenizer.ggml.tokens"])
    cfg = tm.TinyConfig(arch="llama", vocab=V, dim=16, n_layers=1, n_heads=2, n_kv_heads=1,
                        ffn=32, context_length=64)
    testing.write_gguf(str(tmp_path / "a.gguf"), cfg, tm.make_weights(cfg, 1),
                       extra_kv=gguf_kv(meta))
    swapped = dict(meta)
    toks = list(meta["tokenizer.ggml.tokens"])
    toks[-1], toks[-2] = toks[-2], toks[-1]
    swapped["tokenizer.ggml.tokens"] = toks
    testing.write_gguf(str(tmp_path / "b.gguf"), cfg, tm.make_weights(cfg, 2),
                       extra_kv=gguf_kv(swapped))
    a, b = specdec.load(str(tmp_path / "a.gguf")), specdec.load(str(tmp_path / "b.gguf"))
    with pytest.raises(ValueError, match=f"different tokenizers: token {V - 2}"):
        specdec.generate(a, "hello", max_new_tokens=4, speculator=specdec.DraftModel(b))
    # the same tokenizer in another file is fine
    testing.write_gguf(str(tmp_path / "c.gguf"), cfg, tm.make_weights(cfg, 3),
                       extra_kv=gguf_kv(meta))
    c = specdec.load(str(tmp_path / "c.gguf"))
    g = specdec.generate(a, "hello", max_new_tokens=4, speculator=specdec.DraftModel(c))
    assert g.tokens == specdec.generate(a, "hello", max_new_tokens=4).tokens


def test_draft_context_overflow_names_the_draft(pair):
    """The draft's context (64) is shorter than the target's (96)."""
    with pytest.raises(ValueError, match="context length 64 of the draft model"):
        specdec.generate(pair["target"], tm.random_tokens(CFG.vocab, 50, 1), max_new_tokens=20,
                         speculator=specdec.DraftModel(pair["far"]))


@pytest.mark.parametrize("args,exc,match", [((None,), TypeError, "specdec.Model"),
                                            (("x.gguf",), TypeError, "specdec.Model"),
                                            ((0,), TypeError, "specdec.Model")])
def test_bad_draft_model_arguments(args, exc, match):
    with pytest.raises(exc, match=match):
        specdec.DraftModel(*args)


@pytest.mark.parametrize("k,error", [(0, ValueError), (33, ValueError), (2.5, TypeError)])
def test_bad_k(pair, k, error):
    with pytest.raises(error, match="k must"):
        specdec.DraftModel(pair["far"], k=k, verify_slope=0)


def test_smollm2_drafting_for_itself_is_greedy_identical(smollm2_path):
    m = specdec.load(smollm2_path)
    msgs = [{"role": "user", "content": "Name three colours."}]
    plain = specdec.generate(m, msgs, max_new_tokens=24)
    spec = specdec.generate(m, msgs, max_new_tokens=24, speculator=specdec.DraftModel(m, k=4, verify_slope=0))
    assert spec.tokens == plain.tokens and spec.text == plain.text
    assert spec.stats.accepted == spec.stats.drafted


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_p_min_shortens_drafts_and_keeps_the_output(pair, temperature):
    """p_min = 1 stops every step after one draft (no draft is that sure); p_min = 0.3 drafts
    between 1 and k on average; at temperature 0 the output is the plain output whatever
    p_min (when sampling, drafts consume different random draws, so only the stats are
    checked; the distribution tests cover the rule)."""
    target, prompt = pair["target"], tm.random_tokens(CFG.vocab, 9, 4)
    plain = specdec.generate(target, prompt, max_new_tokens=30, stop_tokens=[],
                             temperature=temperature, seed=1)
    drafted = {}
    for p_min in (0.0, 0.3, 1.0):
        g = specdec.generate(target, prompt, max_new_tokens=30, stop_tokens=[],
                             temperature=temperature, seed=1,
                             speculator=specdec.DraftModel(pair["close"], k=5, p_min=p_min,
                                                           verify_slope=0.0))
        if temperature == 0.0:
            assert g.tokens == plain.tokens
        st = g.stats
        assert st.accepted + st.steps == st.new_tokens == 30
        drafted[p_min] = st.drafted / st.steps
    assert drafted[1.0] <= 1.0 < drafted[0.3] < drafted[0.0]


@pytest.mark.parametrize("p_min,error", [(-0.1, ValueError), (1.5, ValueError),
                                          ("0.5", TypeError), (True, TypeError)])
def test_bad_p_min(pair, p_min, error):
    with pytest.raises(error, match="p_min"):
        specdec.DraftModel(pair["far"], p_min=p_min)
    with pytest.raises(error, match="p_min"):
        specdec.LayerSkip(1, p_min=p_min)


def test_sampled_output_with_p_min_is_distributed_as_the_target(v5):
    """Stopping a draft early on the draft's own confidence keeps the output distribution."""
    m, dm, w, wd, row = v5
    setting = SETTINGS["T1"]
    assert_joint_matches(m, specdec.DraftModel(dm, k=3, p_min=0.4, verify_slope=0), setting,
                         exact_joint(row, w, setting))


def _deepened(tmp_path_factory, n_layers):
    """pair["target"] deepened to n_layers whose layers past the second add nothing (zero
    output projections): it computes exactly what the 2-layer target computes."""
    w = tm.make_weights(CFG, 21)  # the weights of pair["target"]
    cfg = tm.TinyConfig(**{**CFG.__dict__, "n_layers": n_layers})
    wd = tm.make_weights(cfg, 5)
    for name in wd:
        if name in w:
            wd[name] = w[name]
        elif name.endswith(("o_proj.weight", "down_proj.weight")):
            wd[name] = np.zeros_like(wd[name])
    path = os.path.join(tmp_path_factory.mktemp("deep"), f"deep{n_layers}.gguf")
    testing.write_gguf(path, cfg, wd)
    return specdec.load(path)


@pytest.fixture(scope="module")
def deep_target(tmp_path_factory):
    """A 6-layer target computing what the 2-layer `pair["target"]` does (_deepened), at three
    times the weights, so that model is a cheap draft that is always right at temperature 0."""
    return _deepened(tmp_path_factory, 6)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_adaptive_length_drafts_what_pays(pair, deep_target, temperature):
    """verify_slope > 0: a draft that is cheap and always right keeps drafting; a draft of the
    target's own size never pays (each drafted token costs a target forward, even when all are
    accepted), so drafting nearly stops (one token every fourth step to keep measuring); the
    output stays the plain output at temperature 0."""
    prompt = tm.random_tokens(CFG.vocab, 9, 4)

    def per_step(target, draft):
        plain = specdec.generate(target, prompt, max_new_tokens=40, stop_tokens=[],
                                 temperature=temperature, seed=2)
        g = specdec.generate(target, prompt, max_new_tokens=40, stop_tokens=[],
                             temperature=temperature, seed=2, speculator=draft)
        if temperature == 0.0:
            assert g.tokens == plain.tokens
        st = g.stats
        assert st.accepted + st.steps == st.new_tokens == 40
        return st.drafted / st.steps

    ds = lambda m: specdec.DraftModel(m, k=4, verify_slope=0.1)  # noqa: E731
    if temperature == 0.0:
        assert per_step(deep_target, ds(pair["target"])) > 2.0
    assert per_step(pair["target"], ds(pair["target"])) <= 0.5
    assert per_step(deep_target, specdec.LayerSkip(2, k=4, verify_slope=0.1)) > (
        2.0 if temperature == 0.0 else 0.0)


def test_sampled_trees_sized_by_cost_pay_for_their_drafting(pair, deep_target, tmp_path_factory):
    """When sampling, a tree sized by cost counts what drafting it costs beside its verify:
    the 6-layer deep_target drafting for the 2-layer pair["target"] is always right (it
    computes the same distribution, so every draft is accepted) but each of its forwards costs
    about three of the target's, so no tree pays. After the first steps (which measure the
    drafting) it drafts one node every fourth step, to keep measuring; without counting the
    drafting it drafted a whole chain every step (every depth is always reached). Where the
    drafting pays, it goes on, as deep as it may."""
    prompt = tm.random_tokens(CFG.vocab, 9, 4)
    spec = specdec.DraftModel(deep_target, k=3, branching=2, nodes=4, size_by_cost=True)
    g = specdec.generate(pair["target"], prompt, max_new_tokens=60, stop_tokens=[],
                         temperature=1.0, seed=3, speculator=spec)
    st = g.stats
    assert st.accepted + st.steps == st.new_tokens == 60
    assert st.accepted == st.drafted  # the draft is the target's distribution
    drafting = sum(n for nodes, n in st.steps_by_nodes.items() if nodes > 0)
    assert drafting <= 0.4 * st.steps, st.steps_by_nodes
    assert max(st.steps_by_nodes) <= 3
    # the other way round, a draft of a sixteenth of the target's layers and as right: drafting
    # pays and goes on (a tiny model's forwards cost mostly what does not grow with its layers,
    # so the target is 32 layers deep)
    spec = specdec.DraftModel(pair["target"], k=3, branching=2, nodes=4, size_by_cost=True)
    st = specdec.generate(_deepened(tmp_path_factory, 32), prompt, max_new_tokens=60,
                          stop_tokens=[], temperature=1.0, seed=3, speculator=spec).stats
    assert st.accepted == st.drafted
    assert st.steps_by_nodes.get(0, 0) <= 0.2 * st.steps, st.steps_by_nodes
    # and as deep as it pays: a depth not drafted yet is judged by how often paths went on past
    # the ones that were, so an always-right draft grows its chain to the full depth. With
    # given costs (no timings) the sizes are fixed: a fixed prior of 0.36 at depth 2 kept one
    # node a step for good (depth 2 was never drafted, so never measured)
    spec = specdec.DraftModel(pair["target"], k=3, branching=2, nodes=4, size_by_cost=True)
    spec.set_verify_costs([1.0, 1.3, 1.6, 1.9, 2.2])
    st = specdec.generate(_deepened(tmp_path_factory, 32), prompt, max_new_tokens=60,
                          stop_tokens=[], temperature=1.0, seed=3, speculator=spec).stats
    assert st.accepted == st.drafted
    assert st.steps_by_nodes.get(3, 0) >= 0.8 * st.steps, st.steps_by_nodes


@pytest.mark.parametrize("slope,error", [(-0.1, ValueError), (float("nan"), ValueError),
                                         ("0.5", TypeError), (True, TypeError)])
def test_bad_verify_slope(pair, slope, error):
    """Python checks the type, the C core the range; each names the parameter."""
    with pytest.raises(error, match="verify_slope"):
        specdec.DraftModel(pair["far"], verify_slope=slope)
    with pytest.raises(error, match="verify_slope"):
        specdec.LayerSkip(1, verify_slope=slope)
    with pytest.raises(error, match="verify_slope"):
        specdec.PromptLookup(verify_slope=slope)


def test_sampled_output_with_adaptive_length_is_distributed_as_the_target(v5):
    """Sizing each draft from the acceptance seen so far (a function of earlier random draws)
    keeps the output distribution: the length is fixed before the step's draws are used."""
    m, dm, w, wd, row = v5
    setting = SETTINGS["T1"]
    assert_joint_matches(m, specdec.DraftModel(dm, k=3, verify_slope=0.05), setting,
                         exact_joint(row, w, setting))
