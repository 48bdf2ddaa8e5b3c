"""Model families against Hugging Face transformers (issue 25): Llama's RoPE scaling (llama3 and
linear, from rope_parameters or rope_scaling), qwen3 (q/k norms, explicit head_dim), Mistral's
sliding window, Gemma 3 (local and global layers, sandwich norms, GeGLU), Gemma 2 (windows on
alternate layers, attention and final soft-caps), Phi-3 (fused matrices, a window), Phi-3.5 /
Phi-4-mini's partial rotary embeddings and LongRoPE, SmolLM3 (NoPE layers), YaRN (qwen2) and
Granite (multipliers), each a tiny random model whose logits
transformers recorded (tools/record_families.py, tests/fixtures/families/). The Hugging Face
directory is rebuilt here from the recorded config.json and the seed of its weights; the GGUF
file is the one llama.cpp's converter wrote. Agreement: max|d| / max|ref| <= 1e-3 with an f32 KV
cache, in prefill, in one-token decode and in a draft tree's verify forward; speculation keeps
greedy output equal."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import specdec
from specdec import testing
from tinymodels import rel_err

FIXTURES = Path(__file__).parent / "fixtures" / "families"
NAMES = ["llama3_rope", "llama_linear_rope", "qwen3", "mistral_window", "gemma3", "gemma2",
         "phi3", "phi3_longrope", "smollm3", "qwen2_yarn", "granite"]
TOL = 1e-3
# how each case is loaded for its recorded tokens: phi3_longrope's 40 pass its original context
# of 16, so it runs with its long factors (its short ones: the LongRoPE tests below)
LOAD = {"phi3_longrope": {"context_length": 64}}


def case(name: str) -> dict:
    return json.loads((FIXTURES / f"{name}.json").read_text())


def shape(c: dict) -> testing.RandomModelConfig:
    return testing.RandomModelConfig(**c["weights"]["shape"])


def write_dir(root: Path, name: str, config: dict | None = None, extra: dict | None = None) -> Path:
    """The case's HF directory: its recorded config.json (or `config`) and its weights (plus
    `extra` tensors)."""
    c = case(name)
    d = root / name
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(config if config is not None else c["config"]))
    w = testing.random_weights(shape(c), c["weights"]["seed"])
    w.update(extra or {})
    (d / "model.safetensors").write_bytes(testing.safetensors_bytes(w, "F32"))
    return d


@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("families")
    return {name: write_dir(root, name) for name in NAMES}


def load(path, **kw):
    return specdec.load(str(path), kv_dtype="f32", threads=2, **kw)


# ---- logits against transformers ----------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_hf_dir_matches_transformers(hf_dirs, name):
    c = case(name)
    got = load(hf_dirs[name], **LOAD.get(name, {})).logits(c["tokens"])
    assert rel_err(got, c["logits"]) <= TOL


SCALAR_CHILD = r"""
import json, sys
import specdec
out = {"simd": specdec._core.simd_name()}
for path, tokens in json.loads(sys.stdin.read()).items():
    out[path] = specdec.load(path, kv_dtype="f32", threads=2).logits(tokens).tolist()
print(json.dumps(out))
"""


def test_gemma_portable_kernels_match_transformers(hf_dirs):
    """SPECDEC_SIMD=scalar (in a child): Gemma's GeGLU through the portable twin of the vector
    kernel, its soft-caps and norms, within the same tolerance of transformers."""
    from helpers import child_json

    names = ["gemma3", "gemma2"]
    cases = {str(hf_dirs[n]): case(n)["tokens"] for n in names}
    out = child_json(SCALAR_CHILD, stdin=json.dumps(cases), SPECDEC_SIMD="scalar")
    assert out["simd"] == "scalar"
    for n in names:
        assert rel_err(np.asarray(out[str(hf_dirs[n])]), case(n)["logits"]) <= TOL, n


@pytest.mark.parametrize("name", NAMES)
def test_llamacpp_gguf_matches_transformers(name):
    """llama.cpp's converter writes llama3 scaling as rope_freqs.weight, linear as
    rope.scaling.*, qwen3's norms as attn_q_norm/attn_k_norm; it drops Mistral's window (the
    file is the model without one: llama.cpp computes it so), which agrees with the windowed
    model only while the sequence fits in the window. It writes Phi-3's window, which llama.cpp
    turns off and specdec applies, as transformers does; and Phi-3's fused q/k/v and gate/up."""
    c = case(name)
    got = load(FIXTURES / f"{name}.gguf", **LOAD.get(name, {})).logits(c["tokens"])
    if name == "mistral_window":
        w = c["config"]["sliding_window"]
        assert rel_err(got, c["logits_without_window"]) <= TOL
        assert rel_err(got[:w], np.asarray(c["logits"])[:w]) <= TOL
        assert rel_err(got, c["logits"]) > 0.05
    else:
        assert rel_err(got, c["logits"]) <= TOL
    if name == "phi3":  # what llama.cpp computes differs past the window
        assert rel_err(got, c["logits_without_window"]) > 0.05


@pytest.mark.parametrize("name", NAMES)
def test_one_token_decode_matches_transformers(hf_dirs, name):
    """Prefill of 3, then one token per forward: the window and the scaled RoPE hold in decode."""
    c = case(name)
    m = load(hf_dirs[name], **LOAD.get(name, {}))
    cache = m.new_cache(len(c["tokens"]))
    rows = [m.forward(cache, c["tokens"][:3])]
    rows += [m.forward(cache, [t]) for t in c["tokens"][3:]]
    assert rel_err(np.concatenate(rows), c["logits"]) <= TOL


@pytest.mark.parametrize("name", ["mistral_window", "llama3_rope", "qwen3", "gemma3", "gemma2",
                                  "phi3", "phi3_longrope", "smollm3", "qwen2_yarn", "granite"])
def test_tree_verify_matches_transformers(hf_dirs, name):
    """A draft tree after a prefix of P: the recorded tokens P.. form one branch, and a decoy
    sibling sits before each of its nodes in the cache. Each branch node sits at position
    P + depth - 1 and sees the prefix, its ancestors and itself (the window cutting in on top):
    its logits are transformers' for the sequence."""
    c = case(name)
    tokens, ref = c["tokens"], np.asarray(c["logits"])
    P = 10 if name != "phi3_longrope" else 20  # its 64 slots hold 20 + 2 * 20 nodes
    branch = tokens[P:]
    nodes, parents, depths = [], [], []
    for i, t in enumerate(branch):  # decoy, then the branch node; both children of node i - 1
        parent = 2 * i - 1 if i > 0 else -1
        for tok in ((t + 1 + i) % len(ref[0]), t):
            nodes.append(tok)
            parents.append(parent)
            depths.append(i + 1)
    n = len(nodes)
    mask = np.zeros((n, P + n), bool)
    mask[:, :P] = True
    for j in range(n):
        k = j
        while k >= 0:
            mask[j, P + k] = True
            k = parents[k]
    m = load(hf_dirs[name], **LOAD.get(name, {}))
    cache = m.new_cache(P + n)
    m.forward(cache, tokens[:P], n_logits=0)
    got = m.forward(cache, nodes, positions=[P + d - 1 for d in depths], mask=mask)
    assert rel_err(got[1::2], ref[P:]) <= TOL


# ---- the RoPE field that transformers >= 5 writes -----------------------------------------


def test_rope_parameters_ignored_would_fail(tmp_path):
    """The fixture tells the scaled model from the unscaled one: dropping rope_parameters'
    scaling (as specdec once did) moves the logits far beyond the tolerance."""
    c = case("llama3_rope")
    conf = dict(c["config"], rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    got = load(write_dir(tmp_path, "llama3_rope", conf)).logits(c["tokens"])
    assert rel_err(got, c["logits"]) > 0.05


@pytest.mark.parametrize("name", ["llama3_rope", "llama_linear_rope"])
def test_rope_scaling_of_transformers_4_is_the_same(tmp_path, name):
    """transformers < 5 wrote the same settings as "rope_scaling" with a top-level rope_theta."""
    c = case(name)
    conf = dict(c["config"])
    rp = dict(conf.pop("rope_parameters"))
    conf["rope_theta"] = rp.pop("rope_theta")
    conf["rope_scaling"] = dict(rp, type=rp.pop("rope_type"))
    got = load(write_dir(tmp_path, name, conf)).logits(c["tokens"])
    assert rel_err(got, c["logits"]) <= TOL
    # both given and agreeing is fine too
    conf["rope_parameters"] = case(name)["config"]["rope_parameters"]
    got = load(write_dir(tmp_path / "both", name, conf)).logits(c["tokens"])
    assert rel_err(got, c["logits"]) <= TOL


def test_rope_theta_inside_rope_parameters_is_read(tmp_path):
    """qwen3's theta (1e6) is only inside rope_parameters: reading 10000 instead fails."""
    c = case("qwen3")
    assert "rope_theta" not in c["config"]
    conf = dict(c["config"], rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    got = load(write_dir(tmp_path, "qwen3", conf)).logits(c["tokens"])
    assert rel_err(got, c["logits"]) > 0.01


def test_window_ignored_would_fail(tmp_path):
    c = case("mistral_window")
    conf = dict(c["config"], sliding_window=None)
    got = load(write_dir(tmp_path, "mistral_window", conf)).logits(c["tokens"])
    assert rel_err(got, c["logits"]) > 0.05


def test_gemma3_config_of_transformers_4_is_the_same(tmp_path):
    """transformers < 5 wrote Gemma 3's RoPE as rope_theta and rope_scaling (global layers) and
    rope_local_base_freq, the pattern as sliding_window_pattern without layer_types."""
    c = case("gemma3")
    conf = dict(c["config"])
    rp = conf.pop("rope_parameters")
    conf.pop("layer_types")
    conf.update(rope_theta=rp["full_attention"]["rope_theta"],
                rope_scaling={"rope_type": "linear", "factor": rp["full_attention"]["factor"]},
                rope_local_base_freq=rp["sliding_attention"]["rope_theta"],
                sliding_window_pattern=6)
    got = load(write_dir(tmp_path, "gemma3", conf)).logits(c["tokens"])
    assert rel_err(got, c["logits"]) <= TOL


@pytest.mark.parametrize("name,variant", [
    ("smollm3", "no_rope_every_2"), ("qwen2_yarn", "betas"), ("qwen2_yarn", "mscale"),
    ("gemma3", "query_pre_attn_scalar_32"), ("gemma3", "final_logit_softcapping_3"),
    ("gemma2", "query_pre_attn_scalar_32"), ("gemma2", "no_attn_softcap"),
    ("gemma2", "no_final_softcap")])
def test_gemma_variants_match_transformers(tmp_path, name, variant):
    """The attention scale from query_pre_attn_scalar and the soft-caps (gemma2: each set to
    null, none), each recorded with its own transformers logits."""
    c = case(name)
    v = c["variants"][variant]
    got = load(write_dir(tmp_path, name, dict(c["config"], **v["config"]))).logits(c["tokens"])
    assert rel_err(got, v["logits"]) <= TOL
    assert rel_err(got, c["logits"]) > 0.01  # the variant is another model


@pytest.mark.parametrize("change", ["no local base", "all global", "no norm shift"])
def test_gemma3_breaks_would_fail(tmp_path, change):
    """What would go unnoticed without the fixture: the local layers' RoPE base, the local
    window's layer pattern, and HF's (1 + w) norms each move the logits far off."""
    c = case("gemma3")
    conf = json.loads(json.dumps(c["config"]))
    extra = None
    if change == "no local base":
        conf["rope_parameters"]["sliding_attention"]["rope_theta"] = 1e6
    elif change == "all global":
        conf["sliding_window"] = 1000
    else:  # what a loader without the + 1 would compute: weights that are 1 less
        w = testing.random_weights(shape(c), c["weights"]["seed"])
        extra = {k: v - 1.0 for k, v in w.items() if k.endswith("norm.weight")}
    got = load(write_dir(tmp_path, "gemma3", conf, extra)).logits(c["tokens"])
    assert rel_err(got, c["logits"]) > 0.01


# ---- Model.config shows what the model computes --------------------------------------------


def test_config_shows_rope_scaling(hf_dirs):
    rp = case("llama3_rope")["config"]["rope_parameters"]
    got = load(hf_dirs["llama3_rope"]).config
    assert got.rope_scaling == {"type": "llama3", "factor": rp["factor"],
                                "low_freq_factor": rp["low_freq_factor"],
                                "high_freq_factor": rp["high_freq_factor"],
                                "original_context": rp["original_max_position_embeddings"]}
    # the converter's GGUF stores the same scaling as per-frequency divisors
    assert load(FIXTURES / "llama3_rope.gguf").config.rope_scaling == {"type": "factors"}
    for path in (hf_dirs["llama_linear_rope"], FIXTURES / "llama_linear_rope.gguf"):
        assert load(path).config.rope_scaling == {"type": "linear", "factor": 4.0}
    plain = load(hf_dirs["qwen3"]).config
    assert plain.rope_scaling is None and plain.qk_norm and plain.sliding_window is None
    assert plain.layer_types == ("full_attention",) * 2 and plain.rope_theta_local is None


@pytest.mark.parametrize("source", ["hf", "gguf"])
def test_config_shows_windows_and_layer_pattern(hf_dirs, source):
    c = case("gemma3")["config"]
    g = load(hf_dirs["gemma3"] if source == "hf" else FIXTURES / "gemma3.gguf").config
    assert g.sliding_window == c["sliding_window"] and g.qk_norm
    assert g.layer_types == tuple(c["layer_types"])  # transformers' own list
    assert g.rope_theta_local == c["rope_parameters"]["sliding_attention"]["rope_theta"]
    assert g.rope_scaling == {"type": "linear", "factor": 4.0}
    assert g.attn_scale == pytest.approx(c["query_pre_attn_scalar"] ** -0.5)
    assert g.final_softcap is None
    m = load(hf_dirs["mistral_window"]).config
    assert m.sliding_window == 6 and m.layer_types == ("sliding_attention",) * 2


def test_config_shows_attention_scale_and_soft_cap(tmp_path):
    c = case("gemma3")
    conf = dict(c["config"], query_pre_attn_scalar=32, final_logit_softcapping=3.0)
    g = load(write_dir(tmp_path, "gemma3", conf)).config
    assert g.attn_scale == pytest.approx(32 ** -0.5) and g.final_softcap == 3.0


@pytest.mark.parametrize("change", ["all global", "no norm shift", "default caps"])
def test_gemma2_breaks_would_fail(tmp_path, change):
    """The alternate layers' window, HF's (1 + w) norms, and the caps the file sets (left out,
    Gemma2Config's 50 and 30 apply) each move the logits far off."""
    c = case("gemma2")
    conf, extra = dict(c["config"]), None
    if change == "all global":
        conf["sliding_window"] = 1000
    elif change == "default caps":
        del conf["attn_logit_softcapping"], conf["final_logit_softcapping"]
        assert load(write_dir(tmp_path / "d", "gemma2", conf)).config.attn_softcap == 50.0
    else:
        w = testing.random_weights(shape(c), c["weights"]["seed"])
        extra = {k: v - 1.0 for k, v in w.items() if k.endswith("norm.weight")}
    got = load(write_dir(tmp_path, "gemma2", conf, extra)).logits(c["tokens"])
    assert rel_err(got, c["logits"]) > 0.01


@pytest.mark.parametrize("source", ["hf", "gguf"])
def test_gemma2_config(hf_dirs, source):
    c = case("gemma2")["config"]
    g = load(hf_dirs["gemma2"] if source == "hf" else FIXTURES / "gemma2.gguf").config
    assert g.arch == "gemma2" and not g.qk_norm and g.sliding_window == c["sliding_window"]
    assert g.layer_types == tuple(c["layer_types"])  # sliding, full, sliding, full
    assert g.rope_theta_local == g.rope_theta == c["rope_parameters"]["rope_theta"]
    assert (g.attn_softcap, g.final_softcap) == (c["attn_logit_softcapping"],
                                                 c["final_logit_softcapping"])
    assert g.attn_scale == pytest.approx(c["query_pre_attn_scalar"] ** -0.5)


@pytest.mark.parametrize("change", ["gate and up swapped", "k and v swapped"])
def test_phi3_split_order_would_fail(tmp_path, change):
    """The fused matrices are cut in their stored order (gate before up, q before k before v):
    cut the other way, the logits move far off."""
    c = case("phi3")
    w = testing.random_weights(shape(c), c["weights"]["seed"])
    QD = c["config"]["hidden_size"]  # 2 heads of 8, one KV head of 8
    extra = {}
    for i in range(c["config"]["num_hidden_layers"]):
        if change.startswith("gate"):
            k = f"model.layers.{i}.mlp.gate_up_proj.weight"
            g, u = np.split(w[k], 2)
            extra[k] = np.concatenate([u, g])
        else:
            k = f"model.layers.{i}.self_attn.qkv_proj.weight"
            q, kk, v = np.split(w[k], [QD, QD + QD // 2])
            extra[k] = np.concatenate([q, v, kk])
    got = load(write_dir(tmp_path, "phi3", extra=extra)).logits(c["tokens"])
    assert rel_err(got, c["logits"]) > 0.05


def test_mistral_sequence_longer_than_window_fits_the_context(hf_dirs):
    """The window is a mask, not a cap on the context (specdec once refused such sequences)."""
    m = load(hf_dirs["mistral_window"])
    assert m.config.context_length == case("mistral_window")["config"]["max_position_embeddings"]
    m.logits(list(range(40)) * 2)


# ---- Phi-3's LongRoPE and partial rotary embeddings (Phi-3.5-mini, Phi-4-mini) -------------


def longrope_conf(change=None) -> dict:
    conf = json.loads(json.dumps(case("phi3_longrope")["config"]))
    if change is not None:
        change(conf)
    return conf


@pytest.mark.parametrize("source", ["hf", "gguf"])
def test_longrope_short_factors_within_the_original_context(hf_dirs, source):
    """By default a LongRoPE model takes its short factors and its original context (16 here)
    is its limit: its logits are transformers' for a text of at most 16 tokens, and far from
    what the long factors give there. The converter's GGUF says the same with its two factor
    tensors, rope.scaling.original_context_length and rope.scaling.attn_factor."""
    c = case("phi3_longrope")
    m = load(hf_dirs["phi3_longrope"] if source == "hf" else FIXTURES / "phi3_longrope.gguf")
    assert m.config.context_length == 16 and m.config.rope_dim == 12
    assert m.config.rope_scaling == {"type": "longrope", "factors": "short", "original_context": 16,
                                     "attention_factor": pytest.approx((1 + np.log(4) /
                                                                        np.log(16)) ** 0.5)}
    got = m.logits(c["tokens"][:16])
    assert rel_err(got, c["logits_short"]) <= TOL
    assert rel_err(got, np.asarray(c["logits"])[:16]) > 0.05  # the long factors' model
    with pytest.raises(ValueError, match=r"context length 16.*LongRoPE.*up to 64.*context_length"):
        m.logits(c["tokens"][:17])
    with pytest.raises(ValueError, match=r"exceeds the context length 16.*LongRoPE"):
        specdec.generate(m, c["tokens"][:10], max_new_tokens=7)
    long = load(hf_dirs["phi3_longrope"] if source == "hf" else FIXTURES / "phi3_longrope.gguf",
                context_length=40)
    assert long.config.context_length == 40 and long.config.rope_scaling["factors"] == "long"


@pytest.mark.parametrize("change", ["full rotary", "no attention factor", "long as short"])
def test_longrope_breaks_would_fail(tmp_path, change):
    """What the fixture catches: rotating the whole head, leaving cos and sin unscaled (the
    attention factor given as 1), and the short factors swapped for the long ones each move
    the logits far off."""
    c = case("phi3_longrope")

    def edit(conf):
        rp = conf["rope_parameters"]
        if change == "full rotary":
            conf["partial_rotary_factor"] = rp["partial_rotary_factor"] = 1.0
            rp["short_factor"] = rp["short_factor"] + [1.0, 1.0]
            rp["long_factor"] = rp["long_factor"] + [1.0, 1.0]
        elif change == "no attention factor":
            rp["attention_factor"] = 1.0
        else:
            rp["short_factor"] = rp["long_factor"]
    got = load(write_dir(tmp_path, "phi3_longrope", longrope_conf(edit))).logits(c["tokens"][:16])
    assert rel_err(got, c["logits_short"]) > 0.05


@pytest.mark.parametrize("kind", ["transformers 4", "su"])
def test_longrope_config_of_transformers_4_is_the_same(tmp_path, kind):
    """Before transformers 5 a Phi-3.5/Phi-4-mini config.json had partial_rotary_factor,
    original_max_position_embeddings and rope_theta at the top level and "rope_scaling" with
    the two factor lists only; older Phi-3 checkpoints name the type "su"."""
    c = case("phi3_longrope")

    def edit(conf):
        rp = conf.pop("rope_parameters")
        conf["rope_theta"] = rp["rope_theta"]
        conf["rope_scaling"] = {"type": "longrope" if kind != "su" else "su",
                                "short_factor": rp["short_factor"],
                                "long_factor": rp["long_factor"]}
    d = write_dir(tmp_path, "phi3_longrope", longrope_conf(edit))
    assert rel_err(load(d).logits(c["tokens"][:16]), c["logits_short"]) <= TOL
    assert rel_err(load(d, context_length=64).logits(c["tokens"]), c["logits"]) <= TOL


def test_context_length_caps_any_model(hf_dirs):
    """load(context_length=N) lowers any model's limit (positions and max_new_tokens are
    checked against it) and refuses more than the file's or less than 1."""
    m = load(hf_dirs["llama3_rope"], context_length=20)
    assert m.config.context_length == 20 and m.config.rope_scaling["type"] == "llama3"
    ref = case("llama3_rope")
    assert rel_err(m.logits(ref["tokens"][:20]), np.asarray(ref["logits"])[:20]) <= TOL
    with pytest.raises(ValueError, match="context length 20"):
        m.logits(list(range(21)))
    for bad, err in ((129, ValueError), (0, ValueError), (-3, ValueError), (2.5, TypeError),
                     (True, TypeError)):
        with pytest.raises(err, match="context_length"):
            load(hf_dirs["llama3_rope"], context_length=bad)


# ---- YaRN ------------------------------------------------------------------------------------


@pytest.mark.parametrize("change", ["unscaled", "linear", "no attention factor", "other ramp"])
def test_yarn_breaks_would_fail(tmp_path, change):
    """What the fixture catches: YaRN left out or read as linear scaling, cos and sin left
    unscaled, and another correction range (betas 16 and 2: frequencies 0 to 3 in place of
    0 to 5)."""
    c = case("qwen2_yarn")
    rp = dict(c["config"]["rope_parameters"])
    if change == "unscaled":
        rp = {"rope_type": "default", "rope_theta": rp["rope_theta"]}
    elif change == "linear":
        rp = {"rope_type": "linear", "rope_theta": rp["rope_theta"], "factor": rp["factor"]}
    elif change == "no attention factor":
        rp["attention_factor"] = 1.0
    else:
        rp.update(beta_fast=16.0, beta_slow=2.0)
    got = load(write_dir(tmp_path, "qwen2_yarn", dict(c["config"], rope_parameters=rp)))
    assert rel_err(got.logits(c["tokens"]), c["logits"]) > 0.01


def test_yarn_config_of_transformers_4_and_the_top_level_context(tmp_path):
    """transformers < 5 wrote YaRN as "rope_scaling" with a top-level rope_theta; a top-level
    original_max_position_embeddings is the one transformers reads (one in the object must then
    agree); without either the original context is max_position_embeddings."""
    c = case("qwen2_yarn")
    conf = dict(c["config"])
    rp = dict(conf.pop("rope_parameters"))
    conf["rope_theta"] = rp.pop("rope_theta")
    conf["rope_scaling"] = dict(rp, type=rp.pop("rope_type"))
    assert rel_err(load(write_dir(tmp_path / "a", "qwen2_yarn", conf)).logits(c["tokens"]),
                   c["logits"]) <= TOL
    orig = conf["rope_scaling"].pop("original_max_position_embeddings")
    top = dict(conf, original_max_position_embeddings=orig)
    assert rel_err(load(write_dir(tmp_path / "b", "qwen2_yarn", top)).logits(c["tokens"]),
                   c["logits"]) <= TOL
    m = load(write_dir(tmp_path / "c", "qwen2_yarn", conf))  # neither: 256, the factor as stated
    assert m.config.rope_scaling["original_context"] == 256
    assert rel_err(m.logits(c["tokens"]), c["logits"]) > 0.01
    top["rope_scaling"] = dict(conf["rope_scaling"], original_max_position_embeddings=32)
    with pytest.raises(ValueError, match="disagrees with the top level"):
        load(write_dir(tmp_path / "d", "qwen2_yarn", top))


@pytest.mark.parametrize("source", ["hf", "gguf"])
def test_config_shows_yarn(hf_dirs, source):
    g = load(hf_dirs["qwen2_yarn"] if source == "hf" else FIXTURES / "qwen2_yarn.gguf").config
    assert g.rope_scaling == {"type": "yarn", "factor": 4.0, "original_context": 64,
                              "beta_fast": 32.0, "beta_slow": 1.0,
                              "attention_factor": pytest.approx(0.1 * np.log(4.0) + 1.0)}


# ---- Granite's multipliers -----------------------------------------------------------------


@pytest.mark.parametrize("key", ["embedding_multiplier", "residual_multiplier",
                                 "attention_multiplier", "logits_scaling"])
def test_granite_multipliers_would_fail(tmp_path, key):
    """Each multiplier left at GraniteConfig's 1 moves the logits far off the fixture's."""
    c = case("granite")
    got = load(write_dir(tmp_path, "granite", dict(c["config"], **{key: 1.0})))
    assert rel_err(got.logits(c["tokens"]), c["logits"]) > 0.01


@pytest.mark.parametrize("source", ["hf", "gguf"])
def test_granite_config(hf_dirs, source):
    """The converter writes the multipliers as granite.embedding_scale, residual_scale,
    attention.scale and logit_scale; the q/k rows permuted as llama's."""
    g = load(hf_dirs["granite"] if source == "hf" else FIXTURES / "granite.gguf").config
    assert (g.embed_scale, g.residual_scale, g.logit_scale) == (6.0, 0.25, 4.0)
    assert g.attn_scale == pytest.approx(0.2) and g.rope_neox == (source == "hf")


# ---- SmolLM3's layers without RoPE ---------------------------------------------------------


@pytest.mark.parametrize("change", ["every layer rotated", "interval 4 dropped"])
def test_smollm3_nope_layers_would_fail(tmp_path, change):
    """The fixture tells the NoPE layers apart: rotating every layer (a list of ones), or reading
    the list's period wrong, moves the logits far off; the interval alone (no list) is the same
    model as the list it implies."""
    c = case("smollm3")
    conf = dict(c["config"])
    if change == "every layer rotated":
        conf["no_rope_layers"] = [1, 1, 1, 1]
        got = load(write_dir(tmp_path, "smollm3", conf)).logits(c["tokens"])
        assert rel_err(got, c["logits"]) > 0.05
        assert load(write_dir(tmp_path / "c", "smollm3", conf)).config.no_rope_interval is None
    else:
        del conf["no_rope_layers"]  # SmolLM3Config builds it from no_rope_layer_interval (4)
        got = load(write_dir(tmp_path, "smollm3", conf)).logits(c["tokens"])
        assert rel_err(got, c["logits"]) <= TOL
        conf["no_rope_layer_interval"] = 2
        got = load(write_dir(tmp_path / "2", "smollm3", conf)).logits(c["tokens"])
        v = c["variants"]["no_rope_every_2"]
        assert rel_err(got, v["logits"]) <= TOL


@pytest.mark.parametrize("source", ["hf", "gguf"])
def test_smollm3_config(hf_dirs, source):
    """llama.cpp's GGUF has no key for the NoPE layers: its smollm3 graph leaves every 4th out,
    as specdec does for that file; its q/k rows are permuted as llama's are."""
    g = load(hf_dirs["smollm3"] if source == "hf" else FIXTURES / "smollm3.gguf").config
    assert g.arch == "smollm3" and g.no_rope_interval == 4 and g.tied_embeddings
    assert g.rope_neox == (source == "hf")


@pytest.mark.parametrize("name", ["phi3_longrope", "qwen2_yarn", "smollm3", "granite"])
def test_cuda_refuses_what_its_forward_lacks(name):
    """The CUDA forward rotates whole heads, unscaled, on every layer: a model with partial
    rotary embeddings, YaRN's or LongRoPE's scaled cos and sin, or NoPE layers is refused there
    by name (checked before any GPU is looked for, so in every CUDA build)."""
    from specdec import _core

    with pytest.raises(ValueError) as e:
        specdec.load(str(FIXTURES / f"{name}.gguf"), device="cuda")
    if _core.built_with_cuda():
        assert "the CUDA backend cannot compute this" in str(e.value)
        assert "use the CPU" in str(e.value)
    else:
        assert "no CUDA backend" in str(e.value)


# ---- speculation --------------------------------------------------------------------------


def prompt(vocab: int, seed: int) -> list[int]:
    phrase = [int(x) for x in np.random.default_rng(seed).integers(0, vocab, 5)]
    return phrase * 4


@pytest.mark.parametrize("name", NAMES)
def test_speculators_keep_greedy_output(hf_dirs, name):
    m = load(hf_dirs[name], **LOAD.get(name, {}))
    other = NAMES[(NAMES.index(name) + 1) % len(NAMES)]
    draft = load(hf_dirs[other], **LOAD.get(other, {}))  # same vocabulary
    specs = [specdec.PromptLookup(k=4), specdec.DraftModel(draft, k=3, verify_slope=0),
             specdec.LayerSkip(layers=1, k=3, verify_slope=0)]
    for seed in range(2):
        p = prompt(m.config.vocab_size, seed)
        plain = specdec.generate(m, p, max_new_tokens=40, stop_tokens=[])
        for s in specs:
            g = specdec.generate(m, p, max_new_tokens=40, stop_tokens=[], speculator=s)
            assert g.tokens == plain.tokens, (name, type(s).__name__)
