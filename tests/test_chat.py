"""`specdec chat`: one answer for a prompt given, a multi-turn prompt loop otherwise, streamed
to stdout and equal to specdec.generate's text over the same conversation, speculating by
default, with a closing line of speed, acceptance and estimated speed-up."""

from __future__ import annotations

import io
import math

import pytest

import specdec
from helpers import write_text_model
from specdec.__main__ import main, perplexity, speculator_from_name


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("chat") / "m.gguf"
    write_text_model(path)
    return str(path)


def chat(capsys, monkeypatch, model_path, *args, stdin=None):
    if stdin is not None:
        monkeypatch.setattr("sys.stdin", io.StringIO(stdin))
    code = main(["chat", "--model", model_path, "--temperature", "0", "--max-new-tokens", "24",
                 *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def answer(model, messages, speculator=None):
    return specdec.generate(model, messages, max_new_tokens=24, temperature=0.0,
                            speculator=speculator).text


def test_penalties_reach_the_answer(capsys, monkeypatch, model_path):
    model = specdec.load(model_path)
    msgs = [{"role": "user", "content": "the cat sat on the mat"}]
    code, out, _ = chat(capsys, monkeypatch, model_path, "the cat sat on the mat",
                        "--repetition-penalty", "1.5", "--presence-penalty", "1")
    want = specdec.generate(model, msgs, max_new_tokens=24, repetition_penalty=1.5,
                            presence_penalty=1.0).text
    assert code == 0 and out == want + "\n" and want != answer(model, msgs)


def test_one_prompt_is_answered_with_speculation(capsys, monkeypatch, model_path):
    code, out, err = chat(capsys, monkeypatch, model_path, "the cat sat on the mat")
    model = specdec.load(model_path)
    want = answer(model, [{"role": "user", "content": "the cat sat on the mat"}])
    assert code == 0 and out == want + "\n"
    closing = err.strip().splitlines()[-1]
    assert "tokens/s" in closing and "drafts accepted" in closing
    assert "x plain decoding (estimated" in closing and "PromptLookup(" in err


def test_the_prompt_loop_keeps_the_conversation(capsys, monkeypatch, model_path):
    code, out, err = chat(capsys, monkeypatch, model_path, "--system", "Be brief.",
                          stdin="hello there\nthe quick brown fox\n\n")
    model = specdec.load(model_path)
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hello there"}]
    first = answer(model, msgs)
    msgs += [{"role": "assistant", "content": first},
             {"role": "user", "content": "the quick brown fox"}]
    second = answer(model, msgs)
    assert first != second
    assert code == 0 and out == f"> {first}\n> {second}\n> "
    assert err.count("tokens/s") == 2


def test_plain_decoding_and_a_bad_speculator(capsys, monkeypatch, model_path):
    code, out, err = chat(capsys, monkeypatch, model_path, "--speculator", "none", "hello")
    assert code == 0 and "drafts" not in err and "plain decoding" not in err
    code, out, err = chat(capsys, monkeypatch, model_path, "--speculator", "magic", "hello")
    assert code == 2 and "unknown speculator 'magic'" in err and "prompt-lookup" in err


def test_speculator_names(model_path):
    model = specdec.load(model_path)
    assert speculator_from_name("none", model) is None
    assert isinstance(speculator_from_name("prompt-lookup", model), specdec.PromptLookup)
    assert isinstance(speculator_from_name("token-recycling", model), specdec.TokenRecycling)
    assert speculator_from_name("layerskip:1", model).layers == 1
    assert speculator_from_name(f"draft:{model_path}", model).model.path == model_path
    for bad in ("layerskip", "layerskip:x", "draft:", "none:1", "lookup"):
        with pytest.raises(ValueError, match="unknown speculator"):
            speculator_from_name(bad, model)


def test_perplexity_of_a_file(capsys, tmp_path, model_path):
    """`specdec perplexity`: windows of --ctx tokens, each one's second half scored with
    Model.token_logprobs; a text shorter than a window is an error."""
    text = "the cat sat on the mat and the dog sat on the log " * 12
    f = tmp_path / "t.txt"
    f.write_text(text)
    code = main(["perplexity", str(f), "--model", model_path, "--ctx", "32"])
    out = capsys.readouterr().out
    model = specdec.load(model_path)
    ids = model.require_tokenizer().encode(text, add_special=True)
    scored = [v for w in range(len(ids) // 32)
              for v in model.token_logprobs(ids[w * 32:(w + 1) * 32])[0][15:]]
    assert code == 0 and len(ids) // 32 >= 3 and len(scored) == 16 * (len(ids) // 32)
    assert f"perplexity {math.exp(-sum(scored) / len(scored)):.4f}" in out
    # a model that adds a BOS gets one at the start of every window, as llama.cpp's tool
    nll, windows, n = perplexity(model, ids, 32, bos=5)
    with_bos = [v for w in range(windows)
                for v in model.token_logprobs([5] + ids[w * 32 + 1:(w + 1) * 32])[0][15:]]
    assert n == len(with_bos) and nll == pytest.approx(-sum(with_bos) / n, rel=1e-12)
    assert with_bos != scored
    f.write_text("hi")
    assert main(["perplexity", str(f), "--model", model_path, "--ctx", "32"]) == 2
    assert "perplexity needs at least one window" in capsys.readouterr().err
