"""Medusa heads (specdec.Medusa): files written here with medusa_model.py's key names, as
medusa_lm_head.safetensors and medusa_lm_head.pt; their logits against a float64 NumPy statement;
greedy output equal to plain decoding with the default and with given trees; sampled output
distributed as the target's (chi-square); bad trees and files named."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

import reference
import specdec
import tinymodels as tm
from helpers import SETTINGS, exact_joint, without_and_with_the_pool
from stats import chi2_critical, chi2_stat
from test_eagle import (TARGET, V5, make_target, make_v5_four_layers, write_bin, write_head,
                        write_safetensors)
from test_model_tree import joint_counts


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return make_target(tmp_path_factory.mktemp("medusa_target"))


@pytest.fixture(scope="module")
def v5(tmp_path_factory):
    return make_v5_four_layers(tmp_path_factory.mktemp("v5medusa"))


def medusa_weights(D: int, V: int, heads: int, blocks: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    w = {}
    for i in range(heads):
        for j in range(blocks):
            w[f"{i}.{j}.linear.weight"] = (rng.standard_normal((D, D)) / np.sqrt(D)).astype(
                np.float32)
            w[f"{i}.{j}.linear.bias"] = (0.1 * rng.standard_normal(D)).astype(np.float32)
        w[f"{i}.{blocks}.weight"] = (3.0 * rng.standard_normal((V, D)) / np.sqrt(D)).astype(
            np.float32)
    return w


def write_medusa(d, fmt: str = "safetensors", heads: int = 3, blocks: int = 1, D: int = TARGET.dim,
                 V: int = TARGET.vocab, seed: int = 4, config_heads: int | None = None):
    d.mkdir(parents=True, exist_ok=True)
    w = medusa_weights(D, V, heads, blocks, seed)
    # the published config may disagree with the tensors (Vicuna-7B's says 2 heads, holds 5)
    (d / "config.json").write_text(json.dumps({"medusa_num_heads": config_heads or heads,
                                               "medusa_num_layers": blocks}))
    if fmt == "safetensors":
        write_safetensors(d / "medusa_lm_head.safetensors", w)
    else:
        write_bin(d / "medusa_lm_head.pt", w)
    return d, w


def ref_medusa(w: dict, heads: int, blocks: int, target_w: dict, cfg, tokens) -> np.ndarray:
    feats: dict = {}
    reference.forward(target_w, cfg, tokens, features=feats)
    out = []
    for i in range(heads):
        y = feats["hidden"]
        for j in range(blocks):
            y = y + reference.silu(y @ np.float64(w[f"{i}.{j}.linear.weight"]).T +
                                   w[f"{i}.{j}.linear.bias"])
        out.append(y @ np.float64(w[f"{i}.{blocks}.weight"]).T)
    return np.stack(out)


@pytest.mark.parametrize("fmt", ["safetensors", "bin"])
@pytest.mark.parametrize("heads,blocks", [(3, 1), (2, 2), (4, 0)])
def test_draft_logits_match_the_reference(tmp_path, target, fmt, heads, blocks):
    m, tiny = target
    d, w = write_medusa(tmp_path / "m", fmt, heads, blocks, config_heads=2)
    spec = specdec.Medusa(d, weights="float")
    assert spec.heads == heads  # the tensors, not the config
    toks = tm.random_tokens(TARGET.vocab, 11, seed=6)
    got = spec.draft_logits(m, toks)
    want = ref_medusa(w, heads, blocks, tiny.ref_weights, TARGET, toks)
    assert got.shape == want.shape == (heads, 11, TARGET.vocab)
    assert np.abs(got - want).max() <= 1e-3 * max(1.0, np.abs(want).max())
    # a wrong statement fails: the residual left out
    if blocks:
        broken = ref_medusa({k: (0 * v if "linear" in k else v) for k, v in w.items()}, heads,
                            blocks, tiny.ref_weights, TARGET, toks)
        assert np.abs(got - broken).max() > 1e-2


TREES = [None, [(0,), (0, 0), (0, 0, 0)], [(0,), (1,), (2,), (3,), (0, 0), (0, 1), (1, 0),
                                           (0, 0, 0), (2, 5), (2, 5, 15)]]


@pytest.mark.parametrize("tree", TREES)
def test_greedy_equals_plain(tmp_path, target, tree):
    m, _ = target
    d, _ = write_medusa(tmp_path / "m", heads=3)
    spec = specdec.Medusa(d, tree=tree)
    for seed in (1, 2):
        prompt = tm.random_tokens(TARGET.vocab, 7, seed=seed)
        plain = specdec.generate(m, prompt, max_new_tokens=40, stop_tokens=[])
        got = specdec.generate(m, prompt, max_new_tokens=40, stop_tokens=[], speculator=spec)
        assert got.tokens == plain.tokens
        assert got.stats.drafted > 0
    for prompt in ([3], [3, 4]):
        for n in (1, 2, 5):
            plain = specdec.generate(m, prompt, max_new_tokens=n, stop_tokens=[])
            got = specdec.generate(m, prompt, max_new_tokens=n, stop_tokens=[], speculator=spec)
            assert got.tokens == plain.tokens


def test_a_reused_prefix_keeps_the_heads_drafts(v5):
    """With prefix reuse, Medusa's first step reads the last prompt position's hidden state
    from the features pooled with the cache: over sampled runs on the 5-token target (where the
    drafts decide which uniforms the tree rule reads, so other drafts give other tokens), the
    same tokens and the same acceptance as without the pool."""
    m, _, _, d = v5
    md, _ = write_medusa(d / "medusa_reuse", heads=2, D=V5.dim, V=5, seed=8)
    spec = specdec.Medusa(md, tree=[(0,), (1,), (0, 0), (0, 1), (1, 0)])
    prompt = [1, 3, 0, 4, 2, 2, 1, 0, 3, 4, 1, 2]

    def runs():
        out = []
        for seed in range(12):
            g = specdec.generate(m, prompt, max_new_tokens=6, temperature=1.0, seed=seed,
                                 stop_tokens=[], speculator=spec)
            out.append((g.tokens, g.stats.accepted, g.stats.steps_by_accepted, g.prefix_reused))
        return out

    alone, pooled = without_and_with_the_pool(m, runs, pool=2)
    assert [r[3] for r in pooled[1:]] == [len(prompt) - 1] * 11
    assert [r[:3] for r in pooled] == [r[:3] for r in alone]
    assert sum(r[1] for r in alone) > 0


SAMPLED = {"T1": SETTINGS["T1"], "T0.7-topk3-topp-minp": (0.7, 3, 0.9, 0.1)}


@pytest.mark.parametrize("name", list(SAMPLED))
def test_sampled_output_is_distributed_as_the_target(v5, name):
    """100,000 runs each: a tree of deterministic children (the heads' best tokens) verified
    by the tree rule, accepted with probability p(c) and p(c) zeroed on rejection."""
    m, row, w, d = v5
    setting, N = SAMPLED[name], 100_000
    md, _ = write_medusa(d / "medusa", heads=2, D=V5.dim, V=5, seed=8)
    spec = specdec.Medusa(md, tree=[(0,), (1,), (0, 0), (0, 1), (1, 0)])
    counts, rejected, drafted = joint_counts(m, spec.drafter(), setting, N)
    assert rejected > N // 10 and drafted > N
    stat, df = chi2_stat(counts, exact_joint(row, w, setting))
    assert stat < chi2_critical(df), (stat, df)


@pytest.mark.parametrize("tree,match", [
    ([(0, 0), (0,)], "path 0 comes before its parent"),
    ([(0,), (0,)], "paths 0 and 1 are the same"),
    ([(0,), (16,)], r"rank 16; ranks are in \[0, 16\)"),
    ([(0, 0, 0, 0)], "path 0 has 4 entries; paths have 1 to 3"),
    ([], r"needs 1 to 64 paths, got 0"),
    ([(0,)] * 65, r"needs 1 to 64 paths, got 65"),
])
def test_bad_trees_are_named(tmp_path, tree, match):
    d, _ = write_medusa(tmp_path / "m", heads=3)
    with pytest.raises(ValueError, match=match):
        specdec.Medusa(d, tree=tree)


def test_bad_files_and_mismatches(tmp_path, target, tiny):
    m, _ = target
    d, w = write_medusa(tmp_path / "m", heads=2)
    other = specdec.load(str(tiny("llama_gqa2", "gguf-f32-v3").path))
    with pytest.raises(ValueError, match="hidden size 48 does not match the target's 32"):
        specdec.generate(other, [1, 2, 3], max_new_tokens=4, speculator=specdec.Medusa(d))
    w2 = dict(w, **{"1.0.extra": np.zeros(2, np.float32)})
    write_safetensors(d / "medusa_lm_head.safetensors", w2)
    with pytest.raises(ValueError, match="'1.0.extra' is not part of 2 Medusa heads of 1 block"):
        specdec.Medusa(d)
    w2 = dict(w)
    w2["1.0.linear.bias"] = np.zeros(5, np.float32)
    write_safetensors(d / "medusa_lm_head.safetensors", w2)
    with pytest.raises(ValueError, match=re.escape("tensor '1.0.linear.bias' has shape [5], "
                                                   "expected [48]")):
        specdec.Medusa(d)
    # a NaN or an infinity is a corrupt file, named with the tensor and where
    for name, at, where in [("1.1.weight", (30, 2), "row 30, column 2"),
                            ("0.0.linear.bias", (9,), "element 9")]:
        w2 = {k: v.copy() for k, v in w.items()}
        w2[name][at] = np.nan
        write_safetensors(d / "medusa_lm_head.safetensors", w2)
        with pytest.raises(ValueError, match=f"'{name}' holds a NaN or infinite value at {where}"):
            specdec.Medusa(d)
    # an EAGLE head is not Medusa's, and Medusa's is not EAGLE's
    e, _, _ = write_head(tmp_path / "e", "eagle", "safetensors")
    with pytest.raises(ValueError, match="needs Medusa heads"):
        specdec.Medusa(e)
    write_safetensors(d / "medusa_lm_head.safetensors", w)
    with pytest.raises(ValueError, match="a Medusa head: use the Medusa drafter"):
        specdec.Eagle(d)
    with pytest.raises(FileNotFoundError):
        specdec.Medusa(tmp_path / "nowhere")
