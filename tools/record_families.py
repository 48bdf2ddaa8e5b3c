"""Record the reference fixtures of the model families (tests/fixtures/families/).

For each case a tiny model with random weights (specdec.testing.random_weights, so the test
suite can rebuild the very same weights from the seed without torch) is loaded into Hugging Face
transformers under the family's own config class; this script records

* the config.json that transformers writes for it (transformers >= 5 writes RoPE settings under
  "rope_parameters"),
* transformers' logits for fixed token ids, computed in float64 (eager attention),
* the GGUF file that llama.cpp's own converter (convert_hf_to_gguf.py with its gguf-py) writes
  from that directory, as F32. The converter needs a tokenizer to run; the tiny models have none,
  so its vocabulary step is replaced by a list of placeholder tokens (the tokenizer plays no part
  in the logits). Everything else (hyper-parameters, tensor names, the llama q/k permutation,
  llama3 RoPE factors) is the converter's own.

torch, transformers and llama.cpp's converter are needed here only; the test suite reads the
fixtures. Usage:

    python tools/record_families.py --llamacpp LLAMA_CPP_SOURCE_DIR

where LLAMA_CPP_SOURCE_DIR holds convert_hf_to_gguf.py and gguf-py/ (the llama-cpp-python sdist
carries them under vendor/llama.cpp).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from specdec import testing  # noqa: E402

OUT = ROOT / "tests" / "fixtures" / "families"

# name -> (transformers config class, its keyword arguments, weight shape, seed, n tokens)
SMALL = dict(vocab=40, dim=16, n_layers=2, n_heads=2, n_kv_heads=1, ffn=32)
CASES = {
    # Llama 3.1's scaling, under rope_parameters (transformers >= 5); original context 16 so
    # that the scaled band lies within the tiny head's frequencies
    "llama3_rope": ("LlamaConfig",
                    dict(rope_parameters=dict(rope_type="llama3", rope_theta=10000.0, factor=8.0,
                                              low_freq_factor=1.0, high_freq_factor=4.0,
                                              original_max_position_embeddings=16)),
                    testing.RandomModelConfig(arch="llama", context_length=128, **SMALL), 31, 40),
    # linear position interpolation (GGUF: rope.scaling.type linear, rope.scaling.factor)
    "llama_linear_rope": ("LlamaConfig",
                          dict(rope_parameters=dict(rope_type="linear", rope_theta=10000.0,
                                                    factor=4.0)),
                          testing.RandomModelConfig(arch="llama", context_length=128, **SMALL),
                          32, 40),
    # qwen3: q/k norms, head_dim 8 apart from hidden 16 / 4 heads, tied head, theta 1e6 (only in
    # rope_parameters)
    "qwen3": ("Qwen3Config",
              dict(head_dim=8, tie_word_embeddings=True,
                   rope_parameters=dict(rope_type="default", rope_theta=1000000.0)),
              testing.RandomModelConfig(arch="qwen3", vocab=40, dim=16, n_layers=2, n_heads=4,
                                        n_kv_heads=2, ffn=32, context_length=128, head_size=8,
                                        tied=True, rms_eps=1e-6),
              33, 40),
    # Gemma 3: 6 layers (5 local with a window of 4 and base 1e4, then a global one, linearly
    # scaled), GeGLU, sandwich norms, (1 + w) norms; query_pre_attn_scalar = head_dim as in the
    # released models (llama.cpp's GGUF cannot say otherwise). Variants, recorded from the HF
    # side only: another query_pre_attn_scalar, a final soft-cap.
    "gemma3": ("Gemma3TextConfig",
               dict(head_dim=8, sliding_window=4, query_pre_attn_scalar=8,
                    hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True,
                    rope_parameters=dict(
                        full_attention=dict(rope_type="linear", factor=4.0, rope_theta=1e6),
                        sliding_attention=dict(rope_type="default", rope_theta=1e4))),
               testing.RandomModelConfig(arch="gemma3", vocab=40, dim=16, n_layers=6, n_heads=2,
                                         n_kv_heads=1, ffn=24, context_length=128, head_size=8,
                                         tied=True, rms_eps=1e-6),
               35, 24),
    # Gemma 2: 4 layers, a window of 4 on the even ones, soft-caps small enough to bite (the
    # released models' 50 and 30 would not on a tiny random model), GeGLU, sandwich norms,
    # (1 + w) norms; query_pre_attn_scalar = head_dim as llama.cpp's GGUF assumes. Variants
    # (HF side): another query_pre_attn_scalar; the caps left to Gemma2Config's defaults.
    "gemma2": ("Gemma2Config",
               dict(head_dim=8, sliding_window=4, query_pre_attn_scalar=8,
                    hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True,
                    attn_logit_softcapping=3.0, final_logit_softcapping=10.0,
                    rope_parameters=dict(rope_type="default", rope_theta=1e4)),
               testing.RandomModelConfig(arch="gemma2", vocab=40, dim=16, n_layers=4, n_heads=2,
                                         n_kv_heads=1, ffn=24, context_length=128, head_size=8,
                                         tied=True, rms_eps=1e-6),
               36, 24),
    # Phi-3: q/k/v and gate/up fused (split at load), a window of 6 on every layer (llama.cpp
    # turns Phi-3's window off: its GGUF logits match only within the window), untied head
    "phi3": ("Phi3Config", dict(sliding_window=6, pad_token_id=0, bos_token_id=1, eos_token_id=2),
             testing.RandomModelConfig(arch="phi3", context_length=128, **SMALL), 37, 24),
    # Phi-4-mini's shape of RoPE: partial rotary embeddings (12 of a head's 16 dimensions) and
    # LongRoPE (short factors up to an original context of 16, long ones past it, cos and sin
    # times sqrt(1 + ln 4 / ln 16) for a context of 64), no window. "logits": the 40 tokens in
    # one forward, past the original context (transformers takes the long factors);
    # "logits_short" (below): the first 16 (the short ones).
    "phi3_longrope": ("Phi3Config",
                      dict(partial_rotary_factor=0.75, original_max_position_embeddings=16,
                           sliding_window=None, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                           rope_parameters=dict(
                               rope_type="longrope", rope_theta=10000.0,
                               original_max_position_embeddings=16, partial_rotary_factor=0.75,
                               short_factor=[1.0, 1.15, 1.4, 1.9, 2.6, 3.3],
                               long_factor=[1.3, 2.2, 3.9, 6.1, 9.5, 14.0])),
                      testing.RandomModelConfig(arch="phi3", vocab=40, dim=32, n_layers=2,
                                                n_heads=2, n_kv_heads=1, ffn=32,
                                                context_length=64),
                      38, 40),
    # SmolLM3: the llama graph with every 4th layer without RoPE (NoPE), tied embeddings; a
    # variant (HF side) with a period of 2 as an explicit no_rope_layers list
    "smollm3": ("SmolLM3Config",
                dict(pad_token_id=0, bos_token_id=1, eos_token_id=2,
                     rope_parameters=dict(rope_type="default", rope_theta=10000.0)),
                testing.RandomModelConfig(arch="smollm3", vocab=40, dim=16, n_layers=4,
                                          n_heads=2, n_kv_heads=1, ffn=32, context_length=128,
                                          tied=True, rms_eps=1e-6),
                39, 40),
    # YaRN on qwen2 (biases, rotate-half RoPE): factor 4 over an original context of 64,
    # theta 100 and 16-dimensional heads so that the ramp between the extrapolated and the
    # interpolated frequencies spans dimensions 0 to 5 (beta_fast 32, beta_slow 1); variants
    # (HF side): other betas and mscale / mscale_all_dim
    "qwen2_yarn": ("Qwen2Config",
                   dict(rope_parameters=dict(rope_type="yarn", rope_theta=100.0, factor=4.0,
                                             original_max_position_embeddings=64)),
                   testing.RandomModelConfig(arch="qwen2", vocab=40, dim=32, n_layers=2,
                                             n_heads=2, n_kv_heads=1, ffn=32,
                                             context_length=256, rope_theta=100.0,
                                             rms_eps=1e-6),
                   40, 40),
    # Granite: the llama graph with its four multipliers away from 1 (embeddings x 6, each
    # block's output x 0.25, attention scale 0.2 in place of 1/sqrt(8), logits / 4)
    "granite": ("GraniteConfig",
                dict(embedding_multiplier=6.0, residual_multiplier=0.25,
                     attention_multiplier=0.2, logits_scaling=4.0, pad_token_id=0,
                     bos_token_id=1, eos_token_id=2,
                     rope_parameters=dict(rope_type="default", rope_theta=10000.0)),
                testing.RandomModelConfig(arch="granite", vocab=40, dim=16, n_layers=2,
                                          n_heads=2, n_kv_heads=1, ffn=32, context_length=128,
                                          tied=True, rms_eps=1e-6),
                41, 40),
    # Mistral with a sliding window of 6 over 24 tokens
    "mistral_window": ("MistralConfig", dict(sliding_window=6),
                       testing.RandomModelConfig(arch="llama", context_length=128, **SMALL), 34,
                       24),
}


VARIANTS = {"smollm3": {"no_rope_every_2": dict(no_rope_layers=[1, 0, 1, 0])},
            "qwen2_yarn": {
                "betas": dict(rope_parameters=dict(rope_type="yarn", rope_theta=100.0, factor=4.0,
                                                   original_max_position_embeddings=64,
                                                   beta_fast=8.0, beta_slow=0.5)),
                "mscale": dict(rope_parameters=dict(rope_type="yarn", rope_theta=100.0,
                                                    factor=4.0,
                                                    original_max_position_embeddings=64,
                                                    mscale=1.0, mscale_all_dim=0.5))},
            "gemma3": {"query_pre_attn_scalar_32": dict(query_pre_attn_scalar=32),
                       "final_logit_softcapping_3": dict(final_logit_softcapping=3.0)},
            "gemma2": {"query_pre_attn_scalar_32": dict(query_pre_attn_scalar=32),
                       "no_attn_softcap": dict(attn_logit_softcapping=None),
                       "no_final_softcap": dict(final_logit_softcapping=None)}}


def hf_kwargs(cfg: testing.RandomModelConfig) -> dict:
    kw = dict(vocab_size=cfg.vocab, hidden_size=cfg.dim, intermediate_size=cfg.ffn,
              num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads,
              num_key_value_heads=cfg.n_kv_heads, max_position_embeddings=cfg.context_length,
              rms_norm_eps=cfg.rms_eps, tie_word_embeddings=cfg.tied)
    if not cfg.is_gemma:
        kw["hidden_act"] = "silu"
    return kw


def hf_logits(config, weights: dict, tokens: list[int]) -> np.ndarray:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    state = {k: torch.tensor(v) for k, v in weights.items()}
    if config.tie_word_embeddings:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and all("rotary" in k for k in missing), (missing, unexpected)
    model = model.double().eval()
    with torch.no_grad():
        out = model(torch.tensor([tokens]), use_cache=False).logits[0]
    return out.numpy().astype(np.float64)


CONVERT = r"""
import sys
sys.argv = ["convert_hf_to_gguf.py", sys.argv[1], "--outtype", "f32", "--outfile", sys.argv[2]]
sys.path.insert(0, __LLAMACPP__)
import convert_hf_to_gguf as conv

def placeholder_vocab(self):
    n = self.hparams["vocab_size"]
    self.gguf_writer.add_tokenizer_model("gpt2")
    self.gguf_writer.add_tokenizer_pre("default")
    self.gguf_writer.add_token_list([f"<t{i}>" for i in range(n)])
    self.gguf_writer.add_token_types([1] * n)
    self.gguf_writer.add_token_merges([])

find_class = conv.get_model_class

def get_model_class(*args, **kw):
    cls = find_class(*args, **kw)
    cls.set_vocab = placeholder_vocab
    return cls

conv.get_model_class = get_model_class
conv.main()
"""


def convert(llamacpp: Path, hf_dir: Path, out: Path) -> None:
    code = CONVERT.replace("__LLAMACPP__", repr(str(llamacpp)))
    subprocess.run([sys.executable, "-c", code, str(hf_dir), str(out)], check=True,
                   cwd=str(llamacpp))


def record(name: str, llamacpp: Path, tmp: Path) -> None:
    import transformers

    cls_name, extra, cfg, seed, n_tokens = CASES[name]
    config = getattr(transformers, cls_name)(**{**hf_kwargs(cfg), **extra})
    weights = testing.random_weights(cfg, seed)
    tokens = [int(t) for t in np.random.default_rng(seed).integers(0, cfg.vocab, n_tokens)]
    logits = hf_logits(config, weights, tokens)

    hf_dir = tmp / name
    hf_dir.mkdir()
    config.save_pretrained(hf_dir)
    conf = json.loads((hf_dir / "config.json").read_text())
    conf.pop("transformers_version", None)
    conf.pop("architectures", None)  # written below, as a model saves it
    conf["architectures"] = [cls_name.replace("TextConfig", "Config").replace("Config",
                                                                             "ForCausalLM")]
    conf["torch_dtype"] = "float32"
    (hf_dir / "config.json").write_text(json.dumps(conf, indent=2))
    (hf_dir / "model.safetensors").write_bytes(testing.safetensors_bytes(weights, "F32"))
    # the gemma3 converter counts the vocabulary of tokenizer.json to trim the embedding
    vocab = {f"<t{i}>": i for i in range(cfg.vocab)}
    (hf_dir / "tokenizer.json").write_text(json.dumps({"model": {"vocab": vocab},
                                                       "added_tokens": []}))
    OUT.mkdir(parents=True, exist_ok=True)
    convert(llamacpp, hf_dir, OUT / f"{name}.gguf")

    fixture = {
        "about": "tools/record_families.py; logits of transformers (float64, eager attention)",
        "transformers": transformers.__version__,
        "config": conf,
        "weights": {"seed": seed, "shape": {k: getattr(cfg, k) for k in (
            "arch", "vocab", "dim", "n_layers", "n_heads", "n_kv_heads", "ffn",
            "context_length", "rms_eps", "tied", "head_size")}},
        "tokens": tokens,
        "logits": [[float(f"{x:.7g}") for x in row] for row in logits],
    }
    if name == "phi3_longrope":  # within the original context: the short factors
        orig = extra["original_max_position_embeddings"]
        fixture["logits_short"] = [[float(f"{x:.7g}") for x in row]
                                   for row in hf_logits(config, weights, tokens[:orig])]
    elif cls_name in ("MistralConfig", "Phi3Config"):
        # llama.cpp's converter writes no window for Mistral, and llama.cpp ignores Phi-3's
        plain = getattr(transformers, cls_name)(**{**hf_kwargs(cfg), **extra,
                                                    "sliding_window": None})
        fixture["logits_without_window"] = [[float(f"{x:.7g}") for x in row]
                                            for row in hf_logits(plain, weights, tokens)]
    for vname, over in VARIANTS.get(name, {}).items():
        vconf = getattr(transformers, cls_name)(**{**hf_kwargs(cfg), **extra, **over})
        fixture.setdefault("variants", {})[vname] = {
            "config": over,
            "logits": [[float(f"{x:.7g}") for x in row]
                       for row in hf_logits(vconf, weights, tokens)]}
    # one key a line, each value compact (the logits are most of the file)
    body = ",\n".join(f" {json.dumps(k)}: {json.dumps(v)}" for k, v in fixture.items())
    (OUT / f"{name}.json").write_text("{\n" + body + "\n}\n")
    print(f"{name}: {len(tokens)} tokens, max |logit| {np.abs(logits).max():.3f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--llamacpp", required=True, type=Path,
                    help="llama.cpp source tree with convert_hf_to_gguf.py and gguf-py/")
    ap.add_argument("names", nargs="*", default=list(CASES))
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for name in a.names:
            record(name, a.llamacpp.resolve(), Path(tmp))


if __name__ == "__main__":
    main()
