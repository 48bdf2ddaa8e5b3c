"""Tests of specdec.tokenizer: GGUF-metadata and Hugging Face tokenizers, encode/decode, the
end-of-generation set, chat templates and errors.

Everything runs on tiny tokenizers (a byte-level BPE trained with `tokenizers` on a few
sentences and written into a metadata dict exactly as GGUF stores it, from helpers.py; a
hand-built SentencePiece-style vocabulary). Incremental decoding (what stream() yields) is
checked against decode() of the whole output. The real SmolLM2 tests need the GGUF file (the
smollm2_path fixture in conftest.py: $SPECDEC_SMOLLM2_GGUF, or specdec's alias resolution) and
are skipped without it (they fail instead when SPECDEC_REQUIRE names smollm2); the comparison
with llama.cpp's own tokenization reads tests/fixtures/smollm2_llamacpp.json, which is committed
with the tests, so its absence is a failure.
"""

from __future__ import annotations

import itertools
import json
import struct
import time
from pathlib import Path

import numpy as np
import pytest
import tokenizers
from tokenizers import AddedToken, decoders, models, pre_tokenizers

from helpers import CHATML, CORPUS, USER_TOKEN, gguf_meta, sentencepiece_meta, train_bpe
from specdec.tokenizer import (
    SUPPORTED_GGUF_PRE, Tokenizer, tokenizer_from_gguf_metadata,
)

# ---------------------------------------------------------------------------------------------
# The tiny byte-level BPE of helpers.py, stored the way a GGUF file stores it
# ---------------------------------------------------------------------------------------------

TRICKY = [
    "", "a", "Hello world", "12345", " 42", "x=1,000,000", "3.14159", "  double  spaces",
    "trailing   ", "\n", "line1\nline2\n\n\nline3", "tab\there\t\t", "a\r\nb", "don't", "I'M",
    "they'll we've you're I'd", "Caf\u00e9 na\u00efve", "\u4f60\u597d\uff0c\u4e16\u754c",
    "\U0001F642\U0001F916 emoji", "\U0001F44D\U0001F3FD\U0001F1FA\U0001F1F8", "\u00a0nbsp\u3000",
    "\u00bd \u00b2 \u0663 \u2160", "e\u0301", "<|im_start|>user\nhi<|im_end|>", "a<|im_end|>b",
    "<|im_start", "< |im_end| >", "code: {\"k\": [1, 2]}",
]


@pytest.fixture(scope="module")
def hf_bpe() -> tokenizers.Tokenizer:
    return train_bpe()


@pytest.fixture(scope="module")
def meta(hf_bpe) -> dict:
    return gguf_meta(hf_bpe)


@pytest.fixture(scope="module")
def tok(meta) -> Tokenizer:
    return Tokenizer.from_gguf_metadata(meta)


def with_tokens(meta: dict, extra: list[tuple[str, int]], **kw) -> dict:
    """`meta` with tokens (text, type) appended (merges untouched) and keys replaced."""
    m = dict(meta)
    m["tokenizer.ggml.tokens"] = list(meta["tokenizer.ggml.tokens"]) + [t for t, _ in extra]
    m["tokenizer.ggml.token_type"] = list(meta["tokenizer.ggml.token_type"]) + [y for _, y in extra]
    m.update(kw)
    return m


# ---------------------------------------------------------------------------------------------
# Byte-level BPE from GGUF metadata
# ---------------------------------------------------------------------------------------------


def test_properties(tok, meta):
    toks = meta["tokenizer.ggml.tokens"]
    assert tok.vocab_size == len(toks)
    assert list(tok.tokens) == toks
    assert tok.bos_id == 1 and tok.eos_id == 2
    assert tok.add_bos is False
    assert tok.chat_template == CHATML
    assert tok.token_type(1) == 3 and tok.token_type(toks.index(USER_TOKEN)) == 4
    assert tok.special_ids == {0, 1, 2, 3}
    assert "smollm" in repr(tok)


def test_matches_huggingface_pipeline(tok, hf_bpe):
    """The GGUF-built tokenizer encodes as the Hugging Face tokenizer it came from (SmolLM2's
    tokenizer.json pipeline: Digits(individual) + ByteLevel, specials as added tokens)."""
    for text in TRICKY + CORPUS[:6]:
        assert tok.encode(text) == hf_bpe.encode(text).ids, text


@pytest.mark.parametrize("text", TRICKY)
def test_roundtrip(tok, text):
    ids = tok.encode(text)
    assert all(isinstance(i, int) for i in ids)
    assert tok.decode(ids) == text
    assert b"".join(tok.token_to_piece(i) for i in ids) == text.encode("utf-8")
    plain = tok.encode(text, parse_special=False)
    assert tok.decode(plain) == text


def test_digits_split_singly(tok):
    toks = tok.tokens
    ids = tok.encode("12345")
    assert [toks[i] for i in ids] == ["1", "2", "3", "4", "5"]
    # the space before a number stays a token of its own ("Ġ"), as llama.cpp's smollm splits
    assert [toks[i] for i in tok.encode("in 2024")][-5:] == ["\u0120", "2", "0", "2", "4"]


def test_special_tokens_parsed(tok, meta):
    toks = meta["tokenizer.ggml.tokens"]
    im_start, im_end = toks.index("<|im_start|>"), toks.index("<|im_end|>")
    ids = tok.encode("<|im_start|>user\nhi<|im_end|>")
    assert ids[0] == im_start and ids[-1] == im_end
    assert im_start not in ids[1:-1] and im_end not in ids[1:-1]
    plain = tok.encode("<|im_start|>user\nhi<|im_end|>", parse_special=False)
    assert im_start not in plain and im_end not in plain and len(plain) > len(ids)
    # parse_special=False does not stick
    assert tok.encode("<|im_end|>") == [im_end]
    # user-defined tokens are matched either way (as llama.cpp does)
    user = toks.index(USER_TOKEN)
    for parse in (True, False):
        assert tok.encode(f"call {USER_TOKEN} now", parse_special=parse).count(user) == 1


def test_decode_multibyte_and_streaming(tok):
    text = "\U0001F916 \u4f60\u597d \u00e9"
    ids = tok.encode(text)
    pieces = [tok.token_to_piece(i) for i in ids]
    assert any(len(p) and not _is_utf8(p) for p in pieces)  # some piece splits a character
    assert tok.decode(ids) == text
    # an incomplete trailing character never raises
    cut = tok.encode("\U0001F916")
    assert len(cut) > 1
    assert tok.decode(cut[:-1]) == "\ufffd" * len(
        b"".join(tok.token_to_piece(i) for i in cut[:-1]).decode("utf-8", "replace"))
    assert "\ufffd" in tok.decode(cut[:-1])
    # incremental UTF-8 decoding of the pieces gives the text
    import codecs
    dec = codecs.getincrementaldecoder("utf-8")()
    assert "".join(dec.decode(p) for p in pieces) + dec.decode(b"", final=True) == text


def _is_utf8(b: bytes) -> bool:
    try:
        b.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


def test_decode_skip_special(tok):
    ids = tok.encode("<|im_start|>user\nhi<|im_end|>")
    assert tok.decode(ids, skip_special=True) == "user\nhi"
    assert tok.token_to_piece(ids[0]) == b"<|im_start|>"
    assert tok.token_to_piece(ids[0], skip_special=True) == b""
    user = tok.encode(USER_TOKEN)
    assert tok.decode(user, skip_special=True) == USER_TOKEN  # user-defined: always rendered


def test_add_special(meta, tok):
    assert tok.encode("hi", add_special=True) == tok.encode("hi")
    t = Tokenizer.from_gguf_metadata(dict(meta, **{"tokenizer.ggml.add_bos_token": True}))
    assert t.add_bos is True
    assert t.encode("hi", add_special=True) == [1] + tok.encode("hi")
    assert t.encode("", add_special=True) == [1]
    assert t.decode(t.encode("hi", add_special=True), skip_special=True) == "hi"
    t = Tokenizer.from_gguf_metadata(dict(meta, **{"tokenizer.ggml.add_eos_token": True}))
    assert t.encode("hi", add_special=True) == tok.encode("hi") + [2]


def test_eog_ids(tok, meta):
    toks = meta["tokenizer.ggml.tokens"]
    # eos (<|im_end|>), <|endoftext|>, and <reponame> (a FIM repo token: llama.cpp ends there)
    assert tok.eog_ids == {toks.index("<|im_end|>"), toks.index("<|endoftext|>"),
                           toks.index("<reponame>")}
    n = len(toks)
    m = with_tokens(meta, [("<|eot_id|>", 1), ("<|eom_id|>", 3), ("<|fim_prefix|>", 1),
                           ("<|file_sep|>", 3)])
    t = Tokenizer.from_gguf_metadata(m)
    assert t.eog_ids == tok.eog_ids | {n, n + 1, n + 3}
    # a control-looking token stored as normal becomes control (llama.cpp overrides it)
    assert t.token_type(n) == 3 and n in t.special_ids and t.encode("<|eot_id|>") == [n]
    assert t.token_type(n + 2) == 3 and n + 2 not in t.eog_ids  # FIM prefix: control, not EOG
    # ids given in metadata win over detection
    t = Tokenizer.from_gguf_metadata(dict(m, **{"tokenizer.ggml.eot_token_id": 1}))
    assert 1 in t.eog_ids
    # gpt-oss style: <|end|> is not EOG when <|return|> and <|call|> are there
    t = Tokenizer.from_gguf_metadata(with_tokens(meta, [("<|end|>", 3)]))
    assert n in t.eog_ids
    t = Tokenizer.from_gguf_metadata(with_tokens(meta, [("<|end|>", 3), ("<|return|>", 3),
                                                        ("<|call|>", 3)]))
    assert n not in t.eog_ids and {n + 1, n + 2} <= t.eog_ids and t.token_type(n) == 4


def test_empty_token_text_and_duplicates(meta):
    m = with_tokens(meta, [("", 1)])
    t = Tokenizer.from_gguf_metadata(m)
    assert t.tokens[-1] == f"[EMPTY_{t.vocab_size - 1}]"  # llama.cpp's placeholder
    with pytest.raises(ValueError, match="duplicate token"):
        Tokenizer.from_gguf_metadata(with_tokens(meta, [("<|im_end|>", 3)]))


# ---- other pre-tokenizers ----------------------------------------------------------------------

DIGITS = ["1", "2", "3", "4", "5", "12", "123", "45", "12345"]


@pytest.fixture(scope="module")
def digit_meta() -> dict:
    """A vocabulary of the 256 byte characters, multi-digit tokens with merges, and "xyz" (in
    the vocabulary, reachable by no merge)."""
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    # U+0663 U+0664 (Arabic-Indic digits, \p{N}) are "\u00d9\u00a3" "\u00d9\u00a4" byte-level
    tokens = ["<|endoftext|>"] + sorted(alphabet) + ["12", "123", "45", "12345", "xyz",
                                                     "\u00d9\u00a3", "\u00d9\u00a4",
                                                     "\u00d9\u00a3\u00d9\u00a4"]
    return {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": [3] + [1] * (len(tokens) - 1),
        "tokenizer.ggml.merges": ["1 2", "12 3", "4 5", "123 45", "\u00d9 \u00a3", "\u00d9 \u00a4",
                                  "\u00d9\u00a3 \u00d9\u00a4"],
        "tokenizer.ggml.bos_token_id": 0,
        "tokenizer.ggml.eos_token_id": 0,
    }


@pytest.mark.parametrize("pre,expect", [
    ("smollm", ["1", "2", "3", "4", "5"]),      # every digit alone
    ("qwen2", ["1", "2", "3", "4", "5"]),       # \p{N} one at a time
    ("gpt-2", ["12345"]),                      # ?\p{N}+
    ("gpt2", ["12345"]),
    ("llama3", ["123", "45"]),                 # \p{N}{1,3}
    ("llama-bpe", ["123", "45"]),
    ("default", ["123", "45"]),                # \p{N}+ then [0-9][0-9][0-9]
    (None, ["123", "45"]),                     # missing = default
])
def test_pre_tokenizers_digits(digit_meta, pre, expect):
    m = dict(digit_meta)
    if pre is not None:
        m["tokenizer.ggml.pre"] = pre
    t = Tokenizer.from_gguf_metadata(m)
    ids = t.encode("12345")
    assert [t.tokens[i] for i in ids] == expect
    assert t.decode(ids) == "12345"
    ids = t.encode("\u0663\u0664")
    assert len(ids) == (2 if pre in ("smollm", "qwen2") else 1)
    assert t.decode(ids) == "\u0663\u0664"


@pytest.mark.parametrize("pre,one_token", [("llama3", True), ("gpt-2", False), ("qwen2", False)])
def test_ignore_merges(digit_meta, pre, one_token):
    """Llama-3 vocabularies take a whole pre-token that is in the vocabulary as one token."""
    t = Tokenizer.from_gguf_metadata(dict(digit_meta, **{"tokenizer.ggml.pre": pre}))
    assert (t.encode("xyz") == [t.tokens.index("xyz")]) is one_token


def test_llama3_and_qwen2_splits(digit_meta):
    """Case-insensitive contractions and newline runs of the Llama-3/Qwen2 regexes."""
    def pieces(pre, text):
        t = Tokenizer.from_gguf_metadata(dict(digit_meta, **{"tokenizer.ggml.pre": pre}))
        ids = t.encode(text)
        assert t.decode(ids, clean_spaces=False) == text
        return [t.token_to_piece(i) for i in ids]

    # no merges between letters here: the pieces are single bytes, so look at the defaults
    t3 = Tokenizer.from_gguf_metadata(dict(digit_meta, **{"tokenizer.ggml.pre": "llama3"}))
    assert t3.add_bos is True  # llama.cpp's default for llama3 when the key is absent
    assert pieces("llama3", "I'M") == [b"I", b"'", b"M"]
    assert pieces("qwen2", "a\n\nb") == [b"a", b"\n", b"\n", b"b"]


def test_clean_spaces(digit_meta):
    """llama.cpp's detokenize clean-up is on for GPT-2-style vocabularies, off for smollm."""
    text = "Hi , there . It 's a ' quote ' !"
    g = Tokenizer.from_gguf_metadata(dict(digit_meta, **{"tokenizer.ggml.pre": "gpt-2"}))
    s = Tokenizer.from_gguf_metadata(dict(digit_meta, **{"tokenizer.ggml.pre": "smollm"}))
    assert g.decode(g.encode(text)) == "Hi, there. It's a'quote '!"
    assert g.decode(g.encode(text), clean_spaces=False) == text
    assert s.decode(s.encode(text)) == text


# ---------------------------------------------------------------------------------------------
# SentencePiece-style ("llama") vocabularies
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def spm_meta() -> dict:
    return sentencepiece_meta()


def test_spm(spm_meta):
    t = Tokenizer.from_gguf_metadata(spm_meta)
    toks = t.tokens
    assert t.add_bos is True and t.eog_ids == {2}
    ids = t.encode("hello world")
    assert [toks[i] for i in ids] == ["\u2581hello", "\u2581world"]
    assert t.encode("hello world", add_special=True) == [1] + ids
    assert t.decode(ids) == "hello world"  # the prefix space of the first token goes
    # byte fallback for characters outside the vocabulary
    ids = t.encode("hello \U0001F642")
    assert [toks[i] for i in ids] == ["\u2581hello", "\u2581", "<0xF0>", "<0x9F>", "<0x99>",
                                      "<0x82>"]
    assert t.decode(ids) == "hello \U0001F642"
    assert t.token_to_piece(ids[2]) == b"\xf0"
    # special tokens; the text after one gets the prefix space again (as llama.cpp does)
    ids = t.encode("hello</s>world")
    assert [toks[i] for i in ids] == ["\u2581hello", "</s>", "\u2581world"]
    ids = t.encode("hello<|user|>world", parse_special=False)
    assert [toks[i] for i in ids] == ["\u2581hello", "<|user|>", "\u2581world"]
    assert t.decode([1] + t.encode("hello"), skip_special=True) == " hello"  # llama.cpp keeps it
    assert t.decode(t.encode("hello world", add_special=True)) == "<s> hello world"


def test_spm_without_byte_tokens_uses_unk(spm_meta):
    m = dict(spm_meta)
    keep = [i for i, y in enumerate(m["tokenizer.ggml.token_type"]) if y != 6]
    for k in ("tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type"):
        m[k] = [spm_meta[k][i] for i in keep]
    t = Tokenizer.from_gguf_metadata(m)
    assert t.encode("hello \u4f60\u597d")[-1] == 0


# ---------------------------------------------------------------------------------------------
# Incremental decoding (what stream() yields): the pieces join to decode() of all the ids
# ---------------------------------------------------------------------------------------------


def pushed(t: Tokenizer, ids: list) -> tuple[list, str]:
    """The text each push of an incremental decoder returned, and its flush."""
    dec = t.incremental_decoder()
    return [dec.push(i) for i in ids], dec.flush()


def assert_joins(t: Tokenizer, ids: list) -> list:
    """The pushes and the flush join to decode(ids); after every push, the pushes so far and
    pending() (which changes nothing) join to decode() of the ids so far."""
    dec = t.incremental_decoder()
    pieces = []
    for k, i in enumerate(ids):
        pieces.append(dec.push(i))
        assert "".join(pieces) + dec.pending() == t.decode(ids[:k + 1]), ids[:k + 1]
    rest = dec.flush()
    assert "".join(pieces) + rest == t.decode(ids), ids
    assert pushed(t, ids) == (pieces, rest)  # pending() left the decoder as it was
    return pieces


@pytest.fixture(scope="module")
def decoders_(meta, spm_meta) -> dict:
    """Byte-level BPE without and with llama.cpp's space clean-up, SentencePiece with byte
    fallback and a dropped first space."""
    return {"bytelevel": Tokenizer.from_gguf_metadata(meta),
            "bytelevel-clean": Tokenizer.from_gguf_metadata(dict(meta, **{
                "tokenizer.ggml.pre": "gpt-2"})),
            "spm": Tokenizer.from_gguf_metadata(spm_meta)}


@pytest.mark.parametrize("kind", ["bytelevel", "bytelevel-clean", "spm"])
def test_incremental_decoding_of_texts(decoders_, kind):
    t = decoders_[kind]
    for text in TRICKY + CORPUS[:6] + ["Hi , there . It 's a ' quote ' ! don 't , they 're"]:
        assert_joins(t, t.encode(text))


@pytest.mark.parametrize("kind", ["bytelevel", "bytelevel-clean", "spm"])
def test_incremental_decoding_of_random_ids(decoders_, kind):
    """Ids as a random model emits them: any token after any other (control tokens, lone bytes
    of multi-byte characters, spaces before punctuation and quotes)."""
    t = decoders_[kind]
    rng = np.random.default_rng(3)
    tokens = t.tokens
    # tokens the clean-up reads (spaces, quotes, punctuation, s/m/re/ve) drawn more often
    hot = [i for i, x in enumerate(tokens) if x.strip("\u0120\u2581 '?!.,smrev") == ""
           and x] or [0]
    for n in range(400):
        k = int(rng.integers(1, 40))
        ids = [int(i) for i in rng.integers(0, t.vocab_size, k)]
        for j in range(k):
            if rng.random() < 0.5:
                ids[j] = hot[int(rng.integers(len(hot)))]
        assert_joins(t, ids)


def test_incremental_decoding_cuts_the_clean_up_nowhere_wrong(decoders_):
    """Every text of up to 5 characters over space, quote, period and r e s x, one token per
    character, so that every rule of the clean-up (" ." " ' " " 's" " 're") is split at every
    place it can be split."""
    t = decoders_["bytelevel-clean"]
    one = {c: t.tokens.index("\u0120" if c == " " else c) for c in " '.resx"}
    for n in range(1, 6):
        for text in itertools.product(" '.resx", repeat=n):
            assert_joins(t, [one[c] for c in text])


def test_incremental_decoding_holds_a_split_character(tok):
    """A character whose UTF-8 bytes span tokens comes out whole, with the push of its last
    token; no push returns half a character."""
    text = "\U0001F916 \u4f60\u597d \u00e9"
    ids = tok.encode(text)
    pieces = assert_joins(tok, ids)
    partial = [i for i in ids if not _is_utf8(tok.token_to_piece(i))]
    assert partial, "the text must split a character across tokens"
    assert "\ufffd" not in "".join(pieces)
    assert "".join(pieces) + pushed(tok, ids)[1] == text


def test_incremental_decoding_byte_fallback_and_leading_space(spm_meta):
    """SentencePiece: the first token's space is dropped, as decode() drops it (not that of
    later tokens); a character out of the vocabulary comes as four byte tokens."""
    t = Tokenizer.from_gguf_metadata(spm_meta)
    ids = t.encode("hello \U0001F642 world")
    assert [t.tokens[i] for i in ids] == ["\u2581hello", "\u2581", "<0xF0>", "<0x9F>", "<0x99>",
                                          "<0x82>", "\u2581world"]
    pieces, rest = pushed(t, ids)
    assert "".join(pieces) + rest == "hello \U0001F642 world" == t.decode(ids)
    assert pieces[2:5] == ["", "", ""]  # the first three bytes of the emoji wait for the fourth
    assert not pieces[0].startswith(" ")
    # a new decoder after flush() starts a new text: its first space goes again
    dec = t.incremental_decoder()
    assert dec.push(ids[0]) + dec.flush() == "hello"
    assert dec.push(ids[-1]) + dec.flush() == "world"


def test_incremental_decoding_with_the_space_clean_up(digit_meta):
    """llama.cpp's clean-up (" ." -> ".", " 's" -> "'s", " ' " -> "'") reads across token
    boundaries: decoding token by token and joining would be wrong, the decoder is not."""
    g = Tokenizer.from_gguf_metadata(dict(digit_meta, **{"tokenizer.ggml.pre": "gpt-2"}))
    text = "Hi , there . It 's a ' quote ' !"
    ids = g.encode(text)
    assert "".join(g.decode([i]) for i in ids) != g.decode(ids)
    pieces, rest = pushed(g, ids)
    assert "".join(pieces) + rest == "Hi, there. It's a'quote '!"


def test_incremental_decoding_reads_each_byte_once(decoders_, monkeypatch):
    """Linear work: over 2,000 tokens with the clean-up on (the path that holds bytes back),
    the bytes cleaned add up to the text's bytes and the held-back tail stays short
    (re-decoding everything at every token would read about 2,000 * 2,000 / 2 tokens)."""
    from specdec import tokenizer as tk

    t = decoders_["bytelevel-clean"]
    cleaned = []
    real = tk._clean_spaces
    monkeypatch.setattr(tk, "_clean_spaces", lambda data: cleaned.append(len(data)) or real(data))
    ids = (t.encode(" ".join(CORPUS)) * 20)[:2000]
    dec = t.incremental_decoder()
    longest = 0
    out = []
    for i in ids:
        out.append(dec.push(i))
        longest = max(longest, len(dec._buf))
    out.append(dec.flush())
    cleaned_by_push = sum(cleaned)
    assert "".join(out) == t.decode(ids)
    assert cleaned_by_push == sum(len(t.token_to_piece(i)) for i in ids) and longest < 64


def test_incremental_decoder_refuses_bad_ids(tok):
    dec = tok.incremental_decoder()
    with pytest.raises(ValueError, match="token id 100000 is out of range"):
        dec.push(100000)
    with pytest.raises(TypeError, match="a token id must be an int, got str"):
        dec.push("7")


# ---------------------------------------------------------------------------------------------
# Chat templates
# ---------------------------------------------------------------------------------------------


def test_chat_template(tok):
    msgs = [{"role": "user", "content": "Hi!"}]
    assert tok.apply_chat_template(msgs) == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n")
    assert tok.apply_chat_template(msgs, add_generation_prompt=False) == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\nHi!<|im_end|>\n")
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"},
            {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Bye"}]
    text = tok.apply_chat_template(msgs)
    assert text.startswith("<|im_start|>system\nBe brief.<|im_end|>\n") and "helpful" not in text
    assert text.endswith("<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n")
    ids = tok.encode(text, add_special=True)
    assert ids.count(tok.tokens.index("<|im_start|>")) == 5
    assert tok.decode(ids) == text


def test_chat_template_features(meta):
    tpl = ("{{ bos_token }}|{{ eos_token }}|{{ messages[0]['content'] | tojson }}|{{ x }}|"
           "{% for m in messages %}{% if m['role'] == 'bad' %}{{ raise_exception('no bad') }}"
           "{% endif %}{% endfor %}{{ tools is none }}|{% generation %}gen{% endgeneration %}\n"
           "  {% if true %}\n    trimmed\n  {% endif %}\n")
    t = Tokenizer.from_gguf_metadata(dict(meta, **{"tokenizer.chat_template": tpl}))
    out = t.apply_chat_template([{"role": "user", "content": "caf\u00e9 \"q\" <b>"}], x=7)
    assert out == '<|im_start|>|<|im_end|>|"caf\u00e9 \\"q\\" <b>"|7|True|gen    trimmed\n'
    with pytest.raises(ValueError, match="no bad"):
        t.apply_chat_template([{"role": "bad", "content": ""}])
    # the sandbox is immutable
    t = Tokenizer.from_gguf_metadata(dict(meta, **{
        "tokenizer.chat_template": "{% set _ = messages.append(1) %}"}))
    with pytest.raises(Exception):
        t.apply_chat_template([{"role": "user", "content": "x"}])


def test_chat_template_errors(meta, tok):
    m = dict(meta)
    del m["tokenizer.chat_template"]
    t = Tokenizer.from_gguf_metadata(m)
    assert t.chat_template is None
    with pytest.raises(ValueError, match="no chat template"):
        t.apply_chat_template([{"role": "user", "content": "hi"}])
    with pytest.raises(TypeError, match="list of dicts"):
        tok.apply_chat_template("hi")
    with pytest.raises(TypeError, match="list of dicts"):
        tok.apply_chat_template({"role": "user", "content": "hi"})
    with pytest.raises(TypeError, match=r"messages\[1\] must be a dict"):
        tok.apply_chat_template([{"role": "user", "content": "hi"}, "oops"])
    with pytest.raises(ValueError, match=r"messages\[0\] has no 'role'"):
        tok.apply_chat_template([{"content": "hi"}])
    with pytest.raises(ValueError, match=r"messages\[0\]\['role'\] must be a non-empty string"):
        tok.apply_chat_template([{"role": 3, "content": "hi"}])
    with pytest.raises(ValueError, match=r"has no 'content'"):
        tok.apply_chat_template([{"role": "user"}])
    with pytest.raises(ValueError, match=r"messages\[0\]\['content'\] must be a string, got int"):
        tok.apply_chat_template([{"role": "user", "content": 5}])
    bad = Tokenizer.from_gguf_metadata(dict(meta, **{"tokenizer.chat_template": "{% if %}"}))
    with pytest.raises(ValueError, match="not valid Jinja"):
        bad.apply_chat_template([{"role": "user", "content": "hi"}])


# ---------------------------------------------------------------------------------------------
# Errors and missing tokenizers
# ---------------------------------------------------------------------------------------------


def test_unsupported(meta):
    with pytest.raises(ValueError, match=r"unsupported GGUF pre-tokenizer 'tekken'.*smollm"):
        Tokenizer.from_gguf_metadata(dict(meta, **{"tokenizer.ggml.pre": "tekken"}))
    with pytest.raises(ValueError, match=r"unsupported GGUF tokenizer model 'bert'.*gpt2, llama"):
        Tokenizer.from_gguf_metadata(dict(meta, **{"tokenizer.ggml.model": "bert"}))
    assert "smollm" in SUPPORTED_GGUF_PRE and "qwen2" in SUPPORTED_GGUF_PRE


def test_missing_tokenizer(meta):
    assert tokenizer_from_gguf_metadata({"general.architecture": "llama"}) is None
    assert tokenizer_from_gguf_metadata(dict(meta, **{"tokenizer.ggml.model": "none"})) is None
    m = dict(meta)
    del m["tokenizer.ggml.merges"]
    assert tokenizer_from_gguf_metadata(m) is None
    with pytest.raises(ValueError, match="'tokenizer.ggml.merges' is missing"):
        Tokenizer.from_gguf_metadata(m)
    with pytest.raises(ValueError, match="no tokenizer"):
        Tokenizer.from_gguf_metadata({})
    assert isinstance(tokenizer_from_gguf_metadata(meta), Tokenizer)


def test_malformed_metadata(meta):
    with pytest.raises(ValueError, match="must be an array"):
        Tokenizer.from_gguf_metadata(dict(meta, **{"tokenizer.ggml.tokens": "abc"}))
    with pytest.raises(ValueError, match="must be a string"):
        Tokenizer.from_gguf_metadata(dict(meta, **{"tokenizer.ggml.tokens": [1, 2]}))
    with pytest.raises(ValueError, match="token_type' has 2 entries"):
        Tokenizer.from_gguf_metadata(dict(meta, **{"tokenizer.ggml.token_type": [1, 1]}))
    with pytest.raises(ValueError, match="not of the form 'a b'"):
        Tokenizer.from_gguf_metadata(dict(meta, **{"tokenizer.ggml.merges": ["ab"]}))
    with pytest.raises(ValueError, match="cannot build"):
        Tokenizer.from_gguf_metadata(dict(meta, **{"tokenizer.ggml.merges": ["qq zz"]}))
    with pytest.raises(TypeError):
        Tokenizer.from_gguf_metadata([("tokenizer.ggml.model", "gpt2")])


def test_bad_ids_and_text(tok):
    with pytest.raises(ValueError, match="out of range"):
        tok.decode([tok.vocab_size])
    with pytest.raises(ValueError, match="out of range"):
        tok.token_to_piece(-1)
    with pytest.raises(TypeError):
        tok.decode([1.0])
    with pytest.raises(TypeError):
        tok.decode([True])
    with pytest.raises(TypeError):
        tok.encode(b"bytes")
    with pytest.raises(ValueError, match="not valid Unicode"):
        tok.encode("a\ud800b")
    import numpy as np
    assert tok.decode(np.array(tok.encode("hi"), dtype=np.int32)) == "hi"


def test_construction_is_cheap(meta):
    t0 = time.perf_counter()
    Tokenizer.from_gguf_metadata(meta)
    assert time.perf_counter() - t0 < 1.0


def test_threads(tok):
    from concurrent.futures import ThreadPoolExecutor
    texts = ["<|im_start|>user\nhi<|im_end|>"] * 64
    flags = [i % 2 == 0 for i in range(64)]
    want = {True: tok.encode(texts[0]), False: tok.encode(texts[0], parse_special=False)}
    with ThreadPoolExecutor(8) as ex:
        got = list(ex.map(lambda a: tok.encode(a[0], parse_special=a[1]), zip(texts, flags)))
    assert got == [want[f] for f in flags]


# ---------------------------------------------------------------------------------------------
# Hugging Face directories
# ---------------------------------------------------------------------------------------------


def test_hf_dir(tmp_path, hf_bpe):
    assert Tokenizer.from_hf_dir(tmp_path) is None
    with pytest.raises(FileNotFoundError):
        Tokenizer.from_hf_dir(tmp_path / "nope")
    hf_bpe.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": "<|im_start|>", "eos_token": {"content": "<|im_end|>", "special": True},
        "chat_template": CHATML, "clean_up_tokenization_spaces": False}))
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 3]}))
    t = Tokenizer.from_hf_dir(str(tmp_path))
    assert t.vocab_size == hf_bpe.get_vocab_size(with_added_tokens=True)
    assert t.bos_id == 1 and t.eos_id == 2 and t.add_bos is False
    assert t.eog_ids == {0, 2, 3}
    assert t.chat_template == CHATML
    for text in TRICKY:
        assert t.encode(text) == hf_bpe.encode(text).ids
        assert t.decode(t.encode(text)) == text
    assert t.decode(t.encode("<|im_start|>a<|im_end|>"), skip_special=True) == "a"
    assert t.apply_chat_template([{"role": "user", "content": "x"}]).endswith(
        "<|im_start|>assistant\n")
    # chat_template.jinja (newer transformers) wins; a list of named templates picks "default"
    (tmp_path / "chat_template.jinja").write_text("J{{ messages[0]['content'] }}")
    assert Tokenizer.from_hf_dir(tmp_path).apply_chat_template(
        [{"role": "user", "content": "x"}]) == "Jx"
    (tmp_path / "chat_template.jinja").unlink()
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": [
        {"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]}))
    t = Tokenizer.from_hf_dir(tmp_path)
    assert t.chat_template == "D" and t.eos_id == 2  # eos from generation_config.json


def test_hf_dir_spm_style(tmp_path, spm_meta):
    """A Llama-style tokenizer.json (BPE with byte fallback, Metaspace-style decoder) loaded
    from a directory decodes like the GGUF twin."""
    g = Tokenizer.from_gguf_metadata(spm_meta)
    hf = g._hf
    hf.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(),
                                    decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    hf.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": "<s>", "eos_token": "</s>", "add_bos_token": True}))
    t = Tokenizer.from_hf_dir(tmp_path)
    text = "hello world \U0001F642"
    assert t.add_bos is True and t.bos_id == 1
    assert t.encode(text, add_special=True) == g.encode(text, add_special=True)
    assert t.decode(t.encode(text)) == text == g.decode(g.encode(text))
    # tokenizer_config.json's add_bos_token / add_eos_token override the post-processor
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": "<s>", "eos_token": "</s>", "add_bos_token": False, "add_eos_token": True}))
    t = Tokenizer.from_hf_dir(tmp_path)
    assert t.add_bos is False
    assert t.encode(text, add_special=True) == g.encode(text) + [2]
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>"}))
    t = Tokenizer.from_hf_dir(tmp_path)
    assert t.add_bos is True and t.encode(text, add_special=True)[0] == 1


# ---------------------------------------------------------------------------------------------
# The real SmolLM2-135M-Instruct GGUF (skipped when it is not available)
# ---------------------------------------------------------------------------------------------

def read_gguf_metadata(path: str) -> dict:
    """GGUF header metadata only (key -> Python value; arrays as lists), read as a stream."""
    scalar = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
              10: "<Q", 11: "<q", 12: "<d"}
    with open(path, "rb") as f:
        def take(fmt):
            n = struct.calcsize(fmt)
            return struct.unpack(fmt, f.read(n))[0]

        def rstr():
            return f.read(take("<Q")).decode("utf-8")

        def rval(t):
            if t == 8:
                return rstr()
            if t == 9:
                et, n = take("<I"), take("<Q")
                if et in scalar:
                    size = struct.calcsize(scalar[et])
                    return list(struct.unpack(f"<{n}{scalar[et][1]}", f.read(n * size)))
                return [rval(et) for _ in range(n)]
            return take(scalar[t])

        assert f.read(4) == b"GGUF"
        take("<I")
        take("<Q")
        n_kv = take("<Q")
        meta = {}
        for _ in range(n_kv):
            k = rstr()
            meta[k] = rval(take("<I"))
    return meta


@pytest.fixture(scope="module")
def smollm2_meta(smollm2_path) -> dict:
    return read_gguf_metadata(smollm2_path)


@pytest.fixture(scope="module")
def smollm2(smollm2_meta) -> Tokenizer:
    return Tokenizer.from_gguf_metadata(smollm2_meta)


# ids agreed by this tokenizer, SmolLM2's own tokenizer.json pipeline (below) and a Python port
# of llama.cpp's smollm path; the llama.cpp fixture, when present, is the authority.
SMOLLM2_KNOWN = {
    "Hello world": [19556, 905],
    "12345": [33, 34, 35, 36, 37],
    "  double  spaces": [216, 5561, 216, 5600],
    "don't": [12420, 982],
    "<|im_start|>user\nhi<|im_end|>": [1, 4093, 198, 6004, 2],
}


def test_smollm2_tokenizer(smollm2_meta, smollm2):
    t0 = time.perf_counter()
    Tokenizer.from_gguf_metadata(smollm2_meta)
    assert time.perf_counter() - t0 < 2.0
    t = smollm2
    assert t.vocab_size == 49152 and t.bos_id == 1 and t.eos_id == 2 and t.add_bos is False
    # <|endoftext|>, <|im_end|>, and <reponame> (llama.cpp's FIM-repo detection)
    assert t.eog_ids == {0, 2, 4}
    for text, ids in SMOLLM2_KNOWN.items():
        assert t.encode(text) == ids, text
    for text in TRICKY:
        assert t.decode(t.encode(text)) == text
    prompt = t.apply_chat_template([{"role": "user", "content": "What is 2+2?"}])
    assert prompt == ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained "
                      "by Hugging Face<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
                      "<|im_start|>assistant\n")
    assert t.encode(prompt)[:1] == [1]


def test_smollm2_matches_hf_pipeline(smollm2_meta, smollm2):
    """SmolLM2's tokenizer.json: BPE + Sequence[Digits(individual), ByteLevel(use_regex)], the
    17 control tokens as special added tokens."""
    toks = smollm2_meta["tokenizer.ggml.tokens"]
    bpe = models.BPE(vocab={s: i for i, s in enumerate(toks)},
                     merges=[tuple(m.split(" ", 1)) for m in smollm2_meta["tokenizer.ggml.merges"]])
    hf = tokenizers.Tokenizer(bpe)
    hf.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    hf.add_special_tokens([AddedToken(toks[i], special=True, normalized=False)
                           for i, y in enumerate(smollm2_meta["tokenizer.ggml.token_type"])
                           if y == 3])
    for text in TRICKY + CORPUS[:6]:
        assert smollm2.encode(text) == hf.encode(text).ids, text


def test_smollm2_llamacpp_fixture(llamacpp_fx, smollm2):
    """llama.cpp's tokenizations of the fixture's prompts. The fixture is committed with the
    tests: without it this fails (llamacpp_fx is asked for first, so even where the model is
    missing and the test would skip)."""
    prompts = llamacpp_fx["prompts"]
    assert prompts
    for p in prompts:
        assert smollm2.encode(p["text"]) == p["tokens"], p.get("name", p["text"])


# ---- llama.cpp's gpt-4o pre-tokenizer (GPT-4o-style vocabularies: Phi-4, Llama 4) ---------------

PRETOK_GPT4O = Path(__file__).parent / "fixtures" / "pretokenizer_gpt_4o.json"


def _gpt4o_tokenizer() -> tuple[Tokenizer, dict]:
    fx = json.loads(PRETOK_GPT4O.read_text(encoding="utf-8"))
    meta = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": fx["pre"],
            "tokenizer.ggml.tokens": fx["tokens"],
            "tokenizer.ggml.token_type": [1] * len(fx["tokens"]),
            "tokenizer.ggml.merges": fx["merges"]}
    return Tokenizer.from_gguf_metadata(meta), fx


def test_gpt4o_pretokenizer_matches_llamacpp():
    """llama.cpp's token ids (tools/record_pretokenizer.py) for a byte-level vocabulary whose
    merges cross case, script and mark boundaries, so that every cut shows: the same ids here."""
    tok, fx = _gpt4o_tokenizer()
    assert "gpt-4o" in SUPPORTED_GGUF_PRE and "llama4" in SUPPORTED_GGUF_PRE
    for text, ids in fx["ids"].items():
        assert tok.encode(text, parse_special=False) == ids, text
        assert tok.decode(ids) == text


def test_gpt4o_tokenizer_json_expression_alone_would_fail(monkeypatch):
    """tokenizer.json's expression alone (without llama.cpp's look-ahead rewrite after it) cuts
    "ÉCOLE" and combining marks otherwise than llama.cpp: the fixture tells them apart."""
    from specdec import tokenizer as T

    monkeypatch.setitem(T._PRE, "gpt-4o", T._Pre((T._RE_GPT4O,), clean_spaces=False))
    tok, fx = _gpt4o_tokenizer()
    differ = [t for t, ids in fx["ids"].items() if tok.encode(t, parse_special=False) != ids]
    assert "ÉCOLE" in differ and "e\u0301" in differ
