"""The OpenAI-compatible server, tested with the official `openai` client against a server on
127.0.0.1: its text equals specdec.generate's, streamed or not; usage and the speculation stats
arrive; 8 concurrent streams succeed; bad requests get 4xx JSON errors and the server goes on;
a client that goes away cancels its request."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import threading
import time

import pytest

import specdec
from helpers import HERE, child_env, write_text_model

httpx = pytest.importorskip("httpx", reason="the test extra (httpx) is not installed")
openai = pytest.importorskip("openai", reason="the test extra (openai) is not installed")
uvicorn = pytest.importorskip("uvicorn", reason="the serve extra (uvicorn) is not installed")
serve = pytest.importorskip("specdec.serve", reason="the serve extra is not installed")

NAME = "tiny-text"
CHAT = [{"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": "the cat sat on the mat the cat sat on the mat"}]


@contextlib.contextmanager
def running(app):
    """uvicorn serving `app` in a thread on a free port of 127.0.0.1; yields the base URL."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    t = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    t.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert t.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        t.join(10)
        sock.close()


def client(url):
    # trust_env=False: a proxy configured in the environment must not see loopback traffic
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0,
                         http_client=httpx.Client(trust_env=False, timeout=60))


@pytest.fixture(scope="module")
def text_model(tmp_path_factory):
    return write_text_model(tmp_path_factory.mktemp("serve") / "m.gguf")


@pytest.fixture(scope="module")
def url(text_model):
    with running(serve.create_app(text_model, specdec.PromptLookup(k=4), name=NAME)) as u:
        yield u


def generated(model, prompt, n, **kw):
    return specdec.generate(model, prompt, max_new_tokens=n, temperature=0.0,
                            speculator=specdec.PromptLookup(k=4), **kw)


def test_health_and_models(url):
    with httpx.Client(trust_env=False) as h:
        r = h.get(url + "/health")
    assert r.status_code == 200 and r.json() == {"status": "ok"}
    assert [m.id for m in client(url).models.list().data] == [NAME]


def test_chat_equals_generate(url, text_model):
    want = generated(text_model, CHAT, 40)
    r = client(url).chat.completions.create(model=NAME, messages=CHAT, max_tokens=40,
                                            temperature=0)
    assert r.choices[0].message.content == want.text and want.text
    assert r.choices[0].finish_reason == {"length": "length"}.get(want.finish_reason, "stop")
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == \
        (len(want.prompt_tokens), len(want.tokens))
    spec = r.model_extra["specdec"]
    assert spec["speculator"].startswith("PromptLookup(") and spec["drafted"] > 0
    assert spec["accepted"] <= spec["drafted"] and spec["mean_accepted_tokens"] >= 1


def test_completion_equals_generate(url, text_model):
    prompt = "the quick brown fox jumps over the lazy dog the quick"
    want = generated(text_model, prompt, 30, stop=["fox"])
    r = client(url).completions.create(model=NAME, prompt=prompt, max_tokens=30, temperature=0,
                                       stop=["fox"])
    assert r.choices[0].text == want.text
    assert r.usage.completion_tokens == len(want.tokens)
    ids = client(url).completions.create(model=NAME, prompt=want.prompt_tokens, max_tokens=30,
                                         temperature=0, stop="fox")
    assert ids.choices[0].text == want.text


def test_sampling_parameters_reach_the_sampler(url, text_model):
    want = specdec.generate(text_model, CHAT, max_new_tokens=30, temperature=0.8, seed=11,
                            top_k=20, top_p=0.9, min_p=0.01,
                            speculator=specdec.PromptLookup(k=4))
    r = client(url).chat.completions.create(model=NAME, messages=CHAT, max_tokens=30,
                                            temperature=0.8, seed=11, top_p=0.9,
                                            extra_body={"top_k": 20, "min_p": 0.01})
    assert r.choices[0].message.content == want.text


def test_penalties_and_logit_bias_reach_the_decoder(url, text_model):
    base = generated(text_model, CHAT, 30)
    bias = {base.tokens[1]: -100, base.tokens[4]: 3.5}
    want = generated(text_model, CHAT, 30, presence_penalty=0.5, frequency_penalty=0.7,
                     repetition_penalty=1.2, logit_bias=bias)
    assert want.text != base.text
    r = client(url).chat.completions.create(
        model=NAME, messages=CHAT, max_tokens=30, temperature=0, presence_penalty=0.5,
        frequency_penalty=0.7, logit_bias={str(k): v for k, v in bias.items()},
        extra_body={"repetition_penalty": 1.2})
    assert r.choices[0].message.content == want.text


def test_n_choices_are_seeded_generations(url, text_model):
    """n choices: choice i is generate's with seed + i, streamed or not, each with its own
    finish_reason and logprobs; usage adds their tokens up."""
    want = [specdec.generate(text_model, CHAT, max_new_tokens=30, temperature=1.0, seed=7 + i,
                             speculator=specdec.PromptLookup(k=4), logprobs=True)
            for i in range(3)]
    assert len({w.text for w in want}) > 1
    kw = dict(model=NAME, messages=CHAT, max_tokens=30, temperature=1.0, seed=7, n=3,
              logprobs=True)
    r = client(url).chat.completions.create(**kw)
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert [c.message.content for c in r.choices] == [w.text for w in want]
    assert [c.finish_reason for c in r.choices] == \
        [{"length": "length"}.get(w.finish_reason, "stop") for w in want]
    for c, w in zip(r.choices, want):
        n = len(w.tokens) - (w.finish_reason == "stop_token")
        assert [e.logprob for e in c.logprobs.content] == w.logprobs[:n]
    assert r.usage.completion_tokens == sum(len(w.tokens) for w in want)
    spec = r.model_extra["specdec"]
    assert spec["drafted"] == sum(w.stats.drafted for w in want)
    chunks = list(client(url).chat.completions.create(**kw, stream=True,
                                                      stream_options={"include_usage": True}))
    texts, lps = ["", "", ""], [[], [], []]
    finished = set()
    for ch in chunks:
        for c in ch.choices:
            texts[c.index] += c.delta.content or ""
            lps[c.index] += [e.logprob for e in c.logprobs.content] if c.logprobs else []
            if c.finish_reason:
                finished.add(c.index)
    assert texts == [w.text for w in want] and finished == {0, 1, 2}
    assert lps == [[e.logprob for e in c.logprobs.content] for c in r.choices]
    assert chunks[-1].usage.completion_tokens == sum(len(w.tokens) for w in want)
    c = client(url).completions.create(model=NAME, prompt="hello world", max_tokens=10,
                                       temperature=0, n=2)
    assert c.choices[0].text == c.choices[1].text  # greedy: the same answer twice


def test_n_choices_take_their_slots_together(url, text_model):
    """Under max_sequences, a request's n slots are taken all at once: two requests of n=2
    with room for 2 both finish (holding one each, they would wait on each other for good),
    and n above the limit is refused."""
    text_model.max_sequences = 2
    try:
        r = post(url, "/v1/chat/completions", {"model": NAME, "messages": CHAT, "n": 3})
        assert r.status_code == 400 and "n must be at most 2" in r.json()["error"]["message"]
        results: list = [None, None]

        def one(i):
            results[i] = client(url).chat.completions.create(
                model=NAME, messages=CHAT, max_tokens=20, temperature=1.0, seed=i, n=2)

        threads = [threading.Thread(target=one, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert all(r is not None and len(r.choices) == 2 for r in results)
    finally:
        text_model.max_sequences = 0


def test_a_batch_of_prompts_gives_their_choices_in_order(url, text_model):
    """A completion's list of prompts: choice i is prompt i // n's choice i % n, each equal to
    generate's with seed + (i % n), streamed or not; usage counts each prompt once."""
    prompts = ["the cat sat on the mat", "hello world hello", "the quick brown fox"]
    want = [specdec.generate(text_model, p, max_new_tokens=12, temperature=1.0, seed=4 + j,
                             speculator=specdec.PromptLookup(k=4)) for p in prompts
            for j in range(2)]
    kw = dict(model=NAME, prompt=prompts, max_tokens=12, temperature=1.0, seed=4, n=2)
    r = client(url).completions.create(**kw)
    assert [c.index for c in r.choices] == list(range(6))
    assert [c.text for c in r.choices] == [w.text for w in want]
    assert r.usage.prompt_tokens == sum(len(w.prompt_tokens) for w in want[::2])
    assert r.usage.completion_tokens == sum(len(w.tokens) for w in want)
    texts = [""] * 6
    for ch in client(url).completions.create(**kw, stream=True):
        for c in ch.choices:
            texts[c.index] += c.text
    assert texts == [w.text for w in want]
    ids = [text_model.require_tokenizer().encode(p, add_special=True) for p in prompts[:2]]
    r = client(url).completions.create(model=NAME, prompt=ids, max_tokens=5, temperature=0)
    assert [c.text for c in r.choices] == [generated(text_model, i, 5).text for i in ids]
    bad = post(url, "/v1/completions", {"model": NAME, "prompt": ["a"] * 65})
    assert bad.status_code == 400 and "at most 64 prompts" in bad.json()["error"]["message"]
    bad = post(url, "/v1/completions", {"model": NAME, "prompt": ["a", 5]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "prompt"


def test_echo_scores_the_prompt(url, text_model):
    """A completion's echo: the prompt's text first and, with logprobs, its tokens' entries
    (Model.token_logprobs; the first null), then the answer's; max_tokens 0 scores a text."""
    prompt = "the quick brown fox jumps over the lazy dog"
    ids = text_model.require_tokenizer().encode(prompt, add_special=True)
    lps, tops = text_model.token_logprobs(ids, top_logprobs=2)
    r = client(url).completions.create(model=NAME, prompt=prompt, max_tokens=0, echo=True,
                                       logprobs=2, temperature=0)
    lp = r.choices[0].logprobs
    assert r.choices[0].text == prompt and r.usage.completion_tokens == 0
    assert lp.token_logprobs == [None] + lps and len(lp.tokens) == len(ids)
    assert [list(d.values())[:2] for d in lp.top_logprobs[1:]] == \
        [[v for _, v in row] for row in tops]
    assert all(set(d.values()) >= {v} for d, v in zip(lp.top_logprobs[1:], lps))
    tok = text_model.require_tokenizer()
    assert lp.text_offset == [len(tok.decode(ids[:i])) for i in range(len(ids))]
    # with an answer after it, streamed or not
    want = generated(text_model, prompt, 12, logprobs=True)
    n = len(want.tokens) - (want.finish_reason == "stop_token")
    r = client(url).completions.create(model=NAME, prompt=prompt, max_tokens=12, echo=True,
                                       logprobs=0, temperature=0)
    assert r.choices[0].text == prompt + want.text
    assert r.choices[0].logprobs.token_logprobs == [None] + lps + want.logprobs[:n]
    offsets = r.choices[0].logprobs.text_offset
    both = ids + want.tokens
    assert offsets == [len(tok.decode(both[:i])) for i in range(len(offsets))]
    s = client(url).completions.create(model=NAME, prompt=prompt, max_tokens=12, echo=True,
                                       logprobs=0, temperature=0, stream=True)
    chunks = [c.choices[0] for c in s]
    assert "".join(c.text for c in chunks) == prompt + want.text
    assert [v for c in chunks if c.logprobs for v in c.logprobs.token_logprobs] == \
        r.choices[0].logprobs.token_logprobs
    assert [o for c in chunks if c.logprobs for o in c.logprobs.text_offset] == offsets
    plain = client(url).completions.create(model=NAME, prompt=prompt, max_tokens=3, echo=True,
                                           temperature=0)
    assert plain.choices[0].text.startswith(prompt) and plain.choices[0].logprobs is None


def test_logprobs_are_generates(url, text_model):
    """Chat's and a completion's logprobs, streamed or not, are generate's numbers for the same
    tokens, in OpenAI's shapes; a final stop token has none."""
    want = generated(text_model, CHAT, 40, logprobs=True, top_logprobs=3)
    tok = text_model.require_tokenizer()
    n = len(want.tokens) - (want.finish_reason == "stop_token")
    assert n > 5
    pieces = [tok.token_to_piece(t).decode("utf-8", errors="replace") for t in want.tokens[:n]]
    c = client(url).chat.completions.create(model=NAME, messages=CHAT, max_tokens=40,
                                            temperature=0, logprobs=True, top_logprobs=3)
    content = c.choices[0].logprobs.content
    assert [e.logprob for e in content] == want.logprobs[:n]
    assert [e.token for e in content] == pieces
    assert [bytes(e.bytes) for e in content] == [tok.token_to_piece(t) for t in want.tokens[:n]]
    assert [[(a.token, a.logprob) for a in e.top_logprobs] for e in content] == \
        [[(tok.token_to_piece(i).decode("utf-8", errors="replace"), v) for i, v in row]
         for row in want.top_logprobs[:n]]
    chunks = client(url).chat.completions.create(model=NAME, messages=CHAT, max_tokens=40,
                                                 temperature=0, logprobs=True, top_logprobs=3,
                                                 stream=True)
    streamed = [e for ch in chunks if ch.choices and ch.choices[0].logprobs
                for e in ch.choices[0].logprobs.content]
    assert [(e.token, e.logprob) for e in streamed] == [(e.token, e.logprob) for e in content]
    # a final stop token (the first seed whose answer ends with one): none for it, streamed
    # or not
    seed, want = next((i, g) for i in range(20) for g in [specdec.generate(
        text_model, CHAT, max_new_tokens=150, temperature=1.0, seed=i,
        speculator=specdec.PromptLookup(k=4), logprobs=True)] if g.finish_reason == "stop_token")
    kw = dict(model=NAME, messages=CHAT, max_tokens=150, temperature=1.0, seed=seed,
              logprobs=True)
    c = client(url).chat.completions.create(**kw)
    assert [e.logprob for e in c.choices[0].logprobs.content] == want.logprobs[:-1]
    chunks = client(url).chat.completions.create(**kw, stream=True)
    assert [e.logprob for ch in chunks if ch.choices and ch.choices[0].logprobs
            for e in ch.choices[0].logprobs.content] == want.logprobs[:-1]
    plain = client(url).chat.completions.create(model=NAME, messages=CHAT, max_tokens=5,
                                                temperature=0)
    assert plain.choices[0].logprobs is None

    prompt = "the quick brown fox jumps over the lazy dog the quick"
    want = generated(text_model, prompt, 30, logprobs=True, top_logprobs=2)
    r = client(url).completions.create(model=NAME, prompt=prompt, max_tokens=30, temperature=0,
                                       logprobs=2)
    lp = r.choices[0].logprobs
    n = len(want.tokens) - (want.finish_reason == "stop_token")
    assert lp.token_logprobs == want.logprobs[:n] and "".join(lp.tokens) == r.choices[0].text
    assert lp.text_offset == [len(tok.decode(want.tokens[:i])) for i in range(n)]
    text = lambda i: tok.token_to_piece(i).decode("utf-8", errors="replace")  # noqa: E731
    # the two best and, as OpenAI gives them, the chosen token (greedy: already the best)
    assert lp.top_logprobs == [{text(i): v for i, v in row} for row in want.top_logprobs[:n]]
    sampled = client(url).completions.create(model=NAME, prompt=prompt, max_tokens=30,
                                             temperature=1.0, seed=3, logprobs=0)
    slp = sampled.choices[0].logprobs
    assert [d == {t: v} for d, t, v in zip(slp.top_logprobs, slp.tokens, slp.token_logprobs)] \
        == [True] * len(slp.tokens)
    s = client(url).completions.create(model=NAME, prompt=prompt, max_tokens=30, temperature=0,
                                       logprobs=2, stream=True)
    got = [c.choices[0].logprobs for c in s if c.choices[0].logprobs]
    assert [v for g in got for v in g.token_logprobs] == lp.token_logprobs
    assert [o for g in got for o in g.text_offset] == lp.text_offset


def stream_chat(url, messages, n):
    s = client(url).chat.completions.create(model=NAME, messages=messages, max_tokens=n,
                                            temperature=0, stream=True,
                                            stream_options={"include_usage": True})
    return list(s)


def test_streamed_chat_equals_generate_and_usage_arrives(url, text_model):
    want = generated(text_model, CHAT, 40)
    chunks = stream_chat(url, CHAT, 40)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == want.text and len(chunks) > 5
    finish = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finish) == 1 and finish[0].model_extra["specdec"]["drafted"] > 0
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == len(want.tokens)
    assert chunks[-1].usage.prompt_tokens == len(want.prompt_tokens)


def test_streamed_completion_ends_with_done(url, text_model):
    prompt = "hello world hello world"
    want = generated(text_model, prompt, 25)
    with httpx.Client(trust_env=False) as h:
        r = h.post(url + "/v1/completions", json={"model": NAME, "prompt": prompt,
                                                  "max_tokens": 25, "temperature": 0,
                                                  "stream": True})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = [e for e in r.text.split("\n\n") if e]
    assert all(e.startswith("data: ") for e in events) and events[-1] == "data: [DONE]"
    s = client(url).completions.create(model=NAME, prompt=prompt, max_tokens=25, temperature=0,
                                       stream=True)
    assert "".join(c.choices[0].text for c in s) == want.text


def test_eight_concurrent_streams(url, text_model):
    prompts = [[{"role": "user", "content": f"item {i}: the cat sat on the mat {i}"}]
               for i in range(8)]
    want = [generated(text_model, p, 30).text for p in prompts]
    got: list = [None] * 8
    errors: list = []

    def one(i):
        try:
            chunks = stream_chat(url, prompts[i], 30)
            got[i] = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        except Exception as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors and got == want


def post(url, path, body=None, content=None):
    with httpx.Client(trust_env=False) as h:
        return h.post(url + path, json=body, content=content,
                      headers={"content-type": "application/json"})


@pytest.mark.parametrize("body,param,needle", [
    (b"{not json", None, "not valid JSON"),
    (b"[1, 2]", None, "JSON object"),
    ({"model": NAME}, "messages", "messages"),
    ({"model": NAME, "messages": [{"role": "wizard", "content": "hi"}]}, "messages[0].role",
     "role"),
    ({"model": NAME, "messages": CHAT, "temperature": "hot"}, "temperature", "temperature"),
    ({"model": NAME, "messages": CHAT, "max_tokens": 2.5}, "max_tokens", "max_tokens"),
    ({"model": NAME, "messages": CHAT, "temperature": -1}, None, "temperature"),
    ({"model": NAME, "messages": CHAT, "max_tokens": 100000}, None, "context"),
    ({"model": NAME, "messages": CHAT, "n": 0}, "n", "n must be in [1, 64]"),
    ({"model": NAME, "messages": CHAT, "n": 65}, "n", "n must be in [1, 64]"),
    ({"model": NAME, "messages": CHAT, "logprobs": "yes"}, "logprobs", "logprobs must be a"),
    ({"model": NAME, "messages": CHAT, "top_logprobs": 3}, "top_logprobs",
     "top_logprobs needs logprobs"),
    ({"model": NAME, "messages": CHAT, "logprobs": True, "top_logprobs": 21}, "top_logprobs",
     "top_logprobs must be in [0, 20]"),
    ({"model": NAME, "messages": CHAT, "logit_bias": {"one": 5}}, "logit_bias", "token ids"),
    ({"model": NAME, "messages": CHAT, "logit_bias": {"1": "up"}}, "logit_bias",
     "logit_bias[1] must be a number"),
    ({"model": NAME, "messages": CHAT, "logit_bias": {"1": 500}}, None, "[-100, 100]"),
    ({"model": NAME, "messages": CHAT, "presence_penalty": 3}, None, "presence_penalty"),
    ({"model": NAME, "messages": CHAT, "echo": True}, "echo", "echo is a parameter of"),
    ({"model": NAME, "messages": CHAT, "suffix": "x"}, "suffix", "not supported"),
    ({"model": NAME, "messages": CHAT, "stop": [1]}, "stop", "stop"),
])
def test_bad_chat_requests_get_400_json_errors(url, body, param, needle):
    r = post(url, "/v1/chat/completions", **({"content": body} if isinstance(body, bytes)
                                             else {"body": body}))
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert needle in err["message"] and err["type"] == "invalid_request_error"
    assert err["param"] == param


def test_errors_through_the_client_and_the_server_goes_on(url, text_model):
    c = client(url)
    with pytest.raises(openai.BadRequestError, match="top_p"):
        c.chat.completions.create(model=NAME, messages=CHAT, top_p="most")
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        c.chat.completions.create(model="gpt-4o", messages=CHAT)
    with pytest.raises(openai.BadRequestError, match="prompt"):
        c.completions.create(model=NAME, prompt=[[]])
    with httpx.Client(trust_env=False) as h:
        assert h.get(url + "/v1/nothing").status_code == 404
        r = h.get(url + "/v1/chat/completions")
        assert r.status_code == 405 and "GET" in r.json()["error"]["message"]
    want = generated(text_model, CHAT, 10)
    r = c.chat.completions.create(model=NAME, messages=CHAT, max_tokens=10, temperature=0)
    assert r.choices[0].message.content == want.text


def test_a_model_without_tokenizer_is_refused(pair):
    with pytest.raises(ValueError, match="tokenizer"):
        serve.create_app(pair["target"])


@pytest.fixture
def slow_steps(monkeypatch):
    """Every core sequence made from now on sleeps 10 ms a step; its log of steps and close."""
    mod = sys.modules["specdec.generate"]
    log = {"steps": 0, "closed": 0}
    real_init = mod._Call.__init__

    class Slow:
        def __init__(self, seq):
            self.seq = seq

        def step(self):
            time.sleep(0.01)
            log["steps"] += 1
            return self.seq.step()

        def close(self):
            log["closed"] += 1
            self.seq.close()

        def __getattr__(self, name):
            return getattr(self.seq, name)

    def init(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        self.seq = Slow(self.seq)

    monkeypatch.setattr(mod._Call, "__init__", init)
    return log


def wait_closed(log, n=1):
    deadline = time.monotonic() + 5
    while log["closed"] < n and time.monotonic() < deadline:
        time.sleep(0.01)
    steps = log["steps"]
    time.sleep(0.3)  # 30 more steps, were decoding to go on
    return steps


@pytest.mark.parametrize("n", [1, 3])
@pytest.mark.parametrize("stream", [True, False])
def test_a_client_disconnect_cancels_its_request(url, slow_steps, stream, n):
    """Every choice's sequence is closed, and no step runs after the one in flight."""
    body = {"model": NAME, "messages": CHAT, "max_tokens": 150, "temperature": 0,
            "stop": [], "stream": stream, "n": n}
    with httpx.Client(trust_env=False, timeout=0.3) as h:
        if stream:
            with h.stream("POST", url + "/v1/chat/completions", json=body) as r:
                lines = r.iter_lines()
                for _ in range(6):
                    next(lines)
        else:
            with pytest.raises(httpx.ReadTimeout):
                h.post(url + "/v1/chat/completions", json=body)
    steps = wait_closed(slow_steps, n)
    assert slow_steps["closed"] == n and slow_steps["steps"] <= steps + n < 100 * n


@pytest.mark.requires("smollm2", "")
def test_smollm2_chat_equals_generate(smollm2_path):
    model = specdec.load(smollm2_path)
    msgs = [{"role": "user", "content": "Name three rivers."}]
    want = generated(model, msgs, 24)
    with running(serve.create_app(model, specdec.PromptLookup(k=4), name="smol")) as u:
        c = openai.OpenAI(base_url=u + "/v1", api_key="unused", max_retries=0,
                          http_client=httpx.Client(trust_env=False, timeout=60))
        r = c.chat.completions.create(model="smol", messages=msgs, max_tokens=24, temperature=0)
        s = c.chat.completions.create(model="smol", messages=msgs, max_tokens=24, temperature=0,
                                      stream=True)
        streamed = "".join(ch.choices[0].delta.content or "" for ch in s if ch.choices)
    assert r.choices[0].message.content == streamed == want.text and len(want.tokens) > 5


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_the_serve_command(text_model):
    """`specdec serve --model M --port P` in a child process serves the model under the name it
    was given, with prompt lookup by default, until it is terminated."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "specdec", "serve", "--model", text_model.path,
                             "--port", str(port), "--log-level", "warning"], cwd=HERE,
                            env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        with httpx.Client(trust_env=False) as h:
            while True:
                assert proc.poll() is None, proc.communicate()[1]
                assert time.monotonic() < deadline, "the server did not come up"
                try:
                    if h.get(url + "/health").status_code == 200:
                        break
                except httpx.TransportError:
                    time.sleep(0.1)
        c = client(url)
        assert [m.id for m in c.models.list().data] == [text_model.path]
        r = c.chat.completions.create(model=text_model.path, messages=CHAT, max_tokens=20,
                                      temperature=0)
        assert r.choices[0].message.content == generated(text_model, CHAT, 20).text
        assert r.model_extra["specdec"]["speculator"].startswith("PromptLookup(")
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=20)
    assert "speculator PromptLookup(" in err
