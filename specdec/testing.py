"""Random models written as real model files, for tests, demos and benchmarks.

specdec's test suite, ``python -m specdec demo`` and the benchmarks need models without a model
hub: this module makes random weights in Hugging Face naming and ``[out, in]`` layout and writes
them as

* a Hugging Face model directory (config.json + model.safetensors, or shards + index), F32, F16
  or BF16;
* a GGUF v2/v3 file laid out the way llama.cpp's converter writes it (q/k rows permuted for the
  llama architecture), F32 or F16 matrices with F32 norms.

Both writers take hooks that produce corrupt variants and return where they put things, so tests
can cut or patch files at known places. Only NumPy is needed.
"""

from __future__ import annotations

import dataclasses
import json
import struct
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

@dataclass(frozen=True)
class RandomModelConfig:
    """Shape and hyper-parameters of a random llama/qwen2/qwen3/gemma2/gemma3/phi3/smollm3/
    granite model."""

    arch: str = "llama"  # "llama", "qwen2", "qwen3", "gemma2", "gemma3", "phi3", "smollm3",
    #                      or "granite"
    vocab: int = 64
    dim: int = 32
    n_layers: int = 2
    n_heads: int = 4
    n_kv_heads: int = 2
    ffn: int = 64
    context_length: int = 64
    rope_theta: float = 10000.0
    rms_eps: float = 1e-5
    tied: bool = False
    head_size: int = 0  # explicit head dimension (qwen3 sets one apart); 0: dim // n_heads

    @property
    def head_dim(self) -> int:
        return self.head_size or self.dim // self.n_heads

    @property
    def has_qk_norm(self) -> bool:
        return self.arch in ("qwen3", "gemma3")

    @property
    def is_gemma(self) -> bool:
        return self.arch in ("gemma2", "gemma3")

    @property
    def has_bias(self) -> bool:
        return self.arch == "qwen2"

    def replace(self, **kw) -> "RandomModelConfig":
        return dataclasses.replace(self, **kw)


def random_weights(cfg: RandomModelConfig, seed: int) -> dict[str, np.ndarray]:
    """Random float32 weights in Hugging Face naming and [out, in] layout.

    Matrices are N(0, 1/fan_in) so every projection of a unit-RMS vector is O(1); norms are
    1 +- 0.1 (uniform); the embedding is N(0, 1); q/k biases (qwen2) N(0, 0.5^2) so they move the
    scores visibly. The output head is scaled up (x2) so logits spread over a few units and the
    greedy argmax has a clear margin.
    """
    assert (cfg.head_size or cfg.dim % cfg.n_heads == 0) and cfg.head_dim % 2 == 0
    assert cfg.n_heads % cfg.n_kv_heads == 0
    rng = np.random.default_rng(seed)
    D, F, V = cfg.dim, cfg.ffn, cfg.vocab
    H, Hkv, Dh = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim

    def mat(out_f, in_f, scale=1.0):
        return (rng.standard_normal((out_f, in_f)) * (scale / np.sqrt(in_f))).astype(np.float32)

    # gemma's norms scale by (1 + w): its stored weights are the small w
    base = 0.0 if cfg.is_gemma else 1.0

    def norm(n):
        return (base + rng.uniform(-0.1, 0.1, size=n)).astype(np.float32)

    w: dict[str, np.ndarray] = {}
    w["model.embed_tokens.weight"] = rng.standard_normal((V, D)).astype(np.float32)
    for i in range(cfg.n_layers):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = norm(D)
        w[p + "self_attn.q_proj.weight"] = mat(H * Dh, D, 1.5)
        w[p + "self_attn.k_proj.weight"] = mat(Hkv * Dh, D, 1.5)
        w[p + "self_attn.v_proj.weight"] = mat(Hkv * Dh, D)
        if cfg.has_bias:
            w[p + "self_attn.q_proj.bias"] = (rng.standard_normal(H * Dh) * 0.5).astype(np.float32)
            w[p + "self_attn.k_proj.bias"] = (rng.standard_normal(Hkv * Dh) * 0.5).astype(np.float32)
            w[p + "self_attn.v_proj.bias"] = (rng.standard_normal(Hkv * Dh) * 0.5).astype(np.float32)
        w[p + "self_attn.o_proj.weight"] = mat(D, H * Dh)
        if cfg.has_qk_norm:  # only qwen3 draws these: the other archs' weights are unchanged
            w[p + "self_attn.q_norm.weight"] = norm(Dh)
            w[p + "self_attn.k_norm.weight"] = norm(Dh)
        w[p + "post_attention_layernorm.weight"] = norm(D)
        w[p + "mlp.gate_proj.weight"] = mat(F, D)
        w[p + "mlp.up_proj.weight"] = mat(F, D)
        w[p + "mlp.down_proj.weight"] = mat(D, F)
        if cfg.is_gemma:  # sandwich norms (post_attention_layernorm is the post-norm)
            w[p + "pre_feedforward_layernorm.weight"] = norm(D)
            w[p + "post_feedforward_layernorm.weight"] = norm(D)
    w["model.norm.weight"] = norm(D)
    if not cfg.tied:
        w["lm_head.weight"] = mat(V, D, 2.0)
    # tied: the N(0, 1) embedding rows against a unit-RMS final state give logits of spread
    # ~sqrt(D), already well separated
    if cfg.arch == "phi3":  # the same values, stacked as Phi-3 stores them
        for i in range(cfg.n_layers):
            a, m = f"model.layers.{i}.self_attn.", f"model.layers.{i}.mlp."
            w[a + "qkv_proj.weight"] = np.concatenate(
                [w.pop(a + x + "_proj.weight") for x in "qkv"])
            w[m + "gate_up_proj.weight"] = np.concatenate(
                [w.pop(m + "gate_proj.weight"), w.pop(m + "up_proj.weight")])
    return w



def f32_to_bf16_bits(a: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit patterns (uint16), round to nearest, ties to even."""
    bits = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounding = 0x7FFF + ((bits >> 16) & 1)
    return ((bits + rounding) >> 16).astype(np.uint16)


def bf16_bits_to_f32(b: np.ndarray) -> np.ndarray:
    return (np.asarray(b, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def round_to(a: np.ndarray, dtype: str) -> np.ndarray:
    """The float32 values a tensor has after being stored as `dtype` ("F32", "F16", "BF16")."""
    a = np.asarray(a, dtype=np.float32)
    if dtype == "F32":
        return a.copy()
    if dtype == "F16":
        return a.astype(np.float16).astype(np.float32)
    if dtype == "BF16":
        return bf16_bits_to_f32(f32_to_bf16_bits(a))
    raise ValueError(dtype)


def encode(a: np.ndarray, dtype: str) -> bytes:
    """Little-endian bytes of `a` stored as `dtype`."""
    a = np.ascontiguousarray(a, dtype=np.float32)
    if dtype == "F32":
        return a.astype("<f4").tobytes()
    if dtype == "F16":
        return a.astype("<f2").tobytes()
    if dtype == "BF16":
        return f32_to_bf16_bits(a).astype("<u2").tobytes()
    raise ValueError(dtype)



ST_DTYPE_SIZE = {"F32": 4, "F16": 2, "BF16": 2}


def safetensors_bytes(tensors: dict[str, np.ndarray], dtype: str, metadata=None) -> bytes:
    """A safetensors file holding `tensors` (float32 arrays) stored as `dtype`.

    Layout: u64 LE header size N, N bytes of JSON (space-padded to a multiple of 8), data.
    """
    header: dict = {"__metadata__": dict(metadata or {"format": "pt"})}
    blobs = []
    pos = 0
    for name, arr in tensors.items():
        b = encode(arr, dtype)
        header[name] = {"dtype": dtype, "shape": list(arr.shape), "data_offsets": [pos, pos + len(b)]}
        blobs.append(b)
        pos += len(b)
    hj = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hj += b" " * ((-len(hj)) % 8)
    return struct.pack("<Q", len(hj)) + hj + b"".join(blobs)



def hf_config_dict(cfg: RandomModelConfig, dtype: str = "F32") -> dict:
    torch_dtype = {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}[dtype]
    arch_class = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
                  "qwen3": "Qwen3ForCausalLM"}[cfg.arch]
    d = {
        "architectures": [arch_class],
        "model_type": cfg.arch,
        "hidden_size": cfg.dim,
        "intermediate_size": cfg.ffn,
        "num_attention_heads": cfg.n_heads,
        "num_key_value_heads": cfg.n_kv_heads,
        "num_hidden_layers": cfg.n_layers,
        "rms_norm_eps": cfg.rms_eps,
        "rope_theta": cfg.rope_theta,
        "max_position_embeddings": cfg.context_length,
        "vocab_size": cfg.vocab,
        "tie_word_embeddings": cfg.tied,
        "torch_dtype": torch_dtype,
        "hidden_act": "silu",
        "bos_token_id": 1,
        "eos_token_id": 2,
        "initializer_range": 0.02,
        "use_cache": True,
    }
    if cfg.head_size:
        d["head_dim"] = cfg.head_size
    if cfg.arch == "llama":
        d["attention_bias"] = False
        d["mlp_bias"] = False
        d["rope_scaling"] = None
    else:
        if cfg.arch == "qwen3":
            d["attention_bias"] = False
        d["use_sliding_window"] = False
        d["sliding_window"] = cfg.context_length
        d["max_window_layers"] = cfg.n_layers
        d["attention_dropout"] = 0.0
    return d


@dataclass
class HFFiles:
    dir: Path
    config: Path
    files: list[Path]  # the safetensors file(s), in shard order
    weight_map: dict[str, str]  # tensor name -> file name


def write_hf(
    dirpath,
    cfg: RandomModelConfig,
    weights: dict[str, np.ndarray],
    dtype: str = "F32",
    shards: int = 1,
    *,
    config_overrides: dict | None = None,
    drop: tuple | list | set = (),
) -> HFFiles:
    """Write a Hugging Face model directory.

    `weights` are written exactly as given (pass a modified dict for wrong shapes); `drop` names
    tensors to leave out; `config_overrides` replaces/adds config.json keys (None values delete).
    Tensors are written sorted by name (as the safetensors library does) and, when sharded,
    split into `shards` contiguous groups.
    """
    d = Path(dirpath)
    d.mkdir(parents=True, exist_ok=True)
    conf = hf_config_dict(cfg, dtype)
    for k, v in (config_overrides or {}).items():
        if v is None:
            conf.pop(k, None)
        else:
            conf[k] = v
    (d / "config.json").write_text(json.dumps(conf, indent=2))

    names = sorted(n for n in weights if n not in set(drop))
    files: list[Path] = []
    weight_map: dict[str, str] = {}
    if shards <= 1:
        p = d / "model.safetensors"
        p.write_bytes(safetensors_bytes({n: weights[n] for n in names}, dtype))
        files.append(p)
        weight_map = {n: p.name for n in names}
    else:
        groups = np.array_split(np.arange(len(names)), shards)
        total = 0
        for k, idx in enumerate(groups):
            fname = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
            part = {names[j]: weights[names[j]] for j in idx}
            p = d / fname
            p.write_bytes(safetensors_bytes(part, dtype))
            files.append(p)
            for n in part:
                weight_map[n] = fname
                total += part[n].size * ST_DTYPE_SIZE[dtype]
        index = {"metadata": {"total_size": int(total)}, "weight_map": weight_map}
        (d / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    return HFFiles(dir=d, config=d / "config.json", files=files, weight_map=weight_map)



GGUF_U8, GGUF_I8, GGUF_U16, GGUF_I16, GGUF_U32, GGUF_I32, GGUF_F32, GGUF_BOOL = range(8)
GGUF_STRING, GGUF_ARRAY, GGUF_U64, GGUF_I64, GGUF_F64 = 8, 9, 10, 11, 12

_SCALAR_FMT = {
    GGUF_U8: "<B", GGUF_I8: "<b", GGUF_U16: "<H", GGUF_I16: "<h", GGUF_U32: "<I",
    GGUF_I32: "<i", GGUF_F32: "<f", GGUF_BOOL: "<?", GGUF_U64: "<Q", GGUF_I64: "<q",
    GGUF_F64: "<d",
}

GGML_F32, GGML_F16 = 0, 1
GGML_TYPE = {"F32": GGML_F32, "F16": GGML_F16}
GGML_SIZE = {GGML_F32: 4, GGML_F16: 2}


@dataclass
class Arr:
    """A GGUF array value: element type and a list of elements (an element of an array of
    arrays is itself an Arr)."""

    elem_type: int
    items: list


def _gstr(s: str | bytes) -> bytes:
    b = s.encode("utf-8") if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


def _gvalue(vtype: int, value) -> bytes:
    if vtype == GGUF_STRING:
        return _gstr(value)
    if vtype == GGUF_ARRAY:
        assert isinstance(value, Arr)
        out = struct.pack("<IQ", value.elem_type, len(value.items))
        return out + b"".join(_gvalue(value.elem_type, x) for x in value.items)
    return struct.pack(_SCALAR_FMT[vtype], value)


def permute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp convert_hf_to_gguf's LlamaModel.permute: reorder the rows of each head from
    HF's rotate-half layout (i, i + Dh/2) to interleaved pairs (2i, 2i + 1)."""
    if w.ndim == 1:
        rows = w.shape[0]
        return w.reshape(n_head, 2, rows // n_head // 2).swapaxes(1, 2).reshape(rows).copy()
    rows, cols = w.shape
    return w.reshape(n_head, 2, rows // n_head // 2, cols).swapaxes(1, 2).reshape(rows, cols).copy()


HF_TO_GGUF_LAYER = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
    "self_attn.qkv_proj.weight": "attn_qkv.weight",  # phi3's fused matrices
    "mlp.gate_up_proj.weight": "ffn_up.weight",
}


# gemma's sandwich norms, as llama.cpp names them (its HF post_attention_layernorm is the
# attention block's post-norm, not the MLP's pre-norm)
GEMMA3_GGUF_LAYER = {
    "post_attention_layernorm.weight": "post_attention_norm.weight",
    "pre_feedforward_layernorm.weight": "ffn_norm.weight",
    "post_feedforward_layernorm.weight": "post_ffw_norm.weight",
}


def gguf_name(hf_name: str, arch: str = "llama") -> str:
    if hf_name == "model.embed_tokens.weight":
        return "token_embd.weight"
    if hf_name == "model.norm.weight":
        return "output_norm.weight"
    if hf_name == "lm_head.weight":
        return "output.weight"
    parts = hf_name.split(".")
    assert parts[0] == "model" and parts[1] == "layers", hf_name
    suffix = ".".join(parts[3:])
    if arch in ("gemma2", "gemma3") and suffix in GEMMA3_GGUF_LAYER:
        return f"blk.{parts[2]}." + GEMMA3_GGUF_LAYER[suffix]
    return f"blk.{parts[2]}." + HF_TO_GGUF_LAYER[suffix]


def gguf_tensors(cfg: RandomModelConfig, weights: dict, dtype: str = "F32") -> list[tuple[str, np.ndarray, int]]:
    """(gguf name, float32 array in HF [out, in] layout after any llama permutation, ggml type)
    in llama.cpp's order: token_embd, blocks, output_norm, output. gemma's norms get the + 1
    of HF's (1 + w) folded in, as llama.cpp's converter does."""
    order = ["model.embed_tokens.weight"]
    for i in range(cfg.n_layers):
        for suffix in [*HF_TO_GGUF_LAYER, *GEMMA3_GGUF_LAYER]:
            if f"model.layers.{i}.{suffix}" not in order:
                order.append(f"model.layers.{i}.{suffix}")
    order += ["model.norm.weight", "lm_head.weight"]
    out = []
    for hf in order:
        if hf not in weights:
            continue
        a = np.asarray(weights[hf], dtype=np.float32)
        if cfg.arch in ("llama", "smollm3", "granite"):
            # only for the llama graph's adjacent pairs; qwen2 is rotate-half (NEOX) in llama.cpp
            if hf.endswith("self_attn.q_proj.weight") or hf.endswith("self_attn.q_proj.bias"):
                a = permute_qk(a, cfg.n_heads)
            elif hf.endswith("self_attn.k_proj.weight") or hf.endswith("self_attn.k_proj.bias"):
                a = permute_qk(a, cfg.n_kv_heads)
        if cfg.is_gemma and hf.endswith("norm.weight"):
            a = a + np.float32(1.0)
        gtype = GGML_TYPE[dtype] if a.ndim >= 2 else GGML_F32
        out.append((gguf_name(hf, cfg.arch), a, gtype))
    return out


def gguf_metadata(cfg: RandomModelConfig, arch: str | None = None, dtype: str = "F32") -> list[tuple[str, int, object]]:
    """The key/value pairs (key, gguf value type, value) of the hyper-parameters, named as
    llama.cpp names them for architecture `arch` (default cfg.arch)."""
    a = arch or cfg.arch
    V = cfg.vocab
    kv = [
        ("general.architecture", GGUF_STRING, a),
        ("general.name", GGUF_STRING, "specdec tiny test model"),
        ("general.file_type", GGUF_U32, 0 if dtype == "F32" else 1),
        ("general.quantization_version", GGUF_U32, 2),
        (f"{a}.vocab_size", GGUF_U32, V),
        (f"{a}.context_length", GGUF_U32, cfg.context_length),
        (f"{a}.embedding_length", GGUF_U32, cfg.dim),
        (f"{a}.block_count", GGUF_U32, cfg.n_layers),
        (f"{a}.feed_forward_length", GGUF_U32, cfg.ffn),
        (f"{a}.attention.head_count", GGUF_U32, cfg.n_heads),
        (f"{a}.attention.head_count_kv", GGUF_U32, cfg.n_kv_heads),
        (f"{a}.rope.dimension_count", GGUF_U32, cfg.head_dim),
        (f"{a}.rope.freq_base", GGUF_F32, cfg.rope_theta),
        (f"{a}.attention.layer_norm_rms_epsilon", GGUF_F32, cfg.rms_eps),
    ]
    if cfg.head_size:  # as llama.cpp's converter, only where config.json names a head_dim
        kv += [(f"{a}.attention.key_length", GGUF_U32, cfg.head_dim),
               (f"{a}.attention.value_length", GGUF_U32, cfg.head_dim)]
    return kv


@dataclass
class GGUFLayout:
    """Where write_gguf put things (byte offsets from the start of the file)."""

    path: Path
    size: int
    kv_start: int  # first byte of the key/value section (= end of the 24-byte header)
    kv_offsets: dict[str, tuple[int, int]]  # key -> (start, end) of that key/value pair
    tensor_info_start: int
    tensor_info_end: int
    tensor_info_offsets: dict[str, tuple[int, int]]  # name -> (start, end) of its tensor info
    offset_field_pos: dict[str, int]  # name -> position of its u64 data-offset field
    data_start: int  # start of the (aligned) data section
    tensor_data: dict[str, tuple[int, int]]  # name -> (offset relative to data_start, n bytes)
    tensor_order: list[str] = field(default_factory=list)


def write_gguf(
    path,
    cfg: RandomModelConfig,
    weights: dict[str, np.ndarray],
    dtype: str = "F32",
    version: int = 3,
    alignment: int = 32,
    *,
    magic: bytes = b"GGUF",
    arch: str | None = None,
    drop: tuple | list | set = (),
    write_alignment_key: bool | None = None,
    extra_kv: list | None = None,
    remove_kv: tuple | list | set = (),
    reverse_tensors: bool = False,
    extra_tensors: list | None = None,
) -> GGUFLayout:
    """Write a GGUF file of `weights` (HF naming/layout; converted and, for llama, q/k-permuted
    here). Hooks: `magic`/`version` written as given; `arch` overrides general.architecture and
    the key prefix; `drop` removes tensors by GGUF name; `remove_kv`/`extra_kv` edit the metadata;
    `write_alignment_key` forces general.alignment in or out (default: only when != 32);
    `reverse_tensors` writes the tensor infos and data in reverse order; `extra_tensors`
    appends (GGUF name, array) pairs as F32 (e.g. rope_freqs.weight).
    Wrong shapes: pass modified `weights`."""
    tensors = [t for t in gguf_tensors(cfg, weights, dtype) if t[0] not in set(drop)]
    tensors += [(n, np.asarray(a, dtype=np.float32), GGML_F32) for n, a in extra_tensors or []]
    if reverse_tensors:
        tensors = tensors[::-1]
    kv = [x for x in gguf_metadata(cfg, arch, dtype) if x[0] not in set(remove_kv)]
    if write_alignment_key is None:
        write_alignment_key = alignment != 32
    if write_alignment_key:
        kv.insert(1, ("general.alignment", GGUF_U32, alignment))
    kv += list(extra_kv or [])

    buf = bytearray()
    buf += magic
    buf += struct.pack("<IQQ", version, len(tensors), len(kv))
    kv_start = len(buf)
    kv_offsets = {}
    for key, vtype, value in kv:
        s = len(buf)
        buf += _gstr(key) + struct.pack("<I", vtype) + _gvalue(vtype, value)
        kv_offsets[key] = (s, len(buf))

    # data layout first (offsets relative to the data section)
    blobs = []
    tensor_data = {}
    off = 0
    for name, a, gtype in tensors:
        b = encode(a, "F32" if gtype == GGML_F32 else "F16")
        off += (-off) % alignment
        tensor_data[name] = (off, len(b))
        blobs.append((off, b))
        off += len(b)

    tensor_info_start = len(buf)
    tinfo = {}
    offset_field_pos = {}
    for name, a, gtype in tensors:
        s = len(buf)
        dims = list(reversed(a.shape))
        buf += _gstr(name) + struct.pack("<I", len(dims)) + struct.pack(f"<{len(dims)}Q", *dims)
        buf += struct.pack("<I", gtype)
        offset_field_pos[name] = len(buf)
        buf += struct.pack("<Q", tensor_data[name][0])
        tinfo[name] = (s, len(buf))
    tensor_info_end = len(buf)
    buf += b"\0" * ((-len(buf)) % alignment)
    data_start = len(buf)
    for o, b in blobs:
        buf += b"\0" * (data_start + o - len(buf))
        buf += b
    # llama.cpp pads the file end to the alignment as well
    buf += b"\0" * ((-len(buf)) % alignment)

    p = Path(path)
    p.write_bytes(bytes(buf))
    return GGUFLayout(
        path=p,
        size=len(buf),
        kv_start=kv_start,
        kv_offsets=kv_offsets,
        tensor_info_start=tensor_info_start,
        tensor_info_end=tensor_info_end,
        tensor_info_offsets=tinfo,
        offset_field_pos=offset_field_pos,
        data_start=data_start,
        tensor_data=tensor_data,
        tensor_order=[t[0] for t in tensors],
    )


# Shapes of real models, for benchmarks and demos with random weights.
SHAPES: dict[str, RandomModelConfig] = {
    # SmolLM2-135M: 30 layers, hidden 576, 9 heads x 64, 3 KV heads, SwiGLU 1536, vocab 49152,
    # tied embeddings, rope theta 100000 (the GGUF file's metadata).
    "smollm2-135m": RandomModelConfig(arch="llama", vocab=49152, dim=576, n_layers=30, n_heads=9,
                                      n_kv_heads=3, ffn=1536, context_length=8192,
                                      rope_theta=100000.0, rms_eps=1e-5, tied=True),
    # a small model that loads in a blink: the default of `python -m specdec demo`
    "tiny": RandomModelConfig(arch="llama", vocab=512, dim=64, n_layers=4, n_heads=4,
                              n_kv_heads=2, ffn=128, context_length=1024, tied=True),
}
