"""Speculators: where draft tokens come from. Pass one to :func:`specdec.generate`."""

from __future__ import annotations

import numbers
import operator
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from . import _core

if TYPE_CHECKING:  # pragma: no cover
    from .model import Model

#: the most draft tokens one speculative step may carry (SD_MAX_DRAFT in csrc/specdec.h)
MAX_DRAFT: int = _core.max_draft()
#: the largest value of a C int, the type of the core's integer parameters
INT_MAX: int = 2**31 - 1


class Speculator:
    """Base of every speculator: a description of where draft tokens come from. Its C drafter
    (``specdec._core.Drafter``), made when the speculator is created, holds the parameters and
    checks their ranges; :func:`specdec.generate` runs it in the one speculative loop in C.

    A new speculator subclasses this, makes its drafter with the matching ``specdec._core``
    constructor in ``__init__`` (or ``__post_init__``), and may override :meth:`check_target`.
    """

    _drafter: Any

    def drafter(self) -> Any:
        """The C drafter, a ``specdec._core.Drafter``."""
        return self._drafter

    def check_target(self, target: "Model") -> None:
        """Raise ValueError when the speculator cannot serve ``target`` (nothing by default)."""

    @property
    def verify_costs(self) -> List[float]:
        """What a verify forward of T tokens costs over one of 1 token, for T = 1, 2, ...: as
        measured on the model at the first request of a speculator that sizes its trees by it
        (adaptive Token Recycling, ``size_by_cost``; [] before) after a short text (64 tokens),
        or as given to :meth:`set_verify_costs`. The model keeps what was measured, so a later
        speculator on it (the same thread count and KV cache type) takes the same curve
        without measuring again. See :meth:`verify_costs_after`."""
        return _core.drafter_costs(self._drafter)

    def verify_costs_after(self, length: int) -> List[float]:
        """:attr:`verify_costs` after a text of ``length`` tokens, the costs a step sizes its
        tree by there. Attention grows with the text and the weights do not, so a verify of
        many tokens costs relatively more after a long text. Every size is timed after 64
        tokens, and a few sizes (1, 2, 4, 8 and the largest) after 320 and 1,024 tokens, where
        the model's context allows; what the longer texts add to a forward of T tokens is
        fitted, over all those timings, as length * (a + b * (T - 1)) seconds, so the costs
        after any length follow from the fit. Given costs hold after any length."""
        return _core.drafter_costs(self._drafter, _int("length", length, 0, INT_MAX))

    def set_verify_costs(self, costs: Sequence[float]) -> None:
        """Size trees by these costs (T = 1, 2, ...; positive, non-decreasing, scaled so the
        first is 1) instead of measuring: reproducible tree sizes, or a curve measured
        elsewhere (``verify_costs`` of another run). Not while a generation uses it."""
        _core.drafter_set_costs(self._drafter, [_number("costs", c) for c in costs])

    def warm_up(self, target: "Model", tokens: int = 4) -> float:
        """Serve one short request (16 prompt tokens, ``tokens`` new ones, greedy) with this
        speculator on ``target`` and return its seconds, so that what a first request pays once
        is paid here, before any user waits: a speculator that sizes its trees by the verify
        cost measures that curve on the model (under a second on a 2-core CPU; the model keeps
        it for later speculators with the same thread count and cache type), and the weights'
        pages are read in. Serving code calls it at start-up; ``specdec serve`` does. Token
        Recycling's table learns from this request's few verify logits, as from any other."""
        from .generate import generate

        n = _int("tokens", tokens, 1, INT_MAX)
        if n < 1:
            raise ValueError(f"tokens must be >= 1, got {n}")
        vocab = target.config.vocab_size
        prompt = [(1000003 * (i + 1)) % vocab for i in range(16)]  # ids spread over the vocab
        t0 = time.perf_counter()
        generate(target, prompt, max_new_tokens=n, stop_tokens=[], speculator=self)
        return time.perf_counter() - t0


@dataclass(frozen=True)
class PromptLookup(Speculator):
    """n-gram prompt lookup: match the last n tokens of prompt + output (n from ``max_ngram``
    down to ``min_ngram``) at an earlier occurrence and propose the ``k`` tokens that followed.
    Of several occurrences, the one whose preceding tokens agree longest with the end of the
    text wins (the latest among equals), and a continuation that runs into the end of the text
    goes on periodically, so a loop of p < k tokens is still drafted k tokens ahead. Needs no
    second model; pays off where the output repeats its input (summarization, editing,
    retrieval-augmented answers, code) or itself (a small model's loops)."""

    #: the most drafts per step; the adaptive draft length (verify_slope) sizes each draft, so a
    #: long one is proposed only where the text repeats itself (on SmolLM2's Spec-Bench answers
    #: 16 beats 8 at 1024 new tokens and makes no difference at 128: benchmarks/RESULTS.md)
    k: int = 16
    max_ngram: int = 4
    min_ngram: int = 1
    #: adaptive draft length: the extra cost of one more token in a verify batch relative to a
    #: single token (about 0.2 on a 2-core CPU with SmolLM2, benchmarks/RESULTS.md; a few
    #: hundredths on a GPU); each draft is then sized to the acceptance rate measured so far in
    #: the request after matches of the same n-gram size (and, apart, after matches that reach
    #: 16 or 32 tokens back, where the text repeats itself and a long draft is tried first).
    #: 0 = always draft up to k.
    verify_slope: float = 0.2
    #: 1: one chain. b > 1: a tree of up to b sibling branches, the continuations of other
    #: earlier occurrences that start with other tokens (the best match's first), verified in
    #: one forward; pays where a verify batch of many tokens costs little more than one (AVX-512,
    #: AMX, GPUs). ``k * branching`` <= 64. CPU models only for b > 1.
    branching: int = 1
    #: keep of each step's drafts only those that pay on the verify costs measured on the
    #: target at the first request (:attr:`verify_costs`), in place of ``verify_slope``: a
    #: chain's j-th draft counts with the measured acceptance rate to the j-th power, a sibling
    #: branch with how often branches of its rank were taken; so a tree grows where verifying
    #: many tokens is cheap and shrinks to the chain, or to nothing, where it is dear. None
    #: (the default): on for trees (``branching`` > 1), off for a chain.
    size_by_cost: Optional[bool] = None
    #: 0 (the default): the text alone. h > 0: keep the last h tokens (at most 2**24) that this
    #: speculator's earlier requests generated, and where the text has no match of two or more
    #: tokens, draft what followed its last 4, 3 or 2 tokens there. Answers to one kind of
    #: request share their phrasing (a server's templated replies; on SmolLM2's Spec-Bench dev
    #: half, math_reasoning's tau 1.51 -> 1.71, benchmarks/RESULTS.md). The requests of one
    #: speculator share it, concurrent ones too (under a lock): one request's output can shape
    #: another's drafts, never its tokens' distribution, since every draft is verified. Its
    #: memory: 36 bytes a token, h rounded up to a power of two (2.4 MB for 65,536); a copy made
    #: by ``dataclasses.replace`` starts empty. Seeded sampling then repeats in distribution,
    #: not token for token: which uniforms decide a token depends on the drafts, and so on the
    #: requests before.
    history: int = 0
    _drafter: Any = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        branching = _int("branching", self.branching, 1, INT_MAX)
        sized = branching > 1 if self.size_by_cost is None else _bool("size_by_cost",
                                                                          self.size_by_cost)
        history = _history(self.history)
        d = _core.prompt_lookup(_int("k", self.k, 1, MAX_DRAFT),
                                _int("max_ngram", self.max_ngram, 1, INT_MAX),
                                _int("min_ngram", self.min_ngram, 1, INT_MAX),
                                _number("verify_slope", self.verify_slope), branching, sized)
        if history:
            _core.drafter_set_history(d, history)
        object.__setattr__(self, "_drafter", d)


@dataclass(frozen=True)
class LayerSkip(Speculator):
    """Self-speculation: the target's own first ``layers`` layers, then its final norm and
    head, draft ``k`` tokens (early exit, as in LayerSkip, Elhoushi et al. 2024, here without
    the early-exit training). It shares the target's weights and KV cache, so it costs no
    memory; it pays off when the shallow exit agrees with the full model often enough.
    ``layers`` must be smaller than the target's layer count (30 for SmolLM2-135M). Only a
    prefix of the layers is supported, not an arbitrary subset."""

    layers: int
    k: int = 5
    #: stop a step's drafting after a token the draft is less sure of than this (see
    #: :class:`DraftModel`); 0 = always draft k
    p_min: float = 0.0
    #: adaptive draft length (see :class:`DraftModel`); 0 = off
    verify_slope: float = 0.2
    #: 1: a chain. b > 1: a tree ``k`` deep of at most ``nodes`` nodes (see :class:`DraftModel`)
    branching: int = 1
    nodes: int = 16
    #: a tree's nodes: only those that pay on the measured verify costs (see :class:`DraftModel`)
    size_by_cost: bool = False
    _drafter: Any = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        d = _core.layerskip(_int("layers", self.layers, 1, INT_MAX),
                            _int("k", self.k, 1, MAX_DRAFT),
                            _number("p_min", self.p_min),
                            _number("verify_slope", self.verify_slope),
                            _int("branching", self.branching, 1, INT_MAX),
                            _int("nodes", self.nodes, 1, INT_MAX),
                            _bool("size_by_cost", self.size_by_cost))
        object.__setattr__(self, "_drafter", d)


# Heads shipped inside the package, by the alias of the target they were trained for.
_SHIPPED_HEADS = {"smollm2-135m-instruct": "smollm2-135m-instruct-eagle3"}
# the shipped heads' sliding window: the longest sequence they were trained on
_SHIPPED_WINDOW = 512


def _head_weights(weights: Any) -> bool:
    """Whether a head computes with Q8_0 copies of its matrices."""
    if weights not in ("q8_0", "float"):
        raise ValueError(f"weights must be 'q8_0' or 'float', got {weights!r}")
    return weights == "q8_0"


def _head_path(path_or_alias: Any) -> str:
    """A head directory: a path as given, or the head shipped for a target alias."""
    import os

    if isinstance(path_or_alias, str) and path_or_alias in _SHIPPED_HEADS:
        d = os.path.join(os.path.dirname(os.path.abspath(__file__)), "heads",
                         _SHIPPED_HEADS[path_or_alias])
        if not os.path.isdir(d):
            raise ValueError(f"no EAGLE head is shipped for {path_or_alias!r} in this build "
                             f"(expected at {d})")
        return d
    if not isinstance(path_or_alias, (str, os.PathLike)):
        raise TypeError(f"path must be a head directory or a model alias, got "
                        f"{type(path_or_alias).__name__}")
    d = os.fspath(path_or_alias)
    if not os.path.isdir(d):
        raise FileNotFoundError(f"no EAGLE head directory at {d!r} (a directory with "
                                f"config.json and model.safetensors or pytorch_model.bin, or one "
                                f"of the aliases {sorted(_SHIPPED_HEADS)})")
    return d


class Eagle(Speculator):
    """A learned draft head that reads the target's own hidden states: EAGLE-1/2 (Li et al.
    2024) or EAGLE-3 (Li et al. 2025), loaded from the directory its authors (SafeAILab/EAGLE)
    or vLLM's ``speculators`` publish: ``config.json`` and ``model.safetensors`` or
    ``pytorch_model.bin`` (read without torch; a pickle holding anything but tensors is
    refused). The kind is told by the file: ``fc`` of width 2H is EAGLE-1/2 (the target's
    final-normed hidden state and the next token's embedding, one decoder layer, the target's
    output head), 3H is EAGLE-3 (three of the target's layer inputs, its own draft vocabulary).
    ``path`` may also be the alias of a target a head ships for: ``"smollm2-135m-instruct"``, an
    EAGLE-3 head trained by ``python -m specdec.train eagle3`` (``specdec[train]``), with a draft
    vocabulary of 4,096 tokens, stored as 4-bit blocks (``tools/pack_head.py --blocks q4_1``).

    Each step the head first reads what the last verify gave (the accepted tokens' features,
    from the same target forward: no extra pass), then drafts ``depth`` levels from the text's
    last token, one head forward per level: a chain for ``branching`` = 1, else EAGLE-2's
    dynamic tree of at most ``nodes`` nodes (the ``branching`` most probable tokens of the most
    probable nodes at temperature 0; draws without replacement when sampling, kept or dropped
    before they are drawn so the output stays exactly the target's). ``p_min`` > 0: a node the
    head gave less than ``p_min`` is not expanded. On a CUDA target each verify forward copies
    the features the head reads back from the device, and the head's layer runs on the same
    GPU (``SPECDEC_CUDA_HEAD=0``: on the CPU); at temperature 0 only so far (sampling raises an
    error there).

    ``size_by_cost``: verify only as many nodes as pay on this machine, by the measured cost of
    a verify forward of each size (timed on the target at the first request; or given by
    :meth:`set_verify_costs`): few where verifying many tokens is dear (AVX2 alone), the whole
    tree where it is cheap (AVX-512, AMX, a GPU); at least one node every fourth step. At
    temperature 0 the most probable nodes, by the head's path probabilities scaled by how they
    have borne out in the request (accepted drafts over the verified nodes' summed
    probabilities), with no deeper head forward when its nodes could not pay for its measured
    time; when sampling, a
    count chosen before the step's draws from how deep this request's accepted paths have
    reached (a drawn token's chance to be accepted is not its draft probability; a depth not
    drafted yet is judged by how often paths went on past the depths that were), so the output
    stays exactly the target's, counting the drafting as well as the verify (the head's
    forwards and the rows' processing as timed over the request's earlier steps): where a
    step's drafts would bring fewer tokens than their time costs, the step drafts nothing
    (one node every fourth step still measures); sizes that follow timings make sampled
    output reproducible in distribution, not token for token, unless the costs are given.
    ``False``: always ``nodes`` (a chain's ``depth``).

    ``lookup`` > 0: prompt lookup beside the head. At a step where the text's last n-gram
    occurred before, the continuation (up to ``lookup`` tokens) is drafted instead of the
    head's tree when it promises more tokens per unit of time: its kind of match's acceptance
    rate so far against the head's accepted drafts, verify sizes and drafting time so far, on
    the measured verify costs. Long matches (copied passages, lists, a small model's loops)
    then go to lookup and the rest to the head; the choice rests on earlier steps only, so the
    output stays exactly the target's. 0 (default): the head alone.

    ``history``: as :class:`PromptLookup`'s, for the lookup beside the head (``lookup`` > 0):
    where the text matches by one token or not at all, the lookup draft comes from the last
    ``history`` tokens the speculator's earlier requests generated. 0 (default): none.

    ``window``: the head attends to its last ``window`` positions only (a sliding window), so
    of a long prompt only the last ``window`` rows go through the head before the first draft
    (the rest of the prompt costs the head nothing). ``None`` (default): 512 when ``path`` is
    the alias of a shipped head (trained on sequences of at most 512 tokens), else the whole
    text; ``0``: the whole text. Drafts only: the output stays exactly the target's.

    ``weights``: ``"q8_0"`` (default) computes with 8-bit copies of the head's matrices (ggml's
    Q8_0 blocks, on the integer kernels: a head runs once per depth, so its speed counts);
    ``"float"`` with the file's own F32/F16/BF16 values. Matrices the file stores as blocks
    (``tools/pack_head.py``, as the shipped head is) compute as stored either way. Either way
    the output is the target's.

    A head that does not fit the target (hidden size, vocabulary, the layers it reads) raises
    ValueError naming the mismatch at generate.
    """

    def __init__(self, path: Any, depth: int = 5, branching: int = 1, nodes: int = 16,
                 p_min: float = 0.0, weights: str = "q8_0", size_by_cost: bool = True,
                 lookup: int = 0, window: Optional[int] = None, history: int = 0) -> None:
        self.path = _head_path(path)
        history = _history(history)
        if window is None:
            window = _SHIPPED_WINDOW if isinstance(path, str) and path in _SHIPPED_HEADS else 0
        self._drafter = _core.eagle(self.path, _int("depth", depth, 1, MAX_DRAFT),
                                    _number("p_min", p_min),
                                    _int("branching", branching, 1, INT_MAX),
                                    _int("nodes", nodes, 1, INT_MAX),
                                    _head_weights(weights), _bool("size_by_cost", size_by_cost),
                                    _int("lookup", lookup, 0, MAX_DRAFT),
                                    _int("window", window, 0, INT_MAX))
        if history:
            _core.drafter_set_history(self._drafter, history)
        self.history = history
        self.lookup = lookup
        self.window = window
        self.weights = weights
        self.size_by_cost = size_by_cost
        self.kind = "eagle3" if _core.head_info(self._drafter)[0] == 3 else "eagle"
        self.depth = depth
        self.branching = branching
        self.nodes = nodes
        self.p_min = float(p_min)

    def __repr__(self) -> str:
        return (f"Eagle({self.path!r}, depth={self.depth}, branching={self.branching}, "
                f"nodes={self.nodes}, p_min={self.p_min}, lookup={self.lookup}, "
                f"window={self.window}, history={self.history})  # {self.kind}")

    def draft_logits(self, target: "Model", tokens: Sequence[int]) -> Any:
        """The head's teacher-forced logits over ``tokens``: a float32 array
        (len(tokens) - 1, vocab) whose row t holds the logits for token t + 2, from the
        target's features at positions <= t and token t + 1; -inf outside a reduced draft
        vocabulary. The head attends as it does when drafting: over its last ``window``
        positions where a window is set. Runs the target over ``tokens`` once."""
        from .model import Model

        if not isinstance(target, Model):
            raise TypeError(f"target must be a specdec.Model, got {type(target).__name__}")
        return _core.head_draft_logits(self._drafter, target._core, list(tokens), self.window)


class Medusa(Speculator):
    """Medusa-1's heads (Cai et al. 2024): extra heads over the target's last hidden state, head
    i predicting the token i + 2 ahead, loaded from a directory holding
    ``medusa_lm_head.safetensors`` or ``medusa_lm_head.pt`` (read without torch) as
    ``medusa_model.py`` saves them (``{i}.{j}.linear.weight/bias`` residual blocks, then
    ``{i}.{blocks}.weight``); the head and block counts come from the tensors.

    Each step the heads read the hidden state the last verify forward computed, and a static
    tree is filled from their best tokens: ``tree`` is a list of paths, path ``(r1, ..., rd)``
    the node holding rank ``rd`` of head ``d - 1``'s tokens, below the node of
    ``(r1, ..., r(d-1))``, which must be listed first (at most 64 paths, ranks < 16, no path
    longer than the head count). ``None``: a small default for CPUs, the first head's 3 best,
    the second's 2 best below the best and 1 below the second, then the best chain with one
    second-best leaf per further head. The nodes are verified by the exact tree rule, so the
    output is the target's; Medusa's "typical acceptance" (lossy) is not offered. On a CUDA
    target the heads run on its GPU (``SPECDEC_CUDA_HEAD=0``: on the CPU), reading the final
    hidden states each verify forward copies back. ``weights``: as :class:`Eagle`'s.
    """

    def __init__(self, path: Any, tree: Any = None, weights: str = "q8_0") -> None:
        import os

        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"path must be a directory, got {type(path).__name__}")
        self.path = os.fspath(path)
        if not os.path.isdir(self.path):
            raise FileNotFoundError(f"no Medusa head directory at {self.path!r}")
        paths = None if tree is None else [tuple(_int("tree rank", r) for r in p) for p in tree]
        self._drafter = _core.medusa(self.path, paths, _head_weights(weights))
        self.weights = weights
        self.tree = None if tree is None else paths
        self.heads = _core.head_info(self._drafter)[1]

    def __repr__(self) -> str:
        return f"Medusa({self.path!r}, tree={self.tree!r})  # {self.heads} heads"

    def draft_logits(self, target: "Model", tokens: Sequence[int]) -> Any:
        """The heads' logits over ``tokens``: a float32 array (heads, len(tokens), vocab) whose
        head i, row t holds the logits for token t + 2 + i, from the target's final-normed
        hidden state at t. Runs the target over ``tokens`` once."""
        from .model import Model

        if not isinstance(target, Model):
            raise TypeError(f"target must be a specdec.Model, got {type(target).__name__}")
        return _core.head_draft_logits(self._drafter, target._core, list(tokens))


@dataclass(frozen=True)
class TokenRecycling(Speculator):
    """Token Recycling (Luo et al. 2024): drafts a tree of tokens from a table of each token's
    most probable successors, which the target itself fills: every verify step records, for
    the root and every node it scored, the ``top`` most probable next tokens of the target's
    logits. No draft model and no training. The text's last token is the root; a node at depth
    d (the root at 0) gets the first ``widths[d]`` successors of its token as children, breadth
    first, up to ``nodes`` nodes, ``len(widths)`` levels deep. The whole tree is verified in
    one forward (each node sees its ancestors only) and the longest accepted path is kept, so
    the output is the target's own: identical at temperature 0, identically distributed when
    sampling.

    The table lives in the speculator: keep one ``TokenRecycling`` per model and reuse it
    across requests (also from several threads), so that it learns the model's habits. CPU
    models only so far.

    A tree pays where a verify forward of many tokens costs little more than one: on a CPU
    with AVX-512 or AMX, or a GPU, much more than with AVX2 alone. With ``adaptive`` (the
    default) each step drafts only the nodes of the template that pay: the speculator counts how
    often each node of the template is on the accepted path, measures once what a forward of
    each size costs on the model (a fraction of a second at the first request), and keeps the
    most promising nodes while expected tokens per unit of time grow; where nothing pays it
    decodes plainly, drafting one node every fourth step to keep measuring. The sizes chosen
    depend on timings, so with sampling a seed reproduces the distribution but not the exact
    tokens; ``adaptive=False`` drafts the whole template every step.

    ``lookup`` > 0 adds prompt lookup's draft (as :class:`PromptLookup` finds it: what followed
    the best earlier match of the text's last tokens, up to ``lookup`` tokens) to each step's
    tree as one more branch from the root, through the template's nodes where the table
    proposes the same tokens. The two cover each other's gaps: the table knows the model's
    habits, lookup the text's own repeats (quotes, names, code, translations). The adaptive cut
    weighs lookup's tokens by how often its drafts of the same kind of match were accepted so
    far in the request. ``history``: as :class:`PromptLookup`'s, for that branch (where the text
    matches by one token or not at all, it comes from the last ``history`` tokens the
    speculator's earlier requests generated); 0 (default): none."""

    nodes: int = 16
    widths: Tuple[int, ...] = (4, 2, 2, 1, 1, 1)
    top: int = 8
    adaptive: bool = True
    lookup: int = 0
    history: int = 0
    _drafter: Any = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if isinstance(self.widths, (str, bytes)) or not hasattr(self.widths, "__iter__"):
            raise TypeError(f"widths must be a sequence of integers, got {self.widths!r}")
        widths = tuple(_int("widths", w, 1, INT_MAX) for w in self.widths)
        object.__setattr__(self, "widths", widths)
        if not isinstance(self.adaptive, bool):
            raise TypeError(f"adaptive must be a bool, got {self.adaptive!r}")
        history = _history(self.history)
        d = _core.token_recycling(_int("nodes", self.nodes, 1, INT_MAX), list(widths),
                                  _int("top", self.top, 1, INT_MAX), self.adaptive,
                                  _int("lookup", self.lookup, 0, MAX_DRAFT))
        if history:
            _core.drafter_set_history(d, history)
        object.__setattr__(self, "_drafter", d)


class DraftModel(Speculator):
    """A separate small draft model (speculative sampling: Leviathan et al. 2023, Chen et al.
    2023). Each step it proposes ``k`` tokens one at a time (greedy at temperature 0, else
    sampled from its own distribution after the same temperature and filters as the target);
    the target checks them in one forward and keeps a prefix by the rejection rule, so the
    output is the target's own. Pays off when the draft is much cheaper than the target and
    agrees with it often.

    The draft must share the target's tokenizer: same vocabulary size, and where both files
    carry a tokenizer, the same text for every token id (checked at each generate, a ValueError
    naming the first id that differs otherwise). It may be the target itself, which accepts
    every draft at temperature 0 (a test of the machinery, not a speed-up). A draft model is
    busy while a generation uses it: use one per thread.

    ``p_min`` > 0 shortens a step's draft: drafting stops after a token to which the draft gave
    probability below ``p_min`` (its processed probability when sampling, its softmax
    probability at temperature 0), since unsure drafts are rarely accepted.

    ``verify_slope`` > 0 sizes each step's draft to the acceptance rate measured so far in the
    request: the k that maximises expected tokens per unit of time, counting one more verified
    token as ``verify_slope`` of a target forward and one drafted token as the draft's weights
    over the target's; when no draft pays, a single token is still drafted every fourth step to
    keep measuring. A draft that does not pay thus costs little instead of slowing decoding
    (self-speculation on SmolLM2: 0.89x of plain speed with it, 0.52x without, and 0.63x with
    ``p_min`` = 0.6 alone; benchmarks/RESULTS.md). 0 = always draft up to k (or until p_min).
    Chains only.

    ``branching`` > 1 drafts a tree instead of a chain (EAGLE-2's dynamic tree, Li et al.
    2024), ``k`` deep and of at most ``nodes`` (<= 64) nodes, verified in one target forward:
    at each depth the most probable nodes so far get the draft's ``branching`` most probable
    tokens as children (at temperature 0) or ``branching`` tokens drawn without replacement
    from its distribution (when sampling), one draft forward per depth. At temperature 0 the
    tree keeps the ``nodes`` most probable paths; when sampling, each node is kept or dropped
    before its token is drawn, which keeps the output exactly the target's. The draft's cache
    keeps the accepted path. Pays where a verify forward of many tokens costs little more than
    one (AVX-512, AMX, GPUs); CPU models only so far. ``branching`` = 1 is the chain.

    ``size_by_cost`` (trees): verify only as many nodes as pay on the verify cost of each size on
    this machine (timed on the target at the first request): at temperature 0 the most
    probable by the draft's path probabilities (scaled by how they have borne out in the
    request), drafting stopping at a depth none of whose nodes would pay or whose next forward
    would cost more than its nodes could bring; when sampling, as many as this request's
    accepted path lengths say pay with the drafting's timed cost counted (none where the draft
    forwards cost more than their tokens bring), chosen before the step's draws (see
    :class:`Eagle`). Off by default for draft models (their probabilities may be poorly
    calibrated); :class:`Eagle` turns it on.
    """

    def __init__(self, model: "Model", k: int = 5, p_min: float = 0.0,
                 verify_slope: float = 0.2, branching: int = 1, nodes: int = 16,
                 size_by_cost: bool = False) -> None:
        from .model import Model

        if not isinstance(model, Model):
            raise TypeError(f"model must be a specdec.Model (from specdec.load), got "
                            f"{type(model).__name__}")
        self._drafter = _core.draft_model(model._core, _int("k", k, 1, MAX_DRAFT),
                                          _number("p_min", p_min),
                                          _number("verify_slope", verify_slope),
                                          _int("branching", branching, 1, INT_MAX),
                                          _int("nodes", nodes, 1, INT_MAX),
                                          _bool("size_by_cost", size_by_cost))
        self.size_by_cost = size_by_cost
        self.model = model
        self.k = k
        self.p_min = float(p_min)
        self.verify_slope = float(verify_slope)
        self.branching = branching
        self.nodes = nodes

    def __repr__(self) -> str:
        tree = f", branching={self.branching}, nodes={self.nodes}" if self.branching > 1 else ""
        return (f"DraftModel({self.model.path!r}, k={self.k}, p_min={self.p_min}, "
                f"verify_slope={self.verify_slope}{tree})")

    def check_target(self, target: "Model") -> None:
        """Raise ValueError unless the draft and ``target`` share one tokenizer (the C core
        checks the vocabulary size, device and context length)."""
        if target is self.model or target.config.vocab_size != self.model.config.vocab_size:
            return  # sizes that differ: the C core's message
        tt, td = _tokenizer_or_none(target), _tokenizer_or_none(self.model)
        if tt is not None and td is not None and tt.tokens != td.tokens:
            i = next((i for i, (a, b) in enumerate(zip(tt.tokens, td.tokens)) if a != b),
                     min(len(tt.tokens), len(td.tokens)))
            a = tt.tokens[i] if i < len(tt.tokens) else None
            b = td.tokens[i] if i < len(td.tokens) else None
            raise ValueError(f"the draft model {self.model.path} and the target {target.path} "
                             f"have different tokenizers: token {i} is {b!r} in the draft, "
                             f"{a!r} in the target")


def _int(name: str, v: Any, lo: Optional[int] = None, hi: Optional[int] = None) -> int:
    """v (a Python or NumPy integer, not a bool) as an int for the C core, which checks its
    range; TypeError naming `name` otherwise. ``lo`` and ``hi``, where given, are the
    parameter's range, told in a ValueError for a value that a C int cannot hold: the conversion
    to C would fail without naming the parameter, so such a value is refused here."""
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, numbers.Integral):
        raise TypeError(f"{name} must be an integer, got {v!r}")
    v = operator.index(v)
    if lo is not None and not -INT_MAX - 1 <= v <= INT_MAX:
        raise ValueError(f"{name} must be in [{lo}, {hi}], got {v}")
    return v


def _history(v: Any) -> int:
    """PromptLookup.history, checked here where it would overflow the C core's int."""
    v = _int("history", v)
    if not 0 <= v <= 1 << 24:
        raise ValueError(f"history must be in [0, {1 << 24}] tokens, got {v}")
    return v


def _bool(name: str, v: Any) -> bool:
    """v as a bool; TypeError naming `name` otherwise."""
    if not isinstance(v, bool):
        raise TypeError(f"{name} must be a bool, got {v!r}")
    return v


def _seed(v: Any) -> int:
    """A seed as the core's unsigned 64-bit integer (a conversion: any other value cannot be
    passed on, so it is refused here)."""
    v = _int("seed", v)
    if not 0 <= v < 2**64:
        raise ValueError(f"seed must be in [0, 2**64), got {v}")
    return v


def _number(name: str, v: Any) -> float:
    """v (a Python or NumPy real number, not a bool) as a float for the C core, which checks
    its range; TypeError naming `name` otherwise."""
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, numbers.Real):
        raise TypeError(f"{name} must be a number, got {v!r}")
    return float(v)


def _tokenizer_or_none(model: "Model"):
    try:
        return model.tokenizer
    except ValueError:
        return None


@dataclass
class SpecStats:
    """What a speculative generation did."""

    steps: int                      # target forwards after the prefill
    drafted: int                    # draft tokens proposed
    accepted: int                   # draft tokens accepted
    new_tokens: int                 # tokens emitted
    per_position_acceptance: List[float] = field(default_factory=list)  # by draft position
    #: steps by the nodes they drafted (a chain's length, a tree's size): {nodes: steps}
    steps_by_nodes: Dict[int, int] = field(default_factory=dict)
    #: steps by the drafts they accepted (the accepted path's length): {accepted: steps}
    steps_by_accepted: Dict[int, int] = field(default_factory=dict)
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
                   steps_by_nodes=dict(d["steps_by_nodes"]),
                   steps_by_accepted=dict(d["steps_by_accepted"]),
                   time_draft_s=d["time_draft_s"], time_verify_s=d["time_verify_s"],
                   time_total_s=d["time_total_s"])
