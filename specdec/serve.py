"""An OpenAI-compatible HTTP server over one loaded model: ``specdec serve --model MODEL``, or
:func:`create_app` for an ASGI app to mount elsewhere. Needs the ``serve`` extra
(``pip install "specdec[serve]"``: Starlette and uvicorn).

Endpoints: ``POST /v1/chat/completions``, ``POST /v1/completions`` (streaming or not; a
completion's prompt may be a list of up to 64 prompts, choice i answering prompt i // n),
``GET /v1/models``, ``GET /health``. Requests decode concurrently (each step of each request in
a worker thread, :mod:`specdec.aio`); a client that disconnects cancels its request after the
step in flight.

Parameters: ``max_tokens`` (chat also ``max_completion_tokens``; default: the rest of the
context), ``temperature`` (default 1, as OpenAI's; 0 is greedy), ``top_p``, ``seed``, ``stop``
(a string or a list), ``stream``, ``stream_options.include_usage``, the extras ``top_k`` and
``min_p``, and log-probabilities: chat's ``logprobs`` (true) and ``top_logprobs`` (0-20), a
completion's ``logprobs`` (0-20 alternatives), in OpenAI's shapes, one entry per generated token
(a final stop token left out), the model's log softmax before the sampling settings
(:func:`specdec.generate`'s ``logprobs``); in a stream, each chunk carries the entries of the
tokens decoded since the chunk before; ``presence_penalty``, ``frequency_penalty``,
``logit_bias`` and the extras ``repetition_penalty`` and ``min_tokens``
(:func:`specdec.generate`'s, exact with the speculator too); ``n`` (1-64, at most the model's
max_sequences, whose slots a request takes all at once) choices, decoded side by side (their
steps share forwards), choice i with ``seed`` + i when a seed is given, streamed as each
produces its chunks; a completion's ``echo`` (the prompt's text before the answer and, with
``logprobs``, its tokens' entries, the first null: with ``max_tokens`` 0 that scores a text,
OpenAI's legacy way of asking for a text's log-likelihood). A completion's ``top_logprobs``
hold the chosen token too (as OpenAI's: up to logprobs + 1 entries), its ``text_offset`` the
length of the text the tokens before decode to. Tools, ``best_of``, ``suffix`` and a non-text
response_format are refused with a 400 rather than ignored. Other fields are ignored.

Every response (in a stream: the chunk with the ``finish_reason``) carries a ``specdec`` object:
``speculator`` (its repr, or null for plain decoding), ``drafted`` and ``accepted`` (draft
tokens), ``acceptance_rate`` and ``mean_accepted_tokens`` (new tokens per target forward after
the prefill; both null for plain decoding), ``time_s`` and ``tokens_per_s`` (prefill included).

Errors are OpenAI's shape, ``{"error": {"message", "type", "param", "code"}}``, with a 4xx
status for a bad request (400; 404 for an unknown model or path, 405 for a wrong method).
``usage.completion_tokens`` counts every generated token, a final stop token included.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid
from typing import Any, AsyncIterator, Dict, List, Optional, Sequence, Tuple

try:
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response, StreamingResponse
    from starlette.routing import Route
except ImportError as e:  # pragma: no cover - only without the extra
    raise ImportError("specdec's server needs Starlette and uvicorn: "
                      "pip install \"specdec[serve]\"") from e

from .aio import ADMISSION_POLL_S, AsyncStream, astream
from .generate import Generation, encode_prompt
from .model import Model
from .speculators import Speculator

FINISH = {"length": "length", "stop_token": "stop", "stop_string": "stop"}
MAX_TOP_LOGPROBS = 20
MAX_N = 64  # choices of one request (each a sequence decoding beside the others)
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
# fields whose effect this server cannot give: refused unless absent or at their no-op value
UNSUPPORTED = {"tools": (None, []), "functions": (None, []), "best_of": (None, 1),
               "suffix": (None, "")}


class BadRequest(Exception):
    """A request the server refuses: answered with an OpenAI-style JSON error."""

    def __init__(self, message: str, param: Optional[str] = None, status: int = 400,
                 code: Optional[str] = None) -> None:
        super().__init__(message)
        self.param, self.status, self.code = param, status, code


def error_body(message: str, kind: str = "invalid_request_error", param: Optional[str] = None,
               code: Optional[str] = None) -> Dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def _error(status: int, message: str, param: Optional[str] = None,
           code: Optional[str] = None) -> JSONResponse:
    kind = "invalid_request_error" if status < 500 else "server_error"
    return JSONResponse(error_body(message, kind, param, code), status_code=status)


def _typed(body: Dict[str, Any], name: str, types: Tuple[type, ...], what: str) -> Any:
    """body[name] if absent/null or of `types` (never a bool for numbers); BadRequest else."""
    v = body.get(name)
    if v is None:
        return None
    if not isinstance(v, types) or (isinstance(v, bool) and bool not in types):
        raise BadRequest(f"{name} must be {what}, got {json.dumps(v)}", name)
    return v


class _Job:
    """One request's parameters, checked for their JSON types (the C core checks ranges)."""

    def __init__(self, body: Dict[str, Any], ids: List[int], context_length: int,
                 chat: bool) -> None:
        for name, neutral in UNSUPPORTED.items():
            if name in body and body[name] not in neutral:
                raise BadRequest(f"{name} is not supported by this server", name)
        n = _typed(body, "n", (int,), "an integer")
        self.n = 1 if n is None else n
        if not 1 <= self.n <= MAX_N:
            raise BadRequest(f"n must be in [1, {MAX_N}], got {self.n}", "n")
        fmt = _typed(body, "response_format", (dict,), "an object")
        if fmt is not None and fmt.get("type", "text") != "text":
            raise BadRequest("only the text response_format is supported", "response_format")
        self.ids = ids
        max_tokens = _typed(body, "max_tokens", (int,), "an integer")
        if max_tokens is None:
            max_tokens = _typed(body, "max_completion_tokens", (int,), "an integer")
        if max_tokens is None:
            max_tokens = max(context_length - len(ids), 0)
        temperature = _typed(body, "temperature", (int, float), "a number")
        stop = _typed(body, "stop", (str, list), "a string or a list of strings")
        if isinstance(stop, list) and not all(isinstance(s, str) for s in stop):
            raise BadRequest("stop must be a string or a list of strings", "stop")
        self.kwargs = dict(
            max_new_tokens=max_tokens, temperature=1.0 if temperature is None else temperature,
            seed=_typed(body, "seed", (int,), "an integer"), stop=stop or None,
            top_k=_typed(body, "top_k", (int,), "an integer") or 0,
            top_p=_number_or(body, "top_p", 1.0), min_p=_number_or(body, "min_p", 0.0),
            presence_penalty=_number_or(body, "presence_penalty", 0.0),
            frequency_penalty=_number_or(body, "frequency_penalty", 0.0),
            repetition_penalty=_number_or(body, "repetition_penalty", 1.0),
            logit_bias=_logit_bias(body),
            min_tokens=_typed(body, "min_tokens", (int,), "an integer") or 0)
        self.logprobs, top = _logprobs(body, chat)
        self.kwargs.update(logprobs=self.logprobs, top_logprobs=top)
        self.echo = bool(_typed(body, "echo", (bool,), "a boolean"))
        if self.echo and chat:
            raise BadRequest("echo is a parameter of completions, not of chat completions",
                             "echo")
        self.stream = bool(_typed(body, "stream", (bool,), "a boolean"))
        options = _typed(body, "stream_options", (dict,), "an object") or {}
        self.include_usage = bool(options.get("include_usage"))


def _logit_bias(body: Dict[str, Any]) -> Optional[Dict[int, float]]:
    """OpenAI's logit_bias, an object of token ids (as strings) to numbers."""
    bias = _typed(body, "logit_bias", (dict,), "an object")
    if not bias:
        return None
    out = {}
    for k, v in bias.items():
        try:
            t = int(k)
        except ValueError:
            raise BadRequest(f"logit_bias keys must be token ids, got {json.dumps(k)}",
                             "logit_bias") from None
        if not isinstance(v, (int, float)) or isinstance(v, bool):
            raise BadRequest(f"logit_bias[{k}] must be a number, got {json.dumps(v)}",
                             "logit_bias")
        out[t] = v
    return out


def _logprobs(body: Dict[str, Any], chat: bool) -> Tuple[bool, int]:
    """Whether to return log-probabilities, and how many alternatives: chat's ``logprobs``
    (a boolean) and ``top_logprobs``, a completion's ``logprobs`` (how many alternatives, null
    for none)."""
    if not chat:
        n = _typed(body, "logprobs", (int,), "an integer")
        if n is not None and not 0 <= n <= MAX_TOP_LOGPROBS:
            raise BadRequest(f"logprobs must be in [0, {MAX_TOP_LOGPROBS}], got {n}", "logprobs")
        return n is not None, n or 0
    on = bool(_typed(body, "logprobs", (bool,), "a boolean"))
    top = _typed(body, "top_logprobs", (int,), "an integer") or 0
    if not 0 <= top <= MAX_TOP_LOGPROBS:
        raise BadRequest(f"top_logprobs must be in [0, {MAX_TOP_LOGPROBS}], got {top}",
                         "top_logprobs")
    if top and not on:
        raise BadRequest("top_logprobs needs logprobs: true", "top_logprobs")
    return on, top


def _number_or(body: Dict[str, Any], name: str, default: float) -> float:
    v = _typed(body, name, (int, float), "a number")
    return default if v is None else v


def _text_content(content: Any, i: int) -> str:
    """A message's content as text: a string, or a list of text parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text" and
                                         isinstance(p.get("text"), str) for p in content):
        return "".join(p["text"] for p in content)
    raise BadRequest(f"messages[{i}].content must be a string or a list of text parts",
                     f"messages[{i}].content")


def chat_messages(body: Dict[str, Any]) -> List[Dict[str, str]]:
    """The request's messages as the chat template takes them (roles system, user, assistant)."""
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise BadRequest("messages must be a non-empty list of messages", "messages")
    out = []
    for i, m in enumerate(msgs):
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise BadRequest(f"messages[{i}] must be an object whose role is one of "
                             f"{', '.join(ROLES)}", f"messages[{i}].role")
        out.append({"role": ROLES[m["role"]], "content": _text_content(m.get("content"), i)})
    return out


def completion_prompts(body: Dict[str, Any]) -> List[Any]:
    """A completion's prompts: a string or a list of token ids, or a list of those (a batch,
    at most MAX_N)."""
    p = body.get("prompt")
    batch = p if isinstance(p, list) and p and all(isinstance(q, (str, list)) for q in p) \
        else [p]
    if len(batch) > MAX_N:
        raise BadRequest(f"prompt: at most {MAX_N} prompts a request, got {len(batch)}", "prompt")
    for q in batch:
        if not (isinstance(q, str) or (isinstance(q, list) and q and all(
                isinstance(t, int) and not isinstance(t, bool) for t in q))):
            raise BadRequest("prompt must be a string or a list of token ids, or a list of "
                             "those", "prompt")
    return batch


class _Server:
    """The endpoints over one model and speculator."""

    def __init__(self, model: Model, speculator: Optional[Speculator], name: str) -> None:
        model.require_tokenizer()
        self.model, self.speculator, self.name = model, speculator, name
        self.created = int(time.time())

    def spec_field(self, *gs: Generation) -> Dict[str, Any]:
        """The specdec object of one or several choices (their drafts and steps added up; the
        time the longest took)."""
        sts = [g.stats for g in gs if g.stats is not None]
        drafted, accepted = sum(st.drafted for st in sts), sum(st.accepted for st in sts)
        steps, new = sum(st.steps for st in sts), sum(st.new_tokens for st in sts)
        time_s = max(g.time_s for g in gs)
        tokens = sum(len(g.tokens) for g in gs)
        return {"speculator": None if self.speculator is None else repr(self.speculator),
                "drafted": drafted, "accepted": accepted,
                "acceptance_rate": (accepted / drafted if drafted else 0.0) if sts else None,
                "mean_accepted_tokens": (new / steps if steps else 0.0) if sts else None,
                "time_s": time_s, "tokens_per_s": tokens / time_s if time_s > 0 else 0.0}

    @staticmethod
    def usage(gs: Sequence[Generation], n: int) -> Dict[str, int]:
        """Usage of choices gs, n per prompt (each prompt counted once)."""
        p = sum(len(g.prompt_tokens) for g in gs[::n])
        c = sum(len(g.tokens) for g in gs)
        return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}

    def piece(self, t: int) -> Tuple[str, bytes]:
        b = self.model.require_tokenizer().token_to_piece(t)
        return b.decode("utf-8", errors="replace"), b

    def logprobs(self, tokens: List[int], lps: Optional[List[float]],
                 tops: Optional[List[List[Tuple[int, float]]]], chat: bool,
                 finish: Optional[str], offsets: Optional["_Offsets"]
                 ) -> Optional[Dict[str, Any]]:
        """OpenAI's logprobs object for these tokens (without a final stop token when `finish`
        is "stop_token"); `offsets`: the text decoded so far (a completion's text_offset), fed
        these tokens. None without logprobs."""
        if lps is None:
            return None
        n = len(tokens) - (finish == "stop_token")
        tops = tops if tops is not None else [[] for _ in range(n)]
        if chat:
            def entry(t: int, v: float) -> Dict[str, Any]:
                text, b = self.piece(t)
                return {"token": text, "logprob": v, "bytes": list(b)}
            return {"content": [dict(entry(t, v), top_logprobs=[entry(a, w) for a, w in top])
                                for t, v, top in zip(tokens[:n], lps, tops)], "refusal": None}
        assert offsets is not None
        texts = [self.piece(t)[0] for t in tokens[:n]]
        alts = []
        for text, v, top in zip(texts, lps, tops):
            d = {self.piece(a)[0]: w for a, w in top}
            d.setdefault(text, v)  # as OpenAI's: the chosen token too (up to logprobs + 1)
            alts.append(d)
        return {"tokens": texts, "token_logprobs": list(lps[:n]), "top_logprobs": alts,
                "text_offset": offsets.take(tokens[:n])}

    async def health(self, request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def models(self, request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [
            {"id": self.name, "object": "model", "created": self.created, "owned_by": "specdec"}]})

    async def chat(self, request: Request) -> Response:
        return await self.complete(request, chat=True)

    async def completions(self, request: Request) -> Response:
        return await self.complete(request, chat=False)

    async def complete(self, request: Request, chat: bool) -> Response:
        try:
            body = await _json_body(request)
            model = body.get("model")
            if model is not None and model != self.name:
                raise BadRequest(f"the model {model!r} does not exist; this server serves "
                                 f"{self.name!r}", "model", 404, "model_not_found")
            prompts = [chat_messages(body)] if chat else completion_prompts(body)
            jobs = []
            for prompt in prompts:
                ids = await asyncio.to_thread(encode_prompt, self.model, prompt)
                jobs.append(_Job(body, [int(t) for t in ids], self.model.config.context_length,
                                 chat))
            job = jobs[0]  # the settings all of them share
            streams = await self.start(jobs)
            try:
                echoes = [await self.echo(j) if j.echo else None for j in jobs]
            except BaseException:
                for s in streams:
                    s.close()
                raise
        except BadRequest as e:
            return _error(e.status, str(e), e.param, e.code)
        except (ValueError, TypeError) as e:  # the core's range checks name the parameter
            return _error(400, str(e))
        kind = "chat.completion" if chat else "text_completion"
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        head = {"id": rid, "object": kind, "created": int(time.time()), "model": self.name}
        if job.stream:
            return StreamingResponse(self.events(streams, head, chat, job.include_usage,
                                                 job.logprobs, echoes, jobs),
                                     media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache",
                                              "X-Accel-Buffering": "no"})
        try:
            gs = await _unless_disconnected(request, asyncio.gather(*map(_drain, streams)))
        finally:
            for s in streams:
                s.close()
        if gs is None:
            return Response(status_code=499)  # nobody is there to read it
        choices = []
        for i, g in enumerate(gs):  # prompt i // n, its choice i % n
            echo, ids = echoes[i // job.n], jobs[i // job.n].ids
            choice: Dict[str, Any] = {"index": i, "finish_reason": FINISH[g.finish_reason]}
            lp = self.logprobs(g.tokens, g.logprobs, g.top_logprobs, chat, g.finish_reason,
                               self.offsets(ids if echo else []))
            if chat:
                choice.update(message={"role": "assistant", "content": g.text}, logprobs=lp)
            elif echo is not None:
                choice.update(text=echo[0] + g.text, logprobs=_joined(echo[1], lp))
            else:
                choice.update(text=g.text, logprobs=lp)
            choices.append(choice)
        return JSONResponse(dict(head, choices=choices, usage=self.usage(gs, job.n),
                                 specdec=self.spec_field(*gs)))

    def offsets(self, prompt: List[int]) -> "_Offsets":
        """Offsets into a completion's text, after `prompt` (its echo) when given."""
        off = _Offsets(self.model.require_tokenizer())
        off.take(prompt)
        return off

    async def echo(self, job: _Job) -> Tuple[str, Optional[Dict[str, Any]]]:
        """A completion's echo: the prompt's text (as its tokens decode) and, with logprobs,
        the prompt tokens' entries (the first token's null: it has no context), scored by
        Model.token_logprobs."""
        text = self.model.require_tokenizer().decode(job.ids)
        if not job.logprobs:
            return text, None
        lps, tops = await asyncio.to_thread(self.model.token_logprobs, job.ids,
                                            job.kwargs["top_logprobs"])
        off = self.offsets([])
        first = {"tokens": [self.piece(job.ids[0])[0]], "token_logprobs": [None],
                 "top_logprobs": [None], "text_offset": off.take(job.ids[:1])}
        return text, _joined(first, self.logprobs(job.ids[1:], lps, tops, False, None, off))

    async def start(self, jobs: List[_Job]) -> List[AsyncStream]:
        """The jobs' n streams each (prompt by prompt), started (arguments checked, sequences
        made); the seed of a prompt's choice j is the request's seed + j (a fresh one each
        without a seed). Their slots under the model's max_sequences are taken all at once, or
        none is held while waiting: requests holding some of theirs while waiting for the rest
        could wait on each other for good."""
        core, limit = self.model._core, self.model.max_sequences
        total = len(jobs) * jobs[0].n
        if limit and total > limit:
            what = "n" if len(jobs) == 1 else f"n times the number of prompts ({total})"
            raise BadRequest(f"{what} must be at most {limit}, the server's --max-sequences",
                             "n")
        while True:
            got = 0
            while got < total and core.try_reserve():
                got += 1
            if got == total:
                break
            for _ in range(got):
                core.unreserve()
            await asyncio.sleep(ADMISSION_POLL_S)
        streams: List[AsyncStream] = []
        try:
            for job in jobs:
                for i in range(job.n):
                    kw = dict(job.kwargs)
                    if kw["seed"] is not None:
                        kw["seed"] = (kw["seed"] + i) % 2**64
                    s = astream(self.model, job.ids, speculator=self.speculator, **kw)
                    s._req.reserved = True  # one of the slots taken above
                    streams.append(s)
                    await s.start()
        except BaseException:
            for s in streams:
                s.close()
            for _ in range(total - len(streams)):  # the slots no stream took
                core.unreserve()
            raise
        return streams

    async def choice_events(self, s: AsyncStream, i: int, head: Dict[str, Any],
                            extra: Dict[str, Any], chat: bool, logprobs: bool,
                            echo: Optional[Tuple[str, Optional[Dict[str, Any]]]] = None,
                            prompt: Sequence[int] = ()) -> AsyncIterator[str]:
        """The SSE events of choice i of a streamed completion, up to its finish_reason (a
        completion's echo of `prompt` first)."""
        sent = [0]  # tokens whose logprobs went out
        offsets = None if chat else self.offsets(prompt if echo is not None else [])

        def new_logprobs() -> Optional[Dict[str, Any]]:
            if not logprobs:
                return None
            tokens, lps, tops, reason = s.logprobs_since(sent[0])
            lp = self.logprobs(tokens, lps, tops, chat, reason, offsets)
            sent[0] += len(tokens)
            return lp

        def chunk(piece: Optional[str], finish: Optional[str], **more: Any) -> str:
            lp = new_logprobs()
            if chat:
                delta = {} if piece is None else {"content": piece}
                choice = {"index": i, "delta": delta, "logprobs": lp, "finish_reason": finish}
            else:
                choice = {"index": i, "text": piece or "", "logprobs": lp,
                          "finish_reason": finish}
            return _event(dict(head, choices=[choice], **extra, **more))

        if chat:
            first = {"index": i, "delta": {"role": "assistant", "content": ""},
                     "finish_reason": None}
            yield _event(dict(head, choices=[first], **extra))
        elif echo is not None:
            first = {"index": i, "text": echo[0], "logprobs": echo[1], "finish_reason": None}
            yield _event(dict(head, choices=[first], **extra))
        async for piece in s:
            yield chunk(str(piece), None)
        g = s.generation
        assert g is not None
        yield chunk(None, FINISH[g.finish_reason], specdec=self.spec_field(g))

    async def events(self, streams: List[AsyncStream], head: Dict[str, Any], chat: bool,
                     include_usage: bool, logprobs: bool,
                     echoes: Sequence[Optional[Tuple[str, Optional[Dict[str, Any]]]]],
                     jobs: Sequence[_Job]) -> AsyncIterator[str]:
        """The SSE events of a streamed completion, ending with ``data: [DONE]``: one choice's
        as its consumer reads them, several choices' as each comes (they decode side by
        side)."""
        head = dict(head, object="chat.completion.chunk" if chat else "text_completion")
        extra = {"usage": None} if include_usage else {}
        n = jobs[0].n  # choice i: prompt i // n's
        gens = [self.choice_events(s, i, head, extra, chat, logprobs, echoes[i // n],
                                   jobs[i // n].ids) for i, s in enumerate(streams)]
        try:
            async for ev in (gens[0] if len(gens) == 1 else _merged(gens)):
                yield ev
            if include_usage:
                gs = [s.generation for s in streams]
                yield _event(dict(head, choices=[], usage=self.usage(gs, n)))
        except Exception as e:  # the response has started: the error goes in the stream
            yield _event(error_body(f"decoding failed: {e}", "server_error"))
        finally:
            for s in streams:
                s.close()  # a disconnect (cancellation) or an error: stop decoding
        yield "data: [DONE]\n\n"


class _Offsets:
    """A completion's text_offset: for each token, the length of the text the tokens before
    it decode to (``decode(tokens[:i])``; a character split over tokens counts there as one
    U+FFFD), found incrementally."""

    def __init__(self, tok: Any) -> None:
        self.dec, self.length = tok.incremental_decoder(), 0  # length: the pushes' text

    def take(self, tokens: Sequence[int]) -> List[int]:
        out = []
        for t in tokens:
            out.append(self.length + len(self.dec.pending()))
            self.length += len(self.dec.push(t))
        return out


def _joined(a: Optional[Dict[str, Any]], b: Optional[Dict[str, Any]]
            ) -> Optional[Dict[str, Any]]:
    """Two completions' logprobs objects one after the other."""
    if a is None or b is None:
        return a or b
    return {k: a[k] + b[k] for k in a}


async def _merged(gens: List[AsyncIterator[str]]) -> AsyncIterator[str]:
    """The items of several async iterators as they come, each pumped by its own task into a
    short queue (a slow reader holds the pumps back, as one stream's reader holds its steps);
    an exception in one is raised here, and leaving stops them all."""
    queue: asyncio.Queue = asyncio.Queue(maxsize=2 * len(gens))
    end = object()

    async def pump(g: AsyncIterator[str]) -> None:
        try:
            async for item in g:
                await queue.put(item)
        except Exception as e:  # handed to the consumer
            await queue.put(e)
        await queue.put(end)  # (a cancelled pump's consumer has gone)

    tasks = [asyncio.ensure_future(pump(g)) for g in gens]
    try:
        left = len(tasks)
        while left:
            item = await queue.get()
            if item is end:
                left -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield item
    finally:
        for t in tasks:
            t.cancel()


def _event(obj: Dict[str, Any]) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


async def _json_body(request: Request) -> Dict[str, Any]:
    raw = await request.body()
    try:
        body = json.loads(raw)
    except ValueError as e:
        raise BadRequest(f"the request body is not valid JSON: {e}") from None
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    return body


async def _drain(s: AsyncStream) -> Generation:
    async for _ in s:
        pass
    assert s.generation is not None
    return s.generation


async def _unless_disconnected(request: Request, coro: Any) -> Optional[Any]:
    """The result of `coro`, or None (coro cancelled) when the client disconnects first."""
    work = asyncio.ensure_future(coro)

    async def disconnect() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    watch = asyncio.ensure_future(disconnect())
    try:
        await asyncio.wait([work, watch], return_when=asyncio.FIRST_COMPLETED)
    except BaseException:  # this task cancelled: so is the work
        watch.cancel()
        work.cancel()
        raise
    watch.cancel()
    if work.done():
        return work.result()
    work.cancel()
    await asyncio.wait([work])  # its cancellation runs to the end (the sequences closed)
    if not work.cancelled():
        work.exception()  # retrieved: nobody is left to read it
    return None


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    what = {404: f"no such endpoint: {request.method} {request.url.path}",
            405: f"{request.method} is not allowed on {request.url.path}"}
    return _error(exc.status_code, what.get(exc.status_code, str(exc.detail)))


async def _server_error(request: Request, exc: Exception) -> Response:
    return _error(500, f"internal error: {type(exc).__name__}: {exc}")


def create_app(model: Model, speculator: Optional[Speculator] = None,
               name: Optional[str] = None) -> Starlette:
    """The ASGI app serving `model` (which needs a tokenizer) with `speculator` (None: plain
    decoding) under the model id `name` (default: the file's name)."""
    srv = _Server(model, speculator, name or os.path.basename(model.path.rstrip("/")))
    return Starlette(routes=[
        Route("/health", srv.health, methods=["GET"]),
        Route("/v1/models", srv.models, methods=["GET"]),
        Route("/v1/chat/completions", srv.chat, methods=["POST"]),
        Route("/v1/completions", srv.completions, methods=["POST"]),
    ], exception_handlers={HTTPException: _http_error, Exception: _server_error})


def serve(model: Model, speculator: Optional[Speculator] = None, host: str = "127.0.0.1",
          port: int = 8000, name: Optional[str] = None, log_level: str = "info") -> None:
    """Serve `model` over HTTP until interrupted (see :func:`create_app`). With a speculator,
    one short request is served first (:meth:`Speculator.warm_up`), so that no user's request
    pays what a first one does (a cost-sized speculator's verify cost measurement)."""
    import uvicorn

    if speculator is not None:
        speculator.warm_up(model)
    uvicorn.run(create_app(model, speculator, name), host=host, port=port, log_level=log_level)
