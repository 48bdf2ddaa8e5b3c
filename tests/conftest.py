"""Fixtures: tiny random models written once per session (GGUF files and Hugging Face
directories, see tinymodels.py), cached float64 reference logits (reference.py), the draft-model
pair, the real SmolLM2 model with its llama.cpp fixture, and the real Gemma-3-270M file.

The writers come from specdec.testing; the models' values are checked independently of the
specdec loaders by tests/test_tinymodels.py.

Requirements: a test that needs something a machine may lack (a GPU, the SmolLM2 file offline,
a SIMD level) skips with the reason through helpers.missing, or with the marker
``@pytest.mark.requires(name, reason)`` (an empty reason: present). SPECDEC_REQUIRE, a comma
list of names from helpers.REQUIRABLE (cuda, smollm2, gemma3, avx2, avxvnni, avx512, vnni,
amx), turns those skips into failures with the same reason, on machines that must have the
thing.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import helpers  # noqa: E402
import reference  # noqa: E402
import tinymodels  # noqa: E402
from tinymodels import CONFIGS, FORMATS  # noqa: E402


def pytest_configure(config) -> None:
    config.addinivalue_line(
        "markers", "requires(name, reason): skip with `reason` (a missing requirement, a key of "
        "helpers.REQUIRABLE) unless it is empty; fail instead when SPECDEC_REQUIRE names it")
    try:
        helpers.required()
    except ValueError as e:
        raise pytest.UsageError(str(e)) from None


def pytest_runtest_setup(item) -> None:
    for mark in item.iter_markers("requires"):
        name, reason = mark.args
        if reason:
            helpers.missing(name, reason)


@pytest.fixture(scope="session")
def tiny(tmp_path_factory):
    """tiny(name, fmt) -> tinymodels.TinyModel, written on first use and reused for the session.

    name: a key of tinymodels.CONFIGS; fmt: a key of tinymodels.FORMATS.
    Tests must not modify the files (copy them first, as test_errors does).
    """
    root = tmp_path_factory.mktemp("tiny")
    cache: dict = {}

    def get(name: str, fmt: str) -> tinymodels.TinyModel:
        assert name in CONFIGS, name
        assert fmt in FORMATS, fmt
        key = (name, fmt)
        if key not in cache:
            cache[key] = tinymodels.write_model(root, name, fmt)
        return cache[key]

    return get


@pytest.fixture(scope="session")
def ref_logits():
    """ref_logits(model, tokens, positions=None, kv_f16=True) -> float64 (T, V) reference logits
    over the values `model` stores (model.ref_weights), with keys and values rounded to halves
    as the CPU's default f16 KV cache holds them (kv_f16=False: as an f32 cache), memoized."""
    cache: dict = {}

    def get(model: tinymodels.TinyModel, tokens, positions=None, kv_f16=True) -> np.ndarray:
        key = (model.name, "F32" if not model.half else model.fmt, tuple(int(t) for t in tokens),
               None if positions is None else tuple(int(p) for p in positions), kv_f16)
        if key not in cache:
            cache[key] = reference.forward(model.ref_weights, model.cfg, tokens, positions,
                                           kv_f16=kv_f16)
        return cache[key]

    return get


@pytest.fixture(scope="session")
def llama_gguf(tiny):
    """The plain GQA llama model as a GGUF F32 file."""
    return tiny("llama_gqa2", "gguf-f32-v3")


@pytest.fixture(scope="session")
def llama_hf(tiny):
    """The same weights as llama_gguf as an HF F32 directory."""
    return tiny("llama_gqa2", "hf-f32")


@pytest.fixture(scope="session")
def qwen_hf(tiny):
    return tiny("qwen2", "hf-f32")


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """helpers.write_pair's target and drafts (a perturbed copy, a smaller model), loaded."""
    return helpers.write_pair(tmp_path_factory.mktemp("draft"))


def real_model(thing: str, env: str, alias: str, what: str) -> str:
    """A real model file: $`env` if set, else specdec's own resolution of `alias` (an installed
    package, the cache, or a one-time download from the package index). Tests that need it are
    skipped, with the reason, when it cannot be had (offline), or fail when SPECDEC_REQUIRE
    names `thing`."""
    p = os.environ.get(env)
    if p:
        if not os.path.isfile(p):
            helpers.missing(thing, f"{env}={p} is not a file")
        return p
    from specdec import hub

    try:
        return hub.resolve(alias)
    except OSError as e:
        helpers.missing(thing, f"{what} is not available (offline?): {e}")


@pytest.fixture(scope="session")
def smollm2_path() -> str:
    """The real SmolLM2-135M-Instruct GGUF (98 MB; $SPECDEC_SMOLLM2_GGUF or the default alias)."""
    from specdec import hub

    return real_model("smollm2", "SPECDEC_SMOLLM2_GGUF", hub.DEFAULT_MODEL,
                      "SmolLM2-135M-Instruct")


@pytest.fixture(scope="session")
def gemma3_path() -> str:
    """The real Gemma-3-270M Q4_K_M GGUF (253 MB; $SPECDEC_GEMMA3_GGUF or the "gemma-3-270m"
    alias, which assembles it from its four chunk packages)."""
    return real_model("gemma3", "SPECDEC_GEMMA3_GGUF", "gemma-3-270m", "Gemma-3-270M")


LLAMACPP_FIXTURE = Path(__file__).parent / "fixtures" / "smollm2_llamacpp.json"


@pytest.fixture(scope="session")
def llamacpp_fx() -> dict:
    """llama.cpp's view of SmolLM2-135M-Instruct: tokens, top-20 logits (batched and one token at
    a time) and greedy continuations of 10 prompts, recorded by tools/llamacpp_reference.py.
    It is committed with the tests, so a missing file fails the tests that use it."""
    if not LLAMACPP_FIXTURE.is_file():
        pytest.fail(f"the committed fixture tests/fixtures/{LLAMACPP_FIXTURE.name} (llama.cpp's "
                    "tokens and logits of SmolLM2) is missing", pytrace=False)
    return json.loads(LLAMACPP_FIXTURE.read_text())


@pytest.fixture(scope="session")
def llamacpp_model(smollm2_path, llamacpp_fx):
    """SmolLM2-135M-Instruct loaded from the very file llamacpp_fx was recorded from."""
    import specdec

    if specdec.hub.sha256_of(smollm2_path) != llamacpp_fx["model_sha256"]:
        pytest.fail(f"{smollm2_path} is not the file the fixture was recorded from")
    return specdec.load(smollm2_path)
