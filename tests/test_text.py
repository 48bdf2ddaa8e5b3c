"""Text in, text out on a tiny random model that carries a real (tiny) byte-level BPE tokenizer
and chat template in its GGUF metadata: string and chat-message prompts, decoded output, stop
tokens and stop strings checked inside the C loop, and the errors of a tokenizer-less model."""

from __future__ import annotations

import pytest

import specdec
from helpers import write_text_model


@pytest.fixture(scope="module")
def text_model(tmp_path_factory):
    return write_text_model(tmp_path_factory.mktemp("text") / "tiny-with-tokenizer.gguf")


def test_tokenizer_comes_from_the_file(text_model):
    tok = text_model.tokenizer
    assert tok is not None and tok.vocab_size == text_model.config.vocab_size
    assert tok.decode(tok.encode("Hello world")) == "Hello world"


def test_string_and_chat_prompts(text_model):
    tok = text_model.tokenizer
    by_ids = specdec.generate(text_model, tok.encode("Hello world"), max_new_tokens=12,
                              stop_tokens=[])
    by_text = specdec.generate(text_model, "Hello world", max_new_tokens=12, stop_tokens=[])
    assert by_text.tokens == by_ids.tokens and by_text.prompt_tokens == by_ids.prompt_tokens
    assert by_text.text == tok.decode(by_text.tokens)
    msgs = [{"role": "user", "content": "hello there"}]
    chat = specdec.generate(text_model, msgs, max_new_tokens=5, stop_tokens=[])
    assert chat.prompt_tokens == tok.encode(tok.apply_chat_template(msgs))
    assert chat.prompt_tokens[0] == tok.encode("<|im_start|>")[0]


def test_stop_string_cuts_text_and_stops_early(text_model):
    full = specdec.generate(text_model, "The quick brown", max_new_tokens=40, stop_tokens=[])
    assert full.finish_reason == "length" and len(full.tokens) == 40
    # a stop string that first completes with the piece of token k
    k = 10
    tok = text_model.tokenizer
    prefix = tok.decode(full.tokens[:k])
    piece = tok.decode(full.tokens[: k + 1])[len(prefix):]
    assert piece, "pick a token with a visible piece"
    stop = prefix[-3:] + piece
    first = tok.decode(full.tokens).find(stop)
    g = specdec.generate(text_model, "The quick brown", max_new_tokens=40, stop_tokens=[],
                         stop=[stop, "never-appears-\u2603"])
    assert g.finish_reason == "stop_string"
    assert full.tokens[: len(g.tokens)] == g.tokens and len(g.tokens) <= k + 1
    assert g.text == tok.decode(full.tokens)[:first]


def test_stop_token_ends_and_is_not_in_text(text_model):
    full = specdec.generate(text_model, "Numbers: 12", max_new_tokens=30, stop_tokens=[])
    target = full.tokens[6]
    g = specdec.generate(text_model, "Numbers: 12", max_new_tokens=30, stop_tokens=[target])
    first = full.tokens.index(target)
    assert g.tokens == full.tokens[: first + 1] and g.finish_reason == "stop_token"
    assert g.text == text_model.tokenizer.decode(full.tokens[:first])


def test_default_stop_tokens_are_end_of_generation(text_model, monkeypatch):
    eog = sorted(text_model.tokenizer.eog_ids)
    assert eog, "the tiny tokenizer has end-of-generation tokens"
    seen = {}
    core = text_model._core

    class Spy:
        def __getattr__(self, name):
            return getattr(core, name)

        def sequence(self, *args, **kwargs):
            seen["stop_ids"] = kwargs["stop_ids"]
            return core.sequence(*args, **kwargs)

    monkeypatch.setattr(text_model, "_core", Spy())
    specdec.generate(text_model, "hi", max_new_tokens=2)
    assert seen["stop_ids"] == eog


def test_model_without_tokenizer_rejects_text(tiny):
    m = specdec.load(tiny("llama_gqa2", "hf-f32").path)
    assert m.tokenizer is None
    with pytest.raises(ValueError, match="no tokenizer"):
        specdec.generate(m, "hello")
    with pytest.raises(ValueError, match="no tokenizer"):
        specdec.generate(m, [1, 2], stop=["x"])
    assert specdec.generate(m, [1, 2], max_new_tokens=3).text is None


def test_bad_stop_argument(text_model):
    with pytest.raises(ValueError, match="stop"):
        specdec.generate(text_model, "hi", stop=[""])


def test_cli_chat_on_a_model_file(text_model):
    """`specdec chat --model FILE PROMPT`: prints the answer, then a speed line on stderr."""
    import subprocess
    import sys

    from helpers import HERE, child_env

    res = subprocess.run([sys.executable, "-m", "specdec", "chat", "--model", text_model.path,
                          "--max-new-tokens", "6", "--temperature", "0", "hello there"],
                         capture_output=True, text=True, timeout=120, env=child_env(), cwd=HERE)
    assert res.returncode == 0, res.stderr
    g = specdec.generate(text_model, [{"role": "user", "content": "hello there"}],
                         max_new_tokens=6)
    assert res.stdout.startswith(g.text)
    assert "tokens/s" in res.stderr and "new tokens" in res.stderr
