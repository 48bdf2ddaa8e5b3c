"""Numbers that are not finite never become tokens.

A NaN or an infinity in a file (a float weight, or the f16 scale of a quantized block) is refused
at load with a ValueError naming the tensor and where. Finite weights can still overflow the
float range in the forward (a corrupt or wrongly scaled file); the forward then checks the
hidden state of every row that gets logits, and the call raises FloatingPointError instead of
picking tokens from logits that mean nothing (argmax skips a NaN, sampling draws from NaN
probabilities)."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import quantref
import specdec
import tinymodels as tm
from specdec import _core, testing

CFG = tm.TinyConfig(arch="llama", vocab=48, dim=32, n_layers=2, n_heads=4, n_kv_heads=2,
                    ffn=64, context_length=64)
PROMPT = [1, 5, 9, 14, 3, 22, 7, 30]

# ggml-common.h: where each block format keeps its f16 scales (d; m or dmin)
SCALES = {"Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q8_0": [0],
          "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208]}
HALF_BAD = {"nan": 0x7E00, "+inf": 0x7C00, "-inf": 0xFC00}


@pytest.mark.parametrize("name", sorted(SCALES))
def test_a_blocks_scales_are_checked_and_nothing_else(name):
    type_id = quantref.BY_NAME[name]
    _, qk, size = quantref.FORMATS[type_id]
    rng = np.random.default_rng(3)
    blocks = quantref.random_blocks(type_id, 8, rng)
    assert _core.first_nonfinite(type_id, blocks.tobytes(), 8 * qk) == -1
    # every byte that is not a scale set to 0xFF: quants and sub-scales are integers, and a
    # check reading them as a half would see a NaN
    filled = np.full_like(blocks, 0xFF)
    for off in SCALES[name]:
        filled[:, off:off + 2] = blocks[:, off:off + 2]
    assert _core.first_nonfinite(type_id, filled.tobytes(), 8 * qk) == -1
    # the largest finite half is finite
    big = blocks.copy()
    for off in SCALES[name]:
        big[:, off:off + 2] = np.frombuffer(np.uint16(0x7BFF).tobytes(), np.uint8)
    assert _core.first_nonfinite(type_id, big.tobytes(), 8 * qk) == -1
    for off in SCALES[name]:
        for bits in HALF_BAD.values():
            bad = blocks.copy()
            bad[5, off:off + 2] = np.frombuffer(np.uint16(bits).tobytes(), np.uint8)
            assert _core.first_nonfinite(type_id, bad.tobytes(), 8 * qk) == 5 * qk, (off, bits)
    assert size == blocks.shape[1]


@pytest.mark.parametrize("dtype, type_id", [("F32", 0), ("F16", 1), ("BF16", 30)])
def test_float_tensors_are_checked_element_by_element(dtype, type_id):
    a = np.random.default_rng(4).standard_normal(96).astype(np.float32)
    assert _core.first_nonfinite(type_id, testing.encode(a, dtype), 96) == -1
    top = {"F32": 3.4e38, "F16": 65504.0, "BF16": 3.38e38}[dtype]
    a[10] = top
    assert _core.first_nonfinite(type_id, testing.encode(a, dtype), 96) == -1
    for v in (np.nan, np.inf, -np.inf):
        b = a.copy()
        b[37] = v
        b[60] = np.nan
        assert _core.first_nonfinite(type_id, testing.encode(b, dtype), 96) == 37


def test_the_check_refuses_a_wrong_length():
    with pytest.raises(ValueError, match="take 40 bytes, got 20"):
        _core.first_nonfinite(3, bytes(20), 64)
    with pytest.raises(ValueError, match="whole blocks"):
        _core.first_nonfinite(3, bytes(20), 30)


def write(tmp_path, weights, dtype="F32", fmt="gguf"):
    if fmt == "gguf":
        path = str(tmp_path / f"m_{dtype}.gguf")
        testing.write_gguf(path, CFG, weights, dtype=dtype)
        return path
    return str(testing.write_hf(tmp_path / f"hf_{dtype}", CFG, weights, dtype=dtype).dir)


@pytest.mark.parametrize("fmt, dtype", [("gguf", "F32"), ("gguf", "F16"), ("hf", "F32"),
                                         ("hf", "F16"), ("hf", "BF16")])
def test_a_file_with_a_nan_or_infinite_weight_is_refused_naming_it(tmp_path, dtype, fmt):
    w = tm.make_weights(CFG, 1)
    w["model.layers.1.mlp.down_proj.weight"][3, 5] = np.nan
    with pytest.raises(ValueError, match=r"down_proj.weight|ffn_down.weight") as e:
        specdec.load(write(tmp_path, w, dtype, fmt), threads=1)
    assert "holds a NaN or infinite value at row 3, column 5" in str(e.value)
    w = tm.make_weights(CFG, 1)
    w["model.layers.0.post_attention_layernorm.weight"][7] = -np.inf
    with pytest.raises(ValueError, match=r"element 7: the file is corrupt"):
        specdec.load(write(tmp_path, w, dtype, fmt), threads=1)
    w = tm.make_weights(CFG, 1)
    w["model.embed_tokens.weight"][40, 0] = np.inf  # a row no prompt may ever read
    with pytest.raises(ValueError, match=r"at row 40, column 0"):
        specdec.load(write(tmp_path, w, dtype, fmt), threads=1)


# Finite F32 weights whose second layer's FFN output is infinite ("inf": about 1e20 * 1e20
# each), or finite but so large (about 1e37) that the final norm's sum of squares overflows
# and the norm gives zeros, and every logit 0 ("huge")
OVERFLOWS = {"inf": {"up_proj": 1e20, "down_proj": 1e20}, "huge": {"down_proj": 3e37}}


def overflow_model(tmp_path, kind):
    w = tm.make_weights(CFG, 1)
    for name, scale in OVERFLOWS[kind].items():
        w[f"model.layers.1.mlp.{name}.weight"] *= np.float32(scale)
        assert np.isfinite(w[f"model.layers.1.mlp.{name}.weight"]).all()
    path = str(tmp_path / f"overflow_{kind}.gguf")
    testing.write_gguf(path, CFG, w)
    return specdec.load(path, threads=2)


@pytest.fixture(scope="module", params=sorted(OVERFLOWS))
def overflowing(request, tmp_path_factory):
    return overflow_model(tmp_path_factory.mktemp("nonfinite"), request.param)


def test_the_unscaled_model_is_finite(tmp_path):
    m = specdec.load(write(tmp_path, tm.make_weights(CFG, 1)), threads=1)
    assert np.isfinite(m.logits(PROMPT)).all()
    assert len(specdec.generate(m, PROMPT, max_new_tokens=8, stop_tokens=[]).tokens) == 8


def test_a_forward_whose_hidden_state_overflows_raises(overflowing):
    with pytest.raises(FloatingPointError, match=r"hidden state is not finite .* at row 0 of "
                       r"the batch \(token id 1\)"):
        overflowing.logits(PROMPT)


@pytest.mark.parametrize("spec", [None, "lookup", "recycling", "tree"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_generation_raises_instead_of_picking_tokens(overflowing, spec, temperature):
    s = {None: None, "lookup": specdec.PromptLookup(k=4),
         "recycling": specdec.TokenRecycling(nodes=8, adaptive=False),
         "tree": specdec.PromptLookup(k=4, branching=3, size_by_cost=False)}[spec]
    with pytest.raises(FloatingPointError, match="hidden state is not finite"):
        specdec.generate(overflowing, PROMPT, max_new_tokens=8, stop_tokens=[],
                         temperature=temperature, seed=1, speculator=s)
    assert overflowing.open_sequences == 0


def test_requests_at_once_each_raise(overflowing):
    """Through the step scheduler, which combines the requests' forwards: each request gets the
    error, and no sequence is left open (the next request runs, and fails the same way)."""
    errors, barrier = [], threading.Barrier(3)

    def work(i):
        barrier.wait()
        try:
            specdec.generate(overflowing, PROMPT[i:], max_new_tokens=8, stop_tokens=[])
        except FloatingPointError as e:
            errors.append(str(e))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(errors) == 3 and all("not finite" in e for e in errors), errors
    assert overflowing.open_sequences == 0
    with pytest.raises(FloatingPointError):
        specdec.generate(overflowing, PROMPT, max_new_tokens=2)


def test_a_request_whose_row_overflows_fails_alone(tmp_path):
    """One token's embedding row is finite but so large (about 1e20) that the final norm's sum
    of squares overflows on the rows of that token (a token the other requests never read or
    write). Requests stepped together share forwards: the request whose prompt ends with it
    fails, the others get their output of alone, the same as on the model without the row."""
    good = [PROMPT, PROMPT[2:], PROMPT[::-1]]
    w = tm.make_weights(CFG, 1)
    clean = specdec.load(write(tmp_path, w), threads=1)
    want = [specdec.generate(clean, p, max_new_tokens=24, stop_tokens=[]).tokens for p in good]
    bad = max(set(range(CFG.vocab)) - {t for r in good + want for t in r})
    w["model.embed_tokens.weight"][bad] *= np.float32(1e20)
    path = str(tmp_path / "poison.gguf")
    testing.write_gguf(path, CFG, w)
    m = specdec.load(path, threads=2)
    m.prefix_cache = 0
    with pytest.raises(FloatingPointError, match=rf"token id {bad}\)"):
        specdec.generate(m, PROMPT + [bad], max_new_tokens=24, stop_tokens=[])
    prompts = [good[0], PROMPT + [bad], good[1], good[2]]
    seqs = [m._core.sequence(p, max_new_tokens=24, stop_ids=[], drafter=None) for p in prompts]
    s0, f0 = m.scheduler_stats["steps"], m.scheduler_stats["forwards"]
    out, barrier = [None] * 4, threading.Barrier(4)

    def step(i):
        barrier.wait()
        try:
            while not seqs[i].done:
                seqs[i].step()
            out[i] = list(seqs[i].tokens)
        except FloatingPointError as e:
            out[i] = str(e)
        finally:
            seqs[i].close()

    threads = [threading.Thread(target=step, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    steps = m.scheduler_stats["steps"] - s0
    forwards = m.scheduler_stats["forwards"] - f0
    assert forwards < steps, (steps, forwards)  # the requests' steps shared forwards
    assert [out[0], out[2], out[3]] == want
    assert isinstance(out[1], str) and f"token id {bad})" in out[1], out[1]
    assert m.open_sequences == 0
