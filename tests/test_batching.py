"""Continuous batching: requests running at once on one model in several threads share
forwards (the model's scheduler puts every ready step's tokens into one forward), each output
bit for bit that of the request alone: plain and speculative decoding (chains and trees),
greedy and sampled, prompts fed over several steps beside other requests' decoding, combined
forwards over the token cap; a request cancelled alone; calls that hold the model alone wait for
the running steps; max_sequences queues requests beyond it."""

from __future__ import annotations

import time

import numpy as np
import pytest

import specdec
import tinymodels as tm
from helpers import in_threads
from specdec import testing

LOOP = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2, 3, 8, 4] * 2
LONG = [(7 * i * i + 3 * i + 1) % 90 + 2 for i in range(1400)] + LOOP


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    cfg = tm.TinyConfig(arch="llama", vocab=96, dim=64, n_layers=3, n_heads=4, n_kv_heads=2,
                        ffn=128, context_length=2048)
    path = str(tmp_path_factory.mktemp("batch") / "m.gguf")
    testing.write_gguf(path, cfg, tm.make_weights(cfg, 5))
    return specdec.load(path, threads=2)


def speculator(name):
    return {"plain": lambda: None,
            "lookup": lambda: specdec.PromptLookup(k=4),
            "branching": lambda: specdec.PromptLookup(k=4, branching=3, size_by_cost=False),
            "recycling": lambda: specdec.TokenRecycling(nodes=8, adaptive=False)}[name]()


def counts(model):
    s = model.scheduler_stats
    return s["steps"], s["forwards"]


# requests of every kind at once: (prompt, speculator, sampling)
MIX = [(LOOP, "plain", dict(temperature=0.0)),
       (LOOP[5:], "lookup", dict(temperature=0.0)),
       ([5, 6, 7, 8, 9] * 3, "recycling", dict(temperature=0.0)),
       (LOOP[2:], "branching", dict(temperature=1.0, seed=3)),
       (LOOP[7:], "plain", dict(temperature=0.8, top_k=20, top_p=0.9, seed=4)),
       (LOOP[1:], "lookup", dict(temperature=1.0, seed=5))]


def run(model, prompt, spec, kw, n=48):
    return specdec.generate(model, prompt, max_new_tokens=n, stop_tokens=[],
                            speculator=speculator(spec), **kw).tokens


def step_to_end(seq):
    while not seq.done:
        seq.step()
    out = seq.tokens
    seq.close()
    return out


def test_requests_at_once_share_forwards_with_their_own_bits(model):
    model.prefix_cache = 0  # every request computes its own prompt
    alone = [run(model, *r) for r in MIX]
    # all six begun before any steps, then stepped from six threads at once: the first leader
    # waits for all of them
    seqs = []
    for prompt, spec, kw in MIX:
        s = speculator(spec)
        seqs.append(model._core.sequence(prompt, max_new_tokens=48, stop_ids=[],
                                         drafter=None if s is None else s.drafter(), **kw))
    s0, f0 = counts(model)
    together = in_threads([lambda q=q: step_to_end(q) for q in seqs])
    s1, f1 = counts(model)
    assert together == alone
    steps, forwards = s1 - s0, f1 - f0
    # six requests of about 48 steps each share forwards (how many depends on timing: a forward
    # of this model takes well under a millisecond, a Python thread's turn about as long)
    assert steps >= 6 * 12 and forwards < steps, (steps, forwards)
    # and so do requests of specdec.generate begun at once, each with its own output
    assert in_threads([lambda r=r: run(model, *r) for r in MIX]) == alone


def test_eight_threads_greedy_each_output_its_own(model):
    model.prefix_cache = 0
    reqs = [(LOOP[i:], "plain" if i % 2 else "lookup", dict(temperature=0.0)) for i in range(8)]
    alone = [run(model, *r, n=40) for r in reqs]
    assert in_threads([lambda r=r: run(model, *r, n=40) for r in reqs]) == alone


def test_long_prompts_go_in_beside_other_requests_decoding(model):
    """Prompts of 1,400 tokens are fed a part per step while short requests decode; two long
    ones at once exceed a forward's token cap, and go into forwards of their own."""
    model.prefix_cache = 0
    reqs = [(LONG, "plain", dict(temperature=0.0)),
            (LONG[::-1], "lookup", dict(temperature=0.0)),
            (LOOP, "plain", dict(temperature=0.0)),
            (LOOP[3:], "recycling", dict(temperature=0.0))]
    alone = [run(model, *r, n=24) for r in reqs]
    together = in_threads([lambda r=r: run(model, *r, n=24) for r in reqs])
    assert together == alone


def test_breaking_out_of_a_stream_cancels_that_request_alone(model):
    model.prefix_cache = 0
    full = [run(model, LOOP[i:], "plain", dict(temperature=0.0)) for i in range(3)]

    def consume(i):
        got = []
        for t in specdec.stream(model, LOOP[i:], max_new_tokens=48, stop_tokens=[]):
            got.append(t)
            if i == 0 and len(got) == 5:
                break  # the first request stops early; the others go on
        return got

    got = in_threads([lambda i=i: consume(i) for i in range(3)])
    assert got[0] == full[0][:5]
    assert got[1:] == full[1:]
    assert model.open_sequences == 0


def test_a_call_holding_the_model_alone_waits_for_running_steps(model):
    """Model.logits from another thread while requests decode: it runs between steps, and both
    it and the requests give what they give alone."""
    want_logits = model.logits(LOOP[:12])
    want = [run(model, LOOP[i:], "lookup", dict(temperature=0.0)) for i in range(2)]

    def logits_often():
        outs = [model.logits(LOOP[:12]) for _ in range(5)]
        return all(np.array_equal(o, want_logits) for o in outs)

    res = in_threads([lambda: run(model, LOOP, "lookup", dict(temperature=0.0)),
                      lambda: run(model, LOOP[1:], "lookup", dict(temperature=0.0)),
                      logits_often])
    assert res[:2] == want and res[2] is True


def test_a_sequence_nobody_steps_does_not_stall_the_others(model):
    """A leader waits a moment for every running request's step; one whose caller does not step
    it costs the others a few short waits, after which the wait shrinks (no stall)."""
    idle = model._core.sequence(LOOP, max_new_tokens=8)
    try:
        t = time.perf_counter()
        g = specdec.generate(model, LOOP[2:], max_new_tokens=200, stop_tokens=[])
        elapsed = time.perf_counter() - t
        alone_t = time.perf_counter()
        idle.close()
        specdec.generate(model, LOOP[2:], max_new_tokens=200, stop_tokens=[])
        alone = time.perf_counter() - alone_t
    finally:
        idle.close()
    assert len(g.tokens) == 200
    # each waits at most a quarter of a forward (halved after each miss): under 2x, with slack
    assert elapsed < 3 * alone + 0.5, (elapsed, alone)


def test_max_sequences_queues_requests_beyond_it(model):
    """With max_sequences=2, six requests at once: never more than two decode together (each
    request looks at every token), the rest wait their turn and all finish with their own
    output; no error."""
    model.prefix_cache = 0
    alone = [run(model, LOOP[i:], "plain", dict(temperature=0.0), n=24) for i in range(6)]
    seen = []

    def request(i):
        return specdec.generate(model, LOOP[i:], max_new_tokens=24, stop_tokens=[],
                                on_token=lambda t: seen.append(model.open_sequences)).tokens

    model.max_sequences = 2
    try:
        together = in_threads([lambda i=i: request(i) for i in range(6)])
    finally:
        model.max_sequences = 0
    assert together == alone
    assert len(seen) == 6 * 24 and 1 <= min(seen) and max(seen) <= 2
    assert model.open_sequences == 0


def test_async_requests_wait_for_a_slot_without_holding_a_worker(model, monkeypatch):
    """Four agenerate calls on two worker threads with max_sequences=1: the three waiting for
    the slot wait in the event loop, so the one decoding always finds a worker for its steps
    (waiting in a worker would leave it none: a deadlock)."""
    import asyncio
    from concurrent.futures import ThreadPoolExecutor

    from specdec import aio

    model.prefix_cache = 0
    alone = [run(model, LOOP[i:], "plain", dict(temperature=0.0), n=16) for i in range(4)]
    pool = ThreadPoolExecutor(2)
    monkeypatch.setattr(aio, "_executor", pool)

    async def main():
        return await asyncio.wait_for(asyncio.gather(*[
            specdec.agenerate(model, LOOP[i:], max_new_tokens=16, stop_tokens=[])
            for i in range(4)]), 60)

    model.max_sequences = 1
    try:
        got = asyncio.run(main())
    finally:
        model.max_sequences = 0
        pool.shutdown()
    assert [g.tokens for g in got] == alone
    assert model.open_sequences == 0


def test_max_sequences_is_checked(model):
    with pytest.raises(ValueError, match="max_sequences must be >= 0"):
        model.max_sequences = -1
    with pytest.raises(TypeError, match="max_sequences"):
        model.max_sequences = 1.5
    assert model.max_sequences == 0
