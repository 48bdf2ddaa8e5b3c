"""specdec — speculative decoding for LLMs with a C core.

Load a model (a GGUF file or a Hugging Face safetensors directory), compute exact logits, and
decode with the loop running in C::

    import specdec
    model = specdec.load("model.gguf")
    out = specdec.generate(model, [1, 2, 3], max_new_tokens=32)
    print(out.tokens)
"""

from ._core import KVCache
from .generate import Generation, generate
from .model import Model, ModelConfig, load

__all__ = ["Generation", "KVCache", "Model", "ModelConfig", "generate", "load"]
__version__ = "0.1.0"
