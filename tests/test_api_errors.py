"""Every error a user can cause in decoding, reached through the public API: the C core checks
each value's range and names the parameter (ValueError), Python checks each type (TypeError);
a message exists once (csrc/README.md, "One place for each check")."""

from __future__ import annotations

import math

import pytest

import specdec
import tinymodels as tm
from specdec import testing

CFG = tm.TinyConfig(arch="llama", vocab=48, dim=32, n_layers=3, n_heads=4, n_kv_heads=2,
                    ffn=64, context_length=64)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("api") / "m.gguf")
    testing.write_gguf(path, CFG, tm.make_weights(CFG, 1))
    return specdec.load(path, threads=1)


@pytest.fixture(scope="module")
def short_draft(tmp_path_factory):
    """A draft of the same vocabulary with a shorter context (32)."""
    cfg = CFG.replace(n_layers=1, context_length=32)
    path = str(tmp_path_factory.mktemp("api") / "d.gguf")
    testing.write_gguf(path, cfg, tm.make_weights(cfg, 2))
    return specdec.load(path, threads=1)


# (keyword arguments of generate, the words the message must hold)
RANGES = [
    (dict(max_new_tokens=-1), r"max_new_tokens must be >= 0, got -1"),
    (dict(temperature=-0.5), r"temperature must be >= 0 and finite, got -0.5"),
    (dict(temperature=math.inf), r"temperature must be >= 0 and finite, got inf"),
    (dict(temperature=math.nan), r"temperature must be >= 0 and finite, got nan"),
    (dict(top_k=-1), r"top_k must be >= 0"),
    (dict(top_p=0.0), r"top_p must be in \(0, 1\], got 0"),
    (dict(top_p=1.5), r"top_p must be in \(0, 1\], got 1.5"),
    (dict(min_p=-0.1), r"min_p must be in \[0, 1\), got -0.1"),
    (dict(min_p=1.0), r"min_p must be in \[0, 1\), got 1"),
    (dict(max_new_tokens=60), r"prompt \(5 tokens\) \+ max_new_tokens \(60\) exceeds the "
                              r"context length 64"),
]


@pytest.mark.parametrize("kwargs,message", RANGES)
@pytest.mark.parametrize("speculator", [None, "lookup", "layerskip"])
def test_generate_ranges_are_the_cores(model, kwargs, message, speculator):
    """The same message from plain and speculative decoding: one check, in C."""
    spec = {None: None, "lookup": specdec.PromptLookup(),
            "layerskip": specdec.LayerSkip(1)}[speculator]
    with pytest.raises(ValueError, match=message):
        specdec.generate(model, [1, 2, 3, 4, 5], speculator=spec, **kwargs)


@pytest.mark.parametrize("kwargs,name", [
    (dict(max_new_tokens=2.0), "max_new_tokens"), (dict(max_new_tokens=True), "max_new_tokens"),
    (dict(temperature="0.5"), "temperature"), (dict(top_k=1.5), "top_k"),
    (dict(top_p=None), "top_p"), (dict(min_p="0"), "min_p"), (dict(seed=1.0), "seed"),
    (dict(speculator="lookup"), "speculator"), (dict(on_token=3), "on_token"),
])
def test_generate_types_are_pythons(model, kwargs, name):
    with pytest.raises(TypeError, match=name):
        specdec.generate(model, [1, 2, 3], **kwargs)


def test_seed_beyond_64_bits(model):
    with pytest.raises(ValueError, match=r"seed must be in \[0, 2\*\*64\)"):
        specdec.generate(model, [1, 2], seed=2**64)


def test_empty_prompt(model):
    with pytest.raises(ValueError, match="the prompt must hold at least one token"):
        specdec.generate(model, [])
    with pytest.raises(ValueError, match="the prompt must hold at least one token"):
        specdec.generate(model, [], speculator=specdec.PromptLookup())


def test_stop_strings_without_a_tokenizer(model):
    with pytest.raises(ValueError, match="stop strings need the text of every token, and the "
                                         "model has no tokenizer"):
        specdec.generate(model, [1, 2], stop=["x"])


@pytest.mark.parametrize("make,message", [
    (lambda: specdec.PromptLookup(k=0), r"k must be in \[1, 32\], got 0"),
    (lambda: specdec.PromptLookup(k=33), r"k must be in \[1, 32\], got 33"),
    (lambda: specdec.PromptLookup(min_ngram=0), r"1 <= min_ngram <= max_ngram, got 0 and 4"),
    (lambda: specdec.PromptLookup(max_ngram=2, min_ngram=3),
     r"1 <= min_ngram <= max_ngram, got 3 and 2"),
    (lambda: specdec.PromptLookup(max_ngram=2**21), r"max_ngram must be <= 1048576"),
    (lambda: specdec.PromptLookup(verify_slope=-1), r"verify_slope must be >= 0, got -1"),
    (lambda: specdec.LayerSkip(0), r"the draft's layers must be >= 1, got 0"),
    (lambda: specdec.LayerSkip(1, k=40), r"k must be in \[1, 32\], got 40"),
    (lambda: specdec.LayerSkip(1, p_min=2), r"p_min must be in \[0, 1\], got 2"),
])
def test_speculator_ranges_are_the_cores(make, message):
    """Checked when the speculator is made, by its C drafter's constructor."""
    with pytest.raises(ValueError, match=message):
        make()


def test_draft_model_ranges_are_the_cores(model):
    with pytest.raises(ValueError, match=r"k must be in \[1, 32\], got 0"):
        specdec.DraftModel(model, k=0)
    with pytest.raises(ValueError, match=r"p_min must be in \[0, 1\], got -1"):
        specdec.DraftModel(model, p_min=-1)


def test_layerskip_needs_fewer_layers_than_the_target(model):
    with pytest.raises(ValueError, match=r"the draft's layers must be in \[1, 3\) \(the target "
                                         r"has 3\), got 3"):
        specdec.generate(model, [1, 2, 3], speculator=specdec.LayerSkip(3))


def test_draft_model_context(model, short_draft):
    """The draft's context bounds a request; with nothing to generate there is nothing to
    check."""
    spec = specdec.DraftModel(short_draft)
    with pytest.raises(ValueError, match=r"prompt \(5 tokens\) \+ max_new_tokens \(30\) exceeds "
                                         r"the context length 32 of the draft model"):
        specdec.generate(model, [1, 2, 3, 4, 5], max_new_tokens=30, speculator=spec)
    assert specdec.generate(model, [1, 2, 3, 4, 5], max_new_tokens=27,
                            speculator=spec).finish_reason in ("length", "stop_token")


def test_synthetic_ranges_are_the_cores(model):
    def run(**kw):
        args = dict(alpha=0.5, k=2, max_new_tokens=16) | kw
        return specdec.dummy.synthetic_speculation(model, [1, 2], **args)

    with pytest.raises(ValueError, match=r"alpha must be in \[0, 1\], got 1.5"):
        run(alpha=1.5)
    with pytest.raises(ValueError, match=r"k must be in \[1, 32\], got 0"):
        run(k=0)
    with pytest.raises(ValueError, match=r"max_new_tokens must be >= 0, got -2"):
        run(max_new_tokens=-2)
    with pytest.raises(TypeError, match="alpha"):
        run(alpha="high")
    assert run().tokens == 16


def test_max_draft_comes_from_the_core():
    assert specdec.speculators.MAX_DRAFT == specdec._core.max_draft() == 32


def test_model_ranges_are_the_cores(model, tmp_path):
    """Threads, the KV cache type, logits rows and llama.cpp's batch: each range checked once,
    in C, with the same message wherever the value enters."""
    path = str(tmp_path / "m.gguf")
    testing.write_gguf(path, CFG, tm.make_weights(CFG, 1))
    for bad in (0, -1, 1025):
        with pytest.raises(ValueError, match=rf"threads must be in \[1, 1024\], got {bad}"):
            specdec.load(path, threads=bad)
        with pytest.raises(ValueError, match=rf"threads must be in \[1, 1024\], got {bad}"):
            model.threads = bad
    assert model.threads == 1  # unchanged by the refusals
    with pytest.raises(TypeError, match="threads must be an integer"):
        model.threads = 1.0
    with pytest.raises(ValueError, match="kv_dtype must be 'f16' or 'f32', got 'f8'"):
        specdec.load(path, kv_dtype="f8")
    with pytest.raises(ValueError, match=r"n_logits -1 is out of range \[0, 2\]"):
        model.forward(model.new_cache(4), [1, 2], n_logits=-1)
    with pytest.raises(ValueError, match=r"n_logits 3 is out of range \[0, 2\]"):
        model.forward(model.new_cache(4), [1, 2], n_logits=3)
    assert model.forward(model.new_cache(4), [1, 2], n_logits=0).shape == (0, CFG.vocab)
    with pytest.raises(ValueError, match="tokens must hold at least one token"):
        model.logits([])
    with pytest.raises(ValueError, match="beyond the context length 64"):
        model.logits([1] * 65)


@pytest.mark.parametrize("value,warns", [("avx512", True), ("AVX2", True), ("avx2", False),
                                         ("avxvnni", False), ("", False)])
def test_an_unknown_simd_level_warns_at_import(value, warns):
    """SPECDEC_SIMD caps the CPU kernels; a value that is not a level (a typo, the wrong case)
    would be ignored silently by the core, so the import says so (RuntimeWarning naming it and
    the levels) and the kernels stay the CPU's best."""
    import subprocess
    import sys

    from helpers import HERE, child_env

    code = "import specdec; print(specdec._core.simd_name())"
    res = subprocess.run([sys.executable, "-W", "error::RuntimeWarning", "-c", code],
                         env=child_env(SPECDEC_SIMD=value), capture_output=True, text=True,
                         cwd=HERE)  # not the source tree's specdec/, which may not be built
    if warns:
        assert res.returncode != 0
        assert f"SPECDEC_SIMD={value!r} is not a kernel level" in res.stderr, res.stderr
        assert "avxvnni" in res.stderr
    else:
        assert res.returncode == 0, res.stderr
