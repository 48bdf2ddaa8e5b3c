"""Bad input at the edges of the Python API: each refused with a clear exception that names the
parameter or metadata key (what was expected, what was given), never a crash, a bare error
from a conversion, or a silent wrong answer.

Everything runs on tiny random models and the tiny byte-level BPE of helpers.py."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

import specdec
import tinymodels as tm
from helpers import gguf_kv, gguf_meta, sentencepiece_meta, train_bpe, write_text_model
from specdec import bench, testing
from specdec.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def meta() -> dict:
    return gguf_meta(train_bpe())


@pytest.fixture(scope="module")
def text_model(tmp_path_factory, meta):
    return write_text_model(tmp_path_factory.mktemp("edges") / "text.gguf", meta)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """A tiny model without a tokenizer."""
    cfg = testing.RandomModelConfig(vocab=64, dim=32, n_layers=2, n_heads=4, n_kv_heads=2,
                                    ffn=64, context_length=64)
    path = str(tmp_path_factory.mktemp("edges") / "plain.gguf")
    testing.write_gguf(path, cfg, testing.random_weights(cfg, 0))
    return specdec.load(path, threads=1)


def write_with_kv(path, meta: dict, kv: list) -> specdec.Model:
    """A tiny model carrying the tokenizer of `meta`, with the GGUF entries of `kv` replacing
    (by key) or added to the metadata."""
    cfg = tm.TinyConfig(arch="llama", vocab=len(meta["tokenizer.ggml.tokens"]), dim=32,
                        n_layers=2, n_heads=4, n_kv_heads=2, ffn=64, context_length=256)
    keys = {k for k, _, _ in kv}
    entries = [e for e in gguf_kv(meta) if e[0] not in keys] + kv
    testing.write_gguf(str(path), cfg, tm.make_weights(cfg, 5), extra_kv=entries, remove_kv=keys)
    return specdec.load(str(path), threads=1)


# ---------------------------------------------------------------------------------------------
# GGUF tokenizer metadata out of spec
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [99, -1, 7])
def test_token_type_outside_the_gguf_types(meta, bad):
    types = list(meta["tokenizer.ggml.token_type"])
    types[5] = bad
    with pytest.raises(ValueError, match=rf"'tokenizer\.ggml\.token_type'\[5\] is {bad}"):
        Tokenizer.from_gguf_metadata(dict(meta, **{"tokenizer.ggml.token_type": types}))


@pytest.mark.parametrize("key", ["bos", "eos", "unknown", "eot", "eom", "fim_pre", "fim_pad"])
@pytest.mark.parametrize("bad", [10**6, -1, "oob"])
def test_special_token_id_out_of_range(meta, key, bad):
    n = len(meta["tokenizer.ggml.tokens"])
    bad = n if bad == "oob" else bad
    m = dict(meta, **{f"tokenizer.ggml.{key}_token_id": bad, "tokenizer.ggml.add_bos_token": True})
    with pytest.raises(ValueError, match=rf"'tokenizer\.ggml\.{key}_token_id' is {bad}, out of "
                                         rf"the vocabulary's range \[0, {n}\)"):
        Tokenizer.from_gguf_metadata(m)


def test_special_token_id_of_the_wrong_type(meta):
    with pytest.raises(ValueError, match=r"'tokenizer\.ggml\.eos_token_id' must be an integer"):
        Tokenizer.from_gguf_metadata(dict(meta, **{"tokenizer.ggml.eos_token_id": "2"}))


def test_sentencepiece_vocabulary_needs_scores():
    m = sentencepiece_meta()
    del m["tokenizer.ggml.scores"]
    with pytest.raises(ValueError, match=r"'tokenizer\.ggml\.scores' is missing"):
        Tokenizer.from_gguf_metadata(m)


# ---------------------------------------------------------------------------------------------
# Metadata strings that are not UTF-8
# ---------------------------------------------------------------------------------------------


def test_bad_utf8_in_an_unread_key_is_tolerated(tmp_path, meta):
    m = write_with_kv(tmp_path / "m.gguf", meta, [("general.name", tm.GGUF_STRING, b"\xffname")])
    assert m.tokenizer is not None
    assert isinstance(specdec.generate(m, "hello", max_new_tokens=2).text, str)


@pytest.mark.parametrize("key", ["tokenizer.chat_template", "tokenizer.ggml.pre"])
def test_bad_utf8_in_a_read_key(tmp_path, meta, key):
    m = write_with_kv(tmp_path / "m.gguf", meta, [(key, tm.GGUF_STRING, b"smol\xfflm")])
    with pytest.raises(ValueError, match=rf"'{key}' is not valid UTF-8"):
        m.tokenizer


def test_bad_utf8_in_a_token_text(meta):
    tokens = list(meta["tokenizer.ggml.tokens"])
    tokens[7] = b"\xff"
    with pytest.raises(ValueError, match=r"'tokenizer\.ggml\.tokens'\[7\] is not valid UTF-8"):
        Tokenizer.from_gguf_metadata(dict(meta, **{"tokenizer.ggml.tokens": tokens}))


def test_bad_utf8_in_a_metadata_key(tmp_path, meta):
    m = write_with_kv(tmp_path / "m.gguf", meta, [(b"general.\xffkey", tm.GGUF_STRING, "x")])
    with pytest.raises(ValueError, match=r"m\.gguf: the GGUF metadata key .* is not valid UTF-8"):
        specdec.generate(m, [1, 2], max_new_tokens=1)


# ---------------------------------------------------------------------------------------------
# generate / stream arguments
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [-1, 64, 10**9])
def test_stop_tokens_out_of_range(model, bad):
    with pytest.raises(ValueError, match=rf"stop_tokens holds token id {bad}, out of range "
                                         r"\[0, 64\)"):
        specdec.generate(model, [1, 2], max_new_tokens=2, stop_tokens=[3, bad])
    with pytest.raises(ValueError, match="stop_tokens"):
        next(specdec.stream(model, [1, 2], max_new_tokens=2, stop_tokens=[bad]))


def test_stop_tokens_and_stop_must_be_sequences(text_model):
    with pytest.raises(TypeError, match="stop_tokens must be a sequence of token ids"):
        specdec.generate(text_model, [1, 2], max_new_tokens=2, stop_tokens=5)
    with pytest.raises(TypeError, match="stop_tokens must be an integer"):
        specdec.generate(text_model, [1, 2], max_new_tokens=2, stop_tokens=[1.5])
    with pytest.raises(TypeError, match="stop must be a string or a sequence of strings"):
        specdec.generate(text_model, [1, 2], max_new_tokens=2, stop=5)
    with pytest.raises(ValueError, match="stop string '\\\\ud800' is not valid Unicode"):
        specdec.generate(text_model, [1, 2], max_new_tokens=2, stop=["\ud800"])
    g = specdec.generate(text_model, [1, 2], max_new_tokens=2, stop_tokens=np.array([3, 4]))
    assert len(g.tokens) <= 2


@pytest.mark.parametrize("bad", [3.7, "64", True, np.bool_(True)])
def test_new_cache_needs_an_integer(model, bad):
    with pytest.raises(TypeError, match="n_slots must be an integer"):
        model.new_cache(bad)
    assert model.new_cache(np.int64(8)).capacity == 8


@pytest.mark.parametrize("prompt", [b"hello", bytearray(b"hello"), memoryview(b"hello")])
def test_byte_prompts_are_refused(model, prompt):
    with pytest.raises(TypeError, match="prompt must be .* token ids, got"):
        specdec.generate(model, prompt, max_new_tokens=1)
    ids = np.array([1, 2, 3], dtype=np.int32)  # a view of integers is token ids
    assert specdec.generate(model, memoryview(ids), max_new_tokens=2).tokens == \
        specdec.generate(model, ids, max_new_tokens=2).tokens


# ---------------------------------------------------------------------------------------------
# Integers a C int cannot hold
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("make, match", [
    (lambda m: specdec.generate(m, [1], max_new_tokens=2**31),
     r"max_new_tokens must be in \[0, 2147483647\], got 2147483648"),
    (lambda m: specdec.generate(m, [1], max_new_tokens=2**64), r"max_new_tokens must be in"),
    (lambda m: specdec.generate(m, [1], max_new_tokens=-2**40), r"max_new_tokens must be in"),
    (lambda m: specdec.generate(m, [1], top_k=2**40),
     r"top_k must be in \[0, 2147483647\], got 1099511627776"),
    (lambda m: specdec.LayerSkip(2**40), r"layers must be in \[1, 2147483647\]"),
    (lambda m: specdec.PromptLookup(k=2**40), r"k must be in \[1, 32\], got 1099511627776"),
    (lambda m: specdec.TokenRecycling(top=2**40), r"top must be in \[1, 2147483647\]"),
    (lambda m: specdec.TokenRecycling(widths=(4, 2**40)), r"widths must be in"),
    (lambda m: m.new_cache(2**40), r"n_slots must be in \[1, 64\], got 1099511627776"),
    (lambda m: setattr(m, "prefix_cache", 2**40),
     r"prefix_cache must be in \[0, 64\], got 1099511627776"),
    (lambda m: setattr(m, "threads", 2**40), r"threads must be in \[1, 1024\], got 1099511627776"),
    (lambda m: setattr(m, "max_sequences", 2**31),
     r"max_sequences must be in \[0, 2147483647\], got 2147483648"),
    (lambda m: specdec.dummy.synthetic_speculation(m, [1, 2], alpha=0.5, k=2**40),
     r"k must be in \[1, 32\], got 1099511627776"),
    (lambda m: specdec.dummy.synthetic_speculation(m, [1, 2], alpha=0.5, k=2, seed=-1),
     r"seed must be in \[0, 2\*\*64\), got -1"),
    (lambda m: m.llamacpp_logits([1, 2], n_batch=2**40), r"n_batch must be in \[1, 2147483647\]"),
])
def test_integers_too_big_for_c(model, make, match):
    with pytest.raises(ValueError, match=match):
        make(model)
    assert model.threads == 1 and model.max_sequences == 0


def test_cache_and_forward_integers_name_themselves(model):
    """The KV cache's methods and forward's n_logits convert in the extension itself: a value a C
    int cannot hold is a ValueError naming the argument (it was a bare OverflowError, or a message
    quoting a clamped value), a float a TypeError naming it."""
    cache = model.new_cache(8)
    model.forward(cache, [1, 2, 3])
    with pytest.raises(ValueError, match=r"n 1099511627776 is out of range"):
        cache.rollback(2**40)
    with pytest.raises(TypeError, match=r"n must be an integer, got 1.5"):
        cache.rollback(1.5)
    with pytest.raises(ValueError, match=r"dst -1099511627776 is out of range"):
        cache.copy_slot(-2**40, 0)
    with pytest.raises(TypeError, match=r"src must be an integer"):
        cache.copy_slot(0, True)
    cache.rollback(np.int64(2))
    assert cache.length == 2
    with pytest.raises(ValueError, match=r"n_logits 1099511627776 is out of range"):
        model.forward(model.new_cache(8), [1, 2], n_logits=2**40)


@pytest.mark.parametrize("kw, name", [(dict(positions=[0.0, 1.0]), "positions"),
                                      (dict(slots=[0.0, 1.0]), "slots")])
def test_positions_and_slots_are_integers_not_token_ids(model, kw, name):
    with pytest.raises(TypeError, match=rf"{name} must be integers, got .*float64 values"):
        model.forward(model.new_cache(8), [1, 2], **kw)
    with pytest.raises(ValueError, match=rf"{name}: value 2147483648 at index 0 is out of range"):
        model.forward(model.new_cache(8), [1, 2], **{name: [2**31, 0]})


# ---------------------------------------------------------------------------------------------
# NumPy scalars
# ---------------------------------------------------------------------------------------------


def test_numpy_scalars_are_numbers(model):
    want = specdec.generate(model, [1, 2], max_new_tokens=4, temperature=0.5, top_k=5,
                            seed=7).tokens
    got = specdec.generate(model, [1, 2], max_new_tokens=np.int64(4),
                           temperature=np.float32(0.5), top_k=np.int32(5),
                           seed=np.uint64(7)).tokens
    assert got == want
    t = specdec.TokenRecycling(widths=np.array([4, 2]), top=np.int16(4))
    assert t.widths == (4, 2) and all(type(w) is int for w in t.widths)
    assert specdec.PromptLookup(k=np.int64(4), verify_slope=np.float32(0.1)).k == 4


@pytest.mark.parametrize("kw, match", [
    ({"max_new_tokens": np.bool_(True)}, "max_new_tokens must be an integer"),
    ({"top_k": True}, "top_k must be an integer"),
    ({"temperature": np.bool_(True)}, "temperature must be a number"),
    ({"top_p": False}, "top_p must be a number"),
    ({"seed": np.bool_(False)}, "seed must be an integer"),
])
def test_bools_are_not_numbers(model, kw, match):
    with pytest.raises(TypeError, match=match):
        specdec.generate(model, [1, 2], **kw)


# ---------------------------------------------------------------------------------------------
# Chat templates that fail
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("template", [
    "{% macro f(x) %}{{ f(x) }}{% endmacro %}{{ f(1) }}",
    "{% for i in range(10**8) %}{% endfor %}",
])
def test_chat_template_failures_are_wrapped(meta, template):
    tok = Tokenizer.from_gguf_metadata(dict(meta, **{"tokenizer.chat_template": template}))
    with pytest.raises(ValueError, match="the chat template failed"):
        tok.apply_chat_template([{"role": "user", "content": "hi"}])


# ---------------------------------------------------------------------------------------------
# forward masks
# ---------------------------------------------------------------------------------------------


def test_forward_mask(model):
    causal = np.tril(np.ones((3, 3), dtype=bool))
    want = model.forward(model.new_cache(8), [1, 2, 3], mask=causal)
    got = model.forward(model.new_cache(8), [1, 2, 3], mask=causal.astype(np.int64))
    np.testing.assert_array_equal(got, want)
    with pytest.raises(ValueError, match=r"mask must be a 2-D bool array .*got shape \(3,\)"):
        model.forward(model.new_cache(8), [1, 2, 3], mask=np.ones(3, dtype=bool))
    with pytest.raises(TypeError, match="mask must be a bool array .*got dtype float64"):
        model.forward(model.new_cache(8), [1, 2, 3], mask=causal.astype(float))
    with pytest.raises(ValueError, match="mask must hold only 0 and 1"):
        model.forward(model.new_cache(8), [1, 2, 3], mask=causal * 2)


# ---------------------------------------------------------------------------------------------
# python -m specdec.bench --data
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("lines, match", [
    (['{"category": "qa", "turns": ["hi"]}', '{"turns": 5}'], r"q\.jsonl:2: every line needs"),
    (['{"category": "qa", "turns": ["hi"]}', "", "not json"], r"q\.jsonl:3: not a JSON object"),
    (["[1, 2]"], r"q\.jsonl:1: not a JSON object"),
    (['{"category": "qa", "turns": []}'], r"q\.jsonl:1: every line needs"),
    ([], r"q\.jsonl holds no questions"),
])
def test_bench_bad_data(tmp_path, capsys, lines, match):
    data = tmp_path / "q.jsonl"
    data.write_text("\n".join(lines))
    with pytest.raises(SystemExit) as e:
        bench.main(["--data", str(data), "--model", str(tmp_path / "no.gguf")])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "--data" in err and re.search(match, err)


def test_bench_missing_file_and_unknown_method(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        bench.main(["--data", str(tmp_path / "none.jsonl")])
    assert e.value.code == 2 and "--data: cannot read" in capsys.readouterr().err
    data = tmp_path / "q.jsonl"
    data.write_text(json.dumps({"category": "qa", "turns": ["hi"]}))
    with pytest.raises(SystemExit) as e:
        bench.main(["--data", str(data), "--methods", "lookup,bogus"])
    assert e.value.code == 2 and "unknown method 'bogus'" in capsys.readouterr().err


def test_a_directory_without_head_files_says_what_it_lacks(tmp_path):
    for make in (specdec.Eagle, specdec.Medusa):
        with pytest.raises(OSError, match="holds no head: neither medusa_lm_head.safetensors"):
            make(str(tmp_path))
