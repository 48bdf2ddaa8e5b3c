"""Streaming: generate(on_token=...) sees every emitted token in order and can stop the loop;
stream() yields pieces that join to the final text, for every speculator, holds back what could
start a stop string, stops when the consumer stops, and passes errors on."""

from __future__ import annotations

import os

import pytest

import specdec
import tinymodels as tm
from specdec import testing


@pytest.fixture(scope="module")
def text_model(tmp_path_factory):
    from test_text import gguf_kv
    from test_tokenizer import _train_bpe, gguf_meta

    meta = gguf_meta(_train_bpe())
    cfg = tm.TinyConfig(arch="llama", vocab=len(meta["tokenizer.ggml.tokens"]), dim=32,
                        n_layers=2, n_heads=4, n_kv_heads=2, ffn=64, context_length=256)
    path = os.path.join(tmp_path_factory.mktemp("stream"), "m.gguf")
    testing.write_gguf(path, cfg, tm.make_weights(cfg, 5), extra_kv=gguf_kv(meta))
    return specdec.load(path)


PROMPT = "the cat sat on the mat the cat sat on the mat the cat"
SPECULATORS = {"plain": lambda: None, "lookup": lambda: specdec.PromptLookup(k=4),
               "layerskip": lambda: specdec.LayerSkip(1, k=3, verify_slope=0)}


@pytest.mark.parametrize("spec", list(SPECULATORS))
def test_on_token_sees_every_token_in_order(text_model, spec):
    seen = []
    g = specdec.generate(text_model, PROMPT, max_new_tokens=30, stop_tokens=[],
                         speculator=SPECULATORS[spec](), on_token=seen.append)
    assert seen == g.tokens and len(seen) == 30


@pytest.mark.parametrize("spec", list(SPECULATORS))
def test_on_token_can_stop_the_loop(text_model, spec):
    full = specdec.generate(text_model, PROMPT, max_new_tokens=30, stop_tokens=[])
    seen = []

    def cb(t):
        seen.append(t)
        return len(seen) == 7

    g = specdec.generate(text_model, PROMPT, max_new_tokens=30, stop_tokens=[],
                         speculator=SPECULATORS[spec](), on_token=cb)
    assert g.tokens == full.tokens[:7] == seen and g.finish_reason == "cancelled"


def test_on_token_errors_propagate(text_model):
    def cb(t):
        raise KeyError("from the callback")

    with pytest.raises(KeyError, match="from the callback"):
        specdec.generate(text_model, PROMPT, max_new_tokens=10, on_token=cb)
    # the model is usable afterwards
    assert len(specdec.generate(text_model, PROMPT, max_new_tokens=3, stop_tokens=[]).tokens) == 3
    with pytest.raises(TypeError, match="on_token"):
        specdec.generate(text_model, PROMPT, max_new_tokens=3, on_token=5)


def drain(gen):
    pieces = []
    while True:
        try:
            pieces.append(next(gen))
        except StopIteration as e:
            return pieces, e.value


@pytest.mark.parametrize("spec", list(SPECULATORS))
def test_stream_pieces_join_to_the_text(text_model, spec):
    want = specdec.generate(text_model, PROMPT, max_new_tokens=40, stop_tokens=[])
    pieces, g = drain(specdec.stream(text_model, PROMPT, max_new_tokens=40, stop_tokens=[],
                                     speculator=SPECULATORS[spec]()))
    assert g.tokens == want.tokens
    assert "".join(pieces) == g.text == want.text
    assert len(pieces) > 3 and all(isinstance(p, str) and p for p in pieces)


def test_stream_never_yields_text_past_a_stop_string(text_model):
    full = specdec.generate(text_model, PROMPT, max_new_tokens=40, stop_tokens=[])
    stop = next(full.text[i:i + 3] for i in range(8, len(full.text) - 3)
                if full.text[i:i + 3].isascii() and full.text[i:i + 3].strip())
    pieces, g = drain(specdec.stream(text_model, PROMPT, max_new_tokens=40, stop_tokens=[],
                                     stop=[stop], speculator=specdec.PromptLookup(k=4)))
    assert g.finish_reason == "stop_string" and stop not in g.text
    assert "".join(pieces) == g.text


def test_breaking_out_stops_decoding(text_model):
    seen = 0
    gen = specdec.stream(text_model, PROMPT, max_new_tokens=200, stop_tokens=[])
    for _ in gen:
        seen += 1
        if seen == 2:
            break
    gen.close()
    # the model is free again (the worker thread has finished)
    assert len(specdec.generate(text_model, PROMPT, max_new_tokens=3, stop_tokens=[]).tokens) == 3


def test_stream_token_ids_without_a_tokenizer(tmp_path):
    cfg = tm.TinyConfig(arch="llama", vocab=40, dim=16, n_layers=1, n_heads=2, n_kv_heads=1,
                        ffn=32, context_length=64)
    testing.write_gguf(str(tmp_path / "m.gguf"), cfg, tm.make_weights(cfg, 2))
    m = specdec.load(str(tmp_path / "m.gguf"))
    want = specdec.generate(m, [1, 2, 3], max_new_tokens=12, stop_tokens=[])
    ids, g = drain(specdec.stream(m, [1, 2, 3], max_new_tokens=12, stop_tokens=[]))
    assert ids == want.tokens == g.tokens


def test_stream_errors_are_raised_to_the_consumer(text_model):
    with pytest.raises(ValueError, match="max_new_tokens"):
        list(specdec.stream(text_model, PROMPT, max_new_tokens=-1))
