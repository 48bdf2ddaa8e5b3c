"""After any speculative step the caches are what a fresh forward over the tokens they stand for
would write, bit for bit: the target's (all drafters, LayerSkip's early-exit drafts included,
which write into it) and a draft model's own. The C loop checks this itself after every step
when asked (`check_cache`, a test hook that ends the call with RuntimeError naming the step,
layer and slot on the first difference); these tests run it over every drafter, k in
{1, 3, 8}, greedy and sampling, and many run lengths, so every kind of step ending (all drafts
accepted, a rejection, a draft cut short by max_new_tokens or a stop token) is checked. Tests
of the kernels that make a batch and one-token steps give the same bits are in test_cache.py
and test_quant.py."""

from __future__ import annotations

import numpy as np
import pytest

import specdec
import tinymodels as tm

from test_draft_model import CFG, pair  # noqa: F401 (pair: the fixture)

SAMPLING = [(0.0, 0, 1.0), (1.0, 0, 1.0), (0.8, 5, 0.9)]


@pytest.fixture(scope="module")
def models(pair):
    """test_draft_model's target and drafts (a perturbed copy, a smaller model)."""
    return pair


def core_drafter(lookup=None, draft=None, layerskip=None):
    """The C drafter of a (k, ...) tuple in the order of its _core constructor, or None."""
    from specdec import _core

    if lookup is not None:
        return _core.prompt_lookup(*lookup)
    if draft is not None:
        return _core.draft_model(*draft)
    return None if layerskip is None else _core.layerskip(*layerskip)


def run_checked(target, prompt, n, temperature, top_k, top_p, *, stop_ids=(), seed=5, **drafter):
    """Model.generate with the cache self-check on (a test hook, not in the public API);
    returns (tokens, reason, stats)."""
    return target._core.generate(prompt, max_new_tokens=n, temperature=temperature, seed=seed,
                                 stop_ids=list(stop_ids), top_k=top_k, top_p=top_p,
                                 drafter=core_drafter(**drafter), check_cache=True)


def drafters(models, k):
    yield "lookup", dict(lookup=(k, 3, 1, 0.0))
    yield "draft-close", dict(draft=(models["close"]._core, k, 0.0, 0.0))
    yield "draft-far", dict(draft=(models["far"]._core, k, 0.0, 0.0))
    yield "layerskip", dict(layerskip=(1, k, 0.0, 0.0))
    # adaptive lengths: steps without drafts, after which the draft model catches up in a batch
    yield "draft-far-adaptive", dict(draft=(models["far"]._core, k, 0.0, 0.5))
    yield "layerskip-adaptive", dict(layerskip=(1, k, 0.3, 0.5))


@pytest.mark.parametrize("k", [1, 3, 8])
@pytest.mark.parametrize("sampling", SAMPLING, ids=["greedy", "T1", "T0.8-topk-topp"])
def test_caches_equal_fresh_forward_after_every_step(models, k, sampling):
    target = models["target"]
    temperature, top_k, top_p = sampling
    # a repetitive prompt, so prompt lookup finds drafts
    prompt = tm.random_tokens(CFG.vocab, 6, 3) * 3
    for name, kw in drafters(models, k):
        steps = 0
        for n in (1, 2, 5, 9, 23):
            tokens, reason, stats = run_checked(target, prompt, n, temperature, top_k, top_p, **kw)
            assert len(tokens) == n and reason == "length", name
            steps += stats["steps"]
        assert steps > 0, name


def test_caches_checked_when_a_stop_token_ends_a_draft(models):
    """A stop token in the middle of accepted drafts ends the run there; every step before was
    checked (the final state is freed, never continued)."""
    target = models["target"]
    prompt = tm.random_tokens(CFG.vocab, 6, 3) * 3
    plain, _, _ = run_checked(target, prompt, 30, 0.0, 0, 1.0)
    stop = plain[12]
    for name, kw in drafters(models, 8):
        tokens, reason, _ = run_checked(target, prompt, 30, 0.0, 0, 1.0, stop_ids=[stop], **kw)
        assert reason == "stop_token" and tokens[-1] == stop, name
        assert tokens == plain[:plain.index(stop) + 1], name


def test_cache_check_on_smollm2(smollm2_path):
    """The same on the quantized SmolLM2 (repacked integer kernels, 8-token verify tiles),
    greedy and sampling, prompt lookup and self-speculation."""
    m = specdec.load(smollm2_path)
    text = ("The quick brown fox jumps over the lazy dog. The quick brown fox jumps over the "
            "lazy dog. Repeat it:")
    prompt = m.tokenizer.encode(text)
    for temperature in (0.0, 1.0):
        for kw in (dict(lookup=(5, 3, 1, 0.0)), dict(layerskip=(20, 3, 0.0, 0.0))):
            tokens, _, stats = run_checked(m, prompt, 24, temperature, 0, 1.0, **kw)
            assert len(tokens) == 24 and stats["steps"] > 0


# Past SD_ATTN_CHUNK (512) cache slots the CPU attention takes the slots in runs and weighs the
# runs together; one-token steps split a KV head's runs over the threads, batches do not.
LONG_CFG = tm.TinyConfig(arch="llama", vocab=40, dim=192, n_layers=2, n_heads=3, n_kv_heads=1,
                         ffn=64, context_length=1400)


@pytest.fixture(scope="module")
def long_model(tmp_path_factory):
    from specdec import testing

    path = str(tmp_path_factory.mktemp("long") / "long.gguf")
    testing.write_gguf(path, LONG_CFG, tm.make_weights(LONG_CFG, 31))
    return specdec.load(path, threads=2)


def test_long_context_steps_keep_their_bits(long_model):
    """After 1100 tokens (three runs of slots), a one-token step, a batch of 4 and the same
    tokens inside a prefill give the same logits bit for bit, at 1 and 2 threads."""
    m = long_model
    tokens = tm.random_tokens(LONG_CFG.vocab, 1105, 9)
    rows = {}
    for threads in (1, 2):
        m.threads = threads
        c = m.new_cache(1200)
        m.forward(c, tokens[:1100], n_logits=1)
        one = [m.forward(c, [t], n_logits=1)[0] for t in tokens[1100:1105]]
        c = m.new_cache(1200)
        m.forward(c, tokens[:1101], n_logits=1)
        batch = m.forward(c, tokens[1101:1105], n_logits=4)
        whole = m.forward(m.new_cache(1200), tokens, n_logits=5)
        np.testing.assert_array_equal(np.array(one[1:]), batch, err_msg=f"{threads} threads")
        np.testing.assert_array_equal(np.array(one), whole, err_msg=f"{threads} threads")
        rows[threads] = whole
    np.testing.assert_array_equal(rows[1], rows[2])
    m.threads = 2


@pytest.mark.parametrize("sampling", SAMPLING[:2], ids=["greedy", "T1"])
def test_caches_equal_fresh_forward_after_a_long_prompt(long_model, sampling):
    """The cache self-check over speculative steps that attend to more than 512 slots."""
    temperature, top_k, top_p = sampling
    prompt = tm.random_tokens(LONG_CFG.vocab, 40, 4) * 14  # 560 tokens that repeat
    for kw in (dict(lookup=(5, 3, 1, 0.0)), dict(layerskip=(1, 3, 0.0, 0.0))):
        tokens, reason, stats = run_checked(long_model, prompt, 30, temperature, top_k, top_p,
                                            **kw)
        assert len(tokens) == 30 and reason == "length" and stats["steps"] > 0
