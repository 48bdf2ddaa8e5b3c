"""Streaming: generate(on_token=...) sees every emitted token in order and can stop the loop;
stream() yields pieces that join to the final text, for every speculator, holds back what could
start a stop string, stops when the consumer stops, and passes errors on."""

from __future__ import annotations

import sys

import pytest

import specdec
import tinymodels as tm
from helpers import gguf_meta, sentencepiece_meta, train_bpe, write_text_model
from specdec import testing


@pytest.fixture(scope="module")
def text_model(tmp_path_factory):
    return write_text_model(tmp_path_factory.mktemp("stream") / "m.gguf")


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


@pytest.fixture(scope="module")
def tokenizer_models(tmp_path_factory):
    """Random models carrying a byte-level BPE without and with llama.cpp's space clean-up, and
    a SentencePiece vocabulary with byte fallback that drops the first space."""
    d = tmp_path_factory.mktemp("kinds")
    bpe = train_bpe()
    metas = {"bytelevel": gguf_meta(bpe), "bytelevel-clean": gguf_meta(bpe, pre="gpt-2"),
             "spm": dict(sentencepiece_meta(), **{"general.architecture": "llama"})}
    return {k: write_text_model(d / f"{k}.gguf", m, seed=7) for k, m in metas.items()}


@pytest.mark.parametrize("kind", ["bytelevel", "bytelevel-clean", "spm"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_stream_pieces_join_to_the_text_for_every_vocabulary(tokenizer_models, kind,
                                                             temperature):
    """Random weights emit any token after any other: characters split over tokens, lone
    continuation bytes, byte-fallback tokens, spaces before punctuation (cleaned up for
    bytelevel-clean). The pieces join to Generation.text exactly, and none of them ends in half
    a character."""
    m = tokenizer_models[kind]
    tok = m.tokenizer
    for seed in range(4):
        want = specdec.generate(m, [1, 5, 9], max_new_tokens=120, temperature=temperature,
                                seed=seed, stop_tokens=[])
        pieces, g = drain(specdec.stream(m, [1, 5, 9], max_new_tokens=120,
                                         temperature=temperature, seed=seed, stop_tokens=[]))
        assert g.tokens == want.tokens and g.text == want.text == tok.decode(g.tokens)
        assert "".join(pieces) == g.text and all(pieces)
        assert len(pieces) > 10


def test_stream_stops_at_a_stop_string_spanning_tokens(text_model):
    """A stop string made of the end of one output token and the start of the next: the text
    stops before it (the C loop matches bytes across tokens) and nothing past it is yielded."""
    full = specdec.generate(text_model, PROMPT, max_new_tokens=40, stop_tokens=[])
    tok = text_model.tokenizer
    pieces = [tok.token_to_piece(t).decode("utf-8", "replace") for t in full.tokens]
    k = next(k for k in range(3, len(pieces)) if len(pieces[k - 1]) >= 2 and
             len(pieces[k]) >= 2 and (pieces[k - 1] + pieces[k]).isascii())
    stop = pieces[k - 1][-2:] + pieces[k][:2]
    at = full.text.find(stop)
    assert at >= 0
    yielded, g = drain(specdec.stream(text_model, PROMPT, max_new_tokens=40, stop_tokens=[],
                                      stop=[stop]))
    assert g.finish_reason == "stop_string" and g.text == full.text[:at]
    assert "".join(yielded) == g.text


def test_stream_decodes_each_token_a_bounded_number_of_times(text_model, monkeypatch):
    """Streaming is linear: over 200 tokens, Tokenizer.decode sees each token about once (the
    Generation's own text), not once per later token as re-decoding the output at each step
    would (200 * 201 / 2 = 20,100)."""
    from specdec.tokenizer import Tokenizer

    seen = []
    real = Tokenizer.decode
    monkeypatch.setattr(Tokenizer, "decode",
                        lambda self, ids, *a, **kw: real(self, seen.extend(ids) or ids, *a, **kw))
    pieces, g = drain(specdec.stream(text_model, PROMPT, max_new_tokens=200, stop_tokens=[]))
    assert len(g.tokens) == 200 and "".join(pieces) == g.text
    assert len(seen) <= 2 * 200, len(seen)


def test_stream_never_yields_text_past_a_stop_string(text_model):
    full = specdec.generate(text_model, PROMPT, max_new_tokens=40, stop_tokens=[])
    stop = next(full.text[i:i + 3] for i in range(8, len(full.text) - 3)
                if full.text[i:i + 3].isascii() and full.text[i:i + 3].strip())
    pieces, g = drain(specdec.stream(text_model, PROMPT, max_new_tokens=40, stop_tokens=[],
                                     stop=[stop], speculator=specdec.PromptLookup(k=4)))
    assert g.finish_reason == "stop_string" and stop not in g.text
    assert "".join(pieces) == g.text


@pytest.fixture(scope="module")
def ids_model(tmp_path_factory):
    """A tiny model without a tokenizer: stream() yields its token ids one by one."""
    cfg = tm.TinyConfig(arch="llama", vocab=40, dim=16, n_layers=2, n_heads=2, n_kv_heads=1,
                        ffn=32, context_length=256)
    path = str(tmp_path_factory.mktemp("ids") / "m.gguf")
    testing.write_gguf(path, cfg, tm.make_weights(cfg, 2))
    return specdec.load(path)


@pytest.mark.parametrize("spec", list(SPECULATORS))
def test_breaking_out_stops_decoding(ids_model, spec, monkeypatch):
    """The consumer breaks out after two tokens of 200: decoding itself ends there (no step runs
    after the break, the sequence and its caches are freed), not only the consumer's view of
    it. The core sequence is wrapped to count what its steps emit."""
    mod = sys.modules["specdec.generate"]
    steps: list = []

    class Counting:
        def __init__(self, seq):
            self.seq = seq

        def step(self):
            steps.append(self.seq.step())
            return steps[-1]

        def __getattr__(self, name):
            return getattr(self.seq, name)

    real_init = mod._Call.__init__

    def init(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        self.seq = Counting(self.seq)

    monkeypatch.setattr(mod._Call, "__init__", init)
    seen = []
    gen = specdec.stream(ids_model, [1, 2, 3], max_new_tokens=200, stop_tokens=[],
                         speculator=SPECULATORS[spec]())
    for t in gen:
        seen.append(t)
        if len(seen) == 2:
            at_break = len(steps)
            break
    gen.close()
    emitted = [t for step in steps for t in step]
    assert len(steps) == at_break, "a step ran after the consumer broke out"
    # the last step may have emitted a speculative step's tokens past the two consumed
    assert 2 <= len(emitted) < 2 + 33 and emitted[:2] == seen
    assert gen.gi_frame is None  # the generator has finished, its sequence closed
    # the model is free again
    assert len(specdec.generate(ids_model, [1, 2], max_new_tokens=3, stop_tokens=[]).tokens) == 3


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
