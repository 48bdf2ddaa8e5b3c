"""Models with random weights and a synthetic drafter, for benchmarks that need neither a file
nor a trained draft.

:func:`dummy_model` builds a model of a named (or given) shape with random weights directly in
memory on the chosen device, the idea of vLLM's ``load_format="dummy"``: the speed of an 8B
model can be measured on a GPU without its 16 GB of weights. The weights are a function of the
seed alone, so the CPU and CUDA backends build the same model.

:func:`synthetic_speculation` measures what speculative decoding would gain with a drafter the
target accepts with probability ``alpha`` per token (vLLM's synthetic rejection sampler): the
real verify forwards, a coin flip instead of the acceptance rule. Its tokens are not the
model's output, so it lives here, apart from :func:`specdec.generate`, which cannot reach it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional, Sequence, Union

from . import _core
from .model import Model, core_threads, finish, parse_device
from .speculators import INT_MAX, MAX_DRAFT, SpecStats, _int, _number, _seed

#: Named shapes (hyper-parameters from the models' published configurations).
SHAPES: Dict[str, Dict[str, object]] = {
    "llama-3-8b": dict(arch="llama", vocab_size=128256, hidden_size=4096, n_layers=32,
                       n_heads=32, n_kv_heads=8, head_dim=128, ffn_size=14336,
                       context_length=8192, rope_theta=500000.0, rms_eps=1e-5,
                       tied_embeddings=False),
    "llama-2-7b": dict(arch="llama", vocab_size=32000, hidden_size=4096, n_layers=32,
                       n_heads=32, n_kv_heads=32, head_dim=128, ffn_size=11008,
                       context_length=4096, rope_theta=10000.0, rms_eps=1e-5,
                       tied_embeddings=False),
    "qwen2-7b": dict(arch="qwen2", vocab_size=152064, hidden_size=3584, n_layers=28,
                     n_heads=28, n_kv_heads=4, head_dim=128, ffn_size=18944,
                     context_length=32768, rope_theta=1000000.0, rms_eps=1e-6,
                     tied_embeddings=False),
    "smollm2-135m": dict(arch="llama", vocab_size=49152, hidden_size=576, n_layers=30,
                         n_heads=9, n_kv_heads=3, head_dim=64, ffn_size=1536,
                         context_length=8192, rope_theta=100000.0, rms_eps=1e-5,
                         tied_embeddings=True),
    "tiny": dict(arch="llama", vocab_size=97, hidden_size=64, n_layers=2, n_heads=4,
                 n_kv_heads=2, head_dim=16, ffn_size=96, context_length=256,
                 rope_theta=10000.0, rms_eps=1e-5, tied_embeddings=False),
}

#: Weight types by name (ggml type ids).
DTYPES = {"f32": 0, "f16": 1, "bf16": 30, "q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7,
          "q8_0": 8, "q4_k": 12, "q5_k": 13, "q6_k": 14}

_REQUIRED = ("arch", "vocab_size", "hidden_size", "n_layers", "n_heads", "n_kv_heads",
             "head_dim", "ffn_size", "context_length")


def dummy_model(shape: Union[str, Dict[str, object]] = "tiny", dtype: str = "bf16",
                device: str = "cpu", seed: int = 0, threads: Optional[int] = None,
                kv_dtype: Optional[str] = None, **overrides: object) -> Model:
    """A model of ``shape`` with random weights of ``dtype``, built on ``device`` (no file).

    Args:
        shape: a name from :data:`SHAPES` (``"llama-3-8b"``, ``"llama-2-7b"``, ``"qwen2-7b"``,
            ``"smollm2-135m"``, ``"tiny"``) or a dict with the keys of those entries.
        dtype: the matrices' type: ``"bf16"``, ``"f16"``, ``"f32"``, ``"q4_0"``, ``"q4_1"``,
            ``"q5_0"``, ``"q5_1"``, ``"q8_0"``, ``"q4_k"``, ``"q5_k"``, ``"q6_k"`` (the
            K-quants need rows of a multiple of 256 elements).
        device: ``"cpu"``, ``"cuda"`` or ``"cuda:N"``; on a GPU the weights are generated
            there and never exist on the host.
        seed: the weights are a function of the seed (and the shape) alone.
        threads, kv_dtype: as for :func:`specdec.load`.
        overrides: replace single entries of a named shape (``n_layers=4``).

    The model has no tokenizer: give it token ids. Values are uniform in about
    [-1/sqrt(cols), 1/sqrt(cols)] and the norms are ones; the outputs mean nothing, the
    speed is the real model's.
    """
    if isinstance(shape, str):
        if shape not in SHAPES:
            raise ValueError(f"unknown shape {shape!r} (known: {', '.join(sorted(SHAPES))})")
        name = shape
        spec = dict(SHAPES[shape])
    elif isinstance(shape, dict):
        name = "custom"
        spec = dict(shape)
    else:
        raise TypeError(f"shape must be a name or a dict, got {type(shape).__name__}")
    unknown = set(overrides) - set(SHAPES["tiny"])
    if unknown:
        raise ValueError(f"unknown shape keys: {', '.join(sorted(unknown))}")
    spec.update(overrides)
    missing = [k for k in _REQUIRED if k not in spec]
    if missing:
        raise ValueError(f"the shape lacks {', '.join(missing)}")
    key = str(dtype).lower()
    if key not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r} (known: {', '.join(DTYPES)})")
    seed = _seed(seed)
    dev, gpu = parse_device(device)
    core = _core.dummy(spec, DTYPES[key], seed, core_threads(threads), dev, gpu)
    return finish(core, f"dummy:{name}:{key}", dev, gpu, kv_dtype)


@dataclass
class SyntheticRun:
    """What :func:`synthetic_speculation` measured."""

    tokens: int         # tokens produced (not the model's output)
    stats: SpecStats    # steps, drafts, acceptance, timings (as a speculative run's)
    time_s: float       # wall time, prefill included

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.time_s if self.time_s > 0 else 0.0


def synthetic_speculation(model: Model, prompt: Sequence[int], *, alpha: float, k: int,
                          max_new_tokens: int = 128, seed: int = 0) -> SyntheticRun:
    """Benchmarks only: speculative decoding's cost with a drafter accepted with probability
    ``alpha`` per token, without a drafter. Each step drafts ``k`` copies of the last token
    (drafting is free), runs the real verify forward over ``k + 1`` tokens and accepts drafts
    while a seeded coin says so; the speedup over plain decoding can then be compared with the
    formula ``(1 - alpha^(k+1)) / (1 - alpha)`` per verify cost. The tokens produced are NOT
    the model's output and are not returned.
    """
    # ranges are the C core's to check (sd_bench_synthetic names the parameter)
    tokens, stats = model._core.bench_synthetic(
        list(prompt), _int("max_new_tokens", max_new_tokens, 0, INT_MAX),
        _int("k", k, 1, MAX_DRAFT), _number("alpha", alpha), _seed(seed))
    s = SpecStats.from_core(stats, len(tokens))
    return SyntheticRun(tokens=len(tokens), stats=s, time_s=stats["time_total_s"])
