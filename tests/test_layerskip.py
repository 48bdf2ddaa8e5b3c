"""Self-speculation with the target's first layers as the draft (sd_generate_layerskip): greedy
output identical to plain decoding for any exit layer and k; the sampled output distributed as
the target's; the early exit computes exactly the truncated model (a model whose later layers
are the identity accepts every draft); bad arguments refused."""

from __future__ import annotations

import os

import numpy as np
import pytest

import reference
import specdec
import tinymodels as tm
from specdec import testing

from test_draft_model import (SETTINGS, assert_joint_matches, assert_stops_like_plain,
                              exact_joint)
from test_verify import process_ref

CFG = tm.TinyConfig(arch="llama", vocab=40, dim=32, n_layers=4, n_heads=4, n_kv_heads=2, ffn=64,
                    context_length=96)


def identity_after(w: dict, n: int) -> dict:
    """Layers n.. add nothing to the residual stream (zero output projections)."""
    w = dict(w)
    for k in list(w):
        parts = k.split(".")
        if len(parts) > 2 and parts[1] == "layers" and int(parts[2]) >= n and \
                (k.endswith("o_proj.weight") or k.endswith("down_proj.weight")):
            w[k] = np.zeros_like(w[k])
    return w


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("skip")
    w = tm.make_weights(CFG, 31)
    out = {}
    for name, weights, fmt in [("gguf", w, "gguf"), ("hf", w, "hf"),
                               ("identity2", identity_after(w, 2), "gguf")]:
        if fmt == "gguf":
            path = os.path.join(d, name + ".gguf")
            testing.write_gguf(path, CFG, weights)
        else:
            path = os.path.join(d, name)
            testing.write_hf(path, CFG, weights)
        out[name] = specdec.load(path)
    return out


@pytest.mark.parametrize("k", [1, 3, 8])
@pytest.mark.parametrize("layers", [1, 2, 3])
def test_greedy_identical_to_plain_decoding(models, layers, k):
    for name in ("gguf", "hf"):
        m = models[name]
        for seed in range(2):
            prompt = tm.random_tokens(CFG.vocab, 4 + 9 * seed, seed)
            plain = specdec.generate(m, prompt, max_new_tokens=30, stop_tokens=[])
            spec = specdec.generate(m, prompt, max_new_tokens=30, stop_tokens=[],
                                    speculator=specdec.LayerSkip(layers, k=k, verify_slope=0))
            assert spec.tokens == plain.tokens, (name, layers, k, seed)
            st = spec.stats
            assert st.accepted + st.steps == st.new_tokens == 30


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_exit_before_identity_layers_accepts_every_draft(models, temperature):
    """Layers 2 and 3 of `identity2` leave the hidden state as it is, so exiting after layer 2
    gives the target's own distribution (p == q exactly) and every draft is accepted: the early
    exit runs layers 0-1, then the final norm and head, and reads the right cache entries."""
    m = models["identity2"]
    for seed in range(3):
        g = specdec.generate(m, tm.random_tokens(CFG.vocab, 7, seed), max_new_tokens=30,
                             temperature=temperature, seed=seed, stop_tokens=[],
                             speculator=specdec.LayerSkip(2, k=4, verify_slope=0))
        assert g.stats.drafted > 0 and g.stats.accepted == g.stats.drafted
        plain = specdec.generate(m, tm.random_tokens(CFG.vocab, 7, seed), max_new_tokens=30,
                                 temperature=temperature, seed=seed, stop_tokens=[])
        if temperature == 0.0:
            assert g.tokens == plain.tokens
    # exiting after one layer (layer 1 is not the identity) gets some drafts rejected
    g = specdec.generate(m, tm.random_tokens(CFG.vocab, 7, 0), max_new_tokens=30,
                         temperature=1.0, seed=0, stop_tokens=[],
                         speculator=specdec.LayerSkip(1, k=4, verify_slope=0))
    assert g.stats.accepted < g.stats.drafted


def test_stops_in_the_middle_of_a_draft(models):
    assert_stops_like_plain(models["gguf"], lambda: specdec.LayerSkip(3, k=6, verify_slope=0))


@pytest.mark.parametrize("name", ["T1", "top_p0.9"])
def test_sampled_output_is_distributed_as_the_target(tmp_path, name):
    """First three tokens of a 3-layer vocabulary-5 target drafting with its first layer, over
    100,000 seeded runs, against exact enumeration (chi-square, alpha = 0.001)."""
    cfg = tm.TinyConfig(arch="llama", vocab=5, dim=16, n_layers=3, n_heads=2, n_kv_heads=1,
                        ffn=32, context_length=32)
    w = tm.make_weights(cfg, 17)
    testing.write_gguf(str(tmp_path / "t.gguf"), cfg, w)
    m = specdec.load(str(tmp_path / "t.gguf"))

    def row(weights, seq, setting):
        return process_ref(reference.forward(weights, cfg, list(seq), kv_f16=True)[-1], *setting)

    setting = SETTINGS[name]
    assert_joint_matches(m, specdec.LayerSkip(1, k=2, verify_slope=0), setting, exact_joint(row, w, setting))


@pytest.mark.parametrize("layers", [4, 5])
def test_exit_layer_must_be_below_the_layer_count(models, layers):
    with pytest.raises(ValueError, match=r"layers must be in \[1, 4\)"):
        specdec.generate(models["gguf"], [1, 2, 3], max_new_tokens=4,
                         speculator=specdec.LayerSkip(layers))


@pytest.mark.parametrize("args,error,match", [((0,), ValueError, "layers"),
                                              ((-1,), ValueError, "layers"),
                                              ((2.0,), TypeError, "layers"),
                                              ((True,), TypeError, "layers"),
                                              ((2, 0), ValueError, "k must"),
                                              ((2, 33), ValueError, "k must")])
def test_bad_layerskip_arguments(args, error, match):
    with pytest.raises(error, match=match):
        specdec.LayerSkip(*args)


def test_smollm2_greedy_identical(smollm2_path):
    m = specdec.load(smollm2_path)
    msgs = [{"role": "user", "content": "List three fruits."}]
    plain = specdec.generate(m, msgs, max_new_tokens=24)
    spec = specdec.generate(m, msgs, max_new_tokens=24, speculator=specdec.LayerSkip(18, k=3, verify_slope=0))
    assert spec.tokens == plain.tokens and spec.text == plain.text
