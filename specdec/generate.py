"""Decoding: greedy or sampled autoregressive generation, the loop running in C."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import List, Optional, Sequence

from .model import Model, TokenIds


@dataclass
class Generation:
    """The result of :func:`generate`."""

    tokens: List[int]                 # the new tokens
    prompt_tokens: List[int] = field(default_factory=list)
    time_s: float = 0.0               # wall time of the whole call (prefill included)

    @property
    def tokens_per_s(self) -> float:
        """New tokens per second of wall time (prefill included)."""
        return len(self.tokens) / self.time_s if self.time_s > 0 else 0.0


def generate(model: Model, prompt_tokens: TokenIds, max_new_tokens: int = 16,
             temperature: float = 0.0, seed: Optional[int] = None,
             stop_tokens: Optional[Sequence[int]] = None) -> Generation:
    """Generate up to ``max_new_tokens`` tokens after ``prompt_tokens``.

    Args:
        model: from :func:`specdec.load`.
        prompt_tokens: at least one token id.
        max_new_tokens: upper bound on new tokens (>= 0); prompt + new tokens must fit in the
            context length.
        temperature: 0 for greedy decoding (argmax, lowest id on ties); > 0 samples from
            softmax(logits / temperature).
        seed: makes sampling reproducible (same seed, same tokens, whatever the thread count);
            None draws a fresh seed.
        stop_tokens: token ids that end generation; the stop token is included in the output.
    """
    if not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be a non-negative integer, got {max_new_tokens!r}")
    if not temperature >= 0.0:
        raise ValueError(f"temperature must be >= 0, got {temperature!r}")
    if seed is None:
        seed = int.from_bytes(os.urandom(8), "little")
    if not 0 <= seed < 2**64:
        raise ValueError(f"seed must be in [0, 2**64), got {seed}")
    t0 = time.perf_counter()
    # the C boundary validates the ids (integers, in range) before any work
    tokens = model._core.generate(prompt_tokens, max_new_tokens, float(temperature), seed,
                                  None if stop_tokens is None else list(stop_tokens))
    elapsed = time.perf_counter() - t0
    return Generation(tokens=tokens, prompt_tokens=[int(t) for t in prompt_tokens],
                      time_s=elapsed)
