"""Token Recycling (spec/drafters/token_recycling.c): trees drafted from the target's own
successor table, verified in one forward. At temperature 0 the output is plain greedy decoding
token for token; when sampling, the first three tokens are distributed as the target's
(chi-square over 100,000 seeded runs); the caches after every tree step hold exactly what a
fresh forward writes (the accepted path compacted into consecutive slots)."""

from __future__ import annotations

import pytest

import specdec
import tinymodels as tm
from specdec import _core, testing
from helpers import SETTINGS, assert_joint_matches, exact_joint, make_v5

CFG = tm.TinyConfig(arch="llama", vocab=40, dim=32, n_layers=2, n_heads=4, n_kv_heads=2,
                    ffn=64, context_length=700)


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def model(request, tmp_path_factory):
    cfg = CFG.replace(arch=request.param)
    path = str(tmp_path_factory.mktemp("tr") / "m.gguf")
    testing.write_gguf(path, cfg, tm.make_weights(cfg, 8))
    return specdec.load(path, threads=2)


TREES = [dict(nodes=1, widths=(1,)), dict(nodes=6, widths=(2, 2)),
         dict(nodes=16, widths=(4, 2, 2, 1, 1, 1)), dict(nodes=64, widths=(8, 4, 2, 1, 1, 1, 1, 1)),
         dict(nodes=40, widths=(3,) * 8, top=3)]


# verify costs for adaptive trees: T tokens cost 1 + (T - 1) / 8 of one, so trees are cut to
# the nodes that pay (given, not measured: the same sizes on every machine)
CHEAP = [1 + (T - 1) / 8 for T in range(1, 66)]


def recycling(adaptive=False, **tree):
    spec = specdec.TokenRecycling(adaptive=adaptive, **tree)
    if adaptive:
        spec.set_verify_costs(CHEAP)
    return spec


@pytest.mark.parametrize("adaptive", [False, True], ids=["whole", "adaptive"])
@pytest.mark.parametrize("tree", TREES, ids=[str(t["nodes"]) for t in TREES])
def test_greedy_equals_plain(model, tree, adaptive):
    """Several requests on one speculator (its table learns from each), all equal to plain."""
    spec = recycling(adaptive, **tree)
    steps = 0
    for seed in range(3):
        prompt = tm.random_tokens(CFG.vocab, 12, seed) * 3
        plain = specdec.generate(model, prompt, max_new_tokens=50, stop_tokens=[])
        got = specdec.generate(model, prompt, max_new_tokens=50, stop_tokens=[], speculator=spec)
        assert got.tokens == plain.tokens, (tree, seed)
        steps += got.stats.steps
        assert got.stats.accepted + got.stats.steps == got.stats.new_tokens
    assert steps < 150  # drafts were accepted


def test_trees_are_drafted_and_paths_accepted(model):
    spec = recycling(nodes=16, widths=(4, 2, 2, 1, 1, 1))
    prompt = tm.random_tokens(CFG.vocab, 10, 5) * 4
    specdec.generate(model, prompt, max_new_tokens=40, stop_tokens=[], speculator=spec)
    g = specdec.generate(model, prompt, max_new_tokens=40, stop_tokens=[], speculator=spec)
    st = g.stats
    assert st.drafted > st.steps * 4  # trees of several nodes
    assert st.accepted > 0 and st.mean_accepted_tokens > 1.2


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_caches_equal_fresh_forward_after_every_step(model, temperature):
    """check_cache after every step: the accepted path's keys and values moved into consecutive
    slots are bit for bit a fresh forward's, also past the first 512 slots (runs of the
    attention), where a tree must not straddle two runs."""
    d = _core.token_recycling(16, [4, 2, 2, 1, 1, 1], 8, False)
    a = _core.token_recycling(16, [4, 2, 2, 1, 1, 1], 8, True)
    _core.drafter_set_costs(a, CHEAP)
    for d, (prompt_len, n) in ((d, (30, 60)), (d, (470, 80)), (a, (470, 80))):
        prompt = (tm.random_tokens(CFG.vocab, 15, 2) * 40)[:prompt_len]
        for _ in range(2):  # the second request drafts from a filled table
            tokens, reason, stats = model._core.generate(
                prompt, max_new_tokens=n, temperature=temperature, seed=3, stop_ids=[],
                drafter=d, check_cache=True)
            assert len(tokens) == n and reason == "length"
        assert stats["drafted"] > (stats["steps"] if d is not a else 0)


@pytest.mark.parametrize("adaptive", [False, True], ids=["whole", "adaptive"])
@pytest.mark.parametrize("name", ["T1", "T0.7-topk3"])
def test_sampled_output_is_distributed_as_the_target(tmp_path, name, adaptive):
    m, _, w, _, row = make_v5(tmp_path)
    setting = SETTINGS[name]
    # 100,000 runs, more than the power calculation's minimum (tests/stats.py): trees are new
    # adaptive: tree sizes change from step to step as acceptance is learnt
    spec = recycling(adaptive, nodes=6, widths=(2, 2), top=3)
    assert_joint_matches(m, spec, setting, exact_joint(row, w, setting), N=100_000)


# prompt lookup's draft as one more branch (TokenRecycling(lookup=k)): the table's template
# and lookup's chain share the nodes where they agree
LOOKUP_TREES = [dict(nodes=1, widths=(1,), lookup=4), dict(nodes=6, widths=(2, 2), lookup=8),
                dict(nodes=16, widths=(4, 2, 2, 1, 1, 1), lookup=32)]


@pytest.mark.parametrize("adaptive", [False, True], ids=["whole", "adaptive"])
@pytest.mark.parametrize("tree", LOOKUP_TREES, ids=[str(t["lookup"]) for t in LOOKUP_TREES])
def test_greedy_with_lookup_equals_plain(model, tree, adaptive):
    spec = recycling(adaptive, **tree)
    bare = recycling(adaptive, **{k: v for k, v in tree.items() if k != "lookup"})
    acc = {id(spec): 0, id(bare): 0}
    for seed in range(3):
        prompt = tm.random_tokens(CFG.vocab, 12, seed) * 3
        plain = specdec.generate(model, prompt, max_new_tokens=50, stop_tokens=[])
        for s in (spec, bare):
            got = specdec.generate(model, prompt, max_new_tokens=50, stop_tokens=[],
                                   speculator=s)
            assert got.tokens == plain.tokens, (tree, seed)
            assert got.stats.accepted + got.stats.steps == got.stats.new_tokens
            acc[id(s)] += got.stats.accepted
    # the prompt repeats itself: lookup's branch finds what the table does not know yet
    assert acc[id(spec)] > acc[id(bare)]


def test_lookup_branch_joins_the_template(model):
    """A template of one chain of 6 and lookup's draft of up to 6: never more than the two
    side by side, shared nodes where they agree (a tree of 7 to 11 nodes: a common start),
    and at least the tokens per step of the template alone."""
    prompt = tm.random_tokens(CFG.vocab, 10, 5) * 4
    got = {}
    for lookup in (0, 6):
        spec = recycling(nodes=6, widths=(1,) * 6, lookup=lookup)
        specdec.generate(model, prompt, max_new_tokens=40, stop_tokens=[], speculator=spec)
        got[lookup] = specdec.generate(model, prompt, max_new_tokens=40, stop_tokens=[],
                                       speculator=spec).stats
    sizes = got[6].steps_by_nodes
    assert max(sizes) <= 12 and any(7 <= n <= 11 for n in sizes), sizes
    assert got[6].mean_accepted_tokens >= got[0].mean_accepted_tokens


@pytest.mark.parametrize("adaptive", [False, True], ids=["whole", "adaptive"])
@pytest.mark.parametrize("name", ["T1", "T0.7-topk3"])
def test_sampled_output_with_lookup_is_distributed_as_the_target(tmp_path, name, adaptive):
    m, _, w, _, row = make_v5(tmp_path)
    setting = SETTINGS[name]
    prompt = [1, 2, 3, 1, 2, 4, 1, 2]  # lookup matches the last tokens earlier in the text
    spec = recycling(adaptive, nodes=6, widths=(2, 2), top=3, lookup=4)
    bare = recycling(adaptive, nodes=6, widths=(2, 2), top=3)
    assert_joint_matches(m, spec, setting, exact_joint(row, w, setting, prompt), N=100_000,
                         prompt=prompt)
    T, top_k, top_p, min_p = setting
    drafted = [_core.joint_counts(m._core, s.drafter(), prompt, 2_000, T, top_k, top_p,
                                  min_p)[1] for s in (spec, bare)]
    assert drafted[0] > drafted[1]  # lookup's nodes were in the trees


@pytest.mark.parametrize("kw,error,match", [
    (dict(nodes=0), ValueError, r"nodes must be in \[1, 64\], got 0"),
    (dict(nodes=65), ValueError, r"nodes must be in \[1, 64\], got 65"),
    (dict(top=0), ValueError, r"top must be in \[1, 16\], got 0"),
    (dict(widths=()), ValueError, r"widths must hold 1 to 8 levels, got 0"),
    (dict(widths=(1,) * 9), ValueError, r"widths must hold 1 to 8 levels, got 9"),
    (dict(widths=(9,)), ValueError, r"widths\[0\] must be in \[1, top = 8\], got 9"),
    (dict(widths=(2, 0)), ValueError, r"widths\[1\] must be in \[1, top = 8\], got 0"),
    (dict(widths=(2.0,)), TypeError, "widths"), (dict(widths=3), TypeError, "widths"),
    (dict(nodes=1.5), TypeError, "nodes"), (dict(adaptive=1), TypeError, "adaptive"),
    (dict(lookup=-1), ValueError, r"lookup must be in \[0, 32\], got -1"),
    (dict(lookup=33), ValueError, r"lookup must be in \[0, 32\], got 33"),
    (dict(lookup=2.0), TypeError, "lookup"),
])
def test_bad_arguments(kw, error, match):
    with pytest.raises(error, match=match):
        specdec.TokenRecycling(**kw)


def test_adaptive_trees_follow_the_verify_costs(model):
    """Where verifying is free the whole template is drafted once the table is full; where a
    forward of T tokens costs T, no node pays and one is drafted every fourth step (to keep
    measuring); measured costs start at 1 and never fall."""
    prompt = tm.random_tokens(CFG.vocab, 10, 5) * 4
    free, dear = recycling(True, nodes=16), recycling(True, nodes=16)
    free.set_verify_costs([1.0] * 17)
    dear.set_verify_costs([float(T) for T in range(1, 18)])
    for spec in (free, dear):
        specdec.generate(model, prompt, max_new_tokens=40, stop_tokens=[], speculator=spec)
    g_free = specdec.generate(model, prompt, max_new_tokens=40, stop_tokens=[], speculator=free)
    g_dear = specdec.generate(model, prompt, max_new_tokens=40, stop_tokens=[], speculator=dear)
    assert g_free.stats.drafted > g_free.stats.steps * 8
    assert 0 < g_dear.stats.drafted <= g_dear.stats.steps // 4 + 1
    measured = specdec.TokenRecycling()
    assert measured.verify_costs == []
    specdec.generate(model, prompt, max_new_tokens=8, speculator=measured)
    costs = measured.verify_costs
    assert len(costs) == 17 and costs[0] == 1.0
    assert all(b >= a for a, b in zip(costs, costs[1:]))


@pytest.mark.parametrize("costs,match", [
    ([], r"need 1 to 65 entries, got 0"), ([1.0] * 66, r"need 1 to 65 entries, got 66"),
    ([1.0, 0.5], r"non-decreasing \(entry 1 is 0.5\)"),
    ([1.0, float("nan")], r"entry 1 is nan"), ([0.0], r"entry 0 is 0"),
])
def test_bad_verify_costs(costs, match):
    with pytest.raises(ValueError, match=match):
        specdec.TokenRecycling().set_verify_costs(costs)


def test_one_table_per_model(model, tmp_path):
    path = str(tmp_path / "o.gguf")
    testing.write_gguf(path, CFG, tm.make_weights(CFG, 9))
    other = specdec.load(path)
    spec = specdec.TokenRecycling()
    specdec.generate(model, [1, 2, 3], max_new_tokens=4, speculator=spec)
    with pytest.raises(ValueError, match="use one TokenRecycling per model"):
        specdec.generate(other, [1, 2, 3], max_new_tokens=4, speculator=spec)


def test_row_top_ids_match_numpy():
    """The table's successors: a row's `top` largest values' ids, by decreasing value, ties to
    the lower id, -1 past the row's length; over rows of many ties, of -inf, and lengths around
    the 32-value blocks the scan skips."""
    import numpy as np
    import kernels as K

    rng = np.random.default_rng(7)
    for V in (3, 31, 32, 33, 65, 1000, 49_152):
        x = rng.integers(-40, 41, size=(4, V)).astype(np.float32)
        x[1] = -np.inf
        x[2, V // 2:] = 50.0  # the largest all late, equal
        x[3] = rng.standard_normal(V).astype(np.float32)
        for top in (1, 3, 8, 16):
            got = K.run("row_top", K.CPU, [np.zeros((4, top), np.int32), x, 4, V, top])[0]
            for r in range(4):
                want = np.lexsort((np.arange(V), -x[r]))[:top]
                want = np.concatenate([want, -np.ones(top - len(want), np.int64)])
                np.testing.assert_array_equal(got[r], want, err_msg=f"V={V} top={top} row={r}")


def test_smollm2_greedy_equals_plain(smollm2_path):
    m = specdec.load(smollm2_path)
    # the adaptive trees (sized from this machine's measured verify costs, so possibly empty
    # on a busy or slow CPU) and the whole template (which always drafts)
    for spec in (specdec.TokenRecycling(), specdec.TokenRecycling(adaptive=False),
                 specdec.TokenRecycling(adaptive=False, lookup=16)):
        for q in ("List the days of the week.", "Count from one to twenty in words."):
            msgs = [{"role": "user", "content": q}]
            plain = specdec.generate(m, msgs, max_new_tokens=64)
            got = specdec.generate(m, msgs, max_new_tokens=64, speculator=spec)
            assert got.tokens == plain.tokens, q
    assert got.stats.accepted > 0
