"""Check specdec's gemma3 forward on a real Gemma 3 GGUF against Hugging Face transformers.

The GGUF's tensors are dequantized to float32 with llama.cpp's gguf-py, renamed to Hugging Face's
names (norm weights less the + 1 the converter folded in) and loaded into transformers'
Gemma3ForCausalLM, built from the file's metadata. Both then score the same token ids (teacher
forced, more than the sliding window so local layers matter): the script prints the top-1
agreement and max|d| / max|ref| of the logits, specdec with an f32 KV cache. The quantized
matrices are the same values on both sides; specdec's quantized dot products round the
activations to 8 bits as llama.cpp does, so agreement is close but not exact.

    python tools/check_gemma3_gguf.py --llamacpp LLAMA_CPP_SOURCE_DIR MODEL.gguf [--tokens N]

Needs torch, transformers and gguf-py (the llama.cpp source tree's gguf-py/).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

LAYER = {
    "attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
    "post_attention_norm": "post_attention_layernorm", "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm", "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}


def hf_name(name: str) -> str:
    if name == "token_embd.weight":
        return "model.embed_tokens.weight"
    if name == "output_norm.weight":
        return "model.norm.weight"
    _, layer, role, kind = name.split(".")
    return f"model.layers.{layer}.{LAYER[role]}.{kind}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--llamacpp", required=True, type=Path)
    ap.add_argument("model", type=Path)
    ap.add_argument("--tokens", type=int, default=600)
    a = ap.parse_args()
    sys.path.insert(0, str(a.llamacpp / "gguf-py"))
    import gguf
    import torch
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    import specdec

    r = gguf.GGUFReader(str(a.model))

    def meta(key, default=None):
        f = r.fields.get(f"gemma3.{key}")
        return f.contents() if f is not None else default

    state = {}
    for t in r.tensors:
        w = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        w = w.reshape([int(d) for d in reversed(t.shape)])
        if t.name.endswith("norm.weight"):
            w = w - 1.0  # HF keeps (1 + w)
        state[hf_name(t.name)] = torch.from_numpy(np.ascontiguousarray(w))
    hd = meta("attention.key_length")
    config = Gemma3TextConfig(
        vocab_size=state["model.embed_tokens.weight"].shape[0],
        hidden_size=meta("embedding_length"), intermediate_size=meta("feed_forward_length"),
        num_hidden_layers=meta("block_count"), num_attention_heads=meta("attention.head_count"),
        num_key_value_heads=meta("attention.head_count_kv"), head_dim=hd,
        max_position_embeddings=meta("context_length"),
        rms_norm_eps=meta("attention.layer_norm_rms_epsilon"),
        sliding_window=meta("attention.sliding_window"), query_pre_attn_scalar=hd,
        tie_word_embeddings=True,
        rope_parameters={
            "full_attention": {"rope_type": "default", "rope_theta": meta("rope.freq_base")},
            "sliding_attention": {"rope_type": "default",
                                  "rope_theta": meta("rope.freq_base_swa", 10000.0)}})
    assert meta("rope.scaling.type") is None, "add the global layers' RoPE scaling here"
    model = Gemma3ForCausalLM(config)
    state["lm_head.weight"] = state["model.embed_tokens.weight"]
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and all("rotary" in k for k in missing), (missing, unexpected)
    model = model.float().eval()

    m = specdec.load(str(a.model), kv_dtype="f32")
    text = ("The history of the printing press begins in the fifteenth century, when movable "
            "type changed how books were made, sold and read across Europe. ") * 40
    ids = [2] + m.tokenizer.encode(text)[: a.tokens - 1]
    got = m.logits(ids)
    with torch.no_grad():
        ref = model(torch.tensor([ids]), use_cache=False).logits[0].double().numpy()
    err = float(np.max(np.abs(got - ref)) / np.max(np.abs(ref)))
    top1 = float(np.mean(np.argmax(got, 1) == np.argmax(ref, 1)))
    w = config.sliding_window
    late = float(np.mean(np.argmax(got[w:], 1) == np.argmax(ref[w:], 1)))
    print(f"{len(ids)} tokens: top-1 agreement {top1:.4f} (positions >= window {w}: {late:.4f}), "
          f"max|d|/max|ref| {err:.3g}")


if __name__ == "__main__":
    main()
