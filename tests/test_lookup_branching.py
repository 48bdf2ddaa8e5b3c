"""Prompt lookup with sibling branches (PromptLookup(branching=b)): the continuations of other
earlier occurrences, starting with other tokens, drafted as a tree and verified in one forward.
Greedy output equals plain decoding; the caches equal a fresh forward after every step; sampled
output is distributed as the target's (chi-square of the first three tokens); branching=1 is
the chain, token for token."""

from __future__ import annotations

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
        spec = specdec.PromptLookup(k=k, branching=b, verify_slope=0)
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
    spec = specdec.PromptLookup(k=2, branching=3, verify_slope=0)
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
                                  lambda: specdec.PromptLookup(k=4, branching=3, verify_slope=0),
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
