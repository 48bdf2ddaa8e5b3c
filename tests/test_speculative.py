"""Speculative decoding with prompt lookup (sd_generate_lookup): at temperature 0 the output is
the plain greedy output token for token, whatever k, however the run ends; when sampling, the
first four tokens, drafted three deep, are distributed as the target's (chi-square against exact
enumeration); the stats add up; bad arguments are refused."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import reference
import specdec
import tinymodels as tm
from helpers import write_text_model
from specdec import testing
from stats import chi2_critical, chi2_stat, runs_for


def repetitive_prompt(vocab: int, n: int, seed: int) -> list[int]:
    """A prompt that repeats a phrase, so prompt lookup has matches to draft from."""
    rng = np.random.default_rng(seed)
    phrase = [int(x) for x in rng.integers(3, vocab, size=7)]
    return (phrase * (n // 7 + 1))[:n]


@pytest.fixture(scope="module")
def models(tiny):
    return [specdec.load(tiny(name, fmt).path) for name, fmt in
            [("llama_odd", "gguf-f32-v3"), ("qwen2", "hf-f32"), ("llama_gqa1", "gguf-f16-v3-align64")]]


@pytest.mark.parametrize("k", [1, 3, 8])
def test_greedy_identical_to_plain_decoding(models, k):
    for m in models:
        for seed in range(3):
            prompt = repetitive_prompt(m.config.vocab_size, 15 + 4 * seed, seed)
            plain = specdec.generate(m, prompt, max_new_tokens=30, stop_tokens=[])
            spec = specdec.generate(m, prompt, max_new_tokens=30, stop_tokens=[],
                                    speculator=specdec.PromptLookup(k=k, max_ngram=3))
            assert spec.tokens == plain.tokens
            assert spec.finish_reason == "length"
            st = spec.stats
            assert st.steps >= 1 and 0 <= st.accepted <= st.drafted
            assert st.new_tokens == len(spec.tokens)
            # each step emits its accepted drafts plus one token
            assert st.accepted + st.steps == st.new_tokens


def test_drafts_are_actually_accepted(models):
    """A model that copies its input (here: greedy on a repetitive prompt of a random model
    often does) must get drafts accepted: the loop is exercised, not just its fallback."""
    total = 0
    for m in models:
        prompt = repetitive_prompt(m.config.vocab_size, 30, 9)
        g = specdec.generate(m, prompt, max_new_tokens=30, stop_tokens=[],
                             speculator=specdec.PromptLookup(k=4))
        total += g.stats.accepted
    assert total > 0


def test_stops_in_the_middle_of_a_draft(models):
    m = models[0]
    prompt = repetitive_prompt(m.config.vocab_size, 21, 4)
    plain = specdec.generate(m, prompt, max_new_tokens=40, stop_tokens=[])
    for j in (3, 10, 25):
        stop = plain.tokens[j]
        first = plain.tokens.index(stop)
        for k in (2, 8):
            spec = specdec.generate(m, prompt, max_new_tokens=40, stop_tokens=[stop],
                                    speculator=specdec.PromptLookup(k=k))
            assert spec.tokens == plain.tokens[: first + 1]
            assert spec.finish_reason == "stop_token"
    # max_new_tokens ends a draft too
    for n in (1, 2, 7):
        spec = specdec.generate(m, prompt, max_new_tokens=n, stop_tokens=[],
                                speculator=specdec.PromptLookup(k=8))
        assert spec.tokens == plain.tokens[:n]


def test_smollm2_greedy_identical(smollm2_path):
    m = specdec.load(smollm2_path)
    msgs = [{"role": "user", "content": "Repeat exactly: the cat sat on the mat, the cat sat "
                                        "on the mat, and then the cat slept."}]
    plain = specdec.generate(m, msgs, max_new_tokens=48)
    for k in (1, 3, 8):
        spec = specdec.generate(m, msgs, max_new_tokens=48,
                                speculator=specdec.PromptLookup(k=k))
        assert spec.tokens == plain.tokens and spec.text == plain.text
    assert spec.stats.accepted > 0


def test_stop_string_with_speculation(tmp_path):
    """Stop strings are checked per emitted token inside the loop, drafts included."""
    m = write_text_model(tmp_path / "m.gguf")
    prompt = "the cat sat on the mat the cat sat on the mat the cat"
    full = specdec.generate(m, prompt, max_new_tokens=40, stop_tokens=[])
    # an ASCII stretch of the output, past its start (random weights emit broken UTF-8 too)
    stop = next(full.text[i:i + 3] for i in range(8, len(full.text) - 3)
                if full.text[i:i + 3].isascii() and full.text[i:i + 3].strip())
    plain = specdec.generate(m, prompt, max_new_tokens=40, stop_tokens=[], stop=[stop])
    spec = specdec.generate(m, prompt, max_new_tokens=40, stop_tokens=[], stop=[stop],
                            speculator=specdec.PromptLookup(k=6))
    assert spec.tokens == plain.tokens and spec.text == plain.text
    assert spec.finish_reason == plain.finish_reason == "stop_string"


# Prompt lookup after this prompt drafts 4, 4, 4 (its last token, continued from the earlier 4):
# a draft the vocabulary-5 model of seed 11 is sure enough of that most runs reach the third
# draft, and uncertain enough that each depth rejects in some runs (probabilities below).
LOOKUP_PROMPT = [0, 2, 2, 2, 2, 4, 4]
LOOKUP_DRAFT = [4, 4, 4]


def test_sampled_output_is_distributed_as_the_target(tmp_path):
    """Temperature 1 on a vocabulary of 5, PromptLookup(k=3) at a fixed draft length, and four
    new tokens, so the first step verifies three drafts and the chain rule decides at depths 1,
    2 and 3 (with max_new_tokens=2 a step could carry one draft only). The joint distribution of
    the four tokens, enumerated exactly from the reference forward, against seeded runs
    (chi-square at stats.ALPHA; stats.runs_for sizes the runs to catch a total variation of
    stats.TV with probability stats.POWER)."""
    cfg = tm.TinyConfig(arch="llama", vocab=5, dim=16, n_layers=1, n_heads=2, n_kv_heads=1,
                        ffn=32, context_length=32)
    w = tm.make_weights(cfg, 11)
    testing.write_gguf(str(tmp_path / "v5.gguf"), cfg, w)
    m = specdec.load(str(tmp_path / "v5.gguf"))

    def row(seq):
        x = reference.forward(w, cfg, LOOKUP_PROMPT + list(seq), kv_f16=True)[-1]
        return reference.process_ref(x, 1.0, 0, 1.0, 0.0)

    exact = np.zeros((5,) * 4)
    for prefix in itertools.product(range(5), repeat=3):
        p = row([])[prefix[0]] * row(prefix[:1])[prefix[1]] * row(prefix[:2])[prefix[2]]
        exact[prefix] = p * row(prefix)
    exact = exact.ravel()
    # where the rule decides: depth 2 after the first draft is taken, depth 3 after two
    reach3 = row([])[4] * row([4])[4]
    reject3 = reach3 * (1.0 - row([4, 4])[4])
    assert reach3 > 0.5 and reject3 > 0.05, (reach3, reject3)

    n = runs_for(exact)
    counts = np.zeros(625)
    all_taken = decided3 = 0
    lookup = specdec.PromptLookup(k=3, verify_slope=0)
    for s in range(n):
        g = specdec.generate(m, LOOKUP_PROMPT, max_new_tokens=4, temperature=1.0, seed=s,
                             stop_tokens=[], speculator=lookup)
        counts[np.ravel_multi_index(g.tokens, (5,) * 4)] += 1
        if g.stats.steps == 1:  # three drafts taken in one step: they are LOOKUP_DRAFT
            assert g.tokens[:3] == LOOKUP_DRAFT and g.stats.drafted == 3
            all_taken += 1
        decided3 += g.tokens[:2] == LOOKUP_DRAFT[:2]
    assert all_taken > n // 2 and decided3 > n // 2  # the third draft was decided, and taken
    stat, df = chi2_stat(counts, exact)
    assert stat < chi2_critical(df), (stat, df, n)


@pytest.mark.parametrize("kw,match", [({"speculator": "lookup"}, "speculator"),
                                      ({"top_p": 0.0}, "top_p"), ({"top_k": -1}, "top_k"),
                                      ({"min_p": 1.0}, "min_p"), ({"temperature": -1.0},
                                                                  "temperature")])
def test_bad_arguments(models, kw, match):
    with pytest.raises((ValueError, TypeError), match=match):
        specdec.generate(models[0], [1, 2, 3], max_new_tokens=4, **kw)


def test_trailing_loop():
    """The bench's loop measure: the longest periodic suffix (period <= 128, two periods, 32
    tokens at least)."""
    from specdec.bench import trailing_loop

    assert trailing_loop([1, 2, 3] * 20) == 60
    assert trailing_loop(list(range(50)) + [7, 8] * 20) == 40
    assert trailing_loop(list(range(100, 140)) + [9] * 31) == 0  # too short
    assert trailing_loop(list(range(100))) == 0
    assert trailing_loop([5] * 40 + [1, 2]) == 0  # the loop must reach the end
    sentence = list(range(200, 300))  # a 100-token sentence said three times and a half
    assert trailing_loop([1, 2] + sentence * 3 + sentence[:50]) == 350
    assert trailing_loop([]) == 0


@pytest.mark.parametrize("args", [dict(k=0), dict(k=33), dict(min_ngram=0),
                                  dict(max_ngram=1, min_ngram=2)])
def test_bad_prompt_lookup(args):
    with pytest.raises(ValueError, match="k must|n-gram"):
        specdec.PromptLookup(**args)


def test_bench_harness_runs(tmp_path, capsys):
    """python -m specdec.bench on a tiny model with a tokenizer and a three-question file."""
    import json as _json

    from specdec import bench

    path = str(tmp_path / "m.gguf")
    write_text_model(path)
    data = tmp_path / "q.jsonl"
    data.write_text("\n".join(_json.dumps(q) for q in [
        {"question_id": 1, "category": "summarization", "turns": ["the cat sat on the mat " * 3]},
        {"question_id": 2, "category": "qa", "turns": ["hello there"]},
        {"question_id": 3, "category": "qa", "turns": ["hello again", "and again"]}]))
    out = tmp_path / "r.json"
    assert bench.main(["--data", str(data), "--model", path, "--max-new-tokens", "6",
                       "--k", "3", "--methods", "lookup,recycling", "--tree-nodes", "6",
                       "--tree-widths", "2,2", "--json", str(out)]) == 0
    table = capsys.readouterr().out
    assert "| overall | 3 |" in table and "lookup speedup" in table
    assert "recycling speedup" in table
    res = _json.loads(out.read_text())
    assert len(res["questions"]) == 3
    # one untimed warm-up request per method, its time reported (recycling measures its costs)
    assert set(res["warmup_s"]) == {"plain", "lookup", "recycling"}
    assert all(t > 0 for t in res["warmup_s"].values()) and "untimed warm-up" in table
    q = res["questions"][0]["methods"]
    assert q["plain"]["new_tokens"] == q["lookup"]["new_tokens"]  # greedy: same output length
    assert q["plain"]["new_tokens"] == q["recycling"]["new_tokens"]
    assert set(q["plain"]) >= {"finish", "loop_tokens"} and "plain looped" in table
    # --repeats: every method run that often per question, in rotated order, the median kept
    assert bench.main(["--data", str(data), "--model", path, "--max-new-tokens", "4",
                       "--methods", "lookup", "--repeats", "3", "--json", str(out)]) == 0
    assert "median of 3 runs each" in capsys.readouterr().out
    res = _json.loads(out.read_text())
    for q in res["questions"]:
        for m in q["methods"].values():
            assert len(m["times_s"]) == 3 and m["time_s"] == sorted(m["times_s"])[1]
    with pytest.raises(SystemExit):
        bench.main(["--data", str(data), "--model", path, "--repeats", "0"])
    assert bench.predicted_speedup(0.0, 4) == 1.0
    assert abs(bench.predicted_speedup(0.5, 2) - 1.75) < 1e-9
