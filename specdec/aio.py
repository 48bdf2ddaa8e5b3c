"""asyncio: :func:`agenerate` and :func:`astream`, the decoding of :func:`specdec.generate` and
:func:`specdec.stream` awaited instead of run in the caller's thread.

Each decoding step (the C call that runs with the GIL released) runs in a worker thread while
the event loop goes on; between steps the request is back in the loop, so cancelling the task
that awaits it (or closing the stream) ends decoding there: the step in flight, if any, is the
last, and the sequence and its caches are freed as soon as it returns. The steps of requests
on one model that are ready at the same time share one forward, as with threads (see
:func:`specdec.generate`). A request beyond :attr:`specdec.Model.max_sequences` waits for its
slot in the event loop, so no worker thread is held by a waiting request.
"""

from __future__ import annotations

import asyncio
import collections
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Deque, List, Mapping, Optional, Sequence, Tuple, Union

from .generate import Generation, Prompt, _Call, _Pieces
from .model import Model
from .speculators import Speculator

#: the most decoding steps (and prompt encodings) that run at once in worker threads, over all
#: requests and models of the process; more wait their turn in the executor's queue
MAX_WORKERS = 64

_executor: Optional[ThreadPoolExecutor] = None
_executor_lock = threading.Lock()


#: how often a request waiting for a slot under Model.max_sequences looks again (seconds)
ADMISSION_POLL_S = 0.002


def _slot_keeper(model: Model) -> Callable[[Future], None]:
    """For a call made in a slot taken by try_reserve: the sequence owns the slot once made;
    if the call failed or never ran, the slot goes back."""
    def done(fut: Future) -> None:
        if fut.cancelled() or fut.exception() is not None:
            model._core.unreserve()
    return done


def _workers() -> ThreadPoolExecutor:
    """The process's pool of stepping threads (made on first use; threads start as needed)."""
    global _executor
    with _executor_lock:
        if _executor is None:
            _executor = ThreadPoolExecutor(MAX_WORKERS, thread_name_prefix="specdec-step")
        return _executor


class _Request:
    """One awaited request: the call made in a worker thread (argument checks, prompt encoding,
    sequence creation), then its steps, one at a time, each in a worker thread. close() frees
    the sequence now, or, when a step is still running (its awaiting task was cancelled), as
    soon as that step returns."""

    def __init__(self, args: tuple) -> None:
        self.args = args
        self.reserved = False  # a caller took the slot for it (Model's try_reserve)
        self.call: Optional[_Call] = None
        self.inflight: Optional[Future] = None  # the call being made or the step being run
        self.closed = False

    async def start(self) -> _Call:
        if self.closed:
            raise ValueError("the request is closed")
        if self.call is None:
            model = self.args[0]
            if not isinstance(model, Model):  # _Call names the wrong type
                self.call = await self._run(_Call, *self.args)
                return self.call
            # a slot under model.max_sequences, waited for here: a worker thread blocked on it
            # could hold up the steps of the requests that have one
            while not self.reserved and not model._core.try_reserve():
                await asyncio.sleep(ADMISSION_POLL_S)
                if self.closed:
                    raise ValueError("the request is closed")
            self.reserved = False  # the call owns it from here (or gives it back)
            self.call = await self._run(_Call, *self.args, reserved=True,
                                        on_done=_slot_keeper(model))
        return self.call

    async def step(self) -> List[int]:
        call = await self.start()
        return await self._run(call.seq.step)

    async def _run(self, fn: Callable[..., Any], *args: Any,
                   on_done: Optional[Callable[[Future], None]] = None, **kw: Any) -> Any:
        self.inflight = fut = _workers().submit(fn, *args, **kw)
        if on_done is not None:
            fut.add_done_callback(on_done)
        try:
            result = await asyncio.wrap_future(fut)
        except BaseException:
            self.close()  # cancelled, or the step failed: no further step
            raise
        self.inflight = None
        return result

    def close(self) -> None:
        if self.closed:  # a second close (the caller's, after _run's) must not free the
            return       # sequence while the step the first one waits for still runs
        self.closed = True
        if self.reserved:  # closed before its call was made: the caller's slot goes back
            self.reserved = False
            self.args[0]._core.unreserve()
        fut, self.inflight = self.inflight, None
        if fut is not None:
            # runs now if the thread is done (or never started it), else when it returns
            fut.add_done_callback(self._free)
        elif self.call is not None:
            self.call.seq.close()

    def _free(self, fut: Future) -> None:
        if fut.cancelled() or fut.exception() is not None:
            if self.call is not None:
                self.call.seq.close()
            return
        result = fut.result()
        (result if isinstance(result, _Call) else self.call).seq.close()


async def agenerate(model: Model, prompt: Prompt, max_new_tokens: int = 16,
                    temperature: float = 0.0, seed: Optional[int] = None,
                    stop_tokens: Optional[Sequence[int]] = None,
                    stop: Optional[Sequence[str]] = None, *, top_k: int = 0, top_p: float = 1.0,
                    min_p: float = 0.0, speculator: Optional[Speculator] = None,
                    on_token: Optional[Callable[[int], Any]] = None, logprobs: bool = False,
                    top_logprobs: int = 0, logit_bias: Optional[Mapping[int, float]] = None,
                    repetition_penalty: float = 1.0, frequency_penalty: float = 0.0,
                    presence_penalty: float = 0.0, min_tokens: int = 0) -> Generation:
    """:func:`specdec.generate` for asyncio: the same arguments and the same
    :class:`~specdec.Generation`, without blocking the event loop (each decoding step runs in a
    worker thread). ``on_token`` is called in the event loop's thread, between steps.
    Cancelling the awaiting task ends decoding after the step in flight and frees the
    sequence."""
    if on_token is not None and not callable(on_token):
        raise TypeError(f"on_token must be callable or None, got {type(on_token).__name__}")
    req = _Request((model, prompt, max_new_tokens, temperature, seed, stop_tokens, stop, top_k,
                    top_p, min_p, speculator, logprobs, top_logprobs, logit_bias,
                    repetition_penalty, frequency_penalty, presence_penalty, min_tokens))
    try:
        call = await req.start()
        seq, n = call.seq, 0
        while not seq.done:
            new = await req.step()
            if on_token is not None:
                for i, t in enumerate(new):
                    if on_token(t):
                        return call.result(seq.tokens[:n + i + 1], "cancelled")
            n += len(new)
        return call.result(seq.tokens, seq.finish_reason)
    finally:
        req.close()


class AsyncStream:
    """What :func:`astream` returns: an async iterator of the output's pieces (text, or token
    ids for a model without a tokenizer), exactly those :func:`specdec.stream` yields, and
    then ``generation``, the :class:`~specdec.Generation`.

    ``async for piece in specdec.astream(model, prompt): ...`` decodes as the loop asks for
    pieces: stopping the loop stops decoding (no step runs while the consumer holds a piece),
    and :meth:`close` (or ``async with``) frees the sequence at once rather than when the stream
    is garbage. Cancelling a task that awaits a piece ends decoding after the step in flight."""

    def __init__(self, args: tuple) -> None:
        self._req = _Request(args)
        self._text: Optional[_Pieces] = None
        self._ready: Deque[Union[str, int]] = collections.deque()
        #: the Generation, once the stream is exhausted (None before)
        self.generation: Optional[Generation] = None

    async def start(self) -> "AsyncStream":
        """Check the arguments, encode the prompt and create the sequence now (their errors are
        raised here rather than at the first piece); nothing is decoded yet."""
        if self._text is None:
            self._text = _Pieces(await self._req.start())
        return self

    def __aiter__(self) -> "AsyncStream":
        return self

    async def __anext__(self) -> Union[str, int]:
        while not self._ready:
            if self._req.closed:  # exhausted, or closed by the consumer
                raise StopAsyncIteration
            await self.start()
            call = self._req.call
            assert call is not None and self._text is not None
            if call.seq.done:
                g = call.result(call.seq.tokens, call.seq.finish_reason)
                rest = self._text.rest(g)
                if rest:
                    self._ready.append(rest)
                self.generation = g
                self._req.close()
                continue
            self._ready.extend(self._text.push(await self._req.step()))
        return self._ready.popleft()

    def logprobs_since(self, start: int) -> Tuple[List[int], Optional[List[float]],
                                                  Optional[List[List[Tuple[int, float]]]],
                                                  Optional[str]]:
        """The output decoded so far from index ``start`` (no step runs between pieces): its
        tokens, their log-probabilities and alternatives (None where not asked for), and the
        finish reason once decoding has ended (else None)."""
        g = self.generation
        if g is not None:
            return (g.tokens[start:], None if g.logprobs is None else g.logprobs[start:],
                    None if g.top_logprobs is None else g.top_logprobs[start:], g.finish_reason)
        call = self._req.call
        if call is None or self._req.closed:
            return [], None, None, None
        seq = call.seq
        got = seq.logprobs(start) if call.logprobs else None
        lps, tops = got if got is not None else (None, None)
        return seq.tokens[start:], lps, tops, seq.finish_reason if seq.done else None

    def close(self) -> None:
        """Stop decoding and free the sequence (after the step in flight, if any)."""
        self._req.close()
        self._ready.clear()

    async def aclose(self) -> None:
        self.close()

    async def __aenter__(self) -> "AsyncStream":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self.close()


def astream(model: Model, prompt: Prompt, max_new_tokens: int = 16, temperature: float = 0.0,
            seed: Optional[int] = None, stop_tokens: Optional[Sequence[int]] = None,
            stop: Optional[Sequence[str]] = None, *, top_k: int = 0, top_p: float = 1.0,
            min_p: float = 0.0, speculator: Optional[Speculator] = None, logprobs: bool = False,
            top_logprobs: int = 0, logit_bias: Optional[Mapping[int, float]] = None,
            repetition_penalty: float = 1.0, frequency_penalty: float = 0.0,
            presence_penalty: float = 0.0, min_tokens: int = 0) -> AsyncStream:
    """:func:`specdec.stream` for asyncio: ``async for piece in astream(...)`` yields the same
    pieces without blocking the event loop, and the stream's ``generation`` is the
    :class:`~specdec.Generation` once it is exhausted. Arguments as for
    :func:`specdec.generate`; their errors are raised at the first piece (or by ``await
    stream.start()``). See :class:`AsyncStream` for stopping and cancelling."""
    return AsyncStream((model, prompt, max_new_tokens, temperature, seed, stop_tokens, stop,
                        top_k, top_p, min_p, speculator, logprobs, top_logprobs, logit_bias,
                        repetition_penalty, frequency_penalty, presence_penalty, min_tokens))
