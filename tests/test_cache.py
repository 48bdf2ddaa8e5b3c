"""KV cache: prefill + decode, rollback, explicit positions/slots, masked (tree) batches,
n_logits. Every result is compared with the float64 reference over the plain sequence it
stands for (and, where cheap, with Model.logits)."""

from __future__ import annotations

import numpy as np
import pytest

import specdec
from tinymodels import random_tokens, rel_err

F16_KV_TOL = 5e-4  # float32 weights, the default f16 KV cache: see test_logits.py
HALF_TOL = 1e-3

# (config, format) pairs the cache tests run on: GGUF and HF, llama (GQA, permuted q/k) and
# qwen2 (biases), F32 and half precision, awkward sizes
CACHE_MODELS = [
    ("llama_gqa2", "gguf-f32-v3"),
    ("qwen2", "hf-f32"),
    ("llama_odd", "hf-bf16"),
    ("qwen2_odd_tied", "gguf-f16-v3-align64"),
    ("llama_wide_heads", "gguf-f32-v3"),
]


def tol(t):
    return HALF_TOL if t.half else F16_KV_TOL


def load(t):
    return specdec.load(str(t.path))


@pytest.fixture(params=CACHE_MODELS, ids=lambda p: f"{p[0]}-{p[1]}")
def cm(request, tiny):
    return tiny(*request.param)


def test_new_cache_defaults(llama_gguf):
    """A new cache is empty; capacity defaults to the context length, or n_slots."""
    m = load(llama_gguf)
    c = m.new_cache()
    assert isinstance(c, specdec.KVCache)
    assert c.length == 0
    assert c.capacity == llama_gguf.cfg.context_length
    c16 = m.new_cache(16)
    assert c16.capacity == 16 and c16.length == 0
    assert m.new_cache(n_slots=5).capacity == 5


def test_prefill_then_decode(cm, ref_logits):
    """Prefill of a prompt followed by one-token decode steps gives the rows of the full
    forward over the whole sequence (reference and Model.logits); length grows by one a step."""
    m = load(cm)
    seq = random_tokens(cm.cfg.vocab, 30, seed=21)
    P = 9
    ref = ref_logits(cm, seq)
    full = m.logits(seq)
    cache = m.new_cache()
    out = m.forward(cache, seq[:P])
    assert out.dtype == np.float32 and out.shape == (P, cm.cfg.vocab)
    assert cache.length == P
    assert rel_err(out, ref[:P]) <= tol(cm)
    rows = [out]
    for i in range(P, len(seq)):
        row = m.forward(cache, [seq[i]])
        assert row.shape == (1, cm.cfg.vocab)
        assert cache.length == i + 1
        rows.append(row)
    got = np.concatenate(rows)
    assert rel_err(got, ref) <= tol(cm)
    assert rel_err(got, full) <= tol(cm)


def test_decode_in_chunks(cm, ref_logits):
    """Multi-token forwards appended to a non-empty cache (chunked prefill / verify of several
    draft tokens) give the same rows as one full forward."""
    m = load(cm)
    seq = random_tokens(cm.cfg.vocab, 33, seed=22)
    ref = ref_logits(cm, seq)
    cache = m.new_cache()
    rows, start = [], 0
    for n in (5, 3, 1, 8, 2, 14):
        rows.append(m.forward(cache, seq[start : start + n]))
        start += n
        assert cache.length == start
    assert start == len(seq)
    assert rel_err(np.concatenate(rows), ref) <= tol(cm)


def test_rollback_then_other_continuation(cm, ref_logits):
    """rollback(n) keeps slots [0, n): decoding a different continuation afterwards equals a
    fresh run over prefix + continuation; rollback(0) empties the cache."""
    m = load(cm)
    V = cm.cfg.vocab
    a = random_tokens(V, 20, seed=23)
    b = random_tokens(V, 7, seed=24)
    assert a[12] != b[0]
    cache = m.new_cache()
    m.forward(cache, a[:8])
    for tok in a[8:]:
        m.forward(cache, [tok])
    assert cache.length == 20
    cache.rollback(12)
    assert cache.length == 12
    cache.rollback(12)  # no-op
    assert cache.length == 12
    seq = a[:12] + b
    ref = ref_logits(cm, seq)
    got = np.concatenate([m.forward(cache, b[:3])] + [m.forward(cache, [t]) for t in b[3:]])
    assert cache.length == len(seq)
    assert rel_err(got, ref[12:]) <= tol(cm)
    # roll back everything and start a new sequence in the same cache
    cache.rollback(0)
    assert cache.length == 0
    c = random_tokens(V, 11, seed=25)
    assert rel_err(m.forward(cache, c), ref_logits(cm, c)) <= tol(cm)


@pytest.mark.parametrize("mask_dtype", [bool, np.uint8])
def test_tree_mask_batch(cm, ref_logits, mask_dtype):
    """A masked multi-token forward equals the separate sequences it stands for.

    After a prefill of P tokens, the branches [a1, a2] and [b1] are verified in one forward:
    tokens [a1, a2, b1] at slots P, P+1, P+2, positions P, P+1, P; a1 sees prefix+a1, a2 sees
    prefix+a1+a2, b1 sees prefix+b1. Row i equals the last logits of prompt+a1, prompt+a1+a2,
    prompt+b1. Then accepting branch a (rollback to P+2) and decoding on with default
    positions/slots equals the plain sequence prompt+a1+a2+c."""
    m = load(cm)
    V = cm.cfg.vocab
    P = 11
    prompt = random_tokens(V, P, seed=26)
    a1, a2, b1, c = 5, 17, 40, 3
    cache = m.new_cache()
    m.forward(cache, prompt)
    mask = np.zeros((3, P + 3), dtype=mask_dtype)
    mask[:, :P] = 1
    mask[0, P] = 1
    mask[1, P] = mask[1, P + 1] = 1
    mask[2, P + 2] = 1
    out = m.forward(cache, [a1, a2, b1], positions=[P, P + 1, P], slots=[P, P + 1, P + 2], mask=mask)
    assert out.shape == (3, V)
    assert cache.length == P + 3
    for row, plain in zip(out, [prompt + [a1], prompt + [a1, a2], prompt + [b1]]):
        assert rel_err(row, ref_logits(cm, plain)[-1]) <= tol(cm)
        assert rel_err(row, m.logits(plain)[-1]) <= tol(cm)
    # accept branch a: keep slots [0, P+2) and go on
    cache.rollback(P + 2)
    nxt = m.forward(cache, [c])
    assert cache.length == P + 3
    assert rel_err(nxt[0], ref_logits(cm, prompt + [a1, a2, c])[-1]) <= tol(cm)


def test_mask_two_siblings_same_position(llama_gguf, ref_logits):
    """Sibling candidates for the same position, each seeing only the prefix and itself, give
    the logits of prefix+candidate; a mask row without the sibling's slot really hides it."""
    t = llama_gguf
    m = load(t)
    P = 6
    prompt = random_tokens(t.cfg.vocab, P, seed=27)
    cands = [7, 8, 9, 10]
    cache = m.new_cache()
    m.forward(cache, prompt)
    n = len(cands)
    mask = np.zeros((n, P + n), dtype=bool)
    mask[:, :P] = True
    mask[np.arange(n), P + np.arange(n)] = True
    out = m.forward(cache, cands, positions=[P] * n, slots=list(range(P, P + n)), mask=mask)
    for i, tok in enumerate(cands):
        assert rel_err(out[i], ref_logits(t, prompt + [tok])[-1]) <= F16_KV_TOL
    # the rows do differ: hiding the siblings mattered
    assert rel_err(out[0], out[1]) > 100 * F16_KV_TOL


def test_positions_default(cm):
    """positions=None / slots=None mean cache.length + arange(T): the same as passing them."""
    m = load(cm)
    seq = random_tokens(cm.cfg.vocab, 14, seed=28)
    c1, c2 = m.new_cache(), m.new_cache()
    x1 = m.forward(c1, seq[:9])
    x2 = m.forward(c2, seq[:9], positions=np.arange(9), slots=np.arange(9))
    y1 = m.forward(c1, seq[9:])
    y2 = m.forward(c2, seq[9:], positions=list(range(9, 14)), slots=list(range(9, 14)))
    assert rel_err(x2, x1) <= 1e-6
    assert rel_err(y2, y1) <= 1e-6
    assert c1.length == c2.length == 14


def test_explicit_gapped_positions(cm, ref_logits):
    """Explicit RoPE positions are used: positions 0, 3, 6, ... (increasing, so causal by
    position is causal by order) match the reference at those positions, not at 0..T-1."""
    m = load(cm)
    seq = random_tokens(cm.cfg.vocab, 12, seed=29)
    pos = [3 * i for i in range(12)]
    ref = ref_logits(cm, seq, positions=pos)
    cache = m.new_cache()
    got = m.forward(cache, seq, positions=pos)
    assert rel_err(got, ref) <= tol(cm)
    assert rel_err(ref, ref_logits(cm, seq)) > 10 * tol(cm)  # the positions do matter


def test_slots_out_of_order(llama_gguf, ref_logits):
    """Slots are storage only: a sequence written into reversed slots (positions 0..T-1, the
    default causal-by-position mask) gives the plain logits; decoding continues from
    cache.length with the default position."""
    t = llama_gguf
    m = load(t)
    seq = random_tokens(t.cfg.vocab, 10, seed=30)
    T = 9
    ref = ref_logits(t, seq)
    cache = m.new_cache()
    got = m.forward(cache, seq[:T], positions=list(range(T)), slots=list(range(T - 1, -1, -1)))
    assert cache.length == T
    assert rel_err(got, ref[:T]) <= F16_KV_TOL
    nxt = m.forward(cache, [seq[T]])
    assert rel_err(nxt[0], ref[T]) <= F16_KV_TOL


def test_overwrite_slot_keeps_length(llama_gguf, ref_logits):
    """Writing a slot below the length leaves length = max(old, slot+1) unchanged; with the
    default causal mask the query sees slots whose position <= its own."""
    t = llama_gguf
    m = load(t)
    seq = random_tokens(t.cfg.vocab, 10, seed=31)
    new = (seq[4] + 1) % t.cfg.vocab
    cache = m.new_cache()
    m.forward(cache, seq)
    out = m.forward(cache, [new], positions=[4], slots=[4])
    assert cache.length == 10
    assert rel_err(out[0], ref_logits(t, seq[:4] + [new])[-1]) <= F16_KV_TOL


@pytest.mark.parametrize("kv_dtype", ["f16", "f32"])
def test_copy_slot_moves_keys_and_values_exactly(llama_gguf, kv_dtype):
    """copy_slot(dst, src) gives dst the key, value and position of src bit for bit, from one
    tile of keys to another (slot 5 to 37; the CPU cache keeps keys in tiles of 16 slots): a
    query that attends to dst where it attended to src gets exactly the logits it got before,
    and before the copy it does not. (37 = 5 + 2 * 16 and no open slot lies between them, so
    the softmax and the weighted sum take the copied slot at the same point of their sums.)"""
    t = llama_gguf
    m = load(t)
    m.kv_dtype = kv_dtype
    seq = random_tokens(t.cfg.vocab, 8, seed=33)
    cache = m.new_cache(45)
    m.forward(cache, seq[:6])                                   # slots 0 .. 5
    m.forward(cache, [seq[6]], positions=[3], slots=[37])       # something else in slot 37
    n_cols = 39
    via_src = np.zeros((1, n_cols), bool)
    via_src[0, [0, 1, 2, 3, 4, 5, 38]] = True
    via_dst = via_src.copy()
    via_dst[0, 5], via_dst[0, 37] = False, True

    def query(mask):
        return m.forward(cache, [seq[7]], positions=[6], slots=[38], mask=mask)

    want = query(via_src)
    assert not np.array_equal(query(via_dst), want)
    cache.copy_slot(37, 5)
    np.testing.assert_array_equal(query(via_dst), want)
    np.testing.assert_array_equal(query(via_src), want)
    with pytest.raises(ValueError, match="outside the cache of 45 slots"):
        cache.copy_slot(45, 5)


def test_n_logits(cm, ref_logits):
    """n_logits=k returns only the last k rows; n_logits=0 returns an empty (0, V) array but
    still writes the cache (the next decode step is right)."""
    m = load(cm)
    V = cm.cfg.vocab
    seq = random_tokens(V, 16, seed=32)
    ref = ref_logits(cm, seq)
    cache = m.new_cache()
    last3 = m.forward(cache, seq[:10], n_logits=3)
    assert last3.shape == (3, V)
    assert rel_err(last3, ref[7:10]) <= tol(cm)
    one = m.forward(cache, seq[10:13], n_logits=1)
    assert one.shape == (1, V)
    assert rel_err(one, ref[12:13]) <= tol(cm)
    none = m.forward(cache, seq[13:15], n_logits=0)
    assert none.shape == (0, V)
    assert cache.length == 15
    last = m.forward(cache, seq[15:], n_logits=1)
    assert rel_err(last, ref[15:]) <= tol(cm)
    c2 = m.new_cache()
    allrows = m.forward(c2, seq, n_logits=len(seq))
    assert rel_err(allrows, ref) <= tol(cm)


def test_two_caches_are_independent(llama_gguf, ref_logits):
    """Two caches of one model interleaved step by step each follow their own sequence."""
    t = llama_gguf
    m = load(t)
    s1 = random_tokens(t.cfg.vocab, 12, seed=33)
    s2 = random_tokens(t.cfg.vocab, 12, seed=34)
    c1, c2 = m.new_cache(), m.new_cache()
    r1 = [m.forward(c1, s1[:4])]
    r2 = [m.forward(c2, s2[:6])]
    for i in range(4, 12):
        r1.append(m.forward(c1, [s1[i]]))
        if i >= 6:
            r2.append(m.forward(c2, [s2[i]]))
    assert rel_err(np.concatenate(r1), ref_logits(t, s1)) <= F16_KV_TOL
    assert rel_err(np.concatenate(r2), ref_logits(t, s2)) <= F16_KV_TOL


def test_small_cache_capacity(llama_gguf, ref_logits):
    """A cache of n_slots < context length works up to its capacity."""
    t = llama_gguf
    m = load(t)
    seq = random_tokens(t.cfg.vocab, 8, seed=35)
    cache = m.new_cache(8)
    got = np.concatenate([m.forward(cache, seq[:5])] + [m.forward(cache, [x]) for x in seq[5:]])
    assert cache.length == cache.capacity == 8
    assert rel_err(got, ref_logits(t, seq)) <= F16_KV_TOL


def _batch_vs_steps(m, prefix, batch):
    """Logits of `batch` forwarded in one call after `prefix`, and the same rows forwarded one
    token at a time after the same prefix."""
    c1 = m.new_cache(len(prefix) + len(batch) + 1)
    m.forward(c1, prefix, n_logits=1)
    together = m.forward(c1, batch)
    c2 = m.new_cache(len(prefix) + len(batch) + 1)
    m.forward(c2, prefix, n_logits=1)
    apart = np.concatenate([m.forward(c2, [t]) for t in batch])
    return together, apart


@pytest.mark.parametrize("P", [1, 7, 8, 13, 16])
def test_batch_rows_equal_one_token_steps_bitwise(cm, P):
    """A row of a batched forward has exactly the bits of the same token forwarded alone: what
    makes greedy speculative decoding (verify in one batch) emit what plain decoding emits.
    Prefix lengths around multiples of 8 move the slots between the kernels' full and partial
    blocks."""
    m = load(cm)
    seq = random_tokens(cm.cfg.vocab, P + 9, seed=P)
    together, apart = _batch_vs_steps(m, seq[:P], seq[P:])
    np.testing.assert_array_equal(together, apart)


@pytest.mark.parametrize("P,B", [(5, 9), (16, 9), (21, 17)])
def test_batch_rows_equal_one_token_steps_bitwise_smollm2(smollm2_path, P, B):
    """The same for the quantized SmolLM2 (repacked integer kernels: batches of 9 and 17 tokens
    go through them in groups of up to 16)."""
    m = specdec.load(smollm2_path)
    seq = random_tokens(49152, P + B, seed=P)
    together, apart = _batch_vs_steps(m, seq[:P], seq[P:])
    np.testing.assert_array_equal(together, apart)


@pytest.mark.parametrize("kv_dtype", ["f16", "f32"])
def test_a_cache_on_huge_pages_gives_a_small_caches_bits_smollm2(smollm2_path, kv_dtype):
    """Caches of 4 MiB or more are anonymous mappings advised onto 2 MiB pages, smaller ones come
    from calloc: the same tokens through a 100-slot cache (1.2 MB of keys at f16) and a 3,000-slot
    one (35 MB) give the same logits bit for bit, written in two forwards (the second at slots the
    first did not touch), and both caches free without harm, again and again."""
    m = specdec.load(smollm2_path)
    m.kv_dtype = kv_dtype
    seq = random_tokens(49152, 90, seed=3)
    for _ in range(3):
        small, large = m.new_cache(100), m.new_cache(3000)
        a = np.concatenate([m.forward(small, seq[:70]), m.forward(small, seq[70:])])
        b = np.concatenate([m.forward(large, seq[:70]), m.forward(large, seq[70:])])
        np.testing.assert_array_equal(a, b)
        del small, large


def test_kv_dtype(llama_gguf, ref_logits):
    """The CPU cache keeps halves by default and f32 on request; each cache keeps the type it
    was made with; both match the reference over their own rounding, and speculative decoding
    over an f32 cache is still plain decoding. Wrong values are refused by name."""
    t = llama_gguf
    m = load(t)
    assert m.kv_dtype == "f16"
    seq = random_tokens(t.cfg.vocab, 24, seed=41)
    c16 = m.new_cache(64)
    m.kv_dtype = "f32"
    assert m.kv_dtype == "f32"
    c32 = m.new_cache(64)
    a = np.concatenate([m.forward(c16, seq[:20]), m.forward(c16, seq[20:])])
    b = np.concatenate([m.forward(c32, seq[:20]), m.forward(c32, seq[20:])])
    assert rel_err(a, ref_logits(t, seq)) <= F16_KV_TOL
    assert rel_err(b, ref_logits(t, seq, kv_f16=False)) <= 1e-4
    assert rel_err(b, ref_logits(t, seq)) > 1e-6  # the two caches really differ
    plain = specdec.generate(m, seq[:8], max_new_tokens=30)
    spec = specdec.generate(m, seq[:8], max_new_tokens=30,
                            speculator=specdec.PromptLookup(k=3, verify_slope=0))
    assert spec.tokens == plain.tokens
    assert specdec.load(t.path, kv_dtype="f32").kv_dtype == "f32"
    with pytest.raises(ValueError, match="kv_dtype must be 'f16' or 'f32'"):
        m.kv_dtype = "bf16"
    with pytest.raises(ValueError, match="kv_dtype must be"):
        specdec.load(t.path, kv_dtype="f8")
    with pytest.raises(ValueError, match="head dimension 520 is larger than the 512"):
        specdec.dummy_model(dict(specdec.dummy.SHAPES["tiny"], head_dim=520), "f32")
