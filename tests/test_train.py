"""EAGLE-3 training pipeline (specdec.train, specdec.train_data, specdec.train_eagle3).

The torch-free parts are tested everywhere: the prompt set, the draft vocabulary and its
d2t/t2d, the shard format, the safetensors writer and the exported head's names, shapes and
dtypes. The head's torch implementation is checked, where torch is installed, against a float64
NumPy forward of the head written here as inference runs it (context rows, then drafted rows one
at a time over a growing cache), which is what the training-time-test masks must reproduce.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest

import helpers
from specdec import train_data as td

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TORCH_REASON = "torch is not installed (pip install specdec[train]); the training code needs it"


# --------------------------------------------------------------------------------------------
# prompts

def test_template_prompts_distinct_reproducible():
    a = td.template_prompts(300, seed=3)
    assert len(a) == 300 and len(set(a)) == 300
    assert a == td.template_prompts(300, seed=3)
    assert a != td.template_prompts(300, seed=4)
    assert all(p.strip() and "{" not in p for p in a)


def test_passage_prompts_cut_at_a_sentence():
    text = ("The sea is wide. " * 60).strip()
    ps = td.passage_prompts([text, "too short"], 5, seed=1)
    assert len(ps) == 1  # one usable passage, at most one prompt per usable passage
    body = ps[0].split("\n\n", 1)[1]
    assert len(body) <= 600 and body.endswith(".")


def test_long_passage_prompts():
    passages = [f"Passage {i}. " + "Some words of it. " * (12 + i) for i in range(40)]
    a = td.long_passage_prompts(passages + ["short"], 30, seed=1)
    assert a == td.long_passage_prompts(passages, 30, seed=1) and len(a) == 30
    assert a != td.long_passage_prompts(passages, 30, seed=2)
    for p in a:
        used = [i for i in range(40) if f"Passage {i}. " in p]
        assert len(used) >= 2 and all(p.count(f"Passage {i}. ") == 1 for i in used)
        assert 1500 <= len(p) <= 4000 + 1000  # the last passage may overshoot
    assert any("Document 2:" in p for p in a) and any("Document 1:" not in p for p in a)
    assert td.long_passage_prompts(passages[:1] + ["short"], 5) == []


def test_english_sentences_and_usable_translations():
    text = ("The first line is long enough to keep here. short. And this one also counts as "
            "a full sentence!\nno capital letter at the start of this line.")
    got = td.english_sentences([text, "The first line is long enough to keep here."])
    assert got == ["And this one also counts as a full sentence!",  # sorted, no duplicate
                   "The first line is long enough to keep here."]
    src = "The weather was cold, but thousands of people came to watch the parade."
    good = "Das Wetter war kalt, aber tausende Menschen kamen zur Parade."
    assert td.usable_translation(src, f'"{good}"\n\nIn German: ...') == good
    assert td.usable_translation(src, None) is None
    assert td.usable_translation(src, " \n ") is None
    assert td.usable_translation(src, "Ja.") is None                       # too short
    assert td.usable_translation(src, src) is None                         # left in English
    assert td.usable_translation(src, "der Staat der Staat der Staat der Staat") is None
    assert td.usable_translation(src, good + " " + good * 3) is None       # far too long


def test_to_english_prompts(monkeypatch):
    """Each request names the language the target was asked to translate into, holds the
    translation it gave, and takes one of the tasks; unusable translations are dropped."""
    asked = []

    def fake_sample(model, prompts, *, threads, seed, max_new_tokens, temperature):
        asked.extend(prompts)
        out = []
        for i, p in enumerate(prompts):
            lang = p.split("into ")[1].split(":")[0]
            out.append(None if i % 4 == 3 else f"{lang} words number {i} zwei drei vier")
        return out

    tok = SimpleNamespace(apply_chat_template=lambda m, add_generation_prompt: m[0]["content"])
    model = SimpleNamespace(require_tokenizer=lambda: tok)
    monkeypatch.setattr(td, "_sample_each", fake_sample)
    sents = [f"Sentence number {i} is a fine English sentence." for i in range(5)]
    got = td.to_english_prompts(model, sents, 40, seed=3)
    assert len(asked) == 40 and len(got) == 30
    assert all(any(s in a for s in sents) for a in asked)
    langs = [a.split("into ")[1].split(":")[0] for a in asked]
    assert set(langs) <= set(td.LANGUAGES) and 10 <= langs.count("German") <= 30
    shapes = [t.replace("{lang}", "German").split("{s}")[0] for t in td.TO_ENGLISH_TASKS]
    for q, p in zip(got, [p for p in range(40) if p % 4 != 3]):
        lang = langs[p]
        assert q.endswith(f"{lang} words number {p} zwei drei vier")
        assert any(q.startswith(sh.replace("German", lang)) for sh in shapes)
    assert td.to_english_prompts(model, [], 5) == []


def test_eagle3_layers():
    assert td.eagle3_layers(30) == [2, 15, 27]
    assert td.eagle3_layers(32) == [2, 16, 29]


# --------------------------------------------------------------------------------------------
# draft vocabulary

def test_draft_vocab_most_frequent_with_forced_ids():
    counts = np.array([5, 0, 9, 9, 1, 7, 0, 3], np.int64)
    ids, d2t, t2d, cov = td.draft_vocab(counts, 4, always=[6])
    # 6 forced in; then by count 2 and 3 (9, tie broken by the lower id), then 5 (7)
    assert ids.tolist() == [2, 3, 5, 6]
    assert (np.arange(4) + d2t).tolist() == ids.tolist()  # target id = draft id + d2t
    assert d2t.dtype == np.int64 and t2d.dtype == bool and t2d.shape == (8,)
    assert np.flatnonzero(t2d).tolist() == ids.tolist()
    assert cov == pytest.approx((9 + 9 + 7 + 0) / counts.sum())


def test_draft_vocab_rejects_bad_size():
    with pytest.raises(ValueError, match="draft vocabulary size"):
        td.draft_vocab(np.ones(10, np.int64), 0)
    with pytest.raises(ValueError, match="draft vocabulary size"):
        td.draft_vocab(np.ones(10, np.int64), 11)


def _shard(tmp_path, name, seqs, H=4, k=3, seed=0):
    rng = np.random.default_rng(seed)
    feats = [rng.standard_normal((len(t), 3 * H)).astype(np.float32) for t, _ in seqs]
    topk = []
    for t, _ in seqs:
        lg = rng.standard_normal((len(t), 20)).astype(np.float32)
        topk.append(td.topk_rows(lg, k))
    path = os.path.join(tmp_path, name)
    td.write_shard(path, seqs, feats, topk, {"note": "test"})
    return path, feats, topk


def test_token_counts_count_answers_only(tmp_path):
    seqs = [([1, 2, 3, 4, 4], 3), ([7, 7, 4], 1)]
    path, _, _ = _shard(str(tmp_path), td.shard_name(0), seqs)
    counts = td.token_counts([td.read_shard(path)], 10)
    assert counts.tolist() == [0, 0, 0, 0, 3, 0, 0, 1, 0, 0]


# --------------------------------------------------------------------------------------------
# shards

def test_shard_roundtrip_and_listing(tmp_path):
    seqs = [([1, 2, 3, 4, 5], 2), ([9, 8, 7], 1)]
    path, feats, topk = _shard(str(tmp_path), td.shard_name(0), seqs)
    os.makedirs(os.path.join(str(tmp_path), td.shard_name(1) + ".tmp"))  # an interrupted one
    os.makedirs(os.path.join(str(tmp_path), td.shard_name(2)))           # an incomplete one
    assert td.list_shards(str(tmp_path)) == [path]
    sh = td.read_shard(path)
    assert sh.n_seqs == 2
    q = sh.seq(1)
    assert q["tokens"].tolist() == [9, 8, 7] and q["answer"] == 1
    assert q["feats"].dtype == np.float16
    np.testing.assert_allclose(q["feats"], feats[1].astype(np.float16))
    assert q["topk_ids"].tolist() == topk[1][0].tolist()
    assert sh.starts.tolist() == [0, 5, 8]
    with open(os.path.join(path, "meta.json")) as f:
        assert json.load(f) == {"note": "test"}


def test_split_shards_spreads_held_out():
    names = [f"s{i}" for i in range(10)]
    train, held = td.split_shards(names, 2)
    assert held == ["s2", "s7"] and len(train) == 8 and not set(train) & set(held)
    assert td.split_shards(names[:1], 1) == (["s0"], [])
    assert td.split_shards(names, 0) == (names, [])


def test_kept_split_holds_out_the_same_shards_when_data_is_added(tmp_path):
    work = str(tmp_path)
    names = [os.path.join(work, "data", f"shard_{i:05d}") for i in range(10)]
    train, held = td.kept_split(work, names, 2)
    assert (train, held) == td.split_shards(names, 2)
    more = names + [os.path.join(work, "data", f"shard_{i:05d}") for i in range(10, 30)]
    assert td.split_shards(more, 2)[1] != held          # a fresh split would move them
    train2, held2 = td.kept_split(work, more, 2)
    assert held2 == held and train2 == [p for p in more if p not in held]
    assert td.kept_split(work, more, 3) == td.split_shards(more, 3)  # another count: again
    assert td.kept_split(work, more, 3)[1] == td.split_shards(more, 3)[1]


def test_topk_rows_sorted_best_first():
    rng = np.random.default_rng(0)
    lg = rng.standard_normal((6, 50)).astype(np.float32)
    ids, vals = td.topk_rows(lg, 5)
    ref = np.argsort(-lg, axis=1, kind="stable")[:, :5]
    assert ids.tolist() == ref.tolist() and ids.dtype == np.int32
    np.testing.assert_array_equal(vals, np.take_along_axis(lg, ref, axis=1))


# --------------------------------------------------------------------------------------------
# export

def _cfg(H=8, nh=2, nkv=1, hd=4, F=12, V=30, Vd=10):
    target = SimpleNamespace(hidden_size=H, n_heads=nh, n_kv_heads=nkv, head_dim=hd,
                             rms_eps=np.float32(1e-5).item(), rope_theta=100000.0,
                             context_length=8192, vocab_size=V)
    return td.eagle3_config(target, F, Vd)


def _weights(cfg, seed=0):
    rng = np.random.default_rng(seed)
    shapes = td.eagle3_shapes(cfg["hidden_size"], cfg["num_attention_heads"],
                              cfg["num_key_value_heads"], cfg["head_dim"],
                              cfg["intermediate_size"], cfg["vocab_size"],
                              cfg["draft_vocab_size"])
    w = {k: (rng.standard_normal(s) * 0.3).astype(np.float32) for k, s in shapes.items()}
    for k in w:
        if k.endswith("norm.weight"):
            w[k] = 1 + 0.1 * w[k]
    ids = np.sort(rng.choice(cfg["vocab_size"], cfg["draft_vocab_size"], replace=False))
    w["d2t"] = ids - np.arange(len(ids))
    w["t2d"] = np.isin(np.arange(cfg["vocab_size"]), ids)
    return w


def test_config_matches_the_published_layout():
    cfg = _cfg(H=576, nh=9, nkv=3, hd=64, F=1536, V=49152, Vd=8192)
    assert cfg == {
        "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama",
        "hidden_size": 576, "intermediate_size": 1536, "num_attention_heads": 9,
        "num_key_value_heads": 3, "head_dim": 64, "num_hidden_layers": 1,
        "rms_norm_eps": 1e-5, "rope_theta": 100000.0, "max_position_embeddings": 8192,
        "vocab_size": 49152, "draft_vocab_size": 8192, "hidden_act": "silu",
        "tie_word_embeddings": False, "bias": False, "torch_dtype": "float16"}


def test_export_names_shapes_dtypes(tmp_path):
    cfg = _cfg()
    w = _weights(cfg)
    td.export_eagle3(str(tmp_path), w, cfg)
    with open(os.path.join(str(tmp_path), "config.json")) as f:
        assert json.load(f) == cfg
    path = os.path.join(str(tmp_path), "model.safetensors")
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    assert n % 8 == 0
    header = json.loads(raw[8:8 + n])
    H, Vd, V = 8, 10, 30
    expect = {
        "fc.weight": ("F16", [H, 3 * H]),
        "midlayer.input_layernorm.weight": ("F16", [H]),
        "midlayer.hidden_norm.weight": ("F16", [H]),
        "midlayer.self_attn.q_proj.weight": ("F16", [8, 2 * H]),
        "midlayer.self_attn.k_proj.weight": ("F16", [4, 2 * H]),
        "midlayer.self_attn.v_proj.weight": ("F16", [4, 2 * H]),
        "midlayer.self_attn.o_proj.weight": ("F16", [H, 8]),
        "midlayer.post_attention_layernorm.weight": ("F16", [H]),
        "midlayer.mlp.gate_proj.weight": ("F16", [12, H]),
        "midlayer.mlp.up_proj.weight": ("F16", [12, H]),
        "midlayer.mlp.down_proj.weight": ("F16", [H, 12]),
        "norm.weight": ("F16", [H]),
        "lm_head.weight": ("F16", [Vd, H]),
        "d2t": ("I64", [Vd]),
        "t2d": ("BOOL", [V]),
    }
    assert {k: (v["dtype"], v["shape"]) for k, v in header.items()} == expect
    # the data offsets tile the data section exactly
    spans = sorted(tuple(v["data_offsets"]) for v in header.values())
    assert spans[0][0] == 0 and all(a[1] == b[0] for a, b in zip(spans, spans[1:]))
    assert spans[-1][1] == len(raw) - 8 - n
    back = td.read_safetensors(path)
    np.testing.assert_array_equal(back["d2t"], w["d2t"])
    np.testing.assert_array_equal(back["t2d"], w["t2d"])
    np.testing.assert_array_equal(back["fc.weight"], w["fc.weight"].astype(np.float16))
    assert not any("embed" in k for k in header)


def test_export_rejects_missing_and_misshapen(tmp_path):
    cfg = _cfg()
    w = _weights(cfg)
    del w["midlayer.hidden_norm.weight"]
    with pytest.raises(ValueError, match="midlayer.hidden_norm.weight"):
        td.export_eagle3(str(tmp_path), w, cfg)
    w = _weights(cfg)
    w["lm_head.weight"] = w["lm_head.weight"][:5]
    with pytest.raises(ValueError, match=r"lm_head.weight has shape \(5, 8\)"):
        td.export_eagle3(str(tmp_path), w, cfg)


def test_safetensors_rejects_unknown_dtype(tmp_path):
    with pytest.raises(ValueError, match="'x'.*complex"):
        td.write_safetensors(os.path.join(str(tmp_path), "a.safetensors"),
                             {"x": np.zeros(2, np.complex64)})


# --------------------------------------------------------------------------------------------
# torch stays out of the library

def test_library_does_not_import_torch():
    code = ("import sys, specdec, specdec.train, specdec.train_data, specdec.train_eagle3; "
            "assert 'torch' not in sys.modules, 'torch was imported'")
    # a child importing the same specdec as this process (the installed one in CI, not the
    # source tree's, which has no built extension there)
    r = subprocess.run([sys.executable, "-c", code], env=helpers.child_env(),
                       cwd=os.path.dirname(os.path.abspath(__file__)), capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr


def test_missing_torch_says_how_to_install(monkeypatch):
    from specdec import train_eagle3
    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(ImportError, match=r"pip install specdec\[train\]"):
        train_eagle3.require_torch()


# --------------------------------------------------------------------------------------------
# the head's arithmetic (torch) against a NumPy forward written as inference runs it

def _rms(x, w, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def _rope_hf(x, pos, theta):
    # x (heads, hd); HF rotate_half pairing (i, i + hd/2)
    hd = x.shape[-1]
    inv = 1.0 / theta ** (np.arange(0, hd, 2) / hd)
    f = pos * inv
    cos, sin = np.cos(np.concatenate([f, f])), np.sin(np.concatenate([f, f]))
    rot = np.concatenate([-x[:, hd // 2:], x[:, :hd // 2]], axis=-1)
    return x * cos + rot * sin


class _NumpyHead:
    """Inference: each row appended to the head's cache, attending all cached rows."""

    def __init__(self, w, cfg, embed):
        self.w = {k: np.asarray(v, np.float64) for k, v in w.items()}
        self.c, self.embed = cfg, embed.astype(np.float64)
        self.ks, self.vs = [], []

    def row(self, x, y, pos):
        w, c = self.w, self.c
        eps, nh, nkv, hd = (c["rms_norm_eps"], c["num_attention_heads"],
                            c["num_key_value_heads"], c["head_dim"])
        h = np.concatenate([_rms(self.embed[y], w["midlayer.input_layernorm.weight"], eps),
                            _rms(x, w["midlayer.hidden_norm.weight"], eps)])
        q = (w["midlayer.self_attn.q_proj.weight"] @ h).reshape(nh, hd)
        k = (w["midlayer.self_attn.k_proj.weight"] @ h).reshape(nkv, hd)
        v = (w["midlayer.self_attn.v_proj.weight"] @ h).reshape(nkv, hd)
        q, k = _rope_hf(q, pos, c["rope_theta"]), _rope_hf(k, pos, c["rope_theta"])
        self.ks.append(k)
        self.vs.append(v)
        K, V = np.stack(self.ks), np.stack(self.vs)          # (n, nkv, hd)
        att = np.zeros((nh, hd))
        for j in range(nh):
            g = j // (nh // nkv)
            s = K[:, g] @ q[j] / np.sqrt(hd)
            p = np.exp(s - s.max())
            att[j] = (p / p.sum()) @ V[:, g]
        o1 = x + w["midlayer.self_attn.o_proj.weight"] @ att.reshape(-1)
        n = _rms(o1, w["midlayer.post_attention_layernorm.weight"], eps)
        gt = w["midlayer.mlp.gate_proj.weight"] @ n
        out = o1 + w["midlayer.mlp.down_proj.weight"] @ (
            gt / (1 + np.exp(-gt)) * (w["midlayer.mlp.up_proj.weight"] @ n))
        return out, w["lm_head.weight"] @ _rms(out, w["norm.weight"], eps)


def _build_torch_head(torch, cfg, w):
    from specdec import train_eagle3 as te
    head = te.build_head(cfg).double()
    inv = {v: k for k, v in te.EXPORT_NAMES.items()}
    with torch.no_grad():
        for name, a in w.items():
            if name in inv:
                dict(head.named_parameters())[inv[name]].copy_(torch.from_numpy(
                    np.asarray(a, np.float64)))
    return head


def test_ttt_unroll_is_inference_drafting():
    torch = pytest.importorskip("torch", reason=TORCH_REASON)
    cfg = _cfg(H=8, nh=4, nkv=2, hd=4, F=12, V=30, Vd=10)
    w = _weights(cfg, seed=1)
    rng = np.random.default_rng(2)
    T, K = 7, 3
    text = rng.integers(0, cfg["vocab_size"], T + K + 1)
    feats = rng.standard_normal((T, 3 * 8))
    embed = rng.standard_normal((cfg["vocab_size"], 8))
    head = _build_torch_head(torch, cfg, w)
    # the unroll's steps, with the real tokens as each step's y
    x = head.fc(torch.from_numpy(feats)[None])
    kv, outs = [], []
    emb_t = torch.from_numpy(embed)
    for i in range(K):
        x = head.layer(emb_t[torch.from_numpy(text[1 + i:1 + i + T])][None], x,
                       torch.arange(i, T + i), kv)
        outs.append(head.logits(x)[0].detach().numpy())
    # inference: the context rows 0..t, then a chain drafted from row t with the same tokens
    for t in range(T):
        ref = _NumpyHead(w, cfg, embed)
        for r in range(t + 1):
            out, lg = ref.row(w["fc.weight"].astype(np.float64) @ feats[r], text[r + 1], r)
        np.testing.assert_allclose(outs[0][t], lg, rtol=1e-9, atol=1e-9)
        for i in range(1, K):
            out, lg = ref.row(out, text[t + 1 + i], t + i)
            np.testing.assert_allclose(outs[i][t], lg, rtol=1e-9, atol=1e-9,
                                       err_msg=f"step {i} row {t}")


def test_ttt_would_catch_a_wrong_mask():
    # the reference is sensitive: letting a drafted row see one more row changes its logits
    cfg = _cfg(H=8, nh=4, nkv=2, hd=4, F=12, V=30, Vd=10)
    w = _weights(cfg, seed=1)
    rng = np.random.default_rng(2)
    T = 5
    text = rng.integers(0, cfg["vocab_size"], T + 3)
    feats = rng.standard_normal((T, 24))
    embed = rng.standard_normal((cfg["vocab_size"], 8))
    ref = _NumpyHead(w, cfg, embed)
    for r in range(T):
        out, _ = ref.row(w["fc.weight"].astype(np.float64) @ feats[r], text[r + 1], r)
    _, right = ref.row(out, text[T + 1], T)
    ref.ks.insert(0, ref.ks[-1])      # one more cached row seen: a different answer
    ref.vs.insert(0, ref.vs[-1])
    _, wrong = ref.row(out, text[T + 1], T)
    assert np.abs(right - wrong).max() > 1e-3


def test_batches_keep_the_answers_of_long_sequences(tmp_path):
    # a window of max_len rows: the sequence's end when its answer fits, else the answer's start
    from specdec import train_eagle3 as te
    V, kt, W = 30, 4, 6
    rng = np.random.default_rng(1)
    seqs = [(rng.integers(0, V, 40).tolist(), 30), (rng.integers(0, V, 60).tolist(), 10),
            (rng.integers(0, V, 12).tolist(), 5)]
    feats = [np.arange(len(t) * W, dtype=np.float32).reshape(len(t), W) for t, _ in seqs]
    topk = [td.topk_rows(rng.standard_normal((len(t), V)).astype(np.float32), kt)
            for t, _ in seqs]
    td.write_shard(str(tmp_path / td.shard_name(0)), seqs, feats, topk, {})
    bt = te.Batches([str(tmp_path / td.shard_name(0))], 16, 2, np.arange(V))
    b = bt.make([0, 1, 2])
    assert b["feats"].shape == (3, 16, W)
    for i, ((toks, ans), start) in enumerate(zip(seqs, (23, 9, 0))):
        np.testing.assert_array_equal(b["feats"][i, 0], feats[i][start])
        assert b["ytok"][i, 0] == toks[start + 1]
        np.testing.assert_array_equal(b["argmax"][i, 0], topk[i][0][start + 1, 0])
        # rows predicting answer tokens: all 10 of the first (rows 29..38), the window's rows
        # from the answer's start for the second, the 7 of the short third (rows 4..10)
        assert b["inans"][i].sum() == (10, 18, 7)[i], i


def test_train_and_export_end_to_end(tmp_path):
    pytest.importorskip("torch", reason=TORCH_REASON)
    from specdec import train_eagle3 as te
    work = str(tmp_path / "work")
    data = os.path.join(work, "data")
    os.makedirs(data)
    H, V, Vd = 8, 30, 10
    rng = np.random.default_rng(0)
    for s in range(3):
        seqs = [(rng.integers(0, V, 12).tolist(), 4) for _ in range(3)]
        feats = [rng.standard_normal((12, 3 * H)).astype(np.float32) for _ in seqs]
        topk = [td.topk_rows(rng.standard_normal((12, V)).astype(np.float32), 4) for _ in seqs]
        td.write_shard(os.path.join(data, td.shard_name(s)), seqs, feats, topk, {})
    counts = td.token_counts([td.read_shard(p) for p in td.list_shards(data)], V)
    ids, d2t, t2d, _ = td.draft_vocab(counts, Vd)
    np.savez(os.path.join(work, "vocab.npz"), ids=ids, d2t=d2t, t2d=t2d, counts=counts)
    np.save(os.path.join(work, "embed.npy"), rng.standard_normal((V, H)).astype(np.float32))
    with open(os.path.join(work, "target_config.json"), "w") as f:
        json.dump(_cfg(H=H, nh=2, nkv=1, hd=4, F=12, V=V, Vd=Vd), f)
    args = SimpleNamespace(torch_threads=1, seed=0, intermediate_size=12, held_out=1,
                           max_len=16, ttt=2, lr=1e-3, warmup=1, steps=3, batch=2,
                           ckpt_every=2, eval_every=2)
    out = str(tmp_path / "head")
    te.train(work, out, args)
    back = td.read_safetensors(os.path.join(out, "model.safetensors"))
    assert back["lm_head.weight"].shape == (Vd, H)
    np.testing.assert_array_equal(back["d2t"], d2t)
    rows = open(os.path.join(work, "train_log.csv")).read().splitlines()
    assert rows[0].startswith("step,") and len(rows) == 4
    assert len(open(os.path.join(work, "eval_log.csv")).read().splitlines()) == 4  # 0, 2, 3
    with open(os.path.join(work, "train_log.csv"), "a") as f:
        f.write("4,0,0,0,0,0,0,0,0,0\n")  # a row logged after the last checkpoint, then a crash
    args.steps = 4  # resumes from the step-3 checkpoint
    te.train(work, out, args)
    steps = [r.split(",")[0] for r in open(os.path.join(work, "train_log.csv")).read().splitlines()]
    assert steps == ["step", "1", "2", "3", "4"]
    for old in os.listdir(os.path.join(work, "ckpt")):
        os.remove(os.path.join(work, "ckpt", old))
    te.train(work, out, args)  # a fresh start: the earlier run's rows go
    steps = [r.split(",")[0] for r in open(os.path.join(work, "train_log.csv")).read().splitlines()]
    assert steps == ["step", "1", "2", "3", "4"]
    evals = [r.split(",")[0] for r in open(os.path.join(work, "eval_log.csv")).read().splitlines()]
    assert evals == ["step", "0", "2", "4"]


def test_check_tool_drafts_as_the_reference(tmp_path):
    # tools/eagle3_check.py reads the exported files and drafts chains in NumPy; its rows must
    # be the reference's (inference, one row at a time), and its accepted counts follow them
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    try:
        import eagle3_check
    finally:
        sys.path.pop(0)
    cfg = _cfg(H=8, nh=4, nkv=2, hd=4, F=12, V=30, Vd=30)
    w = _weights(cfg, seed=3)
    w["d2t"], w["t2d"] = np.zeros(30, np.int64), np.ones(30, bool)  # the whole vocabulary
    td.export_eagle3(str(tmp_path), w, cfg, dtype=np.float32)
    rng = np.random.default_rng(4)
    embed = rng.standard_normal((30, 8)).astype(np.float32)
    feats = rng.standard_normal((12, 24)).astype(np.float32)
    head = eagle3_check.Head(str(tmp_path), embed)
    # a text that follows the head's own greedy drafts from root row 4, two deep, then differs
    toks = list(rng.integers(0, 30, 6))
    ref = _NumpyHead(w, cfg, embed)
    for r in range(5):
        out, lg = ref.row(w["fc.weight"].astype(np.float64) @ feats[r], toks[r + 1], r)
    d1 = int(np.argmax(lg))
    toks.append(d1)                                   # text[6] = d1 (row 4 predicts text[6])
    out, lg = ref.row(out, d1, 5)
    d2 = int(np.argmax(lg))
    toks.append(d2)
    out, lg = ref.row(out, d2, 6)
    toks.append((int(np.argmax(lg)) + 1) % 30)        # the third draft is rejected
    toks += list(rng.integers(0, 30, 2))
    acc = eagle3_check.check_sequence(head, np.array(toks), feats, answer=6, depth=4)
    assert acc[0] == 2  # roots from row answer - 2 = 4 on


def test_data_stage_order_and_resume(tmp_path, monkeypatch):
    """The data stage's rounds (prompts, passage tasks, extra templates, extra target-written
    turns, long-context tasks, translations into English) take consecutive shards and
    consecutive prompt indices (which pick each answer's sampling), and a second run with the
    same work directory generates nothing again."""
    from specdec import train as cli
    made = []

    def fake_shard(model, prompts, path, **kw):
        made.append((os.path.basename(path), [i for i, _ in prompts]))
        os.makedirs(path)
        with open(os.path.join(path, "meta.json"), "w") as f:
            json.dump({"sequences": [{"index": i, "prompt": p} for i, p in prompts]}, f)
        return {"sequences": [{} for _ in prompts], "tokens": 1, "answer_tokens": 1,
                "generate_s": 0, "features_s": 0}

    monkeypatch.setattr(td, "generate_shard", fake_shard)
    monkeypatch.setattr(td, "list_shards", lambda d: sorted(
        os.path.join(d, n) for n in os.listdir(d)))
    monkeypatch.setattr(cli, "_answers_text",
                        lambda model, d, n: [f"Passage {i}. " * 30 for i in range(4)])
    monkeypatch.setattr(td, "self_user_turns",
                        lambda model, n, seed, threads: [f"own {seed} {j}" for j in range(n - 1)])
    monkeypatch.setattr(td, "to_english_prompts",
                        lambda model, sents, n, seed, threads: [f"en {seed} {j}"
                                                                for j in range(n)])
    work = str(tmp_path)
    prompts = [f"p{i}" for i in range(5)]
    kw = dict(n_passage=3, n_extra=4, n_extra_self=6, n_long=3, n_translate=3, shard_size=2,
              max_new_tokens=4, threads=1, k=2, seed=0, lookup=False)
    model = SimpleNamespace(config=SimpleNamespace(n_layers=30))
    cli.stage_data(model, work, prompts, **kw)
    assert made == [("shard_00000", [0, 1]), ("shard_00001", [2, 3]), ("shard_00002", [4]),
                    ("shard_00003", [5, 6]), ("shard_00004", [7]),
                    ("shard_00005", [8, 9]), ("shard_00006", [10, 11]),
                    ("shard_00007", [12, 13]), ("shard_00008", [14, 15]),
                    ("shard_00009", [16]), ("shard_00010", [17, 18]),
                    ("shard_00011", [19]), ("shard_00012", [20, 21]),
                    ("shard_00013", [22])]
    with open(os.path.join(work, "prompts_extra_self.json")) as f:
        assert json.load(f) == [f"own 3 {j}" for j in range(5)]
    with open(os.path.join(work, "prompts_long.json")) as f:
        assert len(json.load(f)) == 3
    with open(os.path.join(work, "prompts_to_english.json")) as f:
        assert json.load(f) == ["en 5 0", "en 5 1", "en 5 2"]
    made.clear()
    cli.stage_data(model, work, prompts, **kw)
    assert made == []
    # a round added before a later round's shards would be skipped: it raises instead
    with pytest.raises(ValueError, match="another round than 'to English'"):
        cli.stage_data(model, work, prompts, **dict(kw, n_long=0))


def test_data_shard_from_the_real_model(smollm2_path, tmp_path):
    # a shard holds the answer generate() gives and the features forward() gives for it
    import specdec
    m = specdec.load(smollm2_path)
    prompts = [(0, "Name a colour."), (3, "Count to three.")]   # index 0 and 3: greedy
    path = os.path.join(str(tmp_path), td.shard_name(0))
    meta = td.generate_shard(m, prompts, path, layers=[2, 15, 27], k=4, max_new_tokens=8,
                             threads=2, seed=0)
    assert [s["index"] for s in meta["sequences"]] == [0, 3]
    sh = td.read_shard(path)
    for s, (_, text) in enumerate(prompts):
        g = specdec.generate(m, [{"role": "user", "content": text}], max_new_tokens=8)
        q = sh.seq(s)
        assert q["tokens"].tolist() == g.prompt_tokens + g.tokens
        assert q["answer"] == len(g.prompt_tokens)
        toks = q["tokens"].tolist()
        logits, _, aux = m.forward(m.new_cache(len(toks)), toks, aux_layers=[2, 15, 27])
        want = np.concatenate([aux[0], aux[1], aux[2]], axis=1)
        np.testing.assert_allclose(q["feats"].astype(np.float32), want, rtol=2e-3, atol=2e-2)
        a = q["answer"]
        assert (q["topk_ids"][:a - 1] == -1).all()
        assert q["topk_ids"][a - 1:, 0].tolist() == logits[a - 1:].argmax(1).tolist()
        # greedy answers: the text's next token is the target's argmax
        assert q["topk_ids"][a - 1:-1, 0].tolist() == toks[a:]


def test_cli_trains_and_exports(tmp_path):
    pytest.importorskip("torch", reason=TORCH_REASON)
    from specdec import train as cli
    work = str(tmp_path / "work")
    os.makedirs(os.path.join(work, "data"))
    H, V, Vd = 8, 30, 10
    rng = np.random.default_rng(5)
    for s in range(2):
        seqs = [(rng.integers(0, V, 10).tolist(), 3) for _ in range(2)]
        td.write_shard(os.path.join(work, "data", td.shard_name(s)), seqs,
                       [rng.standard_normal((10, 3 * H)).astype(np.float32) for _ in seqs],
                       [td.topk_rows(rng.standard_normal((10, V)).astype(np.float32), 4)
                        for _ in seqs], {})
    counts = td.token_counts([td.read_shard(p) for p in td.list_shards(
        os.path.join(work, "data"))], V)
    ids, d2t, t2d, _ = td.draft_vocab(counts, Vd)
    np.savez(os.path.join(work, "vocab.npz"), ids=ids, d2t=d2t, t2d=t2d, counts=counts)
    np.save(os.path.join(work, "embed.npy"), rng.standard_normal((V, H)).astype(np.float32))
    with open(os.path.join(work, "target_config.json"), "w") as f:
        json.dump(_cfg(H=H, nh=2, nkv=1, hd=4, F=12, V=V, Vd=Vd), f)
    out = str(tmp_path / "head")
    base = ["eagle3", "--target", "unused", "--work", work, "--out", out,
            "--intermediate-size", "12", "--draft-vocab", str(Vd), "--torch-threads", "1"]
    assert cli.main(base + ["--stage", "train", "--only", "--steps", "2", "--batch", "2",
                            "--ttt", "2", "--ckpt-every", "1"]) == 0
    os.remove(os.path.join(out, "model.safetensors"))
    assert cli.main(base + ["--stage", "export", "--only"]) == 0
    cfg = json.load(open(os.path.join(out, "config.json")))
    assert cfg["intermediate_size"] == 12 and cfg["draft_vocab_size"] == Vd
    assert td.read_safetensors(os.path.join(out, "model.safetensors"))["t2d"].sum() == Vd
