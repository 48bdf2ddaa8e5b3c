"""specdec's forward in llama.cpp's float order (Model.llamacpp_logits) against the llama.cpp
fixture (tests/fixtures/smollm2_llamacpp.json, recorded by tools/llamacpp_reference.py).

specdec's own kernels agree with llama.cpp within a tolerance (test_llamacpp_parity.py); this
path does each float operation as llama.cpp does, so here the check is equality: every recorded
logit, rounded to the fixture's 5 decimals, must be the recorded value. The fixture holds the
prompts evaluated in one batch and one token at a time (two kernel paths of llama.cpp), and a
64-token greedy continuation made one token at a time after the batched prompt."""

from __future__ import annotations

import numpy as np
import pytest

import specdec


def recorded(logits: np.ndarray, top: np.ndarray) -> np.ndarray:
    """Our logits of the fixture's ids, rounded as the fixture rounds them."""
    ids = top[:, :, 0].astype(int)
    return np.round(np.take_along_axis(logits, ids, axis=1).astype(np.float64), 5)


N_GREEDY = 32  # greedy steps checked after each prompt


@pytest.fixture(scope="module")
def continued(llamacpp_model, llamacpp_fx) -> dict:
    """Per prompt name: the logits of the prompt in one batch followed by llama.cpp's first
    N_GREEDY - 1 greedy tokens one at a time (rows of the prompt: the batch; the others: one
    step each). The reference is slow, so the two tests below share this one pass."""
    out = {}
    for p in llamacpp_fx["prompts"]:
        seq = p["tokens"] + p["greedy"][:N_GREEDY - 1]
        out[p["name"]] = llamacpp_model.llamacpp_logits(seq, n_batch=len(p["tokens"]))
    return out


def test_one_batch_equals_llamacpp(continued, llamacpp_fx):
    """The whole prompt in one batch: all 20 recorded logits of every position, exactly, and so
    the same top-1 token at 100 % of the positions."""
    for p in llamacpp_fx["prompts"]:
        logits = continued[p["name"]][:len(p["tokens"])]
        top = np.array(p["top_logits"])
        np.testing.assert_array_equal(recorded(logits, top), top[:, :, 1], err_msg=p["name"])
        assert np.all(logits.argmax(axis=1) == top[:, 0, 0]), p["name"]


def test_one_token_at_a_time_equals_llamacpp(llamacpp_model, llamacpp_fx):
    """The prompt one token at a time (llama.cpp's one-token attention products): the fixture's
    stepwise logits, exactly. Three prompts, to keep the suite short."""
    for p in llamacpp_fx["prompts"][:3]:
        logits = llamacpp_model.llamacpp_logits(p["tokens"], n_batch=1)
        top = np.array(p["top_logits"])
        np.testing.assert_array_equal(recorded(logits, top), np.array(p["top_logits_stepwise"]),
                                      err_msg=p["name"])


def test_greedy_continuations_equal_llamacpp(continued, llamacpp_fx):
    """The batched prompt, then llama.cpp's greedy tokens one at a time: at each of the first 32
    steps the argmax is llama.cpp's next token, with its recorded top-1/top-2 gap. By induction
    a free-running greedy decode in this order gives llama.cpp's 32 tokens for every prompt."""
    n = N_GREEDY
    for p in llamacpp_fx["prompts"]:
        logits = continued[p["name"]][len(p["tokens"]) - 1:]
        assert logits.argmax(axis=1).tolist() == p["greedy"][:n], p["name"]
        two = np.sort(logits, axis=1)[:, -2:].astype(np.float64)
        np.testing.assert_allclose(two[:, 1] - two[:, 0], p["greedy_margin"][:n], atol=2e-5,
                                   err_msg=p["name"])


def test_orders_differ_where_llamacpp_differs(llamacpp_model, llamacpp_fx):
    """The one-token and batch orders are not the same function: they part where llama.cpp's two
    paths part (a check that the batch/one-token switch does something)."""
    p = llamacpp_fx["prompts"][0]
    a = llamacpp_model.llamacpp_logits(p["tokens"][:20])
    b = llamacpp_model.llamacpp_logits(p["tokens"][:20], n_batch=1)
    np.testing.assert_array_equal(a[0], b[0])  # row 0 attends one slot: both orders agree
    assert np.any(a != b)


def test_bad_arguments(llamacpp_model):
    with pytest.raises(ValueError, match="n_batch"):
        llamacpp_model.llamacpp_logits([1, 2, 3], n_batch=4)
    with pytest.raises(ValueError, match="n_batch"):
        llamacpp_model.llamacpp_logits([1, 2, 3], n_batch=0)
    with pytest.raises(ValueError, match="outside"):
        llamacpp_model.llamacpp_logits([1, 10**6])
    with pytest.raises(ValueError, match="at least one"):
        llamacpp_model.llamacpp_logits([])


def test_unsupported_model_is_named(llama_gguf):
    m = specdec.load(str(llama_gguf.path))  # a tiny llama with F32 matrices
    with pytest.raises(ValueError, match="float order is reproduced for"):
        m.llamacpp_logits([1, 2, 3])
