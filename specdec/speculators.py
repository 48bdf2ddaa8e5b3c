"""Speculators: where draft tokens come from. Pass one to :func:`specdec.generate`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List

MAX_DRAFT = 32  # SD_MAX_DRAFT in csrc/specdec.h


@dataclass(frozen=True)
class PromptLookup:
    """n-gram prompt lookup: match the last n tokens of prompt + output (n from ``max_ngram``
    down to ``min_ngram``) at their latest earlier occurrence and propose the ``k`` tokens that
    followed. Needs no second model; pays off where the output repeats its input
    (summarization, editing, retrieval-augmented answers, code)."""

    k: int = 5
    max_ngram: int = 3
    min_ngram: int = 1
    #: adaptive draft length: the extra cost of one more token in a verify batch relative to a
    #: single token (about 0.3 on a 2-core CPU with SmolLM2, benchmarks/RESULTS.md); drafts are
    #: then sized to the acceptance rate measured so far in the request. 0 = always draft k.
    verify_slope: float = 0.3

    def __post_init__(self) -> None:
        if not isinstance(self.k, int) or not 1 <= self.k <= MAX_DRAFT:
            raise ValueError(f"k must be an integer in [1, {MAX_DRAFT}], got {self.k!r}")
        if not (isinstance(self.verify_slope, (int, float)) and self.verify_slope >= 0):
            raise ValueError(f"verify_slope must be >= 0, got {self.verify_slope!r}")
        if not (isinstance(self.min_ngram, int) and isinstance(self.max_ngram, int)
                and 1 <= self.min_ngram <= self.max_ngram):
            raise ValueError("n-gram sizes must satisfy 1 <= min_ngram <= max_ngram, got "
                             f"min_ngram={self.min_ngram!r}, max_ngram={self.max_ngram!r}")


@dataclass
class SpecStats:
    """What a speculative generation did."""

    steps: int                      # target forwards after the prefill
    drafted: int                    # draft tokens proposed
    accepted: int                   # draft tokens accepted
    new_tokens: int                 # tokens emitted
    per_position_acceptance: List[float] = field(default_factory=list)  # by draft position
    time_draft_s: float = 0.0
    time_verify_s: float = 0.0
    time_total_s: float = 0.0

    @property
    def acceptance_rate(self) -> float:
        """accepted / drafted."""
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def mean_accepted_tokens(self) -> float:
        """New tokens per target forward (tau): 1 + the drafts accepted per step."""
        return self.new_tokens / self.steps if self.steps else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.time_total_s if self.time_total_s > 0 else 0.0

    @classmethod
    def from_core(cls, d: dict, new_tokens: int) -> "SpecStats":
        per = [a / n if n else 0.0 for a, n in zip(d["accepted_at"], d["drafted_at"])]
        return cls(steps=d["steps"], drafted=d["drafted"], accepted=d["accepted"],
                   new_tokens=new_tokens, per_position_acceptance=per,
                   time_draft_s=d["time_draft_s"], time_verify_s=d["time_verify_s"],
                   time_total_s=d["time_total_s"])
