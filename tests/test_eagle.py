"""EAGLE heads (specdec.Eagle): checkpoints written here with the published key names (EAGLE-1/2
as SafeAILab/EAGLE saves it, with and without fc's bias; EAGLE-3 as SafeAILab saves it and as
vLLM's speculators saves it, with a reduced draft vocabulary), in model.safetensors and in
pytorch_model.bin; their teacher-forced logits against an independent float64 NumPy statement
of each head; greedy output equal to plain decoding; sampled output distributed as the
target's (chi-square); and the errors of heads that do not fit."""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

import quantref
import reference
import specdec
import tinymodels as tm
from helpers import SETTINGS, exact_joint, in_threads, without_and_with_the_pool
from specdec import _core, testing
from stats import chi2_critical, chi2_stat
from test_model_tree import joint_counts
from test_torch_bin import STORAGE, checkpoint, evil_call, write_torch_layout_zip

# a target of 6 layers (EAGLE-3's default taps: layers 2, 3 and 3) with awkward sizes
TARGET = tm.TinyConfig(arch="llama", vocab=97, dim=48, n_layers=6, n_heads=4, n_kv_heads=2,
                       ffn=80, context_length=128)
HEAD_FFN = 56
DRAFT_VOCAB = 40


# ---- writing heads --------------------------------------------------------------------------

def _load_pack_head():
    """tools/pack_head.py (its safetensors writer, and the packer under test)."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(
        "pack_head", Path(__file__).resolve().parent.parent / "tools" / "pack_head.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


pack_head = _load_pack_head()
write_safetensors = pack_head.write_safetensors  # mixed dtypes, in insertion order


def write_bin(path, tensors: dict) -> None:
    """pytorch_model.bin as torch.save writes a state dict: one storage per tensor."""
    dts = {np.dtype(np.float32): "F32", np.dtype(np.float16): "F16",
           np.dtype(np.int64): "I64", np.dtype(np.bool_): "BOOL"}
    entries, storages = [], {}
    for i, (name, a) in enumerate(tensors.items()):
        a = np.ascontiguousarray(a)
        entries.append((name, dts[a.dtype], str(i), a.size, 0, list(a.shape), None))
        storages[str(i)] = a.astype(STORAGE[dts[a.dtype]][1])
    write_torch_layout_zip(path, checkpoint(entries, storages))


def head_config(kind: str, **extra) -> dict:
    layer = {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
             "hidden_size": TARGET.dim, "intermediate_size": HEAD_FFN,
             "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 1,
             "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "max_position_embeddings": 128,
             "vocab_size": TARGET.vocab, "hidden_act": "silu", "torch_dtype": "float32"}
    if kind == "speculators":
        return {"speculators_model_type": "eagle3", "architectures": ["Eagle3Speculator"],
                "draft_vocab_size": DRAFT_VOCAB, "norm_before_residual": True,
                "target_hidden_size": None, "transformer_layer_config": layer, **extra}
    if kind == "eagle3":
        layer["architectures"] = ["LlamaForCausalLMEagle3"]
        layer["draft_vocab_size"] = DRAFT_VOCAB
    layer.update(extra)
    return layer


def head_weights(kind: str, bias: bool, seed: int) -> dict:
    """Random weights with the published names (float32; the maps int64 and bool)."""
    rng = np.random.default_rng(seed)
    D, F, QD, KVD = TARGET.dim, HEAD_FFN, 48, 24
    e3 = kind in ("eagle3", "speculators")
    layer = "midlayer." if kind == "eagle3" else "layers.0."
    inp = 2 * D if e3 else D

    def mat(r, c, s=1.0):
        return (rng.standard_normal((r, c)) * s / np.sqrt(c)).astype(np.float32)

    def norm():
        return (1.0 + 0.2 * rng.standard_normal(D)).astype(np.float32)

    w = {"fc.weight": mat(D, 3 * D if e3 else 2 * D, 2.0)}
    if bias:
        w["fc.bias"] = (0.1 * rng.standard_normal(D)).astype(np.float32)
    w.update({layer + "self_attn.q_proj.weight": mat(QD, inp, 2.0),
              layer + "self_attn.k_proj.weight": mat(KVD, inp, 2.0),
              layer + "self_attn.v_proj.weight": mat(KVD, inp),
              layer + "self_attn.o_proj.weight": mat(D, QD),
              layer + "mlp.gate_proj.weight": mat(F, D),
              layer + "mlp.up_proj.weight": mat(F, D),
              layer + "mlp.down_proj.weight": mat(D, F),
              layer + "post_attention_layernorm.weight": norm()})
    if e3:
        ids = np.sort(rng.choice(TARGET.vocab, DRAFT_VOCAB, replace=False))
        t2d = np.zeros(TARGET.vocab, np.bool_)
        t2d[ids] = True
        w.update({layer + "input_layernorm.weight": norm(),
                  layer + "hidden_norm.weight": norm(), "norm.weight": norm(),
                  "lm_head.weight": mat(DRAFT_VOCAB, D, 4.0),
                  "d2t": (ids - np.arange(DRAFT_VOCAB)).astype(np.int64), "t2d": t2d})
    return w


def write_head(d, kind: str, fmt: str, bias: bool = True, seed: int = 3, config_bias=None,
               **extra):
    """A head directory: kind 'eagle' (EAGLE-1/2), 'eagle3' (SafeAILab's EAGLE-3) or
    'speculators' (vLLM's EAGLE-3); fmt 'safetensors' or 'bin'. config_bias: the config's
    "bias" key (None: absent)."""
    d.mkdir(parents=True, exist_ok=True)
    w = head_weights(kind, bias, seed)
    cfg = head_config(kind, **extra)
    if config_bias is not None:
        cfg["bias"] = config_bias
    (d / "config.json").write_text(json.dumps(cfg))
    if fmt == "safetensors":
        write_safetensors(d / "model.safetensors", w)
    else:
        write_bin(d / "pytorch_model.bin", w)
    return d, w, cfg


# ---- the float64 statement of the heads -----------------------------------------------------

def ref_head_logits(kind: str, hw: dict, target_w: dict, tokens, nbr: bool = False,
                    window: int = 0):
    """(len(tokens) - 1, V) float64: row t from the target's features at t and token t + 1,
    -inf outside a draft vocabulary; window > 0: the head attends to its last `window` rows."""
    feats: dict = {}
    reference.forward(target_w, TARGET, tokens, features=feats)
    w = {k: np.asarray(v, np.float64) for k, v in hw.items() if k not in ("d2t", "t2d")}
    E = np.asarray(target_w["model.embed_tokens.weight"], np.float64)
    toks = np.asarray(tokens[1:])
    T, eps = len(toks), 1e-5
    e3 = kind in ("eagle3", "speculators")
    p = "midlayer." if kind == "eagle3" else "layers.0."
    hcfg = SimpleNamespace(n_heads=4, n_kv_heads=2, head_dim=12, rope_theta=10000.0)
    if e3:
        L = TARGET.n_layers
        taps = [feats["layer_in"][i][:-1] for i in (2, L // 2, L - 3)]
        x = np.concatenate(taps, axis=1) @ w["fc.weight"].T
        x = x + w.get("fc.bias", 0.0)
        xn = reference.rmsnorm(x, w[p + "hidden_norm.weight"], eps)
        h = np.concatenate([reference.rmsnorm(E[toks], w[p + "input_layernorm.weight"], eps), xn],
                           axis=1)
        x = xn if nbr else x
    else:
        x = np.concatenate([E[toks], feats["hidden"][:-1]], axis=1) @ w["fc.weight"].T
        x = x + w.get("fc.bias", 0.0)
        h = x  # no input norm
    x = x + reference.attention(h, w, p, hcfg, np.arange(T), window=window)
    h = reference.rmsnorm(x, w[p + "post_attention_layernorm.weight"], eps)
    x = x + (reference.silu(h @ w[p + "mlp.gate_proj.weight"].T) * (h @ w[p + "mlp.up_proj.weight"].T)) \
        @ w[p + "mlp.down_proj.weight"].T
    if not e3:  # straight into the target's output head
        head = target_w["model.embed_tokens.weight" if TARGET.tied else "lm_head.weight"]
        return x @ np.asarray(head, np.float64).T
    draft = reference.rmsnorm(x, w["norm.weight"], eps) @ w["lm_head.weight"].T
    out = np.full((T, TARGET.vocab), -np.inf)
    ids = np.arange(DRAFT_VOCAB) + hw["d2t"]
    out[:, ids] = draft
    return out


def make_target(d):
    """The 6-layer target, written under d and loaded with an f32 cache: (model, TinyModel)."""
    tiny = tm.write_model(d, "eagle_target", "gguf-f32-v3", cfg=TARGET, seed=21)
    return specdec.load(str(tiny.path), kv_dtype="f32"), tiny


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return make_target(tmp_path_factory.mktemp("eagle_target"))


KINDS = [("eagle", True), ("eagle", False), ("eagle3", False), ("speculators", False)]


@pytest.mark.parametrize("fmt", ["safetensors", "bin"])
@pytest.mark.parametrize("kind,bias", KINDS)
def test_draft_logits_match_the_reference(tmp_path, target, kind, bias, fmt):
    m, tiny = target
    d, hw, _ = write_head(tmp_path / "h", kind, fmt, bias=bias,
                          config_bias=None if bias else False)
    spec = specdec.Eagle(d, weights="float")
    assert spec.kind == ("eagle" if kind == "eagle" else "eagle3")
    toks = tm.random_tokens(TARGET.vocab, 14, seed=2)
    got = spec.draft_logits(m, toks)
    want = ref_head_logits(kind, hw, tiny.ref_weights, toks, nbr=kind == "speculators")
    assert got.shape == want.shape == (13, TARGET.vocab)
    finite = np.isfinite(want)
    np.testing.assert_array_equal(np.isfinite(got), finite)
    err = np.abs(got[finite] - want[finite]).max()
    assert err <= 1e-3 * max(1.0, np.abs(want[finite]).max()), err
    # a head's row does not depend on the rows after it
    np.testing.assert_array_equal(spec.draft_logits(m, toks[:8]), got[:7])


@pytest.mark.parametrize("kind", ["eagle", "eagle3"])
def test_q8_0_weights_stay_near_the_float_ones(tmp_path, target, kind):
    """The default Q8_0 copies move the logits by about the 8-bit rounding of the weights (a
    few parts in a thousand of the largest), no more; their rows keep the draft vocabulary."""
    m, _ = target
    d, _, _ = write_head(tmp_path / "h", kind, "safetensors")
    toks = tm.random_tokens(TARGET.vocab, 12, seed=7)
    exact = specdec.Eagle(d, weights="float").draft_logits(m, toks)
    q8 = specdec.Eagle(d).draft_logits(m, toks)
    fin = np.isfinite(exact)
    np.testing.assert_array_equal(np.isfinite(q8), fin)
    err = np.abs(q8[fin] - exact[fin]).max() / np.abs(exact[fin]).max()
    assert 0 < err < 6e-2, err
    with pytest.raises(ValueError, match="weights must be 'q8_0' or 'float'"):
        specdec.Eagle(d, weights="q4")


@pytest.mark.parametrize("kind", ["eagle", "eagle3"])
def test_a_packed_head_computes_as_the_quantized_one(tmp_path, target, kind):
    """tools/pack_head.py's compact form (matrices as U8 rows of Q8_0 blocks, 34 bytes per 32
    weights) gives the bits the file's F16/F32 values give once specdec quantizes them at load,
    whatever the weights= setting."""
    m, _ = target
    d, _, _ = write_head(tmp_path / "h", kind, "safetensors")
    pack_head.pack(d, tmp_path / "packed")
    toks = tm.random_tokens(TARGET.vocab, 12, seed=8)
    want = specdec.Eagle(d).draft_logits(m, toks)
    np.testing.assert_array_equal(specdec.Eagle(tmp_path / "packed").draft_logits(m, toks), want)
    np.testing.assert_array_equal(
        specdec.Eagle(tmp_path / "packed", weights="float").draft_logits(m, toks), want)
    # this head is F32 and only its matrices of whole blocks (fc, EAGLE-3's lm_head) pack
    assert (tmp_path / "packed" / "model.safetensors").stat().st_size < \
        (d / "model.safetensors").stat().st_size


@pytest.mark.parametrize("blocks,type_id,nbytes", [("q4_1", 3, 20), ("q4_0", 2, 18)])
def test_a_head_packed_in_4_bits_computes_with_its_blocks(tmp_path, target, blocks, type_id,
                                                          nbytes):
    """tools/pack_head.py --blocks q4_1/q4_0 (U8 (rows, cols / 32, 20 or 18), the form the
    shipped head takes): the blocks read back as ggml's layout defines them, within half a step
    of the weights, and the head computes with them: its logits follow a float64 statement of
    the head over the dequantized weights (to the 8-bit rounding of the activations the integer
    kernels read), not the unrounded ones."""
    m, tiny = target
    d, hw, _ = write_head(tmp_path / "h", "eagle3", "safetensors")
    pack_head.pack(d, tmp_path / "p", blocks=blocks)
    packed = pack_head.read_safetensors(tmp_path / "p" / "model.safetensors")
    deq = dict(hw)
    for name, w in hw.items():
        if w.ndim == 2 and w.shape[1] % 32 == 0:
            b = packed[name]
            assert b.dtype == np.uint8 and b.shape == (w.shape[0], w.shape[1] // 32, nbytes)
            mine = quantref.dequantize(type_id, b.reshape(-1, nbytes)).reshape(w.shape)
            core = specdec._core.dequantize(type_id, b.tobytes(), w.size).reshape(w.shape)
            np.testing.assert_array_equal(core, mine)
            # half a step of a block's range / 15 (Q4_1); Q4_0's steps are |x*| / 8 and its
            # end opposite x* clips by up to a whole step (ggml's rule)
            bound = np.abs(w).max() / (15 if blocks == "q4_1" else 8)
            assert np.abs(mine - w).max() <= bound + 1e-6
            deq[name] = mine.astype(np.float64)
    toks = tm.random_tokens(TARGET.vocab, 12, seed=9)
    got = specdec.Eagle(tmp_path / "p", weights="float").draft_logits(m, toks)
    np.testing.assert_array_equal(specdec.Eagle(tmp_path / "p").draft_logits(m, toks), got)
    fin = np.isfinite(got)
    scale = np.abs(got[fin]).max()
    near = np.abs(got[fin] - ref_head_logits("eagle3", deq, tiny.ref_weights, toks)[fin]).max()
    far = np.abs(got[fin] - ref_head_logits("eagle3", hw, tiny.ref_weights, toks)[fin]).max()
    assert near < 2e-2 * scale, (near, scale)
    assert far > 3 * near, (far, near)


@pytest.mark.parametrize("t2d", [True, False])
def test_a_packed_head_keeps_the_most_frequent_draft_tokens(tmp_path, target, t2d):
    """pack_head --draft-vocab N --counts: the N draft tokens most frequent in the counts stay,
    with their logits unchanged; the others become -inf; d2t (and t2d) shrink with them."""
    m, _ = target
    d, hw, _ = write_head(tmp_path / "h", "eagle3", "safetensors")
    if not t2d:
        w = pack_head.read_safetensors(d / "model.safetensors")
        pack_head.write_safetensors(d / "model.safetensors",
                                    {k: v for k, v in w.items() if k != "t2d"})
    ids = np.arange(DRAFT_VOCAB) + hw["d2t"]
    counts = np.random.default_rng(4).integers(0, 1000, TARGET.vocab)
    keep = np.sort(ids[np.argsort(-counts[ids], kind="stable")[:16]])
    pack_head.pack(d, tmp_path / "p", draft_vocab=16, counts=counts)
    cfg = json.loads((tmp_path / "p" / "config.json").read_text())
    assert cfg["draft_vocab_size"] == 16
    packed = pack_head.read_safetensors(tmp_path / "p" / "model.safetensors")
    np.testing.assert_array_equal(np.arange(16) + packed["d2t"], keep)
    if t2d:
        np.testing.assert_array_equal(np.flatnonzero(packed["t2d"]), keep)
    toks = tm.random_tokens(TARGET.vocab, 10, seed=5)
    full = specdec.Eagle(d).draft_logits(m, toks)
    small = specdec.Eagle(tmp_path / "p").draft_logits(m, toks)
    np.testing.assert_array_equal(np.flatnonzero(np.isfinite(small[0])), keep)
    np.testing.assert_array_equal(small[:, keep], full[:, keep])
    with pytest.raises(ValueError, match="drafts over 40 tokens"):
        pack_head.pack(d, tmp_path / "q", draft_vocab=41, counts=counts)


def test_a_wrong_rule_fails_the_reference(tmp_path, target):
    """The comparison can fail: EAGLE-1/2 read through an extra final norm (a published bug),
    or EAGLE-3's taps in another order, move the logits far beyond the tolerance."""
    m, tiny = target
    toks = tm.random_tokens(TARGET.vocab, 10, seed=3)
    d, hw, _ = write_head(tmp_path / "e", "eagle", "safetensors")
    got = specdec.Eagle(d, weights="float").draft_logits(m, toks)
    want = ref_head_logits("eagle", hw, tiny.ref_weights, toks)
    normed = want / np.sqrt(np.mean(want ** 2, axis=1, keepdims=True))
    assert np.abs(got - normed).max() > 1e-2
    d3, hw3, _ = write_head(tmp_path / "e3", "eagle3", "safetensors")
    swapped = dict(hw3)
    D = TARGET.dim
    fc = hw3["fc.weight"]
    swapped["fc.weight"] = np.concatenate([fc[:, D:2 * D], fc[:, :D], fc[:, 2 * D:]], axis=1)
    got3 = specdec.Eagle(d3, weights="float").draft_logits(m, toks)
    bad = ref_head_logits("eagle3", swapped, tiny.ref_weights, toks)
    fin = np.isfinite(bad)
    assert np.abs(got3[fin] - bad[fin]).max() > 1e-2


@pytest.mark.parametrize("fmt", ["safetensors", "bin"])
@pytest.mark.parametrize("weights", ["float", "q8_0"])
def test_a_head_holding_a_nan_or_infinite_weight_is_refused_naming_it(tmp_path, fmt, weights):
    """As the target's loader does: a NaN or an infinity in a head's tensor is a corrupt file,
    named with the tensor and where (the forward would make drafts of NaN logits)."""
    for i, (name, at, v, where) in enumerate([
            ("fc.weight", (3, 5), np.nan, "value at row 3, column 5"),
            ("midlayer.mlp.down_proj.weight", (0, 11), -np.inf, "value at row 0, column 11"),
            ("norm.weight", (7,), np.inf, "value at element 7")]):
        d = tmp_path / f"h{i}"
        d.mkdir()
        w = head_weights("eagle3", False, 3)
        w[name][at] = v
        (d / "config.json").write_text(json.dumps(head_config("eagle3")))
        if fmt == "safetensors":
            write_safetensors(d / "model.safetensors", w)
        else:
            write_bin(d / "pytorch_model.bin", w)
        with pytest.raises(ValueError, match=f"'{name}' holds a NaN or infinite {where}: the "
                           "file is corrupt"):
            specdec.Eagle(d, weights=weights)


@pytest.mark.parametrize("blocks,nbytes", [("q8_0", 34), ("q4_1", 20), ("q4_0", 18)])
def test_a_packed_head_with_a_nan_scale_is_refused_naming_it(tmp_path, blocks, nbytes):
    d, _, _ = write_head(tmp_path / "h", "eagle3", "safetensors")
    pack_head.pack(d, tmp_path / "p", blocks=blocks)
    packed = pack_head.read_safetensors(tmp_path / "p" / "model.safetensors")
    assert specdec.Eagle(tmp_path / "p").kind == "eagle3"  # as packed: finite
    name = "midlayer.self_attn.q_proj.weight"  # (48, 96): three blocks a row
    packed[name] = packed[name].copy()  # read back as a read-only view of the file
    q = packed[name].reshape(48, 3, nbytes)
    assert np.shares_memory(q, packed[name])
    q[5, 2, 0:2] = np.frombuffer(np.uint16(0x7E00).tobytes(), np.uint8)  # d: a NaN half
    write_safetensors(tmp_path / "p" / "model.safetensors", packed)
    with pytest.raises(ValueError, match=f"'{name}' holds a NaN or infinite block scale at "
                       "row 5, column 64"):
        specdec.Eagle(tmp_path / "p")


@pytest.mark.parametrize("kind", ["eagle", "eagle3"])
def test_draft_logits_with_a_window_match_the_reference(tmp_path, target, kind):
    """Eagle(window=w): the head attends to its last w rows, in draft_logits as when drafting."""
    m, tiny = target
    d, hw, _ = write_head(tmp_path / "h", kind, "safetensors")
    toks = tm.random_tokens(TARGET.vocab, 14, seed=2)
    got = specdec.Eagle(d, weights="float", window=5).draft_logits(m, toks)
    want = ref_head_logits(kind, hw, tiny.ref_weights, toks, window=5)
    finite = np.isfinite(want)
    err = np.abs(got[finite] - want[finite]).max()
    assert err <= 1e-3 * max(1.0, np.abs(want[finite]).max()), err
    whole = specdec.Eagle(d, weights="float").draft_logits(m, toks)
    np.testing.assert_array_equal(got[:5], whole[:5])  # within the window: the same rows
    assert np.abs(got[5:][finite[5:]] - whole[5:][finite[5:]]).max() > 100 * err


def accepted_by_the_rule(logits: np.ndarray, text: list, n_prompt: int) -> int:
    """The drafts a greedy chain of depth 1 gets accepted over `text`: at a step with n tokens
    the head's root row (n - 2) drafts its argmax; accepted, the step adds two tokens."""
    n, accepted = n_prompt, 0
    while n < len(text):
        if n + 1 < len(text) and int(np.argmax(logits[n - 2])) == text[n]:
            accepted += 1
            n += 2
        else:
            n += 1
    return accepted


@pytest.mark.parametrize("kind", ["eagle", "eagle3"])
def test_a_window_spares_the_head_the_prompt_rows_it_never_sees(tmp_path, target, kind):
    """With a window of w the first step feeds the head only the prompt's last w rows (the
    others are never attended, and with one layer no row's keys depend on them), and its first
    draft is the windowed head's own: of prompts where the windowed head's teacher-forced
    argmax is the target's next token, the first draft is accepted; where only the unwindowed
    head's is, it is not. Whole generations are plain greedy decoding, with the accepted drafts
    those the windowed logits predict over the text."""
    m, _ = target
    d, _, _ = write_head(tmp_path / "h", kind, "safetensors")
    spec = specdec.Eagle(d, depth=1, size_by_cost=False, window=4)
    whole = specdec.Eagle(d, depth=1, size_by_cost=False, window=0)
    hits = misses = 0
    for seed in range(600):
        prompt = tm.random_tokens(TARGET.vocab, 21, seed=seed)  # 21 rows > the window
        # the first token comes from the prefill; the first draft is for the second
        text = prompt + specdec.generate(m, prompt, max_new_tokens=2, stop_tokens=[]).tokens
        w = int(np.argmax(spec.draft_logits(m, text)[-2])) == text[-1]
        h = int(np.argmax(whole.draft_logits(m, text)[-2])) == text[-1]
        if w or h:
            got = specdec.generate(m, prompt, max_new_tokens=3, stop_tokens=[], speculator=spec)
            assert got.stats.accepted == int(w), seed
            hits, misses = hits + w, misses + (not w)
    assert hits >= 3 and misses >= 3, (hits, misses)
    for window in (4, 0):
        spec = specdec.Eagle(d, depth=1, size_by_cost=False, window=window)
        for seed in (1, 2, 3):
            prompt = tm.random_tokens(TARGET.vocab, 7, seed=seed) * 3
            plain = specdec.generate(m, prompt, max_new_tokens=40, stop_tokens=[])
            got = specdec.generate(m, prompt, max_new_tokens=40, stop_tokens=[], speculator=spec)
            assert got.tokens == plain.tokens
            text = prompt + got.tokens
            want = accepted_by_the_rule(spec.draft_logits(m, text), text, len(prompt))
            assert got.stats.accepted == want, (window, seed)


@pytest.mark.parametrize("kind", ["eagle", "eagle3"])
@pytest.mark.parametrize("depth,branching,nodes", [(1, 1, 1), (4, 1, 4), (3, 2, 5), (5, 4, 16)])
def test_greedy_equals_plain(tmp_path, target, kind, depth, branching, nodes):
    m, _ = target
    d, _, _ = write_head(tmp_path / "h", kind, "safetensors")
    spec = specdec.Eagle(d, depth=depth, branching=branching, nodes=nodes)
    for seed in (1, 2):
        assert_greedy_is_plain(m, spec, tm.random_tokens(TARGET.vocab, 9, seed=seed))


def assert_greedy_is_plain(m, spec, prompt, n: int = 40) -> None:
    """spec's greedy output on m is plain decoding's, it drafted, and the target's cache
    matches a fresh forward after every step."""
    plain = specdec.generate(m, prompt, max_new_tokens=n, stop_tokens=[])
    got = specdec.generate(m, prompt, max_new_tokens=n, stop_tokens=[], speculator=spec)
    assert got.tokens == plain.tokens
    assert got.stats.drafted > 0
    toks, _, _ = m._core.generate(prompt, max_new_tokens=n, temperature=0.0, seed=1, stop_ids=[],
                                  top_k=0, top_p=1.0, drafter=spec.drafter(), check_cache=True)
    assert list(toks) == plain.tokens


def test_trees_are_sized_by_the_verify_cost(tmp_path, target):
    """size_by_cost: where a verify of many tokens costs about one (flat costs), the whole tree
    of `nodes` is verified; where each token costs a forward of its own, only the most
    probable few (a node of path probability p pays only if (1 + sum p) / T grows); the output
    is the plain one either way."""
    m, _ = target
    d, _, _ = write_head(tmp_path / "h", "eagle", "safetensors")
    prompt = tm.random_tokens(TARGET.vocab, 9, seed=3)
    plain = specdec.generate(m, prompt, max_new_tokens=40, stop_tokens=[])
    sizes = {}
    for name, costs in (("flat", [1.0] * 9), ("steep", [float(t) for t in range(1, 10)])):
        spec = specdec.Eagle(d, depth=4, branching=2, nodes=8)
        spec.set_verify_costs(costs)
        got = specdec.generate(m, prompt, max_new_tokens=40, stop_tokens=[], speculator=spec)
        assert got.tokens == plain.tokens
        sizes[name] = got.stats.drafted / got.stats.steps
    fixed = specdec.Eagle(d, depth=4, branching=2, nodes=8, size_by_cost=False)
    got = specdec.generate(m, prompt, max_new_tokens=40, stop_tokens=[], speculator=fixed)
    assert got.tokens == plain.tokens
    assert sizes["flat"] > 6 and sizes["steep"] < sizes["flat"] / 2, sizes
    assert got.stats.drafted / got.stats.steps > 6


def test_requests_at_once_give_their_alone_bits(tmp_path, target):
    """Four requests with EAGLE heads (both kinds, greedy and sampled) at once: their steps
    share forwards (the scheduler), each head runs in its request's drafting, and every output
    is the one it has alone."""
    m, _ = target
    d1, _, _ = write_head(tmp_path / "e", "eagle", "safetensors")
    d3, _, _ = write_head(tmp_path / "e3", "eagle3", "safetensors")
    runs = [(specdec.Eagle(d1, depth=3, branching=2, nodes=6), 0.0),
            (specdec.Eagle(d3, depth=4), 0.0),
            (specdec.Eagle(d3, depth=2, branching=2, nodes=4), 1.0),
            (specdec.Eagle(d1, depth=3), 0.7)]
    prompts = [tm.random_tokens(TARGET.vocab, 6 + i, seed=10 + i) for i in range(4)]

    def one(i):
        spec, temp = runs[i]
        return specdec.generate(m, prompts[i], max_new_tokens=48, stop_tokens=[], seed=3,
                                temperature=temp, speculator=spec).tokens

    alone = [one(i) for i in range(4)]
    together = in_threads([lambda i=i: one(i) for i in range(4)])
    assert together == alone


def test_one_token_prompt_and_short_outputs(tmp_path, target):
    m, _ = target
    d, _, _ = write_head(tmp_path / "h", "eagle3", "safetensors")
    spec = specdec.Eagle(d, depth=3, branching=2, nodes=6)
    for prompt in ([5], [5, 6]):
        for n in (0, 1, 2, 9):
            plain = specdec.generate(m, prompt, max_new_tokens=n, stop_tokens=[])
            got = specdec.generate(m, prompt, max_new_tokens=n, stop_tokens=[], speculator=spec)
            assert got.tokens == plain.tokens


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("kind", ["eagle", "eagle3"])
def test_a_chat_reuses_its_prefix_with_the_features_the_head_reads(tmp_path, target, kind,
                                                                   temperature):
    """Prefix reuse (Model.prefix_cache) for a head that reads the target's features: a chat's
    later turns take the earlier turn's cache from the pool together with the features of its
    slots, so the head drafts exactly what it drafts without the pool (the same tokens, and the
    same drafts: every step's counts equal), and the prompt is not computed again."""
    m, _ = target
    d, _, _ = write_head(tmp_path / "h", kind, "safetensors")

    def chat():
        prompt, out = tm.random_tokens(TARGET.vocab, 20, 1), []
        for i in range(3):
            spec = specdec.Eagle(d, depth=3, branching=2, nodes=5, size_by_cost=False)
            out.append(specdec.generate(m, prompt, max_new_tokens=24, temperature=temperature,
                                        seed=i, stop_tokens=[], speculator=spec))
            prompt = prompt + out[-1].tokens + tm.random_tokens(TARGET.vocab, 6, 10 + i)
        return out

    fresh, reused = without_and_with_the_pool(m, chat)
    assert [g.tokens for g in reused] == [g.tokens for g in fresh]
    for a, b in zip(reused, fresh):
        assert (a.stats.steps, a.stats.drafted, a.stats.accepted) == \
            (b.stats.steps, b.stats.drafted, b.stats.accepted)
        assert a.stats.per_position_acceptance == b.stats.per_position_acceptance
        assert a.stats.steps_by_accepted == b.stats.steps_by_accepted
    assert all(g.prefix_reused == 0 for g in fresh) and reused[0].prefix_reused == 0
    for prev, g in zip(reused, reused[1:]):
        assert g.prefix_reused == len(prev.prompt_tokens) + len(prev.tokens) - 1


def test_chats_at_once_share_the_pool_with_their_alone_bits(tmp_path, target):
    """Four two-turn chats in four threads at once, with EAGLE-1 and EAGLE-3 heads, greedy and
    sampled, over one pool: each second turn takes its first turn's cache and features, and
    every output and acceptance count is the one the same chats give without the pool."""
    m, _ = target
    d1, _, _ = write_head(tmp_path / "e", "eagle", "safetensors")
    d3, _, _ = write_head(tmp_path / "e3", "eagle3", "safetensors")
    runs = [(d1, 0.0), (d3, 0.0), (d3, 1.0), (d1, 0.7)]

    def chat(i):
        head, temp = runs[i]
        prompt, out = tm.random_tokens(TARGET.vocab, 16 + i, seed=30 + i), []
        for turn in range(2):
            g = specdec.generate(m, prompt, max_new_tokens=20, stop_tokens=[], seed=turn,
                                 temperature=temp, speculator=specdec.Eagle(head, depth=3))
            out.append((g.tokens, g.stats.accepted, g.stats.steps, g.prefix_reused > 0))
            prompt = prompt + g.tokens + tm.random_tokens(TARGET.vocab, 5, seed=40 + i)
        return out

    alone, together = without_and_with_the_pool(
        m, lambda: in_threads([lambda i=i: chat(i) for i in range(4)]), pool=8)
    assert [[t[:3] for t in c] for c in together] == [[t[:3] for t in c] for c in alone]
    assert all(c[1][3] for c in together) and not any(c[1][3] for c in alone)


def test_pooled_features_go_only_to_heads_that_read_them(tmp_path, target):
    """A cache pooled without features (plain decoding) is not taken by an EAGLE request, nor
    one with EAGLE-1's features (the final hidden state) by an EAGLE-3 head (layer inputs);
    plain decoding takes either, and the output stays the plain one."""
    m, _ = target
    d1, _, _ = write_head(tmp_path / "e", "eagle", "safetensors")
    d3, _, _ = write_head(tmp_path / "e3", "eagle3", "safetensors")
    before = m.prefix_cache
    m.prefix_cache = 0
    m.prefix_cache = 1  # an empty pool that keeps one cache: the last request's

    def run(prompt, head):
        spec = None if head is None else specdec.Eagle(head, depth=3)
        return specdec.generate(m, prompt, max_new_tokens=12, stop_tokens=[], speculator=spec)

    try:
        prompt = tm.random_tokens(TARGET.vocab, 30, 4)
        plain = run(prompt, None)
        assert run(prompt, d1).prefix_reused == 0  # plain's cache has no features
        assert run(prompt, d3).prefix_reused == 0  # EAGLE-1's are not EAGLE-3's
        again = run(prompt, d3)
        assert again.prefix_reused == 29 and again.tokens == plain.tokens
        back = run(prompt, None)
        assert back.prefix_reused == 29 and back.tokens == plain.tokens
    finally:
        m.prefix_cache = before


# ---- sampled output: vocabulary-5 target, enumerated exactly ---------------------------------

V5 = tm.TinyConfig(arch="llama", vocab=5, dim=16, n_layers=4, n_heads=2, n_kv_heads=1, ffn=32,
                   context_length=32)



@pytest.mark.parametrize("branching,nodes", [(1, 1), (2, 4)])
def test_lookup_beside_the_head_keeps_greedy_output(tmp_path, target, branching, nodes):
    """Eagle(lookup=k): on texts that repeat themselves, steps drafted by prompt lookup (more
    than the head's one node) are chosen beside the head's; greedy output is the plain one and
    the cache holds after every step."""
    m, _ = target
    d, _, _ = write_head(tmp_path / "h", "eagle3", "safetensors")
    looked = 0
    for seed in (1, 2, 3):
        prompt = tm.random_tokens(TARGET.vocab, 7, seed=seed) * 3
        plain = specdec.generate(m, prompt, max_new_tokens=48, stop_tokens=[])
        spec = specdec.Eagle(d, depth=1, branching=branching, nodes=nodes, lookup=6)
        spec.set_verify_costs([1.0, 1.02, 1.05, 1.1, 1.15, 1.2, 1.3])
        got = specdec.generate(m, prompt, max_new_tokens=48, stop_tokens=[], speculator=spec)
        assert got.tokens == plain.tokens
        looked += max(got.stats.steps_by_nodes) > nodes  # only lookup drafts more
        toks, _, _ = m._core.generate(prompt, max_new_tokens=48, temperature=0.0, seed=1,
                                      stop_ids=[], top_k=0, top_p=1.0, drafter=spec.drafter(),
                                      check_cache=True)
        assert list(toks) == plain.tokens
    assert looked > 0

def v5_head(d, kind: str):
    """A head for the vocabulary-5 target (EAGLE-3: a draft vocabulary of 3)."""
    rng = np.random.default_rng(9)
    D, e3 = V5.dim, kind == "eagle3"

    def mat(r, c, s=1.5):
        return (rng.standard_normal((r, c)) * s / np.sqrt(c)).astype(np.float32)

    p = "midlayer." if e3 else "layers.0."
    inp = 2 * D if e3 else D
    w = {"fc.weight": mat(D, 3 * D if e3 else 2 * D), "fc.bias": np.zeros(D, np.float32),
         p + "self_attn.q_proj.weight": mat(16, inp), p + "self_attn.k_proj.weight": mat(8, inp),
         p + "self_attn.v_proj.weight": mat(8, inp), p + "self_attn.o_proj.weight": mat(D, 16),
         p + "mlp.gate_proj.weight": mat(24, D), p + "mlp.up_proj.weight": mat(24, D),
         p + "mlp.down_proj.weight": mat(D, 24),
         p + "post_attention_layernorm.weight": np.ones(D, np.float32)}
    cfg = {"model_type": "llama", "hidden_size": D, "intermediate_size": 24,
           "num_attention_heads": 2, "num_key_value_heads": 1, "num_hidden_layers": 1,
           "rms_norm_eps": 1e-5, "max_position_embeddings": 32, "vocab_size": 5}
    if e3:
        del w["fc.bias"]
        ids = np.array([0, 2, 3])
        w.update({p + "input_layernorm.weight": np.ones(D, np.float32),
                  p + "hidden_norm.weight": np.ones(D, np.float32),
                  "norm.weight": np.ones(D, np.float32), "lm_head.weight": mat(3, D, 4.0),
                  "d2t": (ids - np.arange(3)).astype(np.int64)})
        cfg["draft_vocab_size"] = 3
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(cfg))
    write_safetensors(d / "model.safetensors", w)
    return d


@pytest.fixture(scope="module")
def v5(tmp_path_factory):
    return make_v5_four_layers(tmp_path_factory.mktemp("v5eagle"))


def make_v5_four_layers(d):
    """The vocabulary-5 target (4 layers: EAGLE-3's taps) written under d, loaded, and its
    processed reference rows: (model, row(weights, seq, setting), weights, d)."""
    w = tm.make_weights(V5, 11)
    testing.write_gguf(str(d / "t.gguf"), V5, w)
    cache: dict = {}

    def row(weights, seq, setting):
        key = (tuple(seq), setting)
        if key not in cache:
            last = reference.forward(weights, V5, list(seq), kv_f16=True)[-1]
            cache[key] = reference.process_ref(last, *setting)
        return cache[key]

    return specdec.load(str(d / "t.gguf")), row, w, d


SAMPLED = {"T1": SETTINGS["T1"], "T0.7-topk3-topp-minp": (0.7, 3, 0.9, 0.1)}


@pytest.mark.parametrize("kind,branching,name,N", [
    ("eagle", 2, "T1", 100_000), ("eagle3", 3, "T0.7-topk3-topp-minp", 100_000),
    ("eagle3", 1, "T1", 30_000)])  # the chain: sampled drafts verified by the chain rule
def test_sampled_output_is_distributed_as_the_target(v5, kind, branching, name, N):
    """Trees of EAGLE drafts at T=1 and with every filter at once (100,000 runs each, the tree
    rule's own tests show its broken variants failing at this size: test_model_tree.py,
    test_tree.py), and a sampled chain; the whole tree every step."""
    m, row, w, d = v5
    setting = SAMPLED[name]
    spec = specdec.Eagle(v5_head(d / f"head-{kind}", kind), depth=2, branching=branching,
                         nodes=3, size_by_cost=False)
    counts, rejected, drafted = joint_counts(m, spec.drafter(), setting, N)
    assert rejected > N // 10 and drafted > N  # the residual path is exercised
    stat, df = chi2_stat(counts, exact_joint(row, w, setting))
    assert stat < chi2_critical(df), (stat, df)


def test_sampled_trees_sized_by_cost_stay_exact(v5):
    """size_by_cost when sampling: each step draws as many nodes as pay by how deep this
    request's accepted paths reached so far, decided before the step's draws. On a cost curve
    where two nodes pay at first and one after a miss the size changes within each run; the
    output is still the target's (100,000 runs)."""
    m, row, w, d = v5
    setting, N = SAMPLED["T1"], 100_000
    spec = specdec.Eagle(v5_head(d / "head-eagle3", "eagle3"), depth=2, branching=2, nodes=3)
    spec.set_verify_costs([1.0, 1.2, 1.45, 1.8])
    counts, rejected, drafted = joint_counts(m, spec.drafter(), setting, N)
    # a run's first step drafts two nodes (the prior pays for them), and after a miss (this
    # random head's drafts are mostly rejected) one: both sizes occur (the whole tree, 4 N)
    assert 2.5 * N < drafted < 3.5 * N and rejected > N // 10, (drafted, rejected)
    stat, df = chi2_stat(counts, exact_joint(row, w, setting))
    assert stat < chi2_critical(df), (stat, df)



@pytest.mark.parametrize("name", list(SAMPLED))
def test_sampled_lookup_beside_the_head_stays_exact(v5, name):
    """Eagle(lookup=k) when sampling: a step drafts the head's sampled chain or lookup's
    deterministic continuation, chosen from earlier steps alone; over 100,000 runs after a
    prompt that repeats itself the first three tokens are distributed as the target's."""
    m, row, w, d = v5
    setting, N = SAMPLED[name], 100_000
    prompt = [1, 2, 3, 4, 1, 2, 3]
    spec = specdec.Eagle(v5_head(d / "head-eagle3", "eagle3"), depth=1, lookup=4)
    spec.set_verify_costs([1.0, 1.02, 1.05, 1.1, 1.15])
    T, top_k, top_p, min_p = setting
    counts, drafted, accepted = _core.joint_counts(m._core, spec.drafter(), prompt, N, T, top_k,
                                                   top_p, min_p)
    assert drafted > 1.2 * N and drafted - accepted > N // 10, (drafted, accepted)
    looked = [max(specdec.generate(m, prompt, max_new_tokens=12, stop_tokens=[], seed=s,
                                   temperature=T, speculator=spec).stats.steps_by_nodes)
              for s in range(20)]
    assert max(looked) > 1, looked  # lookup drafted (the head's chain is one node)
    stat, df = chi2_stat(counts.astype(np.float64), exact_joint(row, w, setting, prompt))
    assert stat < chi2_critical(df), (stat, df)

# ---- heads that do not fit, files that are not heads ----------------------------------------

def test_mismatches_name_the_problem(tmp_path, target, tiny):
    m, _ = target
    other = specdec.load(str(tiny("llama_gqa2", "gguf-f32-v3").path))  # hidden 32, vocab 64
    d, _, _ = write_head(tmp_path / "h", "eagle", "safetensors")
    spec = specdec.Eagle(d)
    with pytest.raises(ValueError, match="hidden size 48 does not match the target's 32"):
        specdec.generate(other, [1, 2, 3], max_new_tokens=4, speculator=spec)
    with pytest.raises(ValueError, match="hidden size 48"):
        spec.draft_logits(other, [1, 2, 3])
    dv, _, _ = write_head(tmp_path / "v", "eagle", "safetensors", vocab_size=200)
    with pytest.raises(ValueError, match="vocabulary of 200 does not match the target's 97"):
        specdec.generate(m, [1, 2, 3], max_new_tokens=4, speculator=specdec.Eagle(dv))
    d3, _, _ = write_head(tmp_path / "s", "speculators", "safetensors",
                          eagle_aux_hidden_state_layer_ids=[1, 3, 9])
    with pytest.raises(ValueError, match="reads the target's layer 9, but the target has 6"):
        specdec.generate(m, [1, 2, 3], max_new_tokens=4, speculator=specdec.Eagle(d3))


@pytest.mark.parametrize("kw,error,match", [
    (dict(depth=0), ValueError, r"depth must be in \[1, 32\], got 0"),
    (dict(branching=9), ValueError, r"branching must be in \[1, 8\], got 9"),
    (dict(nodes=0, branching=2), ValueError, r"nodes must be in \[1, 64\], got 0"),
    (dict(p_min=2.0), ValueError, r"p_min must be in \[0, 1\], got 2"),
    (dict(depth=1.5), TypeError, "depth must be an integer"),
    (dict(lookup=33), ValueError, r"lookup must be in \[0, 32\], got 33"),
    (dict(lookup=-1), ValueError, r"lookup must be in \[0, 32\], got -1"),
    (dict(lookup=2.0), TypeError, "lookup must be an integer"),
    (dict(window=-1), ValueError, r"window must be >= 0 \(0: the whole text\), got -1"),
    (dict(window=8.0), TypeError, "window must be an integer"),
])
def test_bad_arguments(tmp_path, kw, error, match):
    d, _, _ = write_head(tmp_path / "h", "eagle", "safetensors")
    with pytest.raises(error, match=match):
        specdec.Eagle(d, **kw)


@pytest.mark.parametrize("bias,config_bias,match", [
    (False, None, "no \"bias\" key, which means fc has a bias but the file has no 'fc.bias'"),
    (True, False, "says \\(\"bias\": false\\) no fc has a bias but the file holds 'fc.bias'"),
])
def test_bias_must_agree_with_the_config(tmp_path, bias, config_bias, match):
    d, _, _ = write_head(tmp_path / "h", "eagle", "safetensors", bias=bias,
                         config_bias=config_bias)
    with pytest.raises(ValueError, match=match):
        specdec.Eagle(d)


@pytest.mark.parametrize("kind,key,value,needle", [
    ("eagle", "bias", "yes", '"bias" must be true or false, got a string'),
    ("speculators", "norm_before_residual", 1, '"norm_before_residual" must be true or false'),
    ("eagle3", "rms_norm_eps", "x", '"rms_norm_eps" must be a number, got a string'),
    ("eagle3", "rms_norm_eps", 1e30, "RMS norm epsilon"),
])
def test_config_values_of_the_wrong_type_are_refused(tmp_path, kind, key, value, needle):
    """A head's config.json setting of the wrong type is an error naming it, not a default
    taken silently in its place (a "bias" of "yes" read as absent, an epsilon of "x" as 1e-6)."""
    d, _, _ = write_head(tmp_path / "h", kind, "safetensors")
    cfg = json.loads((d / "config.json").read_text())
    cfg[key] = value
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=re.escape(needle)):
        specdec.Eagle(d)


def test_a_tensor_of_the_wrong_shape_names_both_shapes(tmp_path):
    d, w, _ = write_head(tmp_path / "h", "eagle3", "safetensors")
    w = dict(w, **{"norm.weight": np.ones((TARGET.dim, 2), np.float32)})
    write_safetensors(d / "model.safetensors", w)
    with pytest.raises(ValueError, match=re.escape(
            f"tensor 'norm.weight' has shape [{TARGET.dim}, 2], expected [{TARGET.dim}]")):
        specdec.Eagle(d)


def test_bad_files_are_refused(tmp_path):
    d, w, cfg = write_head(tmp_path / "h", "eagle3", "safetensors")
    w2 = dict(w)
    w2["midlayer.extra.weight"] = np.zeros(3, np.float32)
    write_safetensors(d / "model.safetensors", w2)
    with pytest.raises(ValueError, match="'midlayer.extra.weight' is not part of an EAGLE-3"):
        specdec.Eagle(d)
    w2 = dict(w)
    del w2["t2d"]  # optional
    w2["d2t"] = np.zeros(DRAFT_VOCAB, np.int64)  # the identity ...
    w2["d2t"][1] = -1  # ... but draft id 1 -> target id 0, as draft id 0
    write_safetensors(d / "model.safetensors", w2)
    with pytest.raises(ValueError, match="d2t maps draft id 1 to target id 0, already taken"):
        specdec.Eagle(d)
    w2 = dict(w)
    del w2["midlayer.hidden_norm.weight"]  # then read as speculators' layers.0 layout
    write_safetensors(d / "model.safetensors", w2)
    with pytest.raises(ValueError, match="missing tensor 'layers.0.self_attn.q_proj.weight'"):
        specdec.Eagle(d)
    w2 = dict(w)
    w2["fc.weight"] = np.zeros((TARGET.dim, 5), np.float32)
    write_safetensors(d / "model.safetensors", w2)
    with pytest.raises(ValueError, match="not an EAGLE head"):
        specdec.Eagle(d)
    (d / "model.safetensors").unlink()
    with pytest.raises(OSError):
        specdec.Eagle(d)
    with pytest.raises(FileNotFoundError, match="no EAGLE head directory"):
        specdec.Eagle(tmp_path / "nowhere")
    cfg2 = dict(cfg, num_hidden_layers=2)
    (d / "config.json").write_text(json.dumps(cfg2))
    write_safetensors(d / "model.safetensors", w)
    with pytest.raises(ValueError, match="num_hidden_layers"):
        specdec.Eagle(d)


def test_corrupt_files_and_unsupported_settings_are_named(tmp_path):
    d, _, cfg = write_head(tmp_path / "h", "eagle3", "safetensors")
    data = (d / "model.safetensors").read_bytes()
    for cut, match in ((5, "truncated"), (len(data) // 2, "lies past the end of file")):
        (d / "model.safetensors").write_bytes(data[:cut])
        with pytest.raises(ValueError, match=match):
            specdec.Eagle(d)
    (d / "model.safetensors").write_bytes(data)
    (d / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="config.json: json: unexpected character"):
        specdec.Eagle(d)
    for extra, match in ((dict(rope_scaling={"rope_type": "yarn", "factor": 4.0}),
                          "YaRN RoPE scaling in a head is not supported"),
                         (dict(rope_scaling={"rope_type": "dynamic", "factor": 4.0}),
                          "\"rope_scaling\" of type \"dynamic\" is not supported"),
                         (dict(hidden_act="gelu"), "\"hidden_act\" = \"gelu\" is not supported"),
                         (dict(draft_vocab_size=41), "draft_vocab_size 41 disagrees with lm_head")):
        (d / "config.json").write_text(json.dumps(dict(cfg, **extra)))
        with pytest.raises(ValueError, match=match):
            specdec.Eagle(d)


def test_a_bin_with_code_is_refused(tmp_path):
    """A pytorch_model.bin whose pickle would call os.system is refused, and nothing runs."""
    d, w, _ = write_head(tmp_path / "h", "eagle", "bin")
    entries, storages = [], {}
    for i, (name, a) in enumerate(w.items()):
        entries.append((name, "F32", str(i), a.size, 0, list(a.shape), None))
        storages[str(i)] = a
    marker = tmp_path / "ran"
    write_torch_layout_zip(d / "pytorch_model.bin", checkpoint(
        entries, storages, extra=evil_call("os", "system", f"touch {marker}")))
    with pytest.raises(ValueError, match=r"refused: the pickle calls os\.system"):
        specdec.Eagle(d)
    assert not marker.exists()


# ---- the real model ----------------------------------------------------------------------------

@pytest.mark.parametrize("depth,branching,nodes", [(4, 1, 4), (5, 3, 12)])
def test_smollm2_greedy_equals_plain(tmp_path, smollm2_path, depth, branching, nodes):
    """An EAGLE-3 head of SmolLM2's shapes (random weights, a draft vocabulary of 1,024, taps
    at layers 2, 15 and 27): greedy output with it is the plain one on the real model."""
    rng = np.random.default_rng(0)
    D, F, V, Vd = 576, 512, 49152, 1024

    def mat(r, c):
        return (rng.standard_normal((r, c)) / np.sqrt(c)).astype(np.float16)

    ids = np.sort(rng.choice(V, Vd, replace=False))
    p = "midlayer."
    w = {"fc.weight": mat(D, 3 * D), p + "self_attn.q_proj.weight": mat(576, 2 * D),
         p + "self_attn.k_proj.weight": mat(192, 2 * D),
         p + "self_attn.v_proj.weight": mat(192, 2 * D), p + "self_attn.o_proj.weight": mat(D, 576),
         p + "mlp.gate_proj.weight": mat(F, D), p + "mlp.up_proj.weight": mat(F, D),
         p + "mlp.down_proj.weight": mat(D, F)}
    for n in ("post_attention_layernorm", "input_layernorm", "hidden_norm"):
        w[p + n + ".weight"] = np.ones(D, np.float16)
    w.update({"norm.weight": np.ones(D, np.float16), "lm_head.weight": mat(Vd, D),
              "d2t": (ids - np.arange(Vd)).astype(np.int64)})
    d = tmp_path / "head"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({
        "model_type": "llama", "hidden_size": D, "intermediate_size": F,
        "num_attention_heads": 9, "num_key_value_heads": 3, "head_dim": 64,
        "num_hidden_layers": 1, "rms_norm_eps": 1e-5, "rope_theta": 100000.0,
        "max_position_embeddings": 8192, "vocab_size": V, "draft_vocab_size": Vd}))
    write_safetensors(d / "model.safetensors", w)
    m = specdec.load(smollm2_path)
    spec = specdec.Eagle(d, depth=depth, branching=branching, nodes=nodes, size_by_cost=False)
    for q in ("List the days of the week.", "Explain how a bicycle works in three sentences."):
        msgs = [{"role": "user", "content": q}]
        plain = specdec.generate(m, msgs, max_new_tokens=48)
        got = specdec.generate(m, msgs, max_new_tokens=48, speculator=spec)
        assert got.tokens == plain.tokens, q
        assert got.stats.drafted > got.stats.steps


def test_the_shipped_head_drafts_its_best_token_at_every_step(smollm2_path):
    """A greedy chain one deep with the shipped head (a draft vocabulary of 4,096 spread over
    SmolLM2's 49,152 ids): each step drafts the target id whose logit is the largest in the
    head's row for the next token, as draft_logits states it (the lower id on ties). Replaying
    the output against draft_logits gives every step's draft, and so the count of accepted
    drafts, which must be the one generate reports. A tree that read the draft's rows under the
    wrong target ids, or not the best of them, would accept far fewer."""
    spec = specdec.Eagle("smollm2-135m-instruct", depth=1, size_by_cost=False)
    m = specdec.load(smollm2_path)
    tok = m.require_tokenizer()
    total = 0
    for q in ("What are three good habits for studying?", "How do I boil an egg?"):
        ids = tok.encode(tok.apply_chat_template([{"role": "user", "content": q}]))
        got = specdec.generate(m, ids, max_new_tokens=48, speculator=spec)
        text = list(ids) + list(got.tokens)
        rows = spec.draft_logits(m, text)  # row t: the head's logits for token t + 2
        # the prefill stops before the prompt's last token: the first step feeds it and drafts
        # token len(ids), from the head's row of position len(ids) - 2
        at, steps, accepted = len(ids), 0, 0
        while at < len(text):
            # no room for a draft before the last token the limit allows
            hit = at + 1 < len(ids) + 48 and int(np.argmax(rows[at - 2])) == text[at]
            accepted += hit
            at += 1 + hit
            steps += 1
        assert (got.stats.steps, got.stats.accepted) == (steps, accepted), q
        total += accepted
    assert total > 10, total


def _shipped_head_in_order(d, order, full: bool):
    """The shipped head written to d with its draft vocabulary in another order: draft id i
    holds what the shipped head's draft id order[i] held (its lm_head row, its target id).
    full: the draft vocabulary widened to all 49,152 target ids, the ids it lacked given rows
    of zero blocks (logit 0), before the order is applied; the head then computes another
    function, the same for every order."""
    src = Path(specdec.Eagle("smollm2-135m-instruct").path)
    w = pack_head.read_safetensors(src / "model.safetensors")
    cfg = json.loads((src / "config.json").read_text())
    head, ids = w["lm_head.weight"], np.arange(len(w["d2t"])) + w["d2t"]
    if full:
        V = cfg["vocab_size"]
        wide = np.zeros((V,) + head.shape[1:], head.dtype)
        wide[ids] = head
        head, ids = wide, np.arange(V)
        cfg["draft_vocab_size"] = V
        w["t2d"] = np.ones(V, np.bool_)
    order = np.asarray(order)
    w["lm_head.weight"] = np.ascontiguousarray(head[order])
    w["d2t"] = (ids[order] - np.arange(len(order))).astype(np.int64)
    d.mkdir()
    (d / "config.json").write_text(json.dumps(cfg))
    write_safetensors(d / "model.safetensors", w)
    return d


@pytest.mark.parametrize("full", [False, True])
def test_a_draft_vocabulary_in_another_order_drafts_the_same(tmp_path, smollm2_path, full):
    """The same head with its draft vocabulary in two orders (ascending target ids, and
    shuffled) drafts the same tokens at temperature 0: each step's chain, 3 deep, follows the
    largest logit by target id whatever the draft id, so the steps and the accepted drafts are
    the same. Also with a draft vocabulary as large as the target's, whose rows are in the
    draft's order too: read as the target's ids, the shuffled head's drafts would be others."""
    n = 49152 if full else 4096
    order = np.random.default_rng(5).permutation(n)
    m = specdec.load(smollm2_path)
    tok = m.require_tokenizer()
    got = []
    for name, o in (("sorted", np.arange(n)), ("shuffled", order)):
        d = _shipped_head_in_order(tmp_path / name, o, full)
        spec = specdec.Eagle(d, depth=3, size_by_cost=False)
        runs = []
        for q in ("What are three good habits for studying?", "Name the planets in order."):
            ids = tok.encode(tok.apply_chat_template([{"role": "user", "content": q}]))
            g = specdec.generate(m, ids, max_new_tokens=40, speculator=spec)
            runs.append((g.tokens, g.stats.steps, g.stats.accepted, g.stats.steps_by_accepted))
        got.append(runs)
    assert got[0] == got[1]
    assert sum(r[2] for r in got[0]) > 5  # a head that drafts well enough to tell


def test_the_shipped_smollm2_head(smollm2_path):
    """specdec.Eagle("smollm2-135m-instruct"): the EAGLE-3 head shipped in the package (4-bit
    blocks, a draft vocabulary of 4,096) loads for SmolLM2, greedy output with it is the plain
    one (also with prompt lookup beside it), and it is a trained head: its first draft is
    accepted far more often than a random head's never-accepted guesses (about 0.4 to 0.5 on
    chat answers)."""
    spec = specdec.Eagle("smollm2-135m-instruct", depth=3, size_by_cost=False)
    both = specdec.Eagle("smollm2-135m-instruct", depth=3, lookup=16)
    assert spec.kind == "eagle3"
    cfg = json.loads((Path(spec.path) / "config.json").read_text())
    assert cfg["draft_vocab_size"] == 4096
    m = specdec.load(smollm2_path)
    first = []
    for q in ("What are three good habits for studying?",
              "Write a short poem about the sea.", "How do I boil an egg?"):
        msgs = [{"role": "user", "content": q}]
        plain = specdec.generate(m, msgs, max_new_tokens=64)
        got = specdec.generate(m, msgs, max_new_tokens=64, speculator=spec)
        assert got.tokens == plain.tokens, q
        first.append(got.stats.per_position_acceptance[0])
        mixed = specdec.generate(m, msgs, max_new_tokens=64, speculator=both)
        assert mixed.tokens == plain.tokens, q
    assert np.mean(first) > 0.25, first
    with pytest.raises(FileNotFoundError, match="aliases"):
        specdec.Eagle("no-such-model")
