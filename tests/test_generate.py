"""specdec.generate: greedy decoding equals the reference argmax chain; max_new_tokens=0;
stop tokens; the Generation result type; seeded sampling is reproducible."""

from __future__ import annotations

import numpy as np
import pytest

import reference
import specdec
import tinymodels as tm
from tinymodels import random_tokens

# (config, format): tied and untied, GGUF and HF, llama and qwen2
GEN_MODELS = [
    ("llama_gqa2", "gguf-f32-v3"),
    ("llama_tied", "hf-f32"),
    ("qwen2", "hf-f32-sharded3"),
    ("qwen2_odd_tied", "gguf-f32-v2-align64"),
    ("llama_odd", "hf-f16"),
]

N_NEW = 12


def load(t):
    return specdec.load(str(t.path))


_chains: dict = {}


def ref_chain(t, prompt, n=N_NEW):
    """Reference greedy chain over the stored weights, checked to be well determined: at every
    step the best logit beats the runner-up by more than twice the logits error the logits
    tests allow (1e-4 / 1e-3 of max|logit|), so any implementation within tolerance agrees."""
    key = (t.name, t.fmt if t.half else "F32", tuple(prompt), n)
    if key not in _chains:
        toks, margins = reference.greedy(t.ref_weights, t.cfg, prompt, n, return_margins=True,
                                          kv_f16=True)
        scale = max(1.0, float(np.abs(reference.forward(t.ref_weights, t.cfg, list(prompt) + toks, kv_f16=True)).max()))
        # the fixture's own sanity: if this fails, pick another seed/prompt, not a tolerance
        assert min(margins) > 2 * (1e-3 if t.half else 1e-4) * scale, (t.name, prompt, margins)
        _chains[key] = toks
    return _chains[key]


PROMPTS = [[1], [5, 9, 2], [60, 3, 3, 3, 17, 42, 8]]


@pytest.mark.parametrize("prompt", PROMPTS, ids=lambda p: f"len{len(p)}")
@pytest.mark.parametrize("spec", GEN_MODELS, ids=lambda p: f"{p[0]}-{p[1]}")
def test_greedy_matches_reference(tiny, spec, prompt):
    """temperature 0 generate == the reference argmax chain."""
    t = tiny(*spec)
    m = load(t)
    g = specdec.generate(m, prompt, max_new_tokens=N_NEW, temperature=0.0, stop_tokens=[])
    assert g.tokens == ref_chain(t, prompt)


def test_greedy_default_is_greedy_and_longer_prompt(tiny):
    """Defaults (max_new_tokens=16, temperature=0) decode 16 greedy tokens; a random 20-token
    prompt works the same."""
    t = tiny("llama_gqa2", "hf-f32")
    m = load(t)
    prompt = random_tokens(t.cfg.vocab, 20, seed=40)
    g = specdec.generate(m, prompt, stop_tokens=[])
    assert g.tokens == ref_chain(t, prompt, 16)


def test_greedy_ties_pick_lowest_id(tmp_path):
    """temperature 0 breaks exact ties toward the lowest token id: with the output head's rows
    duplicated in pairs (row 2k+1 = row 2k), logits come in equal pairs and every greedy token
    must be even."""
    cfg = tm.CONFIGS["llama_gqa2"]
    w = tm.make_weights(cfg, 77)
    head = w["lm_head.weight"]
    head[1::2] = head[0::2]
    files = tm.write_hf(tmp_path / "ties", cfg, w)
    m = specdec.load(str(files.dir))
    prompt = [3, 1, 4, 1, 5]
    g = specdec.generate(m, prompt, max_new_tokens=N_NEW, stop_tokens=[])
    assert all(x % 2 == 0 for x in g.tokens), g.tokens
    assert g.tokens == reference.greedy(w, cfg, prompt, N_NEW, kv_f16=True)


def test_generation_type(llama_gguf):
    """generate returns a specdec.Generation whose .tokens is a list of Python ints."""
    m = load(llama_gguf)
    g = specdec.generate(m, [1, 2, 3], max_new_tokens=5)
    assert isinstance(g, specdec.Generation)
    assert type(g.tokens) is list
    assert len(g.tokens) == 5
    assert all(type(x) is int for x in g.tokens)
    assert all(0 <= x < llama_gguf.cfg.vocab for x in g.tokens)


def test_max_new_tokens_zero(llama_gguf):
    m = load(llama_gguf)
    g = specdec.generate(m, [4, 5], max_new_tokens=0)
    assert isinstance(g, specdec.Generation)
    assert g.tokens == []


@pytest.mark.parametrize("spec", [("llama_gqa2", "gguf-f32-v3"), ("qwen2", "hf-f32")], ids=lambda p: p[0])
def test_stop_tokens(tiny, spec):
    """Generation stops right after emitting a stop token (the stop token is included); stop
    ids that never come up change nothing."""
    t = tiny(*spec)
    m = load(t)
    prompt = [5, 9, 2]
    chain = ref_chain(t, prompt)
    # the first token whose first occurrence is at index >= 3
    k = next(i for i, tok in enumerate(chain) if i >= 3 and tok not in chain[:i])
    stop = chain[k]
    g = specdec.generate(m, prompt, max_new_tokens=N_NEW, stop_tokens=[stop])
    assert g.tokens == chain[: k + 1]
    # several stop ids: the earliest emitted one stops
    g = specdec.generate(m, prompt, max_new_tokens=N_NEW, stop_tokens=[stop, chain[0]])
    assert g.tokens == chain[:1]
    unused = [x for x in range(t.cfg.vocab) if x not in chain][:3]
    g = specdec.generate(m, prompt, max_new_tokens=N_NEW, stop_tokens=unused)
    assert g.tokens == chain
    g = specdec.generate(m, prompt, max_new_tokens=N_NEW, stop_tokens=[])
    assert g.tokens == chain


def test_generate_up_to_context_length(tiny):
    """prompt + max_new_tokens == context_length is allowed and still greedy-correct."""
    t = tiny("llama_gqa2", "gguf-f32-v3")
    m = load(t)
    n_ctx = t.cfg.context_length
    prompt = random_tokens(t.cfg.vocab, n_ctx - 4, seed=41)
    g = specdec.generate(m, prompt, max_new_tokens=4)
    assert g.tokens == ref_chain(t, prompt, 4)


def test_sampling_reproducible(llama_gguf):
    """temperature > 0: the same seed gives the same tokens (also with another thread count);
    tokens are valid ids; a very low temperature follows the greedy chain."""
    m = load(llama_gguf)
    prompt = [5, 9, 2]
    a = specdec.generate(m, prompt, max_new_tokens=10, temperature=1.0, seed=1234).tokens
    b = specdec.generate(m, prompt, max_new_tokens=10, temperature=1.0, seed=1234).tokens
    assert a == b
    assert len(a) == 10 and all(0 <= x < llama_gguf.cfg.vocab for x in a)
    m.threads = 1
    c = specdec.generate(m, prompt, max_new_tokens=10, temperature=1.0, seed=1234).tokens
    assert c == a
    cold = specdec.generate(m, prompt, max_new_tokens=N_NEW, temperature=1e-4, seed=7,
                            stop_tokens=[]).tokens
    assert cold == ref_chain(llama_gguf, prompt)


def test_sampling_seeds_differ(llama_gguf):
    """At temperature 2 different seeds do not all give the same sequence (the seed is used)."""
    m = load(llama_gguf)
    runs = {tuple(specdec.generate(m, [1, 2], max_new_tokens=8, temperature=2.0, seed=s).tokens)
            for s in range(6)}
    assert len(runs) > 1


def test_default_stops_at_the_files_end_of_sequence(tiny):
    """Without stop_tokens, generation ends at the end-of-sequence id the GGUF names
    (tokenizer.ggml.eos_token_id = 2 in the test files), emitting it last."""
    t = tiny("qwen2_odd_tied", "gguf-f32-v2-align64")
    m = load(t)
    prompt = [5, 9, 2]
    chain = ref_chain(t, prompt)
    assert 2 in chain, "the fixture's chain must reach the end-of-sequence id"
    g = specdec.generate(m, prompt, max_new_tokens=N_NEW)
    assert g.tokens == chain[: chain.index(2) + 1] and g.finish_reason == "stop_token"
