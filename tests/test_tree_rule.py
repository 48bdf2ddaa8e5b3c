"""The tree rule (csrc/spec/verify.c, sd_verify_tree) on synthetic distributions, before it
touches a model:

* exact: the distribution of what one step emits, enumerated over every draft tree a drafter
  can propose and every accept/reject branch (tests/tree_rule.py), equals plain sampling from
  the target, for sampled and deterministic children, several tree shapes and distributions with
  zeros; each deliberately broken rule fails the same comparison;
* the C function equals its NumPy twin on the same uniforms, and on chains it is the chain rule
  bit for bit;
* 100,000 runs of the C function pass a chi-square test against the exact joint distribution
  of the first two tokens (alpha = 0.001).
"""

from __future__ import annotations

import numpy as np
import pytest

from specdec import _core
from stats import chi2_critical, chi2_stat
from tree_rule import (BROKEN, exact_emitted, first_two, ordered_samples, target_two,
                       verify_tree)

V = 5


def dist_fn(seed: int, zeros: bool = False):
    """A distribution over V tokens for every text, fixed by (seed, text); with `zeros`, some
    tokens have probability 0 (as after top-k or top-p)."""
    cache = {}

    def f(text):
        if text not in cache:
            rng = np.random.default_rng([seed, len(text), *text])
            x = rng.dirichlet(np.full(V, 0.6))
            if zeros:
                x[rng.choice(V, 2, replace=False)] = 0.0
                x = x / x.sum() if x.sum() > 0 else np.eye(V)[0]
            cache[text] = x
        return cache[text]

    return f


SHAPES = [(1,), (3,), (2, 2), (3, 1), (2, 2, 2), (1, 1, 1)]


@pytest.mark.parametrize("widths", SHAPES)
@pytest.mark.parametrize("mode", ["sampled", "deterministic"])
@pytest.mark.parametrize("zeros", [False, True])
def test_the_rule_is_exact(widths, mode, zeros):
    target = dist_fn(1, zeros)
    draft = dist_fn(2, zeros) if mode == "sampled" else None
    guess = dist_fn(3) if mode == "deterministic" else None
    got = first_two(exact_emitted(target, draft, guess, widths), target, V)
    np.testing.assert_allclose(got, target_two(target, V), atol=1e-12)


# every broken rule with the children it applies to (deterministic children have no q)
BROKEN_CASES = [(b, m) for b in BROKEN for m in ("sampled", "deterministic")
                if not (m == "deterministic" and b == "keep_rejected_in_q")]


@pytest.mark.parametrize("broken,mode", BROKEN_CASES)
def test_broken_rules_fail(broken, mode):
    """The same comparison as test_the_rule_is_exact catches each broken rule that applies to
    the children's kind."""
    target, draft, guess = dist_fn(1), dist_fn(2), dist_fn(3)
    if mode == "deterministic":
        draft = None
    else:
        guess = None
    exact = target_two(target, V)
    diffs = [np.abs(first_two(exact_emitted(target, draft, guess, w, broken=broken), target,
                              V) - exact).sum() / 2 for w in ((3,), (2, 2), (3, 1))]
    assert max(diffs) > 0.01, (broken, diffs)


def random_tree(rng, n):
    """Parents of an n-node tree with parents before children."""
    return [-1] + [int(rng.integers(-1, i)) for i in range(1, n)]


def realise(rng, parent, q_rows, V):
    """Tokens for a tree: each node's children drawn without replacement from its row."""
    n = len(parent)
    tokens = [0] * n
    for node in range(-1, n):
        kids = [c for c in range(n) if parent[c] == node]
        if kids:
            row = q_rows[kids[0]].astype(np.float64)
            g = np.log(np.maximum(row, 1e-300)) + rng.gumbel(size=V)
            order = np.argsort(-g)
            for c, t in zip(kids, order):
                tokens[c] = int(t)
    return tokens


@pytest.mark.parametrize("sampled", [True, False])
def test_c_equals_numpy_twin(sampled):
    rng = np.random.default_rng(5)
    for case in range(300):
        n = int(rng.integers(1, 9))
        Vc = int(rng.integers(max(3, n), 12))
        parent = random_tree(rng, n)
        p = rng.dirichlet(np.full(Vc, 0.5), size=n + 1).astype(np.float32)
        p[rng.random(p.shape) < 0.2] = 0.0
        p[:, 0] += np.float32(1e-3)
        q = rng.dirichlet(np.full(Vc, 0.5), size=n).astype(np.float32)
        for node in range(-1, n):  # siblings share their parent's draft row
            kids = [c for c in range(n) if parent[c] == node]
            for c in kids[1:]:
                q[c] = q[kids[0]]
        tokens = realise(rng, parent, q, Vc)
        depth = max(_depth(parent, i) for i in range(n))
        ua, un = rng.random(n), rng.random(depth + 1)
        qq = q if sampled else None
        path, nxt = verify_tree(tokens, parent, p, qq, ua, un)
        na, paths, nx = _core.verify_trees(
            np.array(parent, np.int32), np.array([tokens], np.int32), p[None],
            None if qq is None else qq[None], ua[None], un[None])
        assert list(paths[0][:na[0]]) == path and nx[0] == nxt, case


def _depth(parent, i):
    d = 1
    while parent[i] >= 0:
        i, d = parent[i], d + 1
    return d


@pytest.mark.parametrize("sampled", [True, False])
def test_chains_are_the_chain_rule(sampled):
    """A tree whose parents are i - 1 is verified exactly as sd_verify_chain verifies it."""
    rng = np.random.default_rng(9)
    K, N = 4, 2000
    p = rng.dirichlet(np.full(V, 0.4), size=K + 1).astype(np.float32)
    q = rng.dirichlet(np.full(V, 0.4), size=K).astype(np.float32)
    drafts = rng.integers(0, V, size=(N, K)).astype(np.int32)
    ua, un = rng.random((N, K)), rng.random((N, K + 1))
    qq = q if sampled else None
    n_chain, next_chain = _core.verify_chains(p, qq, drafts, ua, un)
    na, paths, nx = _core.verify_trees(
        np.arange(-1, K - 1, dtype=np.int32), drafts, np.broadcast_to(p, (N, K + 1, V)),
        None if qq is None else np.broadcast_to(q, (N, K, V)), ua, un)
    np.testing.assert_array_equal(na, n_chain)
    np.testing.assert_array_equal(nx, next_chain)


@pytest.mark.parametrize("mode", ["sampled", "deterministic"])
def test_c_rule_distribution_chi_square(mode):
    """100,000 steps over a (2, 2) tree, drafts drawn as a drafter would: the first two tokens
    (the second from the target when a step emits one) against the exact joint."""
    N, widths = 100_000, (2, 2)
    target, draft, guess = dist_fn(11, True), dist_fn(12), dist_fn(13)
    rng = np.random.default_rng(17)
    parent = np.array([-1, -1, 0, 0, 1, 1], np.int32)
    tables_p = {(): target(())}
    for a in range(V):
        tables_p[(a,)] = target((a,))
        for b in range(V):
            tables_p[(a, b)] = target((a, b))
    P1 = np.array([tables_p[(a,)] for a in range(V)], np.float32)
    P2 = np.array([[tables_p[(a, b)] for b in range(V)] for a in range(V)], np.float32)
    Q1 = np.array([draft((a,)) for a in range(V)], np.float32)
    # root children, then each child's children: without replacement (Gumbel top-k)
    if mode == "sampled":
        g = np.log(np.maximum(draft(()), 1e-300)) + rng.gumbel(size=(N, V))
        top = np.argsort(-g, axis=1)[:, :2]
        kids = np.empty((N, 2, 2), np.int64)
        for j in range(2):
            gj = np.log(np.maximum(Q1[top[:, j]], 1e-300)) + rng.gumbel(size=(N, V))
            kids[:, j] = np.argsort(-gj, axis=1)[:, :2]
    else:
        order0 = sorted(range(V), key=lambda t: (-guess(())[t], t))[:2]
        top = np.tile(order0, (N, 1))
        kids = np.empty((N, 2, 2), np.int64)
        for j in range(2):
            for a in range(V):
                sel = top[:, j] == a
                kids[sel, j] = sorted(range(V), key=lambda t: (-guess((a,))[t], t))[:2]
    tokens = np.stack([top[:, 0], top[:, 1], kids[:, 0, 0], kids[:, 0, 1], kids[:, 1, 0],
                       kids[:, 1, 1]], axis=1).astype(np.int32)
    p = np.empty((N, 7, V), np.float32)
    p[:, 0] = target(())
    p[:, 1], p[:, 2] = P1[tokens[:, 0]], P1[tokens[:, 1]]
    for i, (j, c) in enumerate([(0, 2), (0, 3), (1, 4), (1, 5)]):
        p[:, 3 + i] = P2[tokens[:, j], tokens[:, c]]
    q = None
    if mode == "sampled":
        q = np.empty((N, 6, V), np.float32)
        q[:, 0] = q[:, 1] = draft(())
        q[:, 2] = q[:, 3] = Q1[tokens[:, 0]]
        q[:, 4] = q[:, 5] = Q1[tokens[:, 1]]
    na, paths, nx = _core.verify_trees(parent, tokens, p, q, rng.random((N, 6)),
                                       rng.random((N, 3)))
    first = np.where(na >= 1, tokens[np.arange(N), np.maximum(paths[:, 0], 0)], nx)
    second = np.where(na >= 2, tokens[np.arange(N), np.maximum(paths[:, 1], 0)], nx)
    # a step that emitted one token: the second from a plain draw
    one = na == 0
    u = rng.random(N)
    cdf = np.cumsum(P1[first], axis=1)
    plain = (u[:, None] * cdf[:, -1:] < cdf).argmax(axis=1)
    second = np.where(one, plain, second)
    counts = np.bincount(first * V + second, minlength=V * V).astype(float)
    exact = first_two(exact_emitted(target, None if mode != "sampled" else draft,
                                    guess if mode != "sampled" else None, widths), target, V)
    np.testing.assert_allclose(exact, target_two(target, V), atol=1e-12)
    stat, df = chi2_stat(counts, exact.ravel())
    assert stat < chi2_critical(df), (stat, df)
    assert (na == 0).mean() > 0.05 and (na == 2).mean() > 0.05  # every branch is exercised


def test_ordered_samples_sum_to_one():
    q = np.array([0.5, 0.3, 0.2, 0.0])
    assert abs(sum(p for _, p in ordered_samples(q, 2)) - 1.0) < 1e-12
