"""specdec — speculative decoding for LLMs with a C core.

Load a model (a GGUF file or a Hugging Face safetensors directory), compute exact logits, and
decode with the loop running in C::

    import specdec
    model = specdec.load("model.gguf")
    out = specdec.generate(model, [1, 2, 3], max_new_tokens=32)
    print(out.tokens)
"""

try:
    from ._core import KVCache
except ImportError as e:  # pragma: no cover - only in a source tree without a build
    raise ImportError(
        "specdec's C extension (specdec._core) is not built. Install the package with "
        "`pip install .`; if you run from the source tree, run from another directory so that "
        "the installed package is imported, or build in place with "
        "`python setup.py build_ext --inplace`.") from e
from .aio import AsyncStream, agenerate, astream
from .dummy import dummy_model
from .generate import Generation, generate, stream
from .model import Model, ModelConfig, load
from .speculators import (DraftModel, Eagle, LayerSkip, Medusa, PromptLookup, SpecStats,
                          Speculator, TokenRecycling)

__all__ = ["AsyncStream", "DraftModel", "Eagle", "Generation", "KVCache", "LayerSkip", "Medusa",
           "Model", "ModelConfig", "PromptLookup", "SpecStats", "Speculator", "TokenRecycling",
           "agenerate", "astream", "dummy_model", "generate", "load", "stream"]
__version__ = "0.1.0"

#: the values of the SPECDEC_SIMD environment variable, which caps the CPU kernels (README,
#: "Install"); the C core reads it once, at the first model load
SIMD_LEVELS = ("scalar", "avx2", "avxvnni", "avx512vnni")


def _check_simd_env() -> None:
    import os
    import warnings

    v = os.environ.get("SPECDEC_SIMD")
    if v and v not in SIMD_LEVELS:
        warnings.warn(f"SPECDEC_SIMD={v!r} is not a kernel level ({', '.join(SIMD_LEVELS)}): "
                      "it is ignored and the CPU's best kernels run", RuntimeWarning,
                      stacklevel=3)


_check_simd_env()
