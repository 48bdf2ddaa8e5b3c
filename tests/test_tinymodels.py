"""Self-checks of the test helpers (no specdec needed): the GGUF and safetensors writers read
back to what was meant, bf16 rounding, the llama q/k permutation + adjacent-pair RoPE equals HF
rotate-half, and the reference is sensitive to what the specdec tests rely on."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest

import reference
import tinymodels as tm
from tinymodels import CONFIGS, random_tokens, rel_err


# ---- half precision ------------------------------------------------------------------------


def test_bf16_round_to_nearest_even():
    one = 1.0
    cases = {
        one: 0x3F80,
        one + 2**-8: 0x3F80,  # exact tie, 0x3F80 is even: stays
        one + 3 * 2**-8: 0x3F82,  # exact tie, 0x3F81 is odd: goes up
        one + 2**-8 + 2**-20: 0x3F81,  # just above the tie: up
        one + 2**-8 - 2**-20: 0x3F80,  # just below the tie: down
        -2.0: 0xC000,
        0.0: 0x0000,
    }
    x = np.array(list(cases), dtype=np.float32)
    got = tm.f32_to_bf16_bits(x)
    assert [int(v) for v in got] == list(cases.values())
    back = tm.bf16_bits_to_f32(got)
    np.testing.assert_array_equal(back, tm.round_to(x, "BF16"))
    # rounding error of random values is within half an ulp of bf16 (2^-8 relative)
    r = np.random.default_rng(0).standard_normal(10000).astype(np.float32)
    rb = tm.round_to(r, "BF16")
    assert np.max(np.abs(rb - r) / np.abs(r)) <= 2.0**-8
    assert np.any(rb != r)


def test_f16_rounding_matches_numpy():
    r = np.random.default_rng(1).standard_normal(1000).astype(np.float32)
    np.testing.assert_array_equal(tm.round_to(r, "F16"), r.astype(np.float16).astype(np.float32))


# ---- safetensors ---------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["F32", "F16", "BF16"])
@pytest.mark.parametrize("shards", [1, 3])
def test_hf_writer_roundtrip(tmp_path, dtype, shards):
    cfg = CONFIGS["qwen2"]
    w = tm.make_weights(cfg, 3)
    files = tm.write_hf(tmp_path / "m", cfg, w, dtype=dtype, shards=shards)
    conf = json.loads(files.config.read_text())
    assert conf["model_type"] == "qwen2" and conf["hidden_size"] == cfg.dim
    assert conf["num_key_value_heads"] == cfg.n_kv_heads and conf["tie_word_embeddings"] is False
    got = {}
    for f in files.files:
        raw = f.read_bytes()
        (n,) = struct.unpack("<Q", raw[:8])
        assert (8 + n) % 8 == 0
        header = json.loads(raw[8 : 8 + n])
        assert header["__metadata__"] == {"format": "pt"}
        ends = [v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"]
        assert max(ends) == len(raw) - 8 - n
        got.update(tm.read_safetensors(f))
    assert set(got) == set(w)
    stored = tm.stored_weights(w, "hf", dtype)
    for k in w:
        np.testing.assert_array_equal(got[k], stored[k])
    if shards > 1:
        index = json.loads((files.dir / "model.safetensors.index.json").read_text())
        assert set(index["weight_map"]) == set(w)
        assert sorted(set(index["weight_map"].values())) == [f.name for f in files.files]
        assert index["metadata"]["total_size"] == sum(v.size for v in w.values()) * tm.ST_DTYPE_SIZE[dtype]
    else:
        assert not (files.dir / "model.safetensors.index.json").exists()


# ---- GGUF ----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["llama_gqa2", "qwen2", "llama_tied"])
@pytest.mark.parametrize("dtype,version,alignment,reverse",
                         [("F32", 3, 32, False), ("F32", 2, 64, False), ("F16", 3, 64, True)])
def test_gguf_writer_roundtrip(tmp_path, name, dtype, version, alignment, reverse):
    cfg = CONFIGS[name]
    w = tm.make_weights(cfg, 4)
    p = tmp_path / "m.gguf"
    layout = tm.write_gguf(p, cfg, w, dtype=dtype, version=version, alignment=alignment,
                           reverse_tensors=reverse)
    meta, tensors, info = tm.read_gguf(p)
    assert info["version"] == version and info["alignment"] == alignment
    assert ("general.alignment" in meta) == (alignment != 32)
    a = cfg.arch
    assert meta["general.architecture"] == a
    assert meta[f"{a}.embedding_length"] == cfg.dim
    assert meta[f"{a}.attention.head_count_kv"] == cfg.n_kv_heads
    assert meta[f"{a}.context_length"] == cfg.context_length
    assert np.float32(meta[f"{a}.rope.freq_base"]) == np.float32(cfg.rope_theta)
    assert len(meta["tokenizer.ggml.tokens"]) == cfg.vocab
    assert meta["tokenizer.ggml.tokens"][3] == "▁héllo"
    assert meta["specdec.test.nested"] == [[1, -2, 3], ["x", "yz"], []]
    assert meta["specdec.test.u64"] == 2**63 + 5
    assert layout.data_start % alignment == 0
    assert all(off % alignment == 0 for off, _ in layout.tensor_data.values())
    assert ("output.weight" in tensors) == (not cfg.tied)
    stored = tm.stored_weights(w, "gguf", dtype)
    for hf_name, arr in stored.items():
        g = tm.gguf_name(hf_name)
        expect = arr
        if a == "llama" and ".q_proj." in hf_name:
            expect = tm.permute_qk(arr, cfg.n_heads)
        elif a == "llama" and ".k_proj." in hf_name:
            expect = tm.permute_qk(arr, cfg.n_kv_heads)
        np.testing.assert_array_equal(tensors[g], expect)
        assert info["types"][g] == (tm.GGML_F16 if (dtype == "F16" and arr.ndim == 2) else tm.GGML_F32)
    assert set(tensors) == {tm.gguf_name(k) for k in w}


def test_gguf_writer_reads_with_gguf_dims_convention(tmp_path):
    """A 2-D tensor is stored with dims [in, out] (ne0 innermost) and the same bytes as the
    row-major HF [out, in] array."""
    cfg = CONFIGS["llama_odd"]
    w = tm.make_weights(cfg, 5)
    p = tmp_path / "m.gguf"
    layout = tm.write_gguf(p, cfg, w)
    raw = p.read_bytes()
    start, end = layout.tensor_info_offsets["blk.0.ffn_down.weight"]
    (n,) = struct.unpack_from("<Q", raw, start)
    pos = start + 8 + n
    nd, d0, d1, gtype = struct.unpack_from("<IQQI", raw, pos)
    assert (nd, d0, d1, gtype) == (2, cfg.ffn, cfg.dim, 0)  # down_proj HF [D, F] -> dims [F, D]
    off, nbytes = layout.tensor_data["blk.0.ffn_down.weight"]
    blob = raw[layout.data_start + off : layout.data_start + off + nbytes]
    assert blob == w["model.layers.0.mlp.down_proj.weight"].astype("<f4").tobytes()


def test_permute_matches_llama_cpp_formula():
    """permute_qk is llama.cpp's: head h row 2i <- HF row i, row 2i+1 <- HF row i + Dh/2."""
    H, Dh, cols = 3, 8, 5
    w = np.arange(H * Dh * cols, dtype=np.float32).reshape(H * Dh, cols)
    p = tm.permute_qk(w, H)
    for h in range(H):
        for i in range(Dh // 2):
            np.testing.assert_array_equal(p[h * Dh + 2 * i], w[h * Dh + i])
            np.testing.assert_array_equal(p[h * Dh + 2 * i + 1], w[h * Dh + i + Dh // 2])
    b = np.arange(H * Dh, dtype=np.float32)
    np.testing.assert_array_equal(tm.permute_qk(b, H), p[:, 0] / cols)


def rope_adjacent(x, positions, theta):
    """llama.cpp's normal (non-NEOX) RoPE: rotate the adjacent pairs (2i, 2i+1) by pos*inv_freq[i].
    x: (T, n_heads, Dh)."""
    Dh = x.shape[-1]
    inv = float(theta) ** (-2.0 * np.arange(Dh // 2) / Dh)
    ang = np.asarray(positions, dtype=np.float64)[:, None, None] * inv[None, None, :]
    c, s = np.cos(ang), np.sin(ang)
    x0, x1 = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = x0 * c - x1 * s
    out[..., 1::2] = x0 * s + x1 * c
    return out


def test_permuted_adjacent_rope_equals_hf_rotate_half():
    """q.k scores are the same for (HF weights, rotate-half) and (permuted weights, adjacent
    pairs) — so a GGUF llama file and its HF source must give the same logits."""
    cfg = CONFIGS["llama_gqa2"]
    w = tm.make_weights(cfg, 6)
    rng = np.random.default_rng(0)
    T, H, Hkv, Dh = 9, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    x = rng.standard_normal((T, cfg.dim))
    pos = np.array([0, 1, 2, 5, 9, 17, 30, 31, 63])
    wq, wk = w["model.layers.0.self_attn.q_proj.weight"], w["model.layers.0.self_attn.k_proj.weight"]
    cos, sin = reference.rope_cos_sin(pos, Dh, cfg.rope_theta)
    q_hf = reference.apply_rope((x @ wq.T).reshape(T, H, Dh), cos, sin)
    k_hf = reference.apply_rope((x @ wk.T).reshape(T, Hkv, Dh), cos, sin)
    q_gg = rope_adjacent((x @ tm.permute_qk(wq, H).T).reshape(T, H, Dh), pos, cfg.rope_theta)
    k_gg = rope_adjacent((x @ tm.permute_qk(wk, Hkv).T).reshape(T, Hkv, Dh), pos, cfg.rope_theta)
    for h in range(H):
        s_hf = q_hf[:, h] @ k_hf[:, h // (H // Hkv)].T
        s_gg = q_gg[:, h] @ k_gg[:, h // (H // Hkv)].T
        np.testing.assert_allclose(s_gg, s_hf, rtol=1e-12, atol=1e-12)
    # and the unpermuted weights with adjacent pairs would NOT match (the permutation matters)
    q_bad = rope_adjacent((x @ wq.T).reshape(T, H, Dh), pos, cfg.rope_theta)
    k_bad = rope_adjacent((x @ wk.T).reshape(T, Hkv, Dh), pos, cfg.rope_theta)
    assert not np.allclose(q_bad[:, 0] @ k_bad[:, 0].T, q_hf[:, 0] @ k_hf[:, 0].T, atol=1e-3)


def gguf_forward(tensors, cfg, tokens):
    """An independent forward over GGUF tensors (as read back by tm.read_gguf), in llama.cpp's
    own conventions: adjacent-pair RoPE for llama, rotate-half for qwen2."""
    t = {k: v.astype(np.float64) for k, v in tensors.items()}
    T = len(tokens)
    H, Hkv, Dh = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    pos = np.arange(T)
    cos, sin = reference.rope_cos_sin(pos, Dh, cfg.rope_theta)

    def rope(x):
        return rope_adjacent(x, pos, cfg.rope_theta) if cfg.arch == "llama" else reference.apply_rope(x, cos, sin)

    def norm(x, w):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + cfg.rms_eps) * w

    def lin(x, name):  # GGUF dims [in, out] read back as numpy [out, in]
        y = x @ t[name + ".weight"].T
        return y + t[name + ".bias"] if name + ".bias" in t else y

    x = t["token_embd.weight"][np.asarray(tokens)]
    mask = np.tril(np.ones((T, T), dtype=bool))
    for i in range(cfg.n_layers):
        b = f"blk.{i}."
        h = norm(x, t[b + "attn_norm.weight"])
        q = rope(lin(h, b + "attn_q").reshape(T, H, Dh))
        k = rope(lin(h, b + "attn_k").reshape(T, Hkv, Dh))
        v = lin(h, b + "attn_v").reshape(T, Hkv, Dh)
        att = np.zeros((T, H, Dh))
        for hh in range(H):
            s = q[:, hh] @ k[:, hh * Hkv // H].T / np.sqrt(Dh)
            s = np.where(mask, s, -np.inf)
            p = np.exp(s - s.max(-1, keepdims=True))
            att[:, hh] = (p / p.sum(-1, keepdims=True)) @ v[:, hh * Hkv // H]
        x = x + lin(att.reshape(T, H * Dh), b + "attn_output")
        h = norm(x, t[b + "ffn_norm.weight"])
        g = lin(h, b + "ffn_gate")
        x = x + lin(g / (1 + np.exp(-g)) * lin(h, b + "ffn_up"), b + "ffn_down")
    x = norm(x, t["output_norm.weight"])
    return x @ t.get("output.weight", t["token_embd.weight"]).T


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_gguf_file_equals_hf_reference(tmp_path, name):
    """The GGUF file, read back and run in llama.cpp's conventions, gives the reference's logits
    over the HF weights: the writer's naming, layout and permutation are right."""
    cfg = CONFIGS[name]
    w = tm.make_weights(cfg, 7)
    p = tmp_path / "m.gguf"
    tm.write_gguf(p, cfg, w)
    _, tensors, _ = tm.read_gguf(p)
    tokens = random_tokens(cfg.vocab, 23, seed=2)
    np.testing.assert_allclose(gguf_forward(tensors, cfg, tokens), reference.forward(w, cfg, tokens),
                               rtol=1e-9, atol=1e-9)


# ---- reference -----------------------------------------------------------------------------


def test_reference_is_causal():
    cfg = CONFIGS["qwen2"]
    w = tm.make_weights(cfg, 8)
    seq = random_tokens(cfg.vocab, 20, seed=3)
    full = reference.forward(w, cfg, seq)
    for k in (1, 5, 19):
        np.testing.assert_allclose(reference.forward(w, cfg, seq[:k]), full[:k], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_reference_sensitivity(name):
    """The tiny models are not degenerate: dropping RoPE, mis-grouping GQA heads or dropping the
    biases moves the logits by far more than specdec's tolerances (1e-4 / 1e-3), and argmaxes
    vary across positions — so the specdec comparisons can fail."""
    cfg = CONFIGS[name]
    w = tm.make_weights(cfg, tm.CONFIG_SEEDS[name])
    tokens = random_tokens(cfg.vocab, 37, seed=1)
    ref = reference.forward(w, cfg, tokens)
    assert len(set(np.argmax(ref, axis=1).tolist())) > 5
    assert np.ptp(ref, axis=1).min() > 1.0
    no_rope = reference.forward(w, cfg, tokens, positions=np.zeros(37, dtype=int))
    assert rel_err(no_rope, ref) > 1e-2
    if cfg.n_kv_heads > 1:
        # rotate the kv heads: query head h would read kv head (h // group + 1) % Hkv
        sw = dict(w)
        Dh = cfg.head_dim
        for i in range(cfg.n_layers):
            for proj in ("k_proj", "v_proj"):
                for kind in ("weight", "bias"):
                    key = f"model.layers.{i}.self_attn.{proj}.{kind}"
                    if key in sw:
                        sw[key] = np.roll(sw[key], Dh, axis=0)
        assert rel_err(reference.forward(sw, cfg, tokens), ref) > 1e-2
    if cfg.has_bias:
        nobias = {k: v for k, v in w.items() if not k.endswith(".bias")}
        assert rel_err(reference.forward(nobias, cfg, tokens), ref) > 1e-2
    # bf16 rounding of the weights moves the logits by more than the F32 tolerance: the F16/BF16
    # comparisons need the reference over the rounded weights
    bf = reference.forward(tm.stored_weights(w, "hf", "BF16"), cfg, tokens)
    assert 1e-4 < rel_err(bf, ref)
