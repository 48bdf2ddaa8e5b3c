"""No silent ignoring (issue 25): every config.json key and GGUF key that changes a model's
arithmetic in a way specdec does not implement is refused with a ValueError naming it, and so
is any tensor of the file that the architecture's graph would not read. Neutral values of the
same keys (what the model would compute anyway) load."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

import specdec
import tinymodels as tm
from specdec import testing
from tinymodels import GGUF_ARRAY, GGUF_BOOL, GGUF_F32, GGUF_I32, GGUF_STRING, GGUF_U32, Arr

LLAMA = tm.TinyConfig(arch="llama", vocab=48, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn=48)
QWEN3 = tm.TinyConfig(arch="qwen3", vocab=48, dim=32, n_layers=2, n_heads=4, n_kv_heads=2,
                      ffn=48, head_size=16)
LLAMA3 = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 16}


def hf(tmp_path, overrides=None, cfg=LLAMA, extra=None, drop=()):
    w = tm.make_weights(cfg, 5)
    w.update(extra or {})
    return testing.write_hf(tmp_path / "m", cfg, w, config_overrides=overrides, drop=drop).dir


def refused(path, *needles):
    with pytest.raises(ValueError) as e:
        specdec.load(str(path))
    for n in needles:
        assert n in str(e.value), str(e.value)
    return str(e.value)


# ---- config.json ----------------------------------------------------------------------------

HF_REFUSED = [
    ("rope_parameters", {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4,
                         "original_max_position_embeddings": 16, "truncate": False}, "truncate"),
    ("rope_parameters", {"rope_type": "yarn", "factor": 0.0, "rope_theta": 1e4}, "YaRN's factor"),
    ("rope_parameters", {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4,
                         "beta_fast": -1.0}, "beta_fast -1"),
    ("rope_parameters", {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4,
                         "low_freq_factor": 1.0}, "low_freq_factor"),
    ("rope_parameters", {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4,
                         "original_max_position_embeddings": "16"}, "must be an integer"),
    ("rope_parameters", {"rope_type": "dynamic", "factor": 2.0}, "dynamic"),
    ("rope_scaling", {"type": "longrope", "short_factor": [1.0], "long_factor": [1.0]}, "longrope"),
    ("rope_parameters", dict(LLAMA3, attention_factor=2.0), "attention_factor"),
    ("rope_parameters", {"rope_type": "linear", "factor": 2.0, "beta_fast": 32}, "beta_fast"),
    ("rope_parameters", dict(LLAMA3, partial_rotary_factor=0.5), "partial_rotary_factor"),
    ("rope_parameters", {"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}},
     "full_attention"),
    ("rope_parameters", {"rope_type": "llama3", "factor": 8.0}, "low_freq_factor"),
    ("rope_parameters", dict(LLAMA3, high_freq_factor=1.0), "high_freq_factor"),
    ("rope_parameters", [1, 2], "rope_parameters"),
    ("partial_rotary_factor", 0.5, "partial_rotary_factor"),
    ("attn_logit_softcapping", 50.0, "attn_logit_softcapping"),
    ("final_logit_softcapping", 30.0, "final_logit_softcapping"),
    ("query_pre_attn_scalar", 256, "query_pre_attn_scalar"),
    ("attention_multiplier", 0.015625, "attention_multiplier"),
    ("embedding_multiplier", 12.0, "embedding_multiplier"),
    ("logits_scaling", 8.0, "logits_scaling"),
    ("residual_multiplier", 0.22, "residual_multiplier"),
    ("hidden_act", "gelu_pytorch_tanh", "hidden_act"),
    ("hidden_activation", "gelu", "hidden_activation"),
    ("attention_bias", True, "attention_bias"),
    ("mlp_bias", True, "mlp_bias"),
    ("layer_types", ["full_attention", "sliding_attention"], "layer_types"),
    ("num_local_experts", 8, "num_local_experts"),
    ("num_experts", 4, "num_experts"),
    ("quantization_config", {"quant_method": "gptq", "bits": 4}, "quantization_config"),
    ("is_causal", False, "is_causal"),
    ("use_qk_norm", True, "use_qk_norm"),
    ("rope_local_base_freq", 10000.0, "rope_local_base_freq"),
]


@pytest.mark.parametrize("key,value,needle", HF_REFUSED,
                         ids=[f"{k}-{i}" for i, (k, _, _) in enumerate(HF_REFUSED)])
def test_hf_key_refused_by_name(tmp_path, key, value, needle):
    refused(hf(tmp_path, {key: value}), needle)


def test_rope_theta_disagreeing_with_rope_parameters(tmp_path):
    refused(hf(tmp_path, {"rope_theta": 500000.0, "rope_parameters": LLAMA3}), "rope_theta")


def test_rope_scaling_disagreeing_with_rope_parameters(tmp_path):
    old = {"type": "linear", "factor": 2.0}
    refused(hf(tmp_path, {"rope_parameters": LLAMA3, "rope_scaling": old}), "disagree")


def test_qwen_sliding_window_on_some_layers_refused(tmp_path):
    over = {"use_sliding_window": True, "sliding_window": 8, "max_window_layers": 1}
    refused(hf(tmp_path, over, cfg=QWEN3), "use_sliding_window")


NEUTRAL = {
    "attn_logit_softcapping": None, "final_logit_softcapping": None,
    "partial_rotary_factor": 1.0, "hidden_act": "silu", "mlp_bias": False,
    "attention_bias": False, "num_experts": 0, "is_causal": True, "pretraining_tp": 1,
    "layer_types": ["full_attention", "full_attention"], "sliding_window": None,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
    "rope_scaling": {"rope_type": "default"}, "embedding_multiplier": 1.0,
}


def test_neutral_values_load(tmp_path):
    specdec.load(str(hf(tmp_path, NEUTRAL)))


# ---- tensors that no role reads -------------------------------------------------------------

@pytest.mark.parametrize("extra,name", [
    ("model.layers.1.self_attn.o_proj.bias", "model.layers.1.self_attn.o_proj.bias"),
    ("model.layers.0.mlp.down_proj.bias", "model.layers.0.mlp.down_proj.bias"),
    ("model.layers.0.self_attn.q_norm.weight", "model.layers.0.self_attn.q_norm.weight"),
    ("model.layers.0.pre_feedforward_layernorm.weight", "pre_feedforward_layernorm"),
])
def test_unread_hf_tensor_refused(tmp_path, extra, name):
    refused(hf(tmp_path, extra={extra: np.ones(32, np.float32)}), name, "not used")


def test_rotary_buffers_and_tied_head_are_not_unread(tmp_path):
    """HF recomputes saved inv_freq buffers and replaces lm_head when tie_word_embeddings is
    true: both are fine to leave unread."""
    extra = {"model.layers.0.self_attn.rotary_emb.inv_freq": np.ones(4, np.float32)}
    m = specdec.load(str(hf(tmp_path, {"tie_word_embeddings": True}, extra=extra)))
    assert m.config.tied_embeddings


def test_qwen3_without_its_norms_refused(tmp_path):
    drop = ["model.layers.1.self_attn.k_norm.weight"]
    refused(hf(tmp_path, cfg=QWEN3, drop=drop), "model.layers.1.self_attn.k_norm.weight")


# ---- GGUF -----------------------------------------------------------------------------------

def gguf(tmp_path, extra_kv=(), cfg=LLAMA, weights=None, **kw):
    w = weights if weights is not None else tm.make_weights(cfg, 5)
    p = tmp_path / "m.gguf"
    tm.write_gguf(p, cfg, w, extra_kv=list(extra_kv), **kw)
    return p


GGUF_REFUSED = [
    ("llama.attn_logit_softcapping", GGUF_F32, 50.0),
    ("llama.final_logit_softcapping", GGUF_F32, 30.0),
    ("llama.attention.scale", GGUF_F32, 0.125),
    ("llama.embedding_scale", GGUF_F32, 12.0),
    ("llama.logit_scale", GGUF_F32, 8.0),
    ("llama.residual_scale", GGUF_F32, 0.22),
    ("llama.expert_count", GGUF_U32, 8),
    ("llama.attention.clamp_kqv", GGUF_F32, 8.0),
    ("llama.attention.causal", GGUF_BOOL, False),
    ("llama.attention.layer_norm_epsilon", GGUF_F32, 1e-5),
    ("llama.rope.dimension_sections", GGUF_ARRAY, Arr(GGUF_I32, [2, 2, 0, 0])),
    ("llama.rope.freq_base_swa", GGUF_F32, 10000.0),
    ("llama.attention.sliding_window_pattern", GGUF_U32, 6),
    ("llama.rope.scaling.attn_factor", GGUF_F32, 2.0),
    ("llama.rope.scaling.alpha", GGUF_F32, 1000.0),
    ("llama.rope.scaling.type", GGUF_STRING, "dynamic"),
    ("llama.rope.scaling.type", GGUF_STRING, "longrope"),
    ("llama.attention.value_length", GGUF_U32, 4),
]


@pytest.mark.parametrize("key,vtype,value", GGUF_REFUSED,
                         ids=[f"{k}-{i}" for i, (k, _, _) in enumerate(GGUF_REFUSED)])
def test_gguf_key_refused_by_name(tmp_path, key, vtype, value):
    refused(gguf(tmp_path, [(key, vtype, value)]), key)


@pytest.mark.parametrize("kv,needle", [
    ([], "YaRN needs a factor > 0"),
    ([("llama.rope.scaling.factor", GGUF_F32, 4.0),
      ("llama.rope.scaling.yarn_beta_fast", GGUF_F32, 16.0)], "llama.rope.scaling.yarn_beta_fast"),
    ([("llama.rope.scaling.factor", GGUF_F32, 4.0),
      ("llama.rope.scaling.yarn_attn_factor", GGUF_F32, 1.0)], "yarn_attn_factor"),
    ([("llama.rope.scaling.factor", GGUF_F32, 4.0),
      ("llama.rope.scaling.yarn_log_multiplier", GGUF_F32, 0.1)], "yarn_log_multiplier"),
])
def test_gguf_yarn_refusals(tmp_path, kv, needle):
    """llama.cpp reads no rope.scaling.yarn_* key for the llama graphs, while the model's
    transformers config that set one computes with it: a value other than llama.cpp's is
    refused, and so is YaRN without a factor."""
    refused(gguf(tmp_path, [("llama.rope.scaling.type", GGUF_STRING, "yarn")] + kv), needle)


def test_gguf_yarn_with_llamacpp_values_loads(tmp_path):
    """The yarn_* keys stating what llama.cpp computes anyway (beta 32 and 1, the attention
    factor 0.1 ln 4 + 1) are no ambiguity."""
    kv = [("llama.rope.scaling.type", GGUF_STRING, "yarn"),
          ("llama.rope.scaling.factor", GGUF_F32, 4.0),
          ("llama.rope.scaling.original_context_length", GGUF_U32, 16),
          ("llama.rope.scaling.yarn_beta_fast", GGUF_F32, 32.0),
          ("llama.rope.scaling.yarn_beta_slow", GGUF_F32, 1.0),
          ("llama.rope.scaling.yarn_attn_factor", GGUF_F32, 0.1 * math.log(4.0) + 1.0)]
    rs = specdec.load(str(gguf(tmp_path, kv))).config.rope_scaling
    assert rs["type"] == "yarn" and rs["original_context"] == 16 and rs["factor"] == 4.0


@pytest.mark.parametrize("name", ["gemma3", "phi3"])
def test_yarn_refused_outside_the_llama_graphs(tmp_path, name):
    def change(c):
        rp = {"rope_type": "yarn", "rope_theta": 1e4, "factor": 2.0}
        if name == "gemma3":
            c["rope_parameters"]["full_attention"] = rp
        else:
            c["rope_parameters"] = rp
    refused(gemma3_dir(tmp_path, change, name), "YaRN", name)


def test_gguf_linear_without_factor_refused(tmp_path):
    refused(gguf(tmp_path, [("llama.rope.scaling.type", GGUF_STRING, "linear")]),
            "llama.rope.scaling.factor")


def test_gguf_factor_with_type_none_refused(tmp_path):
    kv = [("llama.rope.scaling.type", GGUF_STRING, "none"),
          ("llama.rope.scaling.factor", GGUF_F32, 4.0)]
    refused(gguf(tmp_path, kv), "llama.rope.scaling.factor")


def test_gguf_neutral_values_load(tmp_path):
    kv = [("llama.attn_logit_softcapping", GGUF_F32, 0.0), ("llama.expert_count", GGUF_U32, 0),
          ("llama.attention.causal", GGUF_BOOL, True),
          ("llama.rope.scaling.type", GGUF_STRING, "none"),
          ("llama.rope.scaling.attn_factor", GGUF_F32, 1.0),
          ("llama.attention.value_length", GGUF_U32, LLAMA.head_dim)]
    specdec.load(str(gguf(tmp_path, kv)))


def test_unread_gguf_tensor_refused(tmp_path):
    """A llama file with q/k norm tensors (a qwen3 layer under the wrong name) is refused."""
    w = tm.make_weights(LLAMA, 5)
    w["model.layers.0.self_attn.q_norm.weight"] = np.ones(LLAMA.head_dim, np.float32)
    refused(gguf(tmp_path, weights=w), "blk.0.attn_q_norm.weight", "not used")


def test_gguf_qwen3_loads_and_refuses_missing_norm(tmp_path):
    p = gguf(tmp_path, cfg=QWEN3)
    c = specdec.load(str(p)).config
    assert c.arch == "qwen3" and c.head_dim == 16 and c.n_heads * c.head_dim != c.hidden_size
    refused(gguf(tmp_path, cfg=QWEN3, drop=["blk.0.attn_k_norm.weight"]),
            "blk.0.attn_k_norm.weight")


def test_gguf_linear_factor_without_type_is_linear(tmp_path):
    """llama.cpp reads rope.scaling.factor as linear when no type is given: so does specdec
    (checked against transformers' linear-scaled logits of the families fixture)."""
    fx = fixture("llama_linear_rope")
    cfg = testing.RandomModelConfig(**fx["weights"]["shape"])
    w = testing.random_weights(cfg, fx["weights"]["seed"])
    p = tmp_path / "lin.gguf"
    testing.write_gguf(p, cfg, w, extra_kv=[("llama.rope.scaling.factor", GGUF_F32, 4.0)])
    got = specdec.load(str(p), kv_dtype="f32").logits(fx["tokens"])
    assert tm.rel_err(got, fx["logits"]) <= 1e-3


def fixture(name):
    path = Path(__file__).parent / "fixtures" / "families" / f"{name}.json"
    return json.loads(path.read_text())


def llama3_divisors(rp, head_dim):
    """Per-frequency divisors of llama3 scaling, from the formula (Llama 3.1's reference code):
    wavelengths above original / low_freq_factor are divided by factor, below original /
    high_freq_factor kept, blended in between."""
    out = []
    for i in range(head_dim // 2):
        inv = rp["rope_theta"] ** (-2.0 * i / head_dim)
        wl = 2 * math.pi / inv
        old, lo, hi, f = (rp["original_max_position_embeddings"], rp["low_freq_factor"],
                          rp["high_freq_factor"], rp["factor"])
        if wl < old / hi:
            out.append(1.0)
        elif wl > old / lo:
            out.append(f)
        else:
            s = (old / wl - lo) / (hi - lo)
            out.append(1.0 / ((1 - s) / f + s))
    return np.array(out, np.float32)


def test_gguf_rope_freqs_divide_the_frequencies(tmp_path):
    """rope_freqs.weight written here from the llama3 formula gives transformers' logits."""
    fx = fixture("llama3_rope")
    cfg = testing.RandomModelConfig(**fx["weights"]["shape"])
    w = testing.random_weights(cfg, fx["weights"]["seed"])
    f = llama3_divisors(fx["config"]["rope_parameters"], cfg.head_dim)
    p = tmp_path / "f.gguf"
    testing.write_gguf(p, cfg, w, extra_tensors=[("rope_freqs.weight", f)])
    got = specdec.load(str(p), kv_dtype="f32").logits(fx["tokens"])
    assert tm.rel_err(got, fx["logits"]) <= 1e-3
    # and without the tensor the file is another model
    testing.write_gguf(p, cfg, w)
    got = specdec.load(str(p), kv_dtype="f32").logits(fx["tokens"])
    assert tm.rel_err(got, fx["logits"]) > 0.05


@pytest.mark.parametrize("bad", [0.0, -1.0, float("inf")])
def test_gguf_rope_freqs_must_be_positive(tmp_path, bad):
    f = np.ones(LLAMA.head_dim // 2, np.float32)
    f[1] = bad
    p = gguf(tmp_path, extra_tensors=[("rope_freqs.weight", f)])
    refused(p, "rope_freqs.weight")


def test_gguf_rope_freqs_with_linear_factor_refused(tmp_path):
    f = np.ones(LLAMA.head_dim // 2, np.float32)
    p = gguf(tmp_path, [("llama.rope.scaling.factor", GGUF_F32, 2.0)],
             extra_tensors=[("rope_freqs.weight", f)])
    refused(p, "rope_freqs.weight")


def test_gguf_rope_freqs_of_wrong_length_refused(tmp_path):
    p = gguf(tmp_path, extra_tensors=[("rope_freqs.weight", np.ones(3, np.float32))])
    refused(p, "rope_freqs.weight")


def test_gguf_window_of_qwen_refused(tmp_path):
    qwen2 = LLAMA.replace(arch="qwen2")
    refused(gguf(tmp_path, [("qwen2.attention.sliding_window", GGUF_U32, 8)], cfg=qwen2),
            "qwen2.attention.sliding_window")


def test_gguf_llama_window_holds(tmp_path):
    """A llama GGUF that states a window gets it (the Mistral fixture's, against transformers),
    although llama.cpp's llama graph would not read the key."""
    fx = fixture("mistral_window")
    cfg = testing.RandomModelConfig(**fx["weights"]["shape"])
    w = testing.random_weights(cfg, fx["weights"]["seed"])
    p = tmp_path / "w.gguf"
    window = fx["config"]["sliding_window"]
    testing.write_gguf(p, cfg, w, extra_kv=[("llama.attention.sliding_window", GGUF_U32, window)])
    got = specdec.load(str(p), kv_dtype="f32").logits(fx["tokens"])
    assert tm.rel_err(got, fx["logits"]) <= 1e-3


# ---- gemma3 ---------------------------------------------------------------------------------


def gemma3_dir(tmp_path, change, name="gemma3"):
    fx = fixture(name)
    conf = json.loads(json.dumps(fx["config"]))
    change(conf)
    cfg = testing.RandomModelConfig(**fx["weights"]["shape"])
    w = testing.random_weights(cfg, fx["weights"]["seed"])
    d = tmp_path / "g"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(conf))
    (d / "model.safetensors").write_bytes(testing.safetensors_bytes(w, "F32"))
    return d


GEMMA3_REFUSED = {
    "hidden_activation": (lambda c: c.update(hidden_activation="gelu"), "hidden_activation"),
    "layer_types": (lambda c: c["layer_types"].reverse(), "layer_types"),
    "model_type": (lambda c: c.update(model_type="gemma3"), "gemma3_text"),
    "no window": (lambda c: c.update(sliding_window=None), "sliding_window"),
    "scaled local": (lambda c: c["rope_parameters"]["sliding_attention"].update(
        rope_type="linear", factor=2.0), "sliding_attention"),
    "other layer type": (lambda c: c["rope_parameters"].update(chunked_attention={}),
                         "chunked_attention"),
    "attn softcap": (lambda c: c.update(attn_logit_softcapping=50.0), "attn_logit_softcapping"),
    "bidirectional": (lambda c: c.update(use_bidirectional_attention=True),
                      "use_bidirectional_attention"),
}


@pytest.mark.parametrize("what", list(GEMMA3_REFUSED))
def test_gemma3_hf_refusals(tmp_path, what):
    change, needle = GEMMA3_REFUSED[what]
    refused(gemma3_dir(tmp_path, change), needle)


def gemma3_gguf(tmp_path, extra_kv=()):
    fx = fixture("gemma3")
    cfg = testing.RandomModelConfig(**fx["weights"]["shape"])
    w = testing.random_weights(cfg, fx["weights"]["seed"])
    p = tmp_path / "g.gguf"
    cfg = cfg.replace(rope_theta=1e6)  # the global layers' base
    kv = [("gemma3.attention.sliding_window", GGUF_U32, 4),
          ("gemma3.rope.freq_base_swa", GGUF_F32, 10000.0),
          ("gemma3.rope.scaling.type", GGUF_STRING, "linear"),
          ("gemma3.rope.scaling.factor", GGUF_F32, 4.0)]
    testing.write_gguf(p, cfg, w, extra_kv=kv + list(extra_kv))
    return p, fx


def test_gemma3_gguf_written_here_agrees(tmp_path):
    """This writer's gemma3 GGUF (norms + 1, llama.cpp's names) computes transformers' logits
    as the converter's file does, so the refusals below are tested on a working file."""
    p, fx = gemma3_gguf(tmp_path)
    got = specdec.load(str(p), kv_dtype="f32").logits(fx["tokens"])
    assert tm.rel_err(got, fx["logits"]) <= 1e-3


@pytest.mark.parametrize("key,vtype,value", [
    ("gemma3.attention.sliding_window_pattern", GGUF_ARRAY, Arr(GGUF_BOOL, [True] * 6)),
    ("gemma3.attention.sliding_window_pattern", GGUF_U32, 1),
    ("gemma3.attn_logit_softcapping", GGUF_F32, 50.0),
])
def test_gemma3_gguf_refusals(tmp_path, key, vtype, value):
    refused(gemma3_gguf(tmp_path, [(key, vtype, value)])[0], key)


# ---- gemma2 ---------------------------------------------------------------------------------

GEMMA2_REFUSED = {
    "scaled rope": (lambda c: c.update(rope_parameters={"rope_type": "linear", "factor": 2.0,
                                                         "rope_theta": 1e4}), "RoPE scaling"),
    "no window": (lambda c: c.update(sliding_window=None), "sliding_window"),
    "layer_types": (lambda c: c.update(layer_types=["full_attention", "sliding_attention"] * 2),
                    "layer_types"),
    "local base": (lambda c: c.update(rope_local_base_freq=1e4), "rope_local_base_freq"),
    "cap of 0": (lambda c: c.update(attn_logit_softcapping=0), "attn_logit_softcapping"),
    "cap as text": (lambda c: c.update(final_logit_softcapping="30"), "final_logit_softcapping"),
    "hidden_activation": (lambda c: c.update(hidden_activation="gelu"), "hidden_activation"),
}


@pytest.mark.parametrize("what", list(GEMMA2_REFUSED))
def test_gemma2_hf_refusals(tmp_path, what):
    change, needle = GEMMA2_REFUSED[what]
    refused(gemma3_dir(tmp_path, change, "gemma2"), needle)


def test_gemma2_gguf_without_window_refused(tmp_path):
    """llama.cpp slides Gemma 2's even layers with a window of 4096 unless the file gives one;
    a file that says 0 has no answer that is right for both."""
    fx = fixture("gemma2")
    cfg = testing.RandomModelConfig(**fx["weights"]["shape"])
    w = testing.random_weights(cfg, fx["weights"]["seed"])
    p = tmp_path / "g2.gguf"
    testing.write_gguf(p, cfg, w, extra_kv=[("gemma2.attention.sliding_window", GGUF_U32, 0)])
    refused(p, "gemma2.attention.sliding_window")


# ---- phi3 -----------------------------------------------------------------------------------

PHI3_REFUSED = {
    "hidden_act": (lambda c: c.update(hidden_act="gelu"), "hidden_act"),
}


@pytest.mark.parametrize("what", list(PHI3_REFUSED))
def test_phi3_hf_refusals(tmp_path, what):
    change, needle = PHI3_REFUSED[what]
    refused(gemma3_dir(tmp_path, change, "phi3"), needle)


def _rp(**kw):
    return lambda c: c["rope_parameters"].update(**kw)


LONGROPE_REFUSED = {  # phi3_longrope: 12 rotary dimensions of 16 (6 factors), context 64
    "short list too short": (_rp(short_factor=[1.0] * 5), "short_factor\" must be an array of 6"),
    "long list missing": (lambda c: c["rope_parameters"].pop("long_factor"),
                          "long_factor\" must be an array of 6"),
    "factor not a list": (_rp(short_factor=2.0), "short_factor\" must be an array"),
    "zero factor": (_rp(long_factor=[1.0, 0.0, 1.0, 1.0, 1.0, 1.0]), "long_factor\"[1] must be"),
    "string factor": (_rp(short_factor=["1"] * 6), "short_factor\"[0] must be"),
    # transformers reads the top-level original context (Phi3Config's 4096 when absent) over
    # rope_parameters' own: a disagreement is refused rather than read either way
    "object disagrees with the top level": (
        _rp(original_max_position_embeddings=20), "must be the integer 16 of the top level"),
    "only in the object": (lambda c: c.pop("original_max_position_embeddings"),
                           "must be the integer 4096 of the top level"),
    "original beyond the context": (
        lambda c: (c.update(original_max_position_embeddings=65),
                   c["rope_parameters"].update(original_max_position_embeddings=65)),
        "original_max_position_embeddings 65 is not in [1, max_position_embeddings 64]"),
    "no original": (lambda c: (c["rope_parameters"].pop("original_max_position_embeddings"),
                               c.pop("original_max_position_embeddings")),
                    "original_max_position_embeddings"),
    "odd rotary dimensions": (lambda c: (c.update(partial_rotary_factor=0.3125),
                                         c["rope_parameters"].update(partial_rotary_factor=0.3125)),
                              "rotates 5 of the head's 16"),
    "partial factors disagree": (lambda c: c.update(partial_rotary_factor=0.5), "disagrees"),
    "partial factor above 1": (lambda c: (c.update(partial_rotary_factor=1.5),
                                          c["rope_parameters"].update(partial_rotary_factor=1.5)),
                               "partial_rotary_factor\" must be a number in (0, 1]"),
    "attention factor 0": (_rp(attention_factor=0.0), "attention_factor"),
    "unknown key": (_rp(beta_fast=32), "beta_fast"),
}


@pytest.mark.parametrize("what", list(LONGROPE_REFUSED))
def test_longrope_hf_refusals(tmp_path, what):
    """Phi-3.5/Phi-4-mini's RoPE settings that are malformed, or that transformers would
    compute with another meaning, are refused by name."""
    change, needle = LONGROPE_REFUSED[what]
    refused(gemma3_dir(tmp_path, change, "phi3_longrope"), needle)


SMOLLM3_REFUSED = {  # 4 layers
    "not periodic": (lambda c: c.update(no_rope_layers=[1, 0, 1, 1]), "breaks the pattern"),
    "wrong length": (lambda c: c.update(no_rope_layers=[1, 1, 0]), "not an array of 4"),
    "not 0 or 1": (lambda c: c.update(no_rope_layers=[1, 2, 1, 0]), "[1] must be 0 or 1"),
    "string entry": (lambda c: c.update(no_rope_layers=[1, 1, 1, "0"]), "[3] must be 0 or 1"),
    "interval 0": (lambda c: (c.pop("no_rope_layers"), c.update(no_rope_layer_interval=0)),
                   "no_rope_layer_interval"),
    "window": (lambda c: c.update(use_sliding_window=True, sliding_window=8),
               "use_sliding_window"),
}


@pytest.mark.parametrize("what", list(SMOLLM3_REFUSED))
def test_smollm3_hf_refusals(tmp_path, what):
    """SmolLM3's NoPE layers other than every n-th, malformed lists, and its sliding window
    (transformers puts it on the NoPE layers only) are refused by name."""
    change, needle = SMOLLM3_REFUSED[what]
    refused(gemma3_dir(tmp_path, change, "smollm3"), needle)


@pytest.mark.parametrize("key,value", [("embedding_multiplier", 0.0),
                                       ("residual_multiplier", -1.0),
                                       ("logits_scaling", "4"), ("attention_multiplier", 0.0)])
def test_granite_hf_refusals(tmp_path, key, value):
    refused(gemma3_dir(tmp_path, lambda c: c.update({key: value}), "granite"), key)


@pytest.mark.parametrize("what", ["no logit_scale", "zero logit_scale", "negative residual"])
def test_granite_gguf_refusals(tmp_path, what):
    """llama.cpp requires granite.logit_scale (the logits are divided by it)."""
    fx = fixture("granite")
    cfg = testing.RandomModelConfig(**fx["weights"]["shape"])
    kv = {"no logit_scale": [],
          "zero logit_scale": [("granite.logit_scale", GGUF_F32, 0.0)],
          "negative residual": [("granite.logit_scale", GGUF_F32, 4.0),
                                ("granite.residual_scale", GGUF_F32, -0.5)]}[what]
    p = tmp_path / "g.gguf"
    testing.write_gguf(p, cfg, testing.random_weights(cfg, fx["weights"]["seed"]), extra_kv=kv)
    refused(p, "logit_scale" if what != "negative residual" else "residual_scale")


def test_partial_rotary_only_in_phi3(tmp_path):
    """transformers applies partial rotary embeddings and LongRoPE the same way as llama.cpp in
    phi3 only; in a llama config they stay refused."""
    refused(hf(tmp_path, {"partial_rotary_factor": 0.5}), "partial_rotary_factor")


def phi3_gguf(tmp_path, **kw):
    fx = fixture("phi3")
    cfg = testing.RandomModelConfig(**fx["weights"]["shape"])
    p = tmp_path / "p.gguf"
    testing.write_gguf(p, cfg, testing.random_weights(cfg, fx["weights"]["seed"]), **kw)
    return p, fx


def test_phi3_gguf_written_here_agrees_within_the_window(tmp_path):
    """This writer's phi3 GGUF (fused attn_qkv and ffn_up, no window key) is the model without a
    window, so it agrees with transformers' windowed model over the window only."""
    p, fx = phi3_gguf(tmp_path)
    got = specdec.load(str(p), kv_dtype="f32").logits(fx["tokens"])
    w = fx["config"]["sliding_window"]
    assert tm.rel_err(got, fx["logits_without_window"]) <= 1e-3
    assert tm.rel_err(got[:w], np.asarray(fx["logits"])[:w]) <= 1e-3


@pytest.mark.parametrize("name", ["rope_factors_long.weight", "rope_factors_short.weight"])
def test_phi3_gguf_longrope_needs_both_tables(tmp_path, name):
    p, _ = phi3_gguf(tmp_path, extra_tensors=[(name, np.ones(4))])
    refused(p, name, "LongRoPE needs both")


def longrope_gguf(tmp_path, tables=None, rot=12, extra_kv=()):
    """phi3_longrope's weights in a GGUF written here: 12 rotary dimensions, the two factor
    tables (`tables` in their place), its original context 16 and attention factor."""
    fx = fixture("phi3_longrope")
    cfg = testing.RandomModelConfig(**fx["weights"]["shape"])
    rp = fx["config"]["rope_parameters"]
    if tables is None:
        tables = [("rope_factors_long.weight", rp["long_factor"]),
                  ("rope_factors_short.weight", rp["short_factor"])]
    kv = [("phi3.rope.dimension_count", GGUF_U32, rot),
          ("phi3.rope.scaling.original_context_length", GGUF_U32, 16),
          ("phi3.rope.scaling.attn_factor", GGUF_F32, (1 + math.log(4) / math.log(16)) ** 0.5)]
    drop = {k for k, _, _ in extra_kv}
    kv = [x for x in kv if x[0] not in drop] + list(extra_kv)
    p = tmp_path / "lr.gguf"
    testing.write_gguf(p, cfg, testing.random_weights(cfg, fx["weights"]["seed"]),
                       remove_kv={"phi3.rope.dimension_count"}, extra_kv=kv,
                       extra_tensors=tables)
    return p, fx


def test_longrope_gguf_written_here_matches_transformers(tmp_path):
    """The same model through this writer (no window key): the short factors within 16."""
    p, fx = longrope_gguf(tmp_path)
    got = specdec.load(str(p), kv_dtype="f32").logits(fx["tokens"][:16])
    assert tm.rel_err(got, fx["logits_short"]) <= 1e-3


@pytest.mark.parametrize("what,needle", [
    ("zero divisor", "LongRoPE's divisors must be positive"),
    ("short table", "rope_factors_short.weight"),
    ("odd rotary dimensions", "rotary dimensions must be even"),
    ("attn_factor 0", "attn_factor"),
    ("original beyond the context", "original_context_length"),
    ("in a llama model", "phi3 models only"),
])
def test_longrope_gguf_refusals(tmp_path, what, needle):
    rp = fixture("phi3_longrope")["config"]["rope_parameters"]
    if what == "in a llama model":
        p = gguf(tmp_path, [], extra_tensors=[("rope_factors_long.weight", np.ones(8)),
                                              ("rope_factors_short.weight", np.ones(8))])
        refused(p, needle)
        return
    tables, rot, kv = None, 12, []
    if what == "zero divisor":
        tables = [("rope_factors_long.weight", [0.0] + rp["long_factor"][1:]),
                  ("rope_factors_short.weight", rp["short_factor"])]
    elif what == "short table":
        tables = [("rope_factors_long.weight", rp["long_factor"]),
                  ("rope_factors_short.weight", rp["short_factor"][:5])]
    elif what == "odd rotary dimensions":
        rot = 7
    elif what == "attn_factor 0":
        kv = [("phi3.rope.scaling.attn_factor", GGUF_F32, 0.0)]
    else:
        kv = [("phi3.rope.scaling.original_context_length", GGUF_U32, 65)]
    p, _ = longrope_gguf(tmp_path, tables, rot, kv)
    refused(p, needle)


def test_llamacpp_float_order_refuses_scaled_rope_and_windows(tmp_path):
    """Model.llamacpp_logits reproduces llama.cpp's plain llama graph: a model with scaled RoPE
    or a window is refused rather than computed without them."""
    p = Path(__file__).parent / "fixtures" / "families" / "llama3_rope.gguf"
    with pytest.raises(ValueError, match="RoPE scaling"):
        specdec.load(str(p)).llamacpp_logits([1, 2, 3])
    w = gguf(tmp_path, [("llama.attention.sliding_window", GGUF_U32, 8)])
    with pytest.raises(ValueError, match="sliding windows"):
        specdec.load(str(w)).llamacpp_logits([1, 2, 3])


# ---- values of the wrong type or out of range -------------------------------------------------

@pytest.mark.parametrize("key,value,needle", [
    ("rope_theta", "500000", "must be a number, got a string"),
    ("rope_theta", [500000.0], "must be a number, got an array"),
    ("rms_norm_eps", "1e-2", "must be a number, got a string"),
    ("tie_word_embeddings", "yes", "must be true or false, got a string"),
    ("tie_word_embeddings", 1, "must be true or false, got an integer"),
    ("hidden_size", "32", "must be an integer, got a string"),
    ("num_key_value_heads", 2.5, "must be an integer, got a number"),
    ("layer_types", ["full_attention"], "is not an array of 2"),
    ("rope_parameters", {"rope_type": "default", "rope_theta": "x"}, "must be a number"),
])
def test_hf_values_of_the_wrong_type_refused(tmp_path, key, value, needle):
    """A config.json value of the wrong type is an error naming it, never read as absent: the
    default in its place would compute another model without a word (a rope_theta of "500000"
    became 10000)."""
    msg = refused(hf(tmp_path, {key: value}), needle)
    assert "rope_theta" in msg if key == "rope_parameters" else key in msg


@pytest.mark.parametrize("eps", [math.inf, 3e38, 1.0, 0.0, -1e-6, math.nan])
def test_gguf_rms_epsilon_out_of_range_refused(tmp_path, eps):
    """An epsilon that is not finite or not below 1 (every model uses 1e-6 to 1e-5) loaded and
    turned every token into id 0."""
    key = "llama.attention.layer_norm_rms_epsilon"
    refused(gguf(tmp_path, [(key, GGUF_F32, eps)], remove_kv={key}), "RMS norm epsilon")


def test_qkv_biases_outside_qwen2_refused(tmp_path):
    """llama's graph reads no q/k/v biases (qwen2's does): a bias tensor in a llama file, GGUF
    or config.json, is refused by name rather than applied while config.qkv_bias says False."""
    p = gguf(tmp_path, extra_tensors=[("blk.0.attn_q.bias", np.ones(32))])
    refused(p, "blk.0.attn_q.bias", "not used")
    extra = {"model.layers.0.self_attn.k_proj.bias": np.ones(16, np.float32)}
    refused(hf(tmp_path, extra=extra), "model.layers.0.self_attn.k_proj.bias", "not used")


@pytest.mark.parametrize("key,vtype,value,needle", [
    ("llama.rope.freq_base", GGUF_STRING, "500000", "must be a number, got type string"),
    ("llama.context_length", GGUF_BOOL, True, "must be an integer, got type bool"),
    ("llama.attention.head_count_kv", GGUF_F32, 2.0, "must be an integer, got type f32"),
])
def test_gguf_values_of_the_wrong_type_refused(tmp_path, key, vtype, value, needle):
    """A GGUF key stored with the wrong type is refused by name: read as absent, a string
    rope.freq_base became 10000 and a boolean context length 1."""
    refused(gguf(tmp_path, [(key, vtype, value)], remove_kv={key}), key, needle)


def test_gguf_key_stated_twice_refused(tmp_path):
    refused(gguf(tmp_path, [("general.architecture", GGUF_STRING, "qwen2")]),
            "'general.architecture' appears more than once")
    key = "general.architecture"
    refused(gguf(tmp_path, [(key, GGUF_STRING, "llama\0x")], remove_kv={key}), "NUL byte")


@pytest.mark.parametrize("n", [0, 47, 2**31])
def test_gguf_vocab_size_that_disagrees_with_the_embeddings_refused(tmp_path, n):
    key = "llama.vocab_size"  # the writer states the right one: a file that agrees loads
    specdec.load(str(gguf(tmp_path)))
    refused(gguf(tmp_path, [(key, GGUF_U32, n)], remove_kv={key}), key, "disagrees")
