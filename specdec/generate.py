"""Decoding: greedy or sampled autoregressive generation, the loop running in C."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Union

from .model import Model, TokenIds
from .speculators import DraftModel, LayerSkip, PromptLookup, SpecStats

Messages = List[Dict[str, Any]]
Prompt = Union[str, Messages, TokenIds]
Speculator = Union[PromptLookup, DraftModel, LayerSkip]


@dataclass
class Generation:
    """The result of :func:`generate`."""

    tokens: List[int]                 # the new tokens (a final stop token included)
    prompt_tokens: List[int] = field(default_factory=list)
    text: Optional[str] = None        # the new text, when the model has a tokenizer
    finish_reason: str = "length"     # "length", "stop_token" or "stop_string"
    time_s: float = 0.0               # wall time of decoding (prefill included, tokenizing not)
    stats: Optional[SpecStats] = None  # speculative runs: drafts, acceptance, timings

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
    return prompt  # ids: validated by the C boundary


def generate(model: Model, prompt: Prompt, max_new_tokens: int = 16, temperature: float = 0.0,
             seed: Optional[int] = None, stop_tokens: Optional[Sequence[int]] = None,
             stop: Optional[Sequence[str]] = None, *, top_k: int = 0, top_p: float = 1.0,
             min_p: float = 0.0,
             speculator: Optional[Speculator] = None) -> Generation:
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
        speculator: None for plain decoding, or a :class:`specdec.PromptLookup`,
            :class:`specdec.DraftModel` or :class:`specdec.LayerSkip`: speculative decoding whose output is the target's own
            (identical at temperature 0, identically distributed when sampling); ``stats`` then
            reports drafts and acceptance.
    """
    if not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be a non-negative integer, got {max_new_tokens!r}")
    if not temperature >= 0.0:
        raise ValueError(f"temperature must be >= 0, got {temperature!r}")
    if seed is None:
        seed = int.from_bytes(os.urandom(8), "little")
    if not 0 <= seed < 2**64:
        raise ValueError(f"seed must be in [0, 2**64), got {seed}")
    if not isinstance(top_k, int) or top_k < 0:
        raise ValueError(f"top_k must be a non-negative integer (0 = off), got {top_k!r}")
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {top_p!r}")
    if not 0.0 <= min_p < 1.0:
        raise ValueError(f"min_p must be in [0, 1), got {min_p!r}")
    if speculator is not None and not isinstance(speculator, (PromptLookup, DraftModel,
                                                              LayerSkip)):
        raise TypeError(f"speculator must be a specdec.PromptLookup, DraftModel or LayerSkip, "
                        f"or None, got {type(speculator).__name__}")
    if isinstance(speculator, DraftModel):
        speculator.check_compatible(model)
    if isinstance(stop, str):
        stop = [stop]
    if stop is not None and not all(isinstance(s, str) and s for s in stop):
        raise ValueError("stop must be a list of non-empty strings")
    text_in = isinstance(prompt, str) or _is_messages(prompt)
    try:
        tok = model.tokenizer
    except ValueError:
        if text_in or stop:
            raise
        tok = None  # an unsupported tokenizer does not stop decoding from token ids
    if (stop or text_in) and tok is None:
        model.require_tokenizer()
    if stop_tokens is None:
        stop_tokens = sorted(tok.eog_ids) if tok is not None else model.eos_ids()
    ids = encode_prompt(model, prompt)
    t0 = time.perf_counter()
    lookup = draft = layerskip = None
    if isinstance(speculator, PromptLookup):
        lookup = (speculator.k, speculator.max_ngram, speculator.min_ngram,
                  float(speculator.verify_slope))
    elif isinstance(speculator, DraftModel):
        draft = (speculator.model._core, speculator.k)
    elif isinstance(speculator, LayerSkip):
        layerskip = (speculator.layers, speculator.k)
    tokens, reason, core_stats = model._core.generate(
        ids, max_new_tokens, float(temperature), seed,
        None if stop_tokens is None else list(stop_tokens),
        None if not stop else [s.encode("utf-8") for s in stop],
        top_k, float(top_p), float(min_p), lookup, draft, layerskip)
    elapsed = time.perf_counter() - t0
    text = None
    if tok is not None:
        body = tokens[:-1] if reason == "stop_token" else tokens
        text = tok.decode(body)
        if reason == "stop_string":
            # the C loop matched the raw bytes; a vocabulary whose decoding cleans up spaces
            # could hide the match from the text, which is then left whole
            cut = min((i for i in (text.find(s) for s in stop) if i >= 0), default=len(text))
            text = text[:cut]
    stats = None if core_stats is None else SpecStats.from_core(core_stats, len(tokens))
    return Generation(tokens=tokens, prompt_tokens=[int(t) for t in ids], text=text,
                      finish_reason=reason, time_s=elapsed, stats=stats)
