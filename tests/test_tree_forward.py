"""A draft tree in one forward: node i sits at position prefix + depth(i) - 1 and sees the
prefix, its ancestors and itself. Its logits must be the very bits of the same tokens decoded
one at a time, although its ancestors lie in the cache at other slots than in a sequence: the
attention sums the open slots as if they were consecutive (csrc/cpu/x86/simd_avx2.c,
softmax_open). This is what makes tree verification exact at temperature 0."""

from __future__ import annotations

import numpy as np
import pytest

import specdec
import tinymodels as tm
from specdec import testing

CFG = tm.TinyConfig(arch="llama", vocab=64, dim=64, n_layers=2, n_heads=4, n_kv_heads=2,
                    ffn=128, context_length=256)
# parents of 9 nodes: three branches off the prefix, one of them three deep, and cousins
PARENTS = [-1, 0, -1, 2, 3, 0, -1, 6, 2]


@pytest.fixture(scope="module", params=["f32-gguf", "q4_1-dummy"])
def model(request, tmp_path_factory):
    if request.param == "f32-gguf":
        path = str(tmp_path_factory.mktemp("tree") / "m.gguf")
        testing.write_gguf(path, CFG, tm.make_weights(CFG, 4))
        return specdec.load(path, threads=2)
    return specdec.dummy_model(dict(arch="llama", vocab_size=64, hidden_size=64, n_layers=2,
                                    n_heads=2, n_kv_heads=1, head_dim=32, ffn_size=128,
                                    context_length=256), dtype="q4_1", threads=2)


def depth(i):
    d = 1
    while PARENTS[i] >= 0:
        i, d = PARENTS[i], d + 1
    return d


def path_to(i):
    p = []
    while i >= 0:
        p.append(i)
        i = PARENTS[i]
    return p[::-1]


@pytest.mark.parametrize("kv_dtype", ["f16", "f32"])
@pytest.mark.parametrize("P", [1, 13, 40])
def test_tree_nodes_have_the_bits_of_a_sequence(model, kv_dtype, P):
    model.kv_dtype = kv_dtype
    rng = np.random.default_rng(P)
    V = model.config.vocab_size
    prefix = [int(t) for t in rng.integers(0, V, P)]
    tokens = [int(t) for t in rng.integers(0, V, len(PARENTS))]
    n = len(tokens)
    cache = model.new_cache(P + n)
    model.forward(cache, prefix, n_logits=0)
    mask = np.zeros((n, P + n), bool)
    mask[:, :P] = True
    for i in range(n):
        for a in path_to(i):
            mask[i, P + a] = True
    positions = [P + depth(i) - 1 for i in range(n)]
    tree = model.forward(cache, tokens, positions=positions, slots=list(range(P, P + n)),
                         mask=mask)
    for i in range(n):
        seq = model.new_cache(P + n)
        model.forward(seq, prefix, n_logits=0)
        rows = [model.forward(seq, [tokens[a]], n_logits=1)[0] for a in path_to(i)]
        np.testing.assert_array_equal(tree[i], rows[-1], err_msg=f"node {i}, {kv_dtype}")
    model.kv_dtype = "f16"
