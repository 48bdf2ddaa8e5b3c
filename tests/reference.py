"""Independent float64 NumPy forward pass of a Llama / Qwen2 decoder, over Hugging Face-layout
weights (as made by tinymodels.make_weights). It is the yardstick the tests measure specdec
against, so it is written to be read, not to be fast.

    x = embed[tokens]
    for each layer:
        h = rmsnorm(x) * input_layernorm
        x = x + o_proj(attention(h))
        h = rmsnorm(x) * post_attention_layernorm
        x = x + down_proj(silu(gate_proj(h)) * up_proj(h))
    logits = (rmsnorm(x) * norm) @ lm_head.T          (lm_head = embed_tokens when tied)

RoPE is Hugging Face's rotate-half form; attention is causal over the sequence order, with
grouped-query heads (query head h reads kv head h // (H // Hkv)). With kv_f16, the keys (after
RoPE) and values are rounded to IEEE halves first, saturating at +-65504, as specdec's CPU KV
cache stores them by default.

process_ref is the reference of the samplers' logits processing: temperature, then top-k,
top-p and min-p, ties to the lower id.
"""

from __future__ import annotations

import numpy as np


def rmsnorm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def rotate_half(x: np.ndarray) -> np.ndarray:
    half = x.shape[-1] // 2
    return np.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def rope_cos_sin(positions: np.ndarray, head_dim: int, theta: float):
    """cos, sin of shape (T, head_dim): angle pos * inv_freq[i], i < Dh/2, repeated twice."""
    i = np.arange(head_dim // 2, dtype=np.float64)
    inv_freq = float(theta) ** (-2.0 * i / head_dim)
    ang = np.asarray(positions, dtype=np.float64)[:, None] * inv_freq[None, :]
    ang = np.concatenate([ang, ang], axis=-1)
    return np.cos(ang), np.sin(ang)


def apply_rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """x: (T, n_heads, Dh); cos/sin: (T, Dh)."""
    return x * cos[:, None, :] + rotate_half(x) * sin[:, None, :]


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    x = x - np.max(x, axis=axis, keepdims=True)
    e = np.exp(x)
    return e / np.sum(e, axis=axis, keepdims=True)


def to_f16(x: np.ndarray) -> np.ndarray:
    """x rounded to the nearest IEEE half (ties to even), finite values beyond the half range
    saturating, back in float64: the values an f16 KV cache holds."""
    return np.clip(x, -65504.0, 65504.0).astype(np.float16).astype(np.float64)


def attention(h: np.ndarray, w: dict, prefix: str, cfg, positions: np.ndarray,
              kv_f16: bool = False, window: int = 0) -> np.ndarray:
    T = h.shape[0]
    H, Hkv, Dh = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim

    def proj(name):
        y = h @ w[prefix + name + ".weight"].T
        if prefix + name + ".bias" in w:
            y = y + w[prefix + name + ".bias"]
        return y

    q = proj("self_attn.q_proj").reshape(T, H, Dh)
    k = proj("self_attn.k_proj").reshape(T, Hkv, Dh)
    v = proj("self_attn.v_proj").reshape(T, Hkv, Dh)
    cos, sin = rope_cos_sin(positions, Dh, cfg.rope_theta)
    q = apply_rope(q, cos, sin)
    k = apply_rope(k, cos, sin)
    if kv_f16:
        k, v = to_f16(k), to_f16(v)

    group = H // Hkv
    causal = np.tril(np.ones((T, T), dtype=bool))  # query t sees tokens 0..t
    if window > 0:  # ... and of them only the last `window`
        causal &= np.subtract.outer(np.arange(T), np.arange(T)) < window
    out = np.zeros((T, H, Dh))
    for head in range(H):
        kv = head // group
        scores = (q[:, head, :] @ k[:, kv, :].T) / np.sqrt(Dh)  # (T, T)
        scores = np.where(causal, scores, -np.inf)
        out[:, head, :] = softmax(scores, axis=-1) @ v[:, kv, :]
    return out.reshape(T, H * Dh) @ w[prefix + "self_attn.o_proj.weight"].T


def forward(weights: dict, cfg, tokens, positions=None, kv_f16: bool = False,
            features: dict | None = None) -> np.ndarray:
    """Logits (T, V) in float64 for the sequence `tokens`. `positions` are the RoPE positions
    (default 0..T-1); attention is causal by sequence order whatever the positions. kv_f16:
    keys and values rounded to halves (specdec's CPU cache). features: a dict that receives
    "hidden" (T, D), the final-normed hidden states, and "layer_in", the residual stream
    entering each layer ([L] of (T, D))."""
    w = {k: np.asarray(v, dtype=np.float64) for k, v in weights.items()}
    tokens = np.asarray(tokens, dtype=np.int64)
    T = len(tokens)
    positions = np.arange(T) if positions is None else np.asarray(positions)
    assert positions.shape == (T,)
    eps = cfg.rms_eps

    x = w["model.embed_tokens.weight"][tokens]
    layer_in = []
    for i in range(cfg.n_layers):
        layer_in.append(x)
        p = f"model.layers.{i}."
        h = rmsnorm(x, w[p + "input_layernorm.weight"], eps)
        x = x + attention(h, w, p, cfg, positions, kv_f16)
        h = rmsnorm(x, w[p + "post_attention_layernorm.weight"], eps)
        gate = h @ w[p + "mlp.gate_proj.weight"].T
        up = h @ w[p + "mlp.up_proj.weight"].T
        x = x + (silu(gate) * up) @ w[p + "mlp.down_proj.weight"].T
    x = rmsnorm(x, w["model.norm.weight"], eps)
    if features is not None:
        features["hidden"], features["layer_in"] = x, layer_in
    head = w["model.embed_tokens.weight"] if cfg.tied else w["lm_head.weight"]
    return x @ head.T


def greedy(weights: dict, cfg, prompt, n: int, return_margins: bool = False,
           kv_f16: bool = False):
    """The greedy chain: n tokens, each the argmax (lowest id on ties) of the last row of a
    fresh forward over prompt + the tokens so far. With return_margins, also the gap between
    the best and second-best logit at each step (how safely the argmax is determined)."""
    seq = [int(t) for t in prompt]
    out, margins = [], []
    for _ in range(n):
        last = forward(weights, cfg, seq, kv_f16=kv_f16)[-1]
        tok = int(np.argmax(last))  # first maximum = lowest id
        top2 = np.sort(last)[-2:]
        margins.append(float(top2[1] - top2[0]))
        out.append(tok)
        seq.append(tok)
    return (out, margins) if return_margins else out


def process_ref(logits, temperature, top_k, top_p, min_p):
    """Reference: temperature, top-k, top-p, min-p (in that order), ties to the lower id."""
    x = np.asarray(logits, dtype=np.float64)
    if temperature == 0:
        out = np.zeros_like(x)
        out[int(np.argmax(x))] = 1.0
        return out
    p = np.exp((x - x.max()) / temperature)
    p /= p.sum()
    order = sorted(range(len(p)), key=lambda i: (-p[i], i))
    keep = len(p)
    if 0 < top_k < keep:
        keep = top_k
    if top_p < 1:
        total = sum(p[i] for i in order[:keep])
        mass, r = 0.0, 0
        while r < keep:
            mass += p[order[r]]
            r += 1
            if mass >= top_p * total:
                break
        keep = r
    if min_p > 0:
        r = 1
        while r < keep and p[order[r]] >= min_p * p[order[0]]:
            r += 1
        keep = r
    out = np.zeros_like(p)
    kept = order[:keep]
    out[kept] = p[kept] / p[kept].sum()
    return out
