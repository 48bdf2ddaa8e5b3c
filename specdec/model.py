"""Models: loading, configuration, logits and raw forward passes over a KV cache."""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple, Union

import numpy as np

from . import _core, hub
from ._core import KVCache
from .speculators import INT_MAX, _int
from .tokenizer import Tokenizer, tokenizer_from_gguf_metadata

PathLike = Union[str, "os.PathLike[str]"]
TokenIds = Union[Sequence[int], np.ndarray]


@dataclass(frozen=True)
class ModelConfig:
    """Hyper-parameters read from the model file."""

    arch: str
    vocab_size: int
    hidden_size: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    ffn_size: int
    context_length: int
    rope_theta: float
    rms_eps: float
    tied_embeddings: bool
    rope_neox: bool
    qkv_bias: bool
    qk_norm: bool              # per-head RMSNorm of q and k before RoPE (qwen3, gemma3)
    weight_type: str
    rope_scaling: Optional[dict]       # None, or {"type": "linear" | "llama3" | "factors" |
    #                                    "longrope" | "yarn", ...}; longrope's "factors":
    #                                    "short" | "long" (chosen by load's context_length)
    rope_theta_local: Optional[float]  # the sliding-window layers' own RoPE base (gemma)
    sliding_window: Optional[int]      # a token sees itself and the window - 1 before it
    layer_types: Tuple[str, ...]       # per layer: "sliding_attention" or "full_attention"
    attn_scale: float                  # softmax scale of q.k (1/sqrt(head_dim) unless set)
    final_softcap: Optional[float]     # logits = c * tanh(logits / c)
    attn_softcap: Optional[float]      # attention scores = c * tanh(scores / c) (gemma2)
    rope_dim: int                      # rotated dimensions of each head: head_dim, or fewer
    #                                    (partial rotary embeddings, Phi-4-mini)
    no_rope_interval: Optional[int]    # every n-th layer applies no RoPE (SmolLM3: 4), or None
    embed_scale: Optional[float]       # the embeddings times it (granite), or None
    residual_scale: Optional[float]    # each block's output times it (granite), or None
    logit_scale: Optional[float]       # the logits divided by it (granite), or None


class Model:
    """A loaded model. Create with :func:`specdec.load`.

    The weights stay memory-mapped from the file. Threads (and asyncio tasks) may share one
    model: the decoding steps of their requests are batched into shared forwards, and other
    calls (``forward``, ``logits``, settings) wait for the model in turn. Calls release the GIL
    while the C core computes.
    """

    def __init__(self, core: "_core.Model", path: str, device: str):
        self._core = core
        self.path = path
        self.device = device
        self.config = ModelConfig(**core.config)
        self._tokenizer: Optional[Tokenizer] = None
        self._tokenizer_loaded = False
        self._lock = threading.Lock()

    @property
    def tokenizer(self) -> Optional[Tokenizer]:
        """The model's tokenizer and chat template (from the GGUF metadata, or tokenizer.json
        in a Hugging Face directory), built on first use; None when the file has none."""
        with self._lock:
            if not self._tokenizer_loaded:
                if os.path.isdir(self.path):
                    tok = Tokenizer.from_hf_dir(self.path)
                else:
                    tok = tokenizer_from_gguf_metadata(self._gguf_metadata())
                if tok is not None and tok.vocab_size > self.config.vocab_size:
                    raise ValueError(f"{self.path}: the tokenizer has {tok.vocab_size} tokens, "
                                     f"more than the model's vocabulary of "
                                     f"{self.config.vocab_size}")
                if tok is not None:
                    n = self.config.vocab_size
                    pieces = [tok.token_to_piece(i) if i < tok.vocab_size else b""
                              for i in range(n)]
                    self._core.set_token_pieces(pieces)
                self._tokenizer = tok
                self._tokenizer_loaded = True
            return self._tokenizer

    def _gguf_metadata(self) -> dict:
        """The file's GGUF metadata; ValueError naming the file when a key is not UTF-8 (a
        value that is not comes back as bytes, for the reader of that key to judge)."""
        try:
            return self._core.gguf_metadata()
        except UnicodeDecodeError as e:
            raise ValueError(f"{self.path}: the GGUF metadata key {bytes(e.object)!r} is not "
                             f"valid UTF-8 ({e.reason} at byte {e.start})") from None

    def eos_ids(self) -> List[int]:
        """End-of-sequence ids named by the file's metadata, without building a tokenizer."""
        if os.path.isdir(self.path):
            return []
        v = self._gguf_metadata().get("tokenizer.ggml.eos_token_id")
        return [v] if isinstance(v, int) and 0 <= v < self.config.vocab_size else []

    def require_tokenizer(self) -> Tokenizer:
        """The tokenizer, or a ValueError saying the model has none."""
        tok = self.tokenizer
        if tok is None:
            raise ValueError(f"{self.path} has no tokenizer, so it cannot take or produce "
                             f"text: pass token ids instead")
        return tok

    def __repr__(self) -> str:
        c = self.config
        return (f"specdec.Model({self.path!r}, arch={c.arch}, layers={c.n_layers}, "
                f"hidden={c.hidden_size}, vocab={c.vocab_size}, weights={c.weight_type}, "
                f"device={self.device!r}, threads={self.threads})")

    @property
    def threads(self) -> int:
        """Worker threads of the forward pass (settable, >= 1)."""
        return self._core.threads

    @threads.setter
    def threads(self, n: int) -> None:
        self._core.threads = _int("threads", n, 1, 1024)  # the core checks the range

    @property
    def max_sequences(self) -> int:
        """The most requests decoding on this model at once (settable; 0, the default, sets no
        limit). Each running request holds a KV cache, so this bounds the memory concurrency
        takes: a request beyond it waits, first come first served, until one ends, with no
        error (Ctrl-C still interrupts the wait). Counted are :func:`specdec.generate`,
        :func:`specdec.stream` and the async calls from their start to their end: a stream left
        unfinished holds its slot, so a thread holding every slot in unfinished streams and
        starting another request waits for good (close the streams, or raise the limit)."""
        return self._core.max_sequences

    @max_sequences.setter
    def max_sequences(self, n: int) -> None:
        self._core.max_sequences = _int("max_sequences", n, 0, INT_MAX)

    @property
    def open_sequences(self) -> int:
        """Requests decoding on this model now (see :attr:`max_sequences`)."""
        return self._core.open_sequences

    @property
    def scheduler_stats(self) -> dict:
        """``{"steps": n, "forwards": m}``: the steps of requests run on this model so far and
        the forwards they took. Requests generating at once in several threads share forwards
        (continuous batching: each step's forward carries the tokens of every request ready to
        step, the weights read once for all), so ``steps / forwards`` is the mean number of
        requests per forward."""
        return self._core.scheduler_stats

    @property
    def prefix_cache(self) -> int:
        """How many finished requests' KV caches the model keeps for prefix reuse (settable, 0
        to 64; default 4 on the CPU, 0 on CUDA, which does not reuse yet). A request whose
        prompt starts with tokens one of them holds (the next turn of a chat, a shared system
        prompt) takes their keys and values instead of computing them again, with the same
        output; ``Generation.prefix_reused`` counts the tokens. With a head (Eagle, Medusa) the
        target features it reads are kept and reused too. 0 frees what is kept."""
        return self._core.prefix_cache

    @prefix_cache.setter
    def prefix_cache(self, n: int) -> None:
        self._core.prefix_cache = _int("prefix_cache", n, 0, 64)  # the core checks the range

    @property
    def kv_dtype(self) -> str:
        """Element type of the KV caches this model creates from now on (settable):
        ``"f16"``, IEEE halves, the default on the CPU (half the memory, and half the bytes
        attention reads per token after a long prompt; llama.cpp's default cache type too), or
        ``"f32"``. Keys and values beyond the half range (+-65504) saturate there. A cache
        keeps the type it was made with. The CUDA backend keeps its caches in f32 only."""
        return self._core.kv_dtype

    @kv_dtype.setter
    def kv_dtype(self, dtype: str) -> None:
        self._core.kv_dtype = dtype  # the core names a wrong value

    @property
    def weight_bytes(self) -> int:
        """Bytes of weights one forward pass reads (output head included)."""
        return self._core.weight_bytes

    def logits(self, tokens: TokenIds) -> np.ndarray:
        """Logits of a fresh forward over ``tokens`` at positions 0..T-1.

        Returns a float32 array of shape ``(len(tokens), vocab_size)``; row t scores the
        token that follows ``tokens[:t+1]``.
        """
        # a cache of at most the context (the forward names a sequence that does not fit, or
        # an empty one)
        cache = self._core.new_cache(min(max(len(tokens), 1), self.config.context_length))
        return self._core.forward(cache, tokens)

    def token_logprobs(self, tokens: TokenIds, top_logprobs: int = 0
                       ) -> Tuple[List[float], Optional[List[List[Tuple[int, float]]]]]:
        """How probable the model finds each token of a text after the ones before it: the
        log-probabilities of ``tokens[1:]`` (the first token has no context), log softmax of the
        logits at temperature 1 as :func:`specdec.generate`'s ``logprobs``, and with
        ``top_logprobs=n`` (at most 20) the n most probable tokens at each of those positions as
        (id, log-probability) pairs, best first (ties to the lower id); else None. Their sum is
        the text's log-likelihood (``-mean`` of them its log-perplexity). The text is fed in
        parts of 256 tokens through one cache, so memory stays that of 256 rows of logits."""
        if isinstance(tokens, (str, bytes, bytearray)):
            raise TypeError(f"tokens must be a sequence of token ids, got "
                            f"{type(tokens).__name__}")
        top = _int("top_logprobs", top_logprobs, 0, INT_MAX)
        if not 0 <= top <= 20:
            raise ValueError(f"top_logprobs must be in [0, 20], got {top}")
        ids = [_int("tokens", t) for t in tokens]
        if not ids:
            raise ValueError("tokens must hold at least one token")
        cache = self.new_cache(min(len(ids), self.config.context_length))
        lps: List[float] = []
        tops: List[List[Tuple[int, float]]] = []
        for start in range(0, len(ids), 256):
            rows = self.forward(cache, ids[start:start + 256]).astype(np.float64)
            nxt = ids[start + 1:start + 1 + len(rows)]
            rows = rows[:len(nxt)]  # the last token's row scores nothing
            if not len(rows):
                break
            mx = rows.max(axis=1, keepdims=True)
            ls = rows - (mx + np.log(np.exp(rows - mx).sum(axis=1, keepdims=True)))
            lps.extend(ls[np.arange(len(nxt)), nxt].tolist())
            k = min(top, ls.shape[1])
            for r in ls if k else ():
                # the ids at or above the k-th largest value (ties included), then ordered
                cand = np.flatnonzero(r >= np.partition(r, len(r) - k)[len(r) - k])
                best = cand[np.lexsort((cand, -r[cand]))][:k]
                tops.append([(int(i), float(r[i])) for i in best])
        return lps, (tops if top else None)

    def llamacpp_logits(self, tokens: TokenIds, n_batch: Optional[int] = None) -> np.ndarray:
        """Logits of ``tokens`` at positions 0..T-1, computed in llama.cpp's own float order.

        A reference for checking specdec against llama.cpp bit for bit, not a fast path: it
        keeps its own cache for the one call and runs portable kernels (seconds for a few hundred
        tokens). Two correct implementations of a model that quantizes its activations to 8 bits
        differ by tenths of a logit when they only sum in another order; this one does every
        float operation as llama.cpp's CPU backend does (as shipped with llama-cpp-python 0.3.36
        built for x86-64 with AVX-512, flash attention off, f16 KV cache: that binding's
        defaults), so its logits equal llama.cpp's exactly. It evaluates the first ``n_batch``
        tokens as one batch (default: all of them) and each later token alone, as
        ``Llama.eval(tokens[:n_batch])`` followed by one-token ``eval`` calls does; ``n_batch=1``
        is one token at a time throughout.

        Supported: llama-architecture models on the CPU with Q4_1 attention/MLP matrices and a
        Q8_0 token embedding and head (the layout of SmolLM2-135M-Instruct's GGUF). Anything
        else raises ValueError naming what differs.

        Returns a float32 array of shape ``(len(tokens), vocab_size)``.
        """
        n_batch = len(tokens) if n_batch is None else _int("n_batch", n_batch, 1, INT_MAX)
        return self._core.llamacpp_logits(tokens, n_batch)  # the core checks its range

    def new_cache(self, n_slots: Optional[int] = None) -> KVCache:
        """A KV cache of ``n_slots`` slots (default: the context length) for this model."""
        if n_slots is None:
            n_slots = self.config.context_length
        return self._core.new_cache(_int("n_slots", n_slots, 1, self.config.context_length))

    def forward(self, cache: KVCache, tokens: TokenIds, positions: Optional[TokenIds] = None,
                slots: Optional[TokenIds] = None, mask: Optional[np.ndarray] = None,
                n_logits: Optional[int] = None, *, hidden: bool = False,
                aux_layers: Optional[Sequence[int]] = None):
        """One forward pass over T tokens against ``cache``.

        Args:
            cache: from :meth:`new_cache`; updated in place (its length becomes
                ``max(length, max(slots) + 1)``).
            tokens: T token ids.
            positions: RoPE positions (default ``cache.length + arange(T)``).
            slots: cache slots to write the tokens' keys/values to (default
                ``cache.length + arange(T)``); distinct, below ``cache.capacity``.
            mask: optional ``(T, n_cols)`` bool array (or integers 0 and 1): True where query
                t may attend cache slot s (its own slot included); slots ``>= n_cols`` are not
                attended. None means causal by position over the live slots.
            n_logits: return logits for the last ``n_logits`` tokens only (default: all).
            hidden: also return every token's final-normed hidden state, what the output head
                multiplies (EAGLE-1/2's features; CPU models).
            aux_layers: also return the residual stream entering each of these layers (before
                its norm) for every token (EAGLE-3's features; at most 8 layers; CPU models);
                layer ``n_layers`` is the residual stream after the last layer, before the final
                norm.

        Returns:
            float32 array ``(n_logits, vocab_size)``; with ``hidden`` or ``aux_layers``, the
            tuple ``(logits, hidden (T, hidden_size) or None, aux (len(aux_layers), T,
            hidden_size) or None)``.
        """
        if not isinstance(hidden, bool):
            raise TypeError(f"hidden must be a bool, got {type(hidden).__name__}")
        if mask is not None:
            mask = _as_mask(mask)
        if hidden or aux_layers is not None:
            return self._core.forward(cache, tokens, positions, slots, mask, n_logits,
                                      hidden=hidden, aux_layers=aux_layers)
        return self._core.forward(cache, tokens, positions, slots, mask, n_logits)


def _as_mask(mask: object) -> np.ndarray:
    """``mask`` as the 2-D bool array the core takes (integer 0/1 entries taken as bools);
    TypeError or ValueError naming it otherwise. The core checks the sizes."""
    try:
        m = np.asarray(mask)
    except ValueError as e:  # a ragged nesting of lists
        raise ValueError(f"mask must be a 2-D bool array of shape (T, n_cols): {e}") from None
    if m.dtype != np.bool_:
        if not np.issubdtype(m.dtype, np.integer):
            raise TypeError(f"mask must be a bool array (or integers 0 and 1) of shape "
                            f"(T, n_cols), got dtype {m.dtype}")
        if not np.isin(m, (0, 1)).all():
            raise ValueError("mask must hold only 0 and 1 (or bools)")
        m = m.astype(bool)
    if m.ndim != 2:
        raise ValueError(f"mask must be a 2-D bool array of shape (T, n_cols), got shape "
                         f"{m.shape}")
    return m


def parse_device(device: str) -> Tuple[int, int]:
    """``"cpu"``, ``"cuda"`` or ``"cuda:N"`` as (core device id, GPU index)."""
    if not isinstance(device, str):
        raise TypeError(f"device must be a string such as 'cpu' or 'cuda', got "
                        f"{type(device).__name__}")
    if device == "cpu":
        return 0, 0
    if device in ("cuda", "gpu"):
        return 1, 0
    if device.startswith("cuda:") and device[5:].isdigit():
        return 1, int(device[5:])
    raise ValueError(f"unknown device {device!r} (expected 'cpu', 'cuda' or 'cuda:N')")


def core_threads(threads: Optional[int]) -> Optional[int]:
    """A thread count for the core, which checks its range (None: the cores this process may
    use)."""
    return None if threads is None else _int("threads", threads, 1, 1024)


def finish(core: "_core.Model", path: str, dev: int, gpu: int,
           kv_dtype: Optional[str]) -> Model:
    """The Python model over a loaded core, its cache type set (None keeps the default)."""
    m = Model(core, path, "cpu" if dev == 0 else f"cuda:{gpu}")
    if kv_dtype is not None:
        m.kv_dtype = kv_dtype
    return m


def load(path: PathLike, device: str = "cpu", threads: Optional[int] = None,
         kv_dtype: Optional[str] = None, max_sequences: int = 0,
         context_length: Optional[int] = None) -> Model:
    """Load a model from a ``.gguf`` file or a Hugging Face model directory.

    Args:
        path: a GGUF v2/v3 file, a directory with ``config.json`` and ``model.safetensors``
            (or a sharded ``model.safetensors.index.json``), or a model alias such as
            ``"smollm2-135m-instruct"`` (fetched once into a cache; see :mod:`specdec.hub`).
        device: ``"cpu"`` (default), or ``"cuda"`` / ``"cuda:N"``: the weights are copied once
            to that GPU and forwards, caches and decoding loops run there (in a build made
            where ``nvcc`` was found; ``specdec info`` tells).
        threads: worker threads, 1 to 1024 (default: the cores this process may use).
        kv_dtype: ``"f16"`` or ``"f32"``, the element type of the KV caches (default: f16 on
            the CPU, f32 on CUDA, which supports only f32); see :attr:`Model.kv_dtype`.
        max_sequences: the most requests decoding at once (0: no limit); more wait for a free
            slot. See :attr:`Model.max_sequences`.
        context_length: the longest text (prompt and output) a request may hold, at most the
            file's context length (default: the file's). A LongRoPE model (Phi-3.5-mini,
            Phi-4-mini, the 128k Phi-3 models) runs with its short factors up to its original
            context (4,096 tokens for those), which is then its default limit; a
            ``context_length`` above that selects its long factors for every position, as
            llama.cpp does for a context above the original one. ``config.rope_scaling`` tells
            which.

    Raises:
        FileNotFoundError: ``path`` does not exist and is no alias.
        OSError: an alias's model could not be downloaded.
        ValueError: the file is malformed, truncated, of an unsupported architecture or type,
            or holds a NaN or infinite weight (the message names the tensor); an unknown device
            or kv_dtype; a context_length above the file's; ``device="cuda"`` in a build without
            the CUDA backend, or with ``kv_dtype="f16"``.
        RuntimeError: no usable GPU (the message names the failed CUDA call), or not enough
            GPU memory.
    """
    p = os.fspath(path)
    if not os.path.exists(p):
        if hub.is_alias(p):
            p = hub.resolve(p)
        else:
            raise FileNotFoundError(
                f"no such model file or directory: '{p}' (known model aliases: "
                f"{', '.join(hub.known_aliases())})")
    dev, gpu = parse_device(device)
    max_sequences = _int("max_sequences", max_sequences, 0, INT_MAX)
    ctx = 0 if context_length is None else _int("context_length", context_length, 1, INT_MAX)
    if context_length is not None and ctx < 1:  # the core reads 0 as "the file's"
        raise ValueError(f"context_length must be >= 1 (None: the file's), got {ctx}")
    core = _core.load(p, core_threads(threads), dev, gpu, ctx)
    m = finish(core, p, dev, gpu, kv_dtype)
    m.max_sequences = max_sequences
    return m
