"""The target's features for drafters that read its hidden states (EAGLE): Model.forward with
hidden=True gives the final-normed hidden states the output head multiplies, and with
aux_layers the residual stream entering chosen layers, taken from the forward that computes
the logits (no second pass), against a float64 NumPy statement of the model."""

from __future__ import annotations

import numpy as np
import pytest

import reference
import specdec
from tinymodels import random_tokens


@pytest.fixture(scope="module")
def m(llama_gguf):
    return specdec.load(str(llama_gguf.path), kv_dtype="f32"), llama_gguf


def test_hidden_and_layer_inputs_match_the_reference(m):
    model, tiny = m
    cfg = tiny.cfg
    toks = random_tokens(cfg.vocab, 11, seed=4)
    feats: dict = {}
    want_logits = reference.forward(tiny.ref_weights, cfg, toks, features=feats)
    layers = [0, cfg.n_layers // 2, cfg.n_layers - 1]
    logits, hidden, aux = model.forward(model.new_cache(32), toks, hidden=True,
                                        aux_layers=layers)
    assert hidden.shape == (11, cfg.dim) and aux.shape == (3, 11, cfg.dim)
    # the same logits as without features, bit for bit
    plain = model.forward(model.new_cache(32), toks)
    np.testing.assert_array_equal(logits, plain)
    scale = np.abs(feats["hidden"]).max()
    assert np.abs(hidden - feats["hidden"]).max() <= 1e-4 * scale
    for i, layer in enumerate(layers):
        ref = feats["layer_in"][layer]
        assert np.abs(aux[i] - ref).max() <= 1e-4 * np.abs(ref).max(), layer
    # layer 0's input is the embedding rows themselves
    np.testing.assert_array_equal(aux[0], tiny.ref_weights["model.embed_tokens.weight"][toks]
                                  .astype(np.float32))
    # what the head multiplies: logits = hidden @ W_out^T
    head = tiny.ref_weights["model.embed_tokens.weight" if cfg.tied else "lm_head.weight"]
    assert np.abs(hidden.astype(np.float64) @ head.T - want_logits).max() <= \
        1e-4 * np.abs(want_logits).max()


def test_hidden_of_every_row_whatever_n_logits(m):
    """Every token's hidden state, also of rows without logits; a second batch continues the
    cache and its features are those of the whole sequence's last rows."""
    model, tiny = m
    toks = random_tokens(tiny.cfg.vocab, 12, seed=5)
    _, whole, aux_whole = model.forward(model.new_cache(32), toks, hidden=True, aux_layers=[1])
    cache = model.new_cache(32)
    model.forward(cache, toks[:8], n_logits=0)
    logits, tail, aux_tail = model.forward(cache, toks[8:], n_logits=2, hidden=True,
                                           aux_layers=[1])
    assert logits.shape[0] == 2 and tail.shape == (4, tiny.cfg.dim)
    np.testing.assert_array_equal(tail, whole[8:])
    np.testing.assert_array_equal(aux_tail[0], aux_whole[0][8:])
    _, none_h, only_aux = model.forward(model.new_cache(32), toks, aux_layers=[0])
    assert none_h is None and only_aux.shape == (1, 12, tiny.cfg.dim)


def test_bad_feature_requests_are_named(m):
    model, tiny = m
    L = tiny.cfg.n_layers
    with pytest.raises(ValueError, match=f"aux layer {L + 1} is out of range"):
        model.forward(model.new_cache(8), [1, 2], aux_layers=[L + 1])
    # layer L: the residual stream after the last layer, whose final norm is the hidden state
    _, hid, after = model.forward(model.new_cache(8), [1, 2], hidden=True, aux_layers=[L])
    ref = reference.rmsnorm(after[0].astype(np.float64), tiny.ref_weights["model.norm.weight"],
                            tiny.cfg.rms_eps)
    assert np.abs(hid - ref).max() <= 1e-5 * np.abs(ref).max()
    with pytest.raises(ValueError, match="n_aux 9 is out of range"):
        model.forward(model.new_cache(8), [1, 2], aux_layers=[0] * 9)
    with pytest.raises(TypeError, match="hidden must be a bool"):
        model.forward(model.new_cache(8), [1, 2], hidden=1)
