"""Bad files and bad arguments raise the documented exception type with a message that names
the problem. Each corrupt file is written fresh into the test's tmp_path."""

from __future__ import annotations

import re
import struct

import numpy as np
import pytest

import specdec
import tinymodels
from tinymodels import CONFIGS, make_weights, patch_file, truncate_file, write_gguf, write_hf

BASE = "llama_gqa2"  # D=32, F=64, H=4, Hkv=2, V=64, context 64
QWEN = "qwen2"


def weights(name=BASE):
    return make_weights(CONFIGS[name], 5)


def gguf(tmp_path, name=BASE, **kw):
    """Write a GGUF of config `name`; returns (path, layout)."""
    w = kw.pop("w", None) or weights(name)
    p = tmp_path / "model.gguf"
    layout = write_gguf(p, CONFIGS[name], w, **kw)
    return p, layout


def hf(tmp_path, name=BASE, **kw):
    w = kw.pop("w", None) or weights(name)
    return write_hf(tmp_path / "hfmodel", CONFIGS[name], w, **kw)


def load(path):
    return specdec.load(str(path))


def test_valid_base_files_load(tmp_path):
    """Control: the uncorrupted files the cases below start from do load."""
    p, _ = gguf(tmp_path)
    assert load(p).config.n_layers == 2
    files = hf(tmp_path)
    assert load(files.dir).config.n_layers == 2


# ---- nonexistent path ----------------------------------------------------------------------


@pytest.mark.parametrize("what", ["gguf-file", "hf-dir"])
def test_nonexistent_path(tmp_path, what):
    p = tmp_path / ("nope.gguf" if what == "gguf-file" else "no_such_model_dir")
    with pytest.raises(FileNotFoundError, match=re.escape(str(p))) as ei:
        load(p)
    assert isinstance(ei.value, OSError)


# ---- GGUF structure ------------------------------------------------------------------------


def _cut_points(layout: tinymodels.GGUFLayout) -> dict[str, int]:
    tokens_start, tokens_end = layout.kv_offsets["tokenizer.ggml.tokens"]
    nested_start, nested_end = layout.kv_offsets["specdec.test.nested"]
    first_info_start, first_info_end = layout.tensor_info_offsets[layout.tensor_order[0]]
    last = layout.tensor_order[-1]
    return {
        "header-in-n_tensors": 12,
        "header-in-n_kv": 20,
        "metadata-first-key": layout.kv_start + 5,
        "metadata-in-string-array": (tokens_start + tokens_end) // 2,
        "metadata-in-nested-array": nested_end - 3,
        "metadata-end": layout.tensor_info_start,  # all kv pairs, no tensor info
        "tensor-infos-first-name": first_info_start + 10,
        "tensor-infos-middle": (layout.tensor_info_start + layout.tensor_info_end) // 2,
        "tensor-infos-last-offset": layout.offset_field_pos[last] + 4,
    }


_CUTS = ["header-in-n_tensors", "header-in-n_kv", "metadata-first-key", "metadata-in-string-array",
         "metadata-in-nested-array", "metadata-end", "tensor-infos-first-name", "tensor-infos-middle",
         "tensor-infos-last-offset"]


@pytest.mark.parametrize("where", _CUTS)
def test_gguf_truncated(tmp_path, where):
    """A GGUF cut inside the header, the metadata or the tensor infos: ValueError 'truncated'."""
    p, layout = gguf(tmp_path)
    cut = _cut_points(layout)[where]
    assert 0 < cut < layout.data_start
    truncate_file(p, cut)
    with pytest.raises(ValueError, match="(?i)truncated"):
        load(p)


def test_gguf_bad_magic(tmp_path):
    p, _ = gguf(tmp_path, magic=b"GGUX")
    with pytest.raises(ValueError, match="(?i)magic"):
        load(p)


@pytest.mark.parametrize("version", [1, 4])
def test_gguf_unsupported_version(tmp_path, version):
    p, _ = gguf(tmp_path, version=version)
    with pytest.raises(ValueError, match="(?i)version"):
        load(p)


@pytest.mark.parametrize("how", ["cut-in-data", "offset-past-end", "offset-overflow"])
def test_gguf_tensor_data_past_end(tmp_path, how):
    """A tensor whose data extent (offset + size) lies past the end of the file: ValueError
    'end of file' — whether the file is cut inside the data section or an offset is patched
    (also to a value where offset + size overflows 64 bits)."""
    p, layout = gguf(tmp_path)
    last = max(layout.tensor_data, key=lambda n: layout.tensor_data[n][0])
    off, nbytes = layout.tensor_data[last]
    if how == "cut-in-data":
        truncate_file(p, layout.data_start + off + nbytes // 2)
    elif how == "offset-past-end":
        far = (layout.size // 32 + 1) * 32
        patch_file(p, layout.offset_field_pos[last], struct.pack("<Q", far))
    else:
        patch_file(p, layout.offset_field_pos[last], struct.pack("<Q", 2**64 - 32))
    with pytest.raises(ValueError, match="(?i)end of file"):
        load(p)


@pytest.mark.parametrize(
    "name,tensor",
    [(BASE, "blk.0.ffn_up.weight"), (BASE, "output_norm.weight"), (BASE, "blk.1.attn_v.weight"),
     (QWEN, "blk.1.attn_k.bias")],
)
def test_gguf_missing_tensor(tmp_path, name, tensor):
    p, _ = gguf(tmp_path, name, drop=[tensor])
    with pytest.raises(ValueError, match=r"(?i)missing tensor") as ei:
        load(p)
    assert tensor in str(ei.value)


def _bad_shapes(name):
    """Weight edits giving a wrong shape: (hf tensor name, gguf tensor name, edit)."""
    cfg = CONFIGS[name]
    return {
        "transposed": ("model.layers.0.mlp.up_proj.weight", "blk.0.ffn_up.weight", lambda a: a.T.copy()),
        "extra-rows": ("model.layers.1.self_attn.k_proj.weight", "blk.1.attn_k.weight",
                       lambda a: np.concatenate([a, a[: cfg.head_dim * cfg.n_kv_heads // 2]])),
        "short-norm": ("model.layers.0.input_layernorm.weight", "blk.0.attn_norm.weight", lambda a: a[:-1].copy()),
        "short-embedding-cols": ("model.embed_tokens.weight", "token_embd.weight", lambda a: a[:, :-2].copy()),
    }


@pytest.mark.parametrize("case", list(_bad_shapes(BASE)))
def test_gguf_wrong_shape(tmp_path, case):
    hf_name, g_name, edit = _bad_shapes(BASE)[case]
    w = weights()
    w[hf_name] = edit(w[hf_name])
    p, _ = gguf(tmp_path, w=w)
    with pytest.raises(ValueError, match="(?i)shape") as ei:
        load(p)
    assert g_name in str(ei.value)


def test_gguf_unknown_architecture(tmp_path):
    p, _ = gguf(tmp_path, arch="gpt5")
    with pytest.raises(ValueError, match="(?i)architecture") as ei:
        load(p)
    assert "gpt5" in str(ei.value)


# ---- Hugging Face directory ----------------------------------------------------------------


@pytest.mark.parametrize(
    "name,tensor,shards",
    [(BASE, "model.layers.0.mlp.up_proj.weight", 1), (BASE, "model.norm.weight", 1),
     (BASE, "model.layers.1.self_attn.v_proj.weight", 3), (QWEN, "model.layers.1.self_attn.k_proj.bias", 1)],
)
def test_hf_missing_tensor(tmp_path, name, tensor, shards):
    files = hf(tmp_path, name, drop=[tensor], shards=shards)
    with pytest.raises(ValueError, match=r"(?i)missing tensor") as ei:
        load(files.dir)
    assert tensor in str(ei.value)


@pytest.mark.parametrize("case", list(_bad_shapes(BASE)))
def test_hf_wrong_shape(tmp_path, case):
    hf_name, _, edit = _bad_shapes(BASE)[case]
    w = weights()
    w[hf_name] = edit(w[hf_name])
    files = hf(tmp_path, w=w)
    with pytest.raises(ValueError, match="(?i)shape") as ei:
        load(files.dir)
    assert hf_name in str(ei.value)


def test_hf_unknown_architecture(tmp_path):
    files = hf(tmp_path, config_overrides={"model_type": "gpt5", "architectures": ["Gpt5ForCausalLM"]})
    with pytest.raises(ValueError, match="(?i)architecture") as ei:
        load(files.dir)
    assert "gpt5" in str(ei.value).lower()


@pytest.mark.parametrize("where", ["in-size-field", "in-header", "in-data", "sharded-in-data"])
def test_safetensors_truncated(tmp_path, where):
    files = hf(tmp_path, shards=2 if where.startswith("sharded") else 1)
    f = files.files[-1]
    size = f.stat().st_size
    (n,) = struct.unpack("<Q", f.read_bytes()[:8])
    cut = {"in-size-field": 4, "in-header": 8 + n // 2, "in-data": size - 10, "sharded-in-data": size - 10}[where]
    truncate_file(f, cut)
    with pytest.raises(ValueError, match="(?i)safetensors"):
        load(files.dir)


@pytest.mark.parametrize("how", ["garbage", "unterminated", "not-an-object", "header-size-huge"])
def test_safetensors_bad_header(tmp_path, how):
    """A safetensors header that is not valid JSON (same length, so the file size still adds
    up) or whose size field points past the file: ValueError naming safetensors."""
    files = hf(tmp_path)
    f = files.files[0]
    data = f.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    if how == "header-size-huge":
        patch_file(f, 0, struct.pack("<Q", 2**62))
    else:
        body = {"garbage": b"\x00\xff not json at all",
                "unterminated": b'{"__metadata__": {"format": "pt"}, "x": [1, 2',
                "not-an-object": b"[1, 2, 3]"}[how]
        patch_file(f, 8, body + b" " * (n - len(body)))
    with pytest.raises(ValueError, match="(?i)safetensors"):
        load(files.dir)


# ---- arguments -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    p = tmp_path_factory.mktemp("errs") / "m.gguf"
    write_gguf(p, CONFIGS[BASE], weights())
    return load(p)


V = CONFIGS[BASE].vocab
CTX = CONFIGS[BASE].context_length


@pytest.mark.parametrize("bad", [-1, V])
@pytest.mark.parametrize("call", ["logits", "forward", "forward-decode", "generate"])
def test_token_out_of_range(model, call, bad):
    """A token id < 0 or >= vocab_size: ValueError 'out of range'; a rejected forward leaves the
    cache as it was."""
    cache = model.new_cache()
    if call == "forward-decode":
        model.forward(cache, [1, 2, 3])
    before = cache.length
    with pytest.raises(ValueError, match="(?i)out of range"):
        if call == "logits":
            model.logits([1, 2, bad, 3])
        elif call == "generate":
            specdec.generate(model, [1, bad], max_new_tokens=2)
        elif call == "forward":
            model.forward(cache, [4, bad])
        else:
            model.forward(cache, [bad])
    assert cache.length == before


@pytest.mark.parametrize("case", ["logits", "generate", "generate-prompt-too-long"])
def test_beyond_context_length(model, case):
    """A sequence longer than the context length: ValueError 'context length'."""
    with pytest.raises(ValueError, match="(?i)context length"):
        if case == "logits":
            model.logits([1] * (CTX + 1))
        elif case == "generate":
            specdec.generate(model, [1] * (CTX - 3), max_new_tokens=4)
        else:
            specdec.generate(model, [1] * (CTX + 1), max_new_tokens=0)


def test_forward_past_capacity(model):
    """A forward that would write past the cache's capacity or context length is a ValueError
    (message not prescribed), and the cache is unchanged."""
    cache = model.new_cache()
    model.forward(cache, [1] * CTX, n_logits=0)
    assert cache.length == CTX
    with pytest.raises(ValueError):
        model.forward(cache, [2])
    assert cache.length == CTX
    small = model.new_cache(4)
    model.forward(small, [1, 2, 3])
    with pytest.raises(ValueError):
        model.forward(small, [4, 5])
    assert small.length == 3
    with pytest.raises(ValueError):
        model.forward(model.new_cache(), [1], positions=[CTX])


def _bad_call(model, case):
    c = model.new_cache()
    if case == "logits-empty":
        model.logits([])
    elif case == "generate-empty-prompt":
        specdec.generate(model, [], max_new_tokens=2)
    elif case == "generate-negative-max":
        specdec.generate(model, [1], max_new_tokens=-1)
    elif case == "rollback-past-length":
        model.forward(c, [1, 2])
        c.rollback(3)
    elif case == "rollback-negative":
        c.rollback(-1)
    elif case == "cache-zero-slots":
        model.new_cache(0)
    elif case == "cache-beyond-context":
        model.new_cache(CTX + 1)
    elif case == "forward-empty":
        model.forward(c, [])
    elif case == "forward-mask-wrong-rows":
        model.forward(c, [1, 2], mask=np.ones((3, 2), dtype=bool))
    elif case == "forward-positions-wrong-length":
        model.forward(c, [1, 2], positions=[0])
    elif case == "forward-slots-wrong-length":
        model.forward(c, [1, 2], slots=[0, 1, 2])
    elif case == "forward-duplicate-slots":
        model.forward(c, [1, 2], positions=[0, 1], slots=[0, 0])
    elif case == "forward-n-logits-too-many":
        model.forward(c, [1, 2], n_logits=3)
    elif case == "forward-n-logits-negative":
        model.forward(c, [1, 2], n_logits=-1)
    else:
        raise AssertionError(case)


@pytest.mark.parametrize(
    "case",
    ["logits-empty", "generate-empty-prompt", "generate-negative-max", "rollback-past-length",
     "rollback-negative", "cache-zero-slots", "cache-beyond-context", "forward-empty",
     "forward-mask-wrong-rows", "forward-positions-wrong-length", "forward-slots-wrong-length",
     "forward-duplicate-slots", "forward-n-logits-too-many", "forward-n-logits-negative"],
)
def test_invalid_arguments(model, case):
    """Arguments outside the documented domains (specdec.h) are ValueErrors; the message is
    not prescribed."""
    with pytest.raises(ValueError):
        _bad_call(model, case)


@pytest.mark.parametrize("type_id,name", [(9, "Q8_1"), (24, "I8")])
def test_gguf_unsupported_tensor_type_is_named(tmp_path, type_id, name):
    """A tensor of a ggml type whose layout is known but which specdec cannot compute with: the
    error names the tensor and the type (the file itself is consistent)."""
    p, layout = gguf(tmp_path)
    tname = "blk.0.attn_q.weight"
    patch_file(p, layout.offset_field_pos[tname] - 4, struct.pack("<I", type_id))
    with pytest.raises(ValueError, match=rf"(?i){re.escape(tname)}.*{name}.*cannot compute"):
        load(p)
