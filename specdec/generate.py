"""Decoding: greedy or sampled autoregressive generation, the loop running in C."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import (Any, Callable, Dict, Generator, List, Mapping, Optional, Sequence, Tuple,
                    Union)

from .model import Model, TokenIds
from .speculators import INT_MAX, SpecStats, Speculator, _bool, _int, _number, _seed

Messages = List[Dict[str, Any]]
Prompt = Union[str, Messages, TokenIds]


@dataclass
class Generation:
    """The result of :func:`generate`."""

    tokens: List[int]                 # the new tokens (a final stop token included)
    prompt_tokens: List[int] = field(default_factory=list)
    text: Optional[str] = None        # the new text, when the model has a tokenizer
    finish_reason: str = "length"     # "length", "stop_token", "stop_string" or "cancelled"
    time_s: float = 0.0               # wall time of decoding (prefill included, tokenizing not)
    stats: Optional[SpecStats] = None  # speculative runs: drafts, acceptance, timings
    prefix_reused: int = 0            # prompt tokens whose keys and values a finished request's
    #                                   cache gave (Model.prefix_cache), not computed again
    #: with ``logprobs=True``: each token's log-probability under the model (log softmax of its
    #: logits at temperature 1, before any sampling setting), one per entry of ``tokens``
    logprobs: Optional[List[float]] = None
    #: with ``top_logprobs=n``: the n most probable tokens at each position, as (id,
    #: log-probability) pairs, best first
    top_logprobs: Optional[List[List[Tuple[int, float]]]] = None

    @property
    def tokens_per_s(self) -> float:
        """New tokens per second of wall time (prefill included)."""
        return len(self.tokens) / self.time_s if self.time_s > 0 else 0.0


def _is_messages(prompt: Prompt) -> bool:
    return isinstance(prompt, (list, tuple)) and bool(prompt) and isinstance(prompt[0], dict)


def encode_prompt(model: Model, prompt: Prompt) -> List[int]:
    """Token ids of a prompt: ids as given; a string encoded (special tokens such as
    ``<|im_start|>`` recognised); a list of chat messages rendered with the model's chat
    template (generation prompt added) and encoded."""
    if isinstance(prompt, str):
        return model.require_tokenizer().encode(prompt, add_special=True)
    if _is_messages(prompt):
        tok = model.require_tokenizer()
        return tok.encode(tok.apply_chat_template(list(prompt), add_generation_prompt=True))
    if isinstance(prompt, (bytes, bytearray)) or (isinstance(prompt, memoryview)
                                                   and isinstance(prompt.obj, (bytes, bytearray))):
        raise TypeError(f"prompt must be a string, chat messages or a 1-D sequence of integer "
                        f"token ids, got {type(prompt).__name__}")
    return prompt  # ids: validated by the C boundary


class _Call:
    """One generate/stream call: the arguments checked and converted, the prompt encoded, and
    the core sequence that decodes it a step at a time (nothing computed yet)."""

    def __init__(self, model: Model, prompt: Prompt, max_new_tokens: Any, temperature: Any,
                 seed: Optional[int], stop_tokens: Optional[Sequence[int]],
                 stop: Optional[Sequence[str]], top_k: Any, top_p: Any, min_p: Any,
                 speculator: Optional[Speculator], logprobs: Any = False, top_logprobs: Any = 0,
                 logit_bias: Any = None, repetition_penalty: Any = 1.0,
                 frequency_penalty: Any = 0.0, presence_penalty: Any = 0.0, min_tokens: Any = 0,
                 reserved: bool = False) -> None:
        # types are checked here, ranges by the C core (its messages name the parameter)
        max_new_tokens = _int("max_new_tokens", max_new_tokens, 0, INT_MAX)
        temperature = _number("temperature", temperature)
        top_k = _int("top_k", top_k, 0, INT_MAX)
        top_p = _number("top_p", top_p)
        min_p = _number("min_p", min_p)
        logprobs = _bool("logprobs", logprobs)
        top_logprobs = _int("top_logprobs", top_logprobs, 0, INT_MAX)
        if not 0 <= top_logprobs <= 20:
            raise ValueError(f"top_logprobs must be in [0, 20], got {top_logprobs}")
        # a vocabulary smaller than that has no more alternatives to give
        top_logprobs = min(top_logprobs, model.config.vocab_size)
        self.logprobs = logprobs or top_logprobs > 0  # the alternatives come with the token's
        penalties = {name: _number(name, v) for name, v in (
            ("repetition_penalty", repetition_penalty), ("frequency_penalty", frequency_penalty),
            ("presence_penalty", presence_penalty))}
        bias_ids, bias_values = _logit_bias(logit_bias)
        min_tokens = _int("min_tokens", min_tokens, 0, INT_MAX)
        if seed is None:
            seed = int.from_bytes(os.urandom(8), "little")
        seed = _seed(seed)
        if speculator is not None and not isinstance(speculator, Speculator):
            raise TypeError(f"speculator must be a specdec.Speculator (PromptLookup, DraftModel, "
                            f"LayerSkip, ...) or None, got {type(speculator).__name__}")
        if speculator is not None:
            speculator.check_target(model)
        if isinstance(stop, str):
            stop = [stop]
        if stop is not None:
            if isinstance(stop, (bytes, bytearray)) or not hasattr(stop, "__iter__"):
                raise TypeError(f"stop must be a string or a sequence of strings, got "
                                f"{type(stop).__name__}")
            stop = list(stop)
            if not all(isinstance(s, str) and s for s in stop):
                raise ValueError("stop must be a list of non-empty strings")
            for s in stop:
                try:
                    s.encode("utf-8")
                except UnicodeEncodeError as e:
                    raise ValueError(f"stop string {s!r} is not valid Unicode ({e.reason} at "
                                     f"index {e.start})") from None
        if stop_tokens is not None:
            if isinstance(stop_tokens, (str, bytes, bytearray)) or not hasattr(stop_tokens,
                                                                               "__iter__"):
                raise TypeError(f"stop_tokens must be a sequence of token ids or None, got "
                                f"{type(stop_tokens).__name__}")
            vocab = model.config.vocab_size
            stop_tokens = [_int("stop_tokens", t) for t in stop_tokens]
            for t in stop_tokens:
                if not 0 <= t < vocab:
                    raise ValueError(f"stop_tokens holds token id {t}, out of range "
                                     f"[0, {vocab})")
        text_in = isinstance(prompt, str) or _is_messages(prompt)
        try:
            tok = model.tokenizer
        except ValueError:
            if text_in or stop:
                raise
            tok = None  # an unsupported tokenizer does not stop decoding from token ids
        if text_in and tok is None:
            model.require_tokenizer()  # stop strings without a tokenizer: the C core says so
        if stop_tokens is None:
            stop_tokens = sorted(tok.eog_ids) if tok is not None else model.eos_ids()
        self.tok = tok
        self.stop: List[str] = list(stop or [])
        self.stop_ids = set(stop_tokens) if stop_tokens is not None else set()
        self.ids = encode_prompt(model, prompt)
        self.t0 = time.perf_counter()
        self.seq = model._core.sequence(
            self.ids, max_new_tokens=max_new_tokens, temperature=temperature, seed=seed,
            stop_ids=None if stop_tokens is None else list(stop_tokens),
            stop_strings=[s.encode("utf-8") for s in self.stop] or None,
            top_k=top_k, top_p=top_p, min_p=min_p,
            drafter=None if speculator is None else speculator.drafter(), reserved=reserved,
            logprobs=self.logprobs, top_logprobs=top_logprobs, logit_bias_ids=bias_ids,
            logit_bias_values=bias_values, min_tokens=min_tokens, **penalties)

    def result(self, tokens: List[int], reason: str) -> Generation:
        """The Generation of these tokens; frees the sequence."""
        elapsed = time.perf_counter() - self.t0
        core_stats, reused = self.seq.stats, self.seq.reused
        lps, tops = self.seq.logprobs() if self.logprobs else (None, None)
        self.seq.close()
        text = None
        if self.tok is not None:
            body = tokens[:-1] if reason == "stop_token" else tokens
            text = self.tok.decode(body)
            if reason == "stop_string":
                # the C loop matched the raw bytes; a vocabulary whose decoding cleans up spaces
                # could hide the match from the text, which is then left whole
                cut = min((i for i in (text.find(s) for s in self.stop) if i >= 0),
                          default=len(text))
                text = text[:cut]
        stats = None if core_stats is None else SpecStats.from_core(core_stats, len(tokens))
        n = len(tokens)  # a cancelled call's tokens stop short of the sequence's
        return Generation(tokens=tokens, prompt_tokens=[int(t) for t in self.ids], text=text,
                          finish_reason=reason, time_s=elapsed, stats=stats,
                          prefix_reused=reused, logprobs=None if lps is None else lps[:n],
                          top_logprobs=None if tops is None else tops[:n])


def _logit_bias(bias: Any) -> Tuple[Optional[List[int]], Optional[List[float]]]:
    """A logit_bias mapping (token id -> number) as the core's two lists (None for none)."""
    if bias is None:
        return None, None
    if not isinstance(bias, Mapping):
        raise TypeError(f"logit_bias must be a mapping of token ids to numbers, got "
                        f"{type(bias).__name__}")
    ids = [_int("logit_bias token id", k, 0, INT_MAX) for k in bias]
    values = [_number(f"logit_bias[{k}]", v) for k, v in zip(ids, bias.values())]
    for k, v in zip(ids, values):
        if not -100 <= v <= 100:  # before float32 could make it inf
            raise ValueError(f"logit_bias for token id {k} must be in [-100, 100], got {v}")
    return ids, values


class _Pieces:
    """What :func:`stream` (and :func:`specdec.astream`) yield for a call's new tokens: token ids
    for a model without a tokenizer; otherwise pieces of text, a character held back until its
    UTF-8 bytes are complete, and text that could start a stop string until it is known not to.

    Text is decoded incrementally (each token costs the same however long the output is):
    ``pending`` is final text not yet yielded, ``tail`` the last ``hold`` characters yielded, so
    that a stop string spanning both is found."""

    def __init__(self, call: _Call) -> None:
        self.stop, self.stop_ids = call.stop, call.stop_ids
        self.dec = call.tok.incremental_decoder() if call.tok is not None else None
        self.hold = max((len(s) for s in call.stop), default=1) - 1
        self.sent: List[str] = []
        self.pending = self.tail = ""
        self.stopped = False

    def push(self, tokens: Sequence[int]) -> List[Union[str, int]]:
        """The pieces (or ids) that these new tokens release, in order."""
        if self.dec is None:
            return list(tokens)
        out: List[Union[str, int]] = []
        for t in tokens:
            if t in self.stop_ids or self.stopped:
                continue  # a stop token ends the text without adding to it
            self.pending += self.dec.push(t)
            if not self.pending:
                continue
            window = self.tail + self.pending
            safe = len(window) - self.hold
            for s in self.stop:  # never past a stop string, even one the byte match missed
                i = window.find(s)
                if i >= 0:
                    safe, self.stopped = min(safe, i), True
            piece = self.pending[:max(0, safe - len(self.tail))]
            if piece:
                out.append(piece)
                self.sent.append(piece)
                self.pending = self.pending[len(piece):]
                self.tail = (self.tail + piece)[-self.hold:] if self.hold else ""
        return out

    def rest(self, g: Generation) -> str:
        """The end of ``g.text`` not yielded yet (text held back until the end); "" if none."""
        sent = "".join(self.sent)
        if g.text is not None and g.text.startswith(sent) and len(g.text) > len(sent):
            return g.text[len(sent):]
        return ""


def _run(seq: Any, on_token: Optional[Callable[[int], Any]]) -> Tuple[List[int], str]:
    """Steps a core sequence to its end in this thread, calling on_token with each new token (a
    true result cancels after that token); the tokens and the finish reason."""
    n = 0
    while not seq.done:
        new = seq.step()
        if on_token is not None:
            for i, t in enumerate(new):
                if on_token(t):
                    return seq.tokens[:n + i + 1], "cancelled"
        n += len(new)
    return seq.tokens, seq.finish_reason


def generate(model: Model, prompt: Prompt, max_new_tokens: int = 16, temperature: float = 0.0,
             seed: Optional[int] = None, stop_tokens: Optional[Sequence[int]] = None,
             stop: Optional[Sequence[str]] = None, *, top_k: int = 0, top_p: float = 1.0,
             min_p: float = 0.0,
             speculator: Optional[Speculator] = None,
             on_token: Optional[Callable[[int], Any]] = None, logprobs: bool = False,
             top_logprobs: int = 0, logit_bias: Optional[Mapping[int, float]] = None,
             repetition_penalty: float = 1.0, frequency_penalty: float = 0.0,
             presence_penalty: float = 0.0, min_tokens: int = 0) -> Generation:
    """Generate up to ``max_new_tokens`` tokens after ``prompt``.

    Args:
        model: from :func:`specdec.load`.
        prompt: token ids, a string, or a list of chat messages
            (``[{"role": "user", "content": "..."}]``, rendered with the model's chat template);
            text needs a model with a tokenizer.
        max_new_tokens: upper bound on new tokens (>= 0); prompt + new tokens must fit in the
            context length.
        temperature: 0 for greedy decoding (argmax, lowest id on ties); > 0 samples from
            softmax(logits / temperature).
        seed: makes sampling reproducible (same seed, same tokens, whatever the thread count);
            None draws a fresh seed.
        stop_tokens: token ids that end generation (the stop token is the last of ``tokens``).
            Default: the model's end-of-generation tokens (from its tokenizer, else the
            end-of-sequence id its file names, else none).
        stop: strings that end generation; ``text`` is cut before the first one.
        top_k, top_p, min_p: sampling filters applied after the temperature (0, 1 and 0 are
            off): keep the k most probable tokens, then the smallest set with mass >= top_p,
            then drop tokens below min_p times the most probable.
        speculator: None for plain decoding, or a :class:`specdec.Speculator` such as
            :class:`specdec.PromptLookup`, :class:`specdec.DraftModel` or
            :class:`specdec.LayerSkip`: speculative decoding whose output is the target's own
            (identical at temperature 0, identically distributed when sampling); ``stats`` then
            reports drafts and acceptance.
        on_token: called with each new token id as it is emitted, in the thread that called
            ``generate``, between decoding steps (a speculative step emits several tokens at
            once); a true result ends generation after that token with ``finish_reason``
            "cancelled"; an exception it raises ends generation and propagates. See
            :func:`stream` for an iterator of text.
        logprobs: True fills ``Generation.logprobs`` with each new token's log-probability
            under the model: log softmax of the target's logits at temperature 1 (after
            ``logit_bias`` and the penalties, when given), before ``temperature``, ``top_k``,
            ``top_p`` and ``min_p`` (as vLLM's default and OpenAI's report them). The same
            with or without a speculator: a token's logits do not depend on the batch it was
            verified in, so the numbers are plain decoding's, bit for bit. CPU models only;
            costs a pass over the vocabulary per token.
        top_logprobs: n in [0, 20]: also the n most probable tokens at each position and their
            log-probabilities (``Generation.top_logprobs``; ties to the lower id); n > 0
            implies ``logprobs``.
        logit_bias: {token id: bias in [-100, 100]} added to the model's logits at every
            position (-100 all but bans a token).
        repetition_penalty: > 0 (1 is off): the logit of a token already in the prompt or the
            output is divided by it where positive, multiplied where negative (as in
            transformers and vLLM).
        frequency_penalty, presence_penalty: in [-2, 2] (0 is off): a token the output already
            holds c times loses ``frequency_penalty * c + presence_penalty`` from its logit (as
            OpenAI and vLLM define them; the prompt does not count).
            These three and ``logit_bias`` change the distribution that is decoded, in that
            order, before the temperature and the filters; with a speculator each verified
            position counts the drafted tokens before it, so the output is still exactly that
            of plain decoding with the same settings. ``logprobs`` then report the changed
            logits. CPU models only.
        min_tokens: the stop tokens cannot end generation before this many new tokens (their
            logits are -inf until then; stop strings still stop it); exact under speculation
            as the penalties are. CPU models only.

    Decoding runs in C a step at a time (a part of a long prompt, one token, or one speculative
    step) with the GIL released, so Ctrl-C raises KeyboardInterrupt between steps, and other
    threads may generate with the same model at the same time: the steps that are ready
    together share one forward (continuous batching; :attr:`Model.scheduler_stats` counts),
    each request keeping its own cache, sampling and stop rules, and its output the same as
    alone. :attr:`Model.max_sequences` bounds how many decode at once; more wait their turn.

    Raises:
        ValueError: an argument out of its range (the message names it), a prompt and
            ``max_new_tokens`` beyond the context length, text for a model without a tokenizer.
        TypeError: an argument of the wrong type.
        FloatingPointError: the model's hidden state left the finite range (NaN or infinity) on
            the CPU, so its logits mean nothing: the model's arithmetic overflows (a corrupt or
            wrongly scaled file).
    """
    if on_token is not None and not callable(on_token):
        raise TypeError(f"on_token must be callable or None, got {type(on_token).__name__}")
    call = _Call(model, prompt, max_new_tokens, temperature, seed, stop_tokens, stop, top_k, top_p,
                 min_p, speculator, logprobs, top_logprobs, logit_bias, repetition_penalty,
                 frequency_penalty, presence_penalty, min_tokens)
    try:
        tokens, reason = _run(call.seq, on_token)
    except BaseException:
        call.seq.close()
        raise
    return call.result(tokens, reason)


def stream(model: Model, prompt: Prompt, max_new_tokens: int = 16, temperature: float = 0.0,
           seed: Optional[int] = None, stop_tokens: Optional[Sequence[int]] = None,
           stop: Optional[Sequence[str]] = None, *, top_k: int = 0, top_p: float = 1.0,
           min_p: float = 0.0, speculator: Optional[Speculator] = None, logprobs: bool = False,
           top_logprobs: int = 0, logit_bias: Optional[Mapping[int, float]] = None,
           repetition_penalty: float = 1.0, frequency_penalty: float = 0.0,
           presence_penalty: float = 0.0, min_tokens: int = 0
           ) -> Generator[Union[str, int], None, Generation]:
    """:func:`generate`, yielding the output as it is accepted: pieces of text for a model with
    a tokenizer (a character is held back until its UTF-8 bytes are complete, and text that
    could be the start of a ``stop`` string until it is known not to be), token ids otherwise.
    The pieces join to ``Generation.text``; the :class:`Generation` is the generator's return
    value (``g = yield from stream(...)``). Breaking out of the loop (or closing the generator)
    stops decoding after the current step. Each token's bytes are decoded once
    (:meth:`specdec.tokenizer.Tokenizer.incremental_decoder`), so the text costs time linear in
    its length. Arguments as for :func:`generate` (the log-probabilities, when asked for, come
    with the returned Generation).
    """
    call = _Call(model, prompt, max_new_tokens, temperature, seed, stop_tokens, stop, top_k, top_p,
                 min_p, speculator, logprobs, top_logprobs, logit_bias, repetition_penalty,
                 frequency_penalty, presence_penalty, min_tokens)
    seq, text = call.seq, _Pieces(call)
    try:
        while not seq.done:
            yield from text.push(seq.step())
        g = call.result(seq.tokens, seq.finish_reason)
    finally:
        seq.close()  # also when the consumer stops early: decoding ends with this step
    rest = text.rest(g)
    if rest:
        yield rest
    return g
