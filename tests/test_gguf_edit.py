"""specdec.gguf_edit.truncate_layers: a GGUF cut to its first layers is the model those layers
make (bit for bit the logits of the same weights written with fewer layers), works as a
DraftModel that drafts exactly what LayerSkip drafts with as many layers, and bad requests are
refused by name."""

from __future__ import annotations

import numpy as np
import pytest

import specdec
import tinymodels as tm
from specdec import testing
from specdec.gguf_edit import truncate_layers

CFG = tm.TinyConfig(arch="llama", vocab=40, dim=32, n_layers=3, n_heads=4, n_kv_heads=2, ffn=64,
                    context_length=96)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("edit")
    w = tm.make_weights(CFG, 41)
    full = d / "full.gguf"
    testing.write_gguf(str(full), CFG, w, dtype="F16")
    one = d / "one.gguf"
    cfg1 = tm.TinyConfig(**{**CFG.__dict__, "n_layers": 1})
    w1 = {k: v for k, v in w.items() if ".layers." not in k or ".layers.0." in k}
    testing.write_gguf(str(one), cfg1, w1, dtype="F16")
    cut = d / "cut.gguf"
    truncate_layers(str(full), str(cut), 1)
    return full, one, cut


def test_truncated_file_is_the_smaller_model(files):
    full, one, cut = files
    m = specdec.load(str(cut))
    assert m.config.n_layers == 1
    tokens = tm.random_tokens(CFG.vocab, 17, 3)
    np.testing.assert_array_equal(m.logits(tokens), specdec.load(str(one)).logits(tokens))
    assert not np.array_equal(m.logits(tokens), specdec.load(str(full)).logits(tokens))


def test_truncated_draft_drafts_what_layerskip_drafts(files):
    full, _, cut = files
    target, draft = specdec.load(str(full)), specdec.load(str(cut))
    prompt = tm.random_tokens(CFG.vocab, 9, 4)
    a = specdec.generate(target, prompt, max_new_tokens=30, stop_tokens=[],
                         speculator=specdec.DraftModel(draft, k=3, verify_slope=0))
    b = specdec.generate(target, prompt, max_new_tokens=30, stop_tokens=[],
                         speculator=specdec.LayerSkip(1, k=3, verify_slope=0))
    assert a.tokens == b.tokens
    assert (a.stats.steps, a.stats.drafted, a.stats.accepted) == \
        (b.stats.steps, b.stats.drafted, b.stats.accepted)


def test_bad_requests(files, tmp_path):
    full, _, _ = files
    for n in (0, 4):
        with pytest.raises(ValueError, match=r"n_layers must be in \[1, 3\]"):
            truncate_layers(str(full), str(tmp_path / "x.gguf"), n)
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"NOPE" + bytes(60))
    with pytest.raises(ValueError, match="not a GGUF file"):
        truncate_layers(str(bad), str(tmp_path / "y.gguf"), 1)
    short = tmp_path / "short.gguf"
    short.write_bytes(full.read_bytes()[:100])
    with pytest.raises(ValueError, match="truncated GGUF"):
        truncate_layers(str(short), str(tmp_path / "z.gguf"), 1)


def test_truncated_smollm2_loads_and_agrees_with_layerskip(smollm2_path, tmp_path):
    cut = tmp_path / "smol20.gguf"
    truncate_layers(smollm2_path, str(cut), 20)
    target, draft = specdec.load(smollm2_path), specdec.load(str(cut))
    assert draft.config.n_layers == 20 and draft.tokenizer is not None
    msgs = [{"role": "user", "content": "Name three colours."}]
    a = specdec.generate(target, msgs, max_new_tokens=20, speculator=specdec.DraftModel(draft, k=3, verify_slope=0))
    b = specdec.generate(target, msgs, max_new_tokens=20, speculator=specdec.LayerSkip(20, k=3, verify_slope=0))
    plain = specdec.generate(target, msgs, max_new_tokens=20)
    assert a.tokens == b.tokens == plain.tokens
    assert (a.stats.drafted, a.stats.accepted) == (b.stats.drafted, b.stats.accepted)
