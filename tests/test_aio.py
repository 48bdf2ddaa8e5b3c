"""asyncio: agenerate and astream give what generate and stream give, keep the event loop
running while they decode, and stop decoding (freeing the sequence) when their task is
cancelled or their stream is closed."""

from __future__ import annotations

import asyncio
import sys
import time

import pytest

import specdec
from helpers import write_text_model
from test_stream import PROMPT, SPECULATORS, drain


@pytest.fixture(scope="module")
def text_model(tmp_path_factory):
    return write_text_model(tmp_path_factory.mktemp("aio") / "m.gguf")


def run(coro):
    return asyncio.run(coro)


async def collect(s):
    return [p async for p in s]


def same_generation(a, b):
    assert (a.tokens, a.text, a.finish_reason, a.prompt_tokens) == \
        (b.tokens, b.text, b.finish_reason, b.prompt_tokens)


@pytest.mark.parametrize("spec", list(SPECULATORS))
def test_agenerate_equals_generate(text_model, spec):
    for kw in (dict(max_new_tokens=40, stop_tokens=[]),
               dict(max_new_tokens=40, temperature=0.9, seed=3, top_p=0.9),
               dict(max_new_tokens=60, stop=["ca"])):
        want = specdec.generate(text_model, PROMPT, speculator=SPECULATORS[spec](), **kw)
        got = run(specdec.agenerate(text_model, PROMPT, speculator=SPECULATORS[spec](), **kw))
        same_generation(got, want)
        assert (got.stats is None) == (spec == "plain")


@pytest.mark.parametrize("spec", list(SPECULATORS))
def test_astream_yields_what_stream_yields(text_model, spec):
    for kw in (dict(max_new_tokens=40, stop_tokens=[]), dict(max_new_tokens=60, stop=["at t"])):
        want, wg = drain(specdec.stream(text_model, PROMPT, speculator=SPECULATORS[spec](), **kw))
        s = specdec.astream(text_model, PROMPT, speculator=SPECULATORS[spec](), **kw)
        assert s.generation is None
        got = run(collect(s))
        assert got == want and len(got) > 3
        same_generation(s.generation, wg)


def test_astream_of_a_model_without_tokenizer_yields_ids(pair):
    m = pair["target"]
    s = specdec.astream(m, [1, 2, 3], max_new_tokens=12, stop_tokens=[])
    ids = run(collect(s))
    assert ids == s.generation.tokens == specdec.generate(m, [1, 2, 3], max_new_tokens=12,
                                                          stop_tokens=[]).tokens


def test_concurrent_requests_on_one_model_each_equal_alone(text_model):
    prompts = [PROMPT, "hello world", "the quick brown fox", "numbers 1 2 3"]
    alone = [specdec.generate(text_model, p, max_new_tokens=30, stop_tokens=[]) for p in prompts]

    async def main():
        gens = [specdec.agenerate(text_model, p, max_new_tokens=30, stop_tokens=[],
                                  speculator=specdec.PromptLookup(k=3)) for p in prompts[:2]]
        streams = [specdec.astream(text_model, p, max_new_tokens=30, stop_tokens=[])
                   for p in prompts[2:]]
        out = await asyncio.gather(*gens, *(collect(s) for s in streams))
        return out[:2] + [s.generation for s in streams], out[2:]

    gens, pieces = run(main())
    for g, a in zip(gens, alone):
        assert g.tokens == a.tokens and g.text == a.text
    assert ["".join(p) for p in pieces] == [a.text for a in alone[2:]]


async def with_ticker(coro):
    """Runs `coro` beside a task that counts its turns of the event loop; (result, turns)."""
    turns = 0
    done = asyncio.Event()

    async def ticker():
        nonlocal turns
        while not done.is_set():
            turns += 1
            await asyncio.sleep(0)

    t = asyncio.ensure_future(ticker())
    await asyncio.sleep(0)
    start = turns
    try:
        result = await coro
    finally:
        done.set()
    await t
    return result, turns - start


def test_the_event_loop_keeps_running_while_decoding(text_model, monkeypatch):
    """A task beside agenerate / astream gets turns of the loop during decoding: at least one per
    few steps (each step awaits a worker thread). Decoding in the loop's own thread would give it
    none until the end; the second half of the test shows the check catches that."""
    g, turns = run(with_ticker(specdec.agenerate(text_model, PROMPT, max_new_tokens=200,
                                                 stop_tokens=[])))
    assert len(g.tokens) == 200 and turns >= 50, turns
    pieces, turns = run(with_ticker(collect(specdec.astream(text_model, PROMPT,
                                                            max_new_tokens=200, stop_tokens=[]))))
    assert len(pieces) > 50 and turns >= 50, turns

    # broken on purpose: steps run in the loop's thread
    mod = sys.modules["specdec.aio"]

    async def blocking(self, fn, *args, on_done=None, **kw):
        return fn(*args, **kw)

    monkeypatch.setattr(mod._Request, "_run", blocking)
    g, turns = run(with_ticker(specdec.agenerate(text_model, PROMPT, max_new_tokens=200,
                                                 stop_tokens=[])))
    assert len(g.tokens) == 200 and turns <= 1


class Counting:
    """A core sequence that records its steps and whether it was closed."""

    def __init__(self, seq, log):
        self.seq, self.log = seq, log

    def step(self):
        self.log["in_step"] = True
        try:
            new = self.seq.step()
            time.sleep(self.log["step_sleep"])  # a slower step: the cancel lands inside it
        finally:
            self.log["in_step"] = False
        self.log["steps"].append(new)
        return new

    def close(self):
        self.log["closed"] = True
        self.log["closed_in_step"] |= self.log["in_step"]
        self.seq.close()

    def __getattr__(self, name):
        return getattr(self.seq, name)


@pytest.fixture
def counted(monkeypatch):
    """Wraps every core sequence made by _Call in Counting; the log of the latest."""
    mod = sys.modules["specdec.generate"]
    log = {"steps": [], "closed": False, "in_step": False, "closed_in_step": False,
           "step_sleep": 0.0}
    real_init = mod._Call.__init__

    def init(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        self.seq = Counting(self.seq, log)

    monkeypatch.setattr(mod._Call, "__init__", init)
    return log


@pytest.mark.parametrize("kind", ["agenerate", "astream"])
def test_cancelling_the_task_stops_decoding_and_frees_the_sequence(text_model, counted, kind):
    async def consume():
        if kind == "agenerate":
            return await specdec.agenerate(text_model, PROMPT, max_new_tokens=200,
                                           stop_tokens=[])
        return await collect(specdec.astream(text_model, PROMPT, max_new_tokens=200,
                                             stop_tokens=[]))

    async def main():
        task = asyncio.ensure_future(consume())
        while len(counted["steps"]) < 5 and not task.done():
            await asyncio.sleep(0.001)
        counted["step_sleep"] = 0.05
        while not counted["in_step"] and not task.done():
            await asyncio.sleep(0.001)
        task.cancel()  # mid-step: the sequence is freed when the step returns, not before
        with pytest.raises(asyncio.CancelledError):
            await task
        at_cancel = len(counted["steps"])
        await asyncio.sleep(0.2)  # time for ~100 more steps, were decoding to go on
        return at_cancel

    at_cancel = run(main())
    assert at_cancel <= len(counted["steps"]) <= at_cancel + 1  # the step in flight, at most
    assert len(counted["steps"]) < 50 and counted["closed"] and not counted["closed_in_step"]


def test_breaking_out_of_astream_stops_decoding(text_model, counted):
    async def main():
        seen = []
        async with specdec.astream(text_model, PROMPT, max_new_tokens=200,
                                   stop_tokens=[]) as s:
            async for piece in s:
                seen.append(piece)
                if len(seen) == 3:
                    at_break = len(counted["steps"])
                    break
        assert counted["closed"]
        await asyncio.sleep(0.1)
        return at_break

    at_break = run(main())
    assert len(counted["steps"]) == at_break < 20
    assert specdec.generate(text_model, PROMPT, max_new_tokens=3, stop_tokens=[]).tokens


def test_on_token_can_stop_agenerate(text_model):
    full = specdec.generate(text_model, PROMPT, max_new_tokens=30, stop_tokens=[])
    seen = []
    g = run(specdec.agenerate(text_model, PROMPT, max_new_tokens=30, stop_tokens=[],
                              speculator=specdec.PromptLookup(k=4),
                              on_token=lambda t: seen.append(t) or len(seen) == 7))
    assert g.tokens == seen == full.tokens[:7] and g.finish_reason == "cancelled"


def test_bad_arguments_raise_the_same_errors(text_model):
    with pytest.raises(TypeError, match="max_new_tokens"):
        run(specdec.agenerate(text_model, PROMPT, max_new_tokens="many"))
    s = specdec.astream(text_model, PROMPT, temperature="hot")
    with pytest.raises(TypeError, match="temperature"):
        run(s.start())
    with pytest.raises(TypeError, match="temperature"):
        run(collect(specdec.astream(text_model, PROMPT, temperature="hot")))
    with pytest.raises(ValueError, match="temperature"):
        run(specdec.agenerate(text_model, PROMPT, temperature=-1.0))
    with pytest.raises(TypeError, match="on_token"):
        run(specdec.agenerate(text_model, PROMPT, on_token=5))
    # the model serves on afterwards
    assert len(run(specdec.agenerate(text_model, PROMPT, max_new_tokens=4,
                                     stop_tokens=[])).tokens) == 4
