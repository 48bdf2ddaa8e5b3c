"""Verify batches on the CPU: a batched matmul is split into pieces of equal row counts that may
span the products of one dispatch (q, k and v together), and a token's logits must not depend on
that split (thread count), nor on the batch it is verified in."""

from __future__ import annotations

import numpy as np
import pytest

import specdec

from tinymodels import random_tokens


@pytest.fixture(scope="module")
def smollm2(smollm2_path):
    return specdec.load(smollm2_path)


def _verify_logits(m: specdec.Model, prefix: list[int], batch: list[int], threads: int):
    m.threads = threads
    cache = m.new_cache(len(prefix) + len(batch) + 1)
    m.forward(cache, prefix, n_logits=1)
    return np.array(m.forward(cache, batch), copy=True)


@pytest.mark.parametrize("T", [1, 2, 4, 8, 16])
def test_verify_logits_do_not_depend_on_the_threads_smollm2(smollm2, T):
    """SmolLM2 (repacked Q4_1 layers, Q8_0 head): the logits of a verify batch after a 64-token
    prefix are bit for bit the same on 1, 2 and 3 threads. On 2 threads the q, k, v product
    (576 + 192 + 192 rows) goes as four pieces of 240 rows, two of them across the boundary
    between products; on 3 threads six of 160. (A split of the rows in which threads took 16-row
    units from each other, tried with a claim that could take more units than were left, added
    those twice to the accumulating products and failed here at 1, 2 and 4 tokens.)"""
    vocab = smollm2.config.vocab_size
    prefix = random_tokens(vocab, 64, seed=27)
    batch = random_tokens(vocab, T, seed=28)
    one = _verify_logits(smollm2, prefix, batch, 1)
    for threads in (2, 3):
        np.testing.assert_array_equal(_verify_logits(smollm2, prefix, batch, threads), one,
                                      err_msg=f"threads {threads}")


def test_verify_rows_equal_one_token_steps_on_two_threads_smollm2(smollm2):
    """Row t of a 16-token batch has the bits of token t decoded alone after the tokens before
    it, on 2 threads (the thread count the ratio benchmarks use)."""
    vocab = smollm2.config.vocab_size
    prefix = random_tokens(vocab, 64, seed=29)
    batch = random_tokens(vocab, 16, seed=30)
    smollm2.threads = 2
    rows = _verify_logits(smollm2, prefix, batch, 2)
    cache = smollm2.new_cache(len(prefix) + len(batch) + 1)
    smollm2.forward(cache, prefix, n_logits=1)
    for t, tok in enumerate(batch):
        alone = np.asarray(smollm2.forward(cache, [tok]))
        np.testing.assert_array_equal(alone.reshape(-1), rows[t], err_msg=f"token {t}")


CHILD_LOGITS = r"""
import hashlib, json, sys
import numpy as np
import specdec
from specdec import _core
m = specdec.load(sys.argv[1])
m.threads = 2
prefix, batch = json.loads(sys.argv[2]), json.loads(sys.argv[3])
cache = m.new_cache(len(prefix) + len(batch) + 1)
m.forward(cache, prefix, n_logits=1)
rows = np.array(m.forward(cache, batch), copy=True)
cache = m.new_cache(len(prefix) + len(batch) + 1)
m.forward(cache, prefix, n_logits=1)
alone = [np.array(m.forward(cache, [t]), copy=True).reshape(-1) for t in batch]
sha = lambda a: hashlib.sha1(np.ascontiguousarray(a).tobytes()).hexdigest()
print(json.dumps({"simd": _core.simd_name(), "rows": [sha(r) for r in rows],
                  "alone": [sha(a) for a in alone]}))
"""


def test_avxvnni_forward_gives_the_vnni_logits_smollm2(smollm2, smollm2_path):
    """SmolLM2 with its kernels capped at AVX-VNNI (SPECDEC_SIMD=avxvnni, in a child): the rows
    of an 8-token verify batch after a 64-token prefix have the bits of each token decoded alone,
    and where this CPU has AVX512-VNNI, the bits of the forward on those kernels (its Q4_1
    layers and Q8_0 head go through the AVX-VNNI tile there, the rest through the AVX2 kernels,
    which give the AVX-512 ones' bits)."""
    import hashlib
    import json

    from helpers import child_json, missing
    from specdec import _core

    vocab = smollm2.config.vocab_size
    prefix = random_tokens(vocab, 64, seed=31)
    batch = random_tokens(vocab, 8, seed=32)
    out = child_json(CHILD_LOGITS, smollm2_path, json.dumps(prefix), json.dumps(batch),
                     SPECDEC_SIMD="avxvnni")
    if "avxvnni" not in out["simd"]:
        missing("avxvnni", f"this CPU has no AVX-VNNI (kernels capped there: {out['simd']})")
    assert out["rows"] == out["alone"]
    if "avx512vnni" in _core.simd_name():
        rows = _verify_logits(smollm2, prefix, batch, 2)
        assert [hashlib.sha1(np.ascontiguousarray(r).tobytes()).hexdigest()
                for r in rows] == out["rows"]
