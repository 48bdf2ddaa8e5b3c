"""The rule of speculative sampling, tested as the pure C functions it is (csrc/spec/verify.c):
logits processing against a NumPy reference, the chain rule against a NumPy twin run on the same
uniform numbers, and the distribution of the emitted tokens against the target's by a
chi-square test, which a deliberately broken rule fails.

Significance and size (tests/stats.py): each chi-square test rejects at alpha = 0.001 (critical
value from the Wilson-Hilferty approximation of the chi-square quantile, accurate to well under
1 % at these degrees of freedom), over as many runs as reject a distribution 0.04 away in total
variation with probability 0.99 (stats.runs_for). A broken residual is rejected at that size
with a statistic far above the critical value."""

from __future__ import annotations

import numpy as np
import pytest

from helpers import child_json, require_simd
from reference import process_ref
from specdec import _core
from stats import chi2_critical, chi2_stat, runs_for

# ---------------------------------------------------------------------------------------------
# logits processing
# ---------------------------------------------------------------------------------------------


SETTINGS = [(0.0, 0, 1.0, 0.0), (1.0, 0, 1.0, 0.0), (0.7, 5, 1.0, 0.0), (1.0, 0, 0.9, 0.0),
            (1.0, 0, 1.0, 0.1), (0.8, 20, 0.95, 0.05), (2.0, 1, 1.0, 0.0)]


@pytest.mark.parametrize("setting", SETTINGS)
def test_process_logits_matches_reference(setting):
    rng = np.random.default_rng(7)
    for V in (1, 7, 97, 5000):  # 5000: the threshold search for the head of the order
        logits = (rng.standard_normal(V) * 3).astype(np.float32)
        logits[V // 2:V // 2 + 2] = logits[0]  # ties
        got = _core.process_logits(logits, *setting)
        ref = process_ref(logits, *setting)
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-7)
        assert abs(float(got.sum()) - 1.0) < 1e-5


@pytest.mark.parametrize("setting", [(1.0, 50, 0.95, 0.0), (0.8, 20, 0.9, 0.02),
                                     (0.7, 0, 0.9, 0.0), (1.0, 0, 1.0, 0.05)])
def test_filters_over_a_flat_vocabulary(setting):
    """A flat distribution over 49,152 tokens, where top-p alone needs thousands of them: with
    top-k on, the head of the order is searched only as deep as the k largest (top-p and min-p
    cut within them), and the result is still the reference's."""
    logits = (np.random.default_rng(2).standard_normal(49_152) * 0.5).astype(np.float32)
    got = _core.process_logits(logits, *setting)
    ref = process_ref(logits, *setting)
    np.testing.assert_array_equal(got > 0, ref > 0)
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-9)


@pytest.mark.parametrize("top_k", [1, 17, 40, 256, 300])
def test_top_k_breaks_ties_by_id(top_k):
    """Logits of a few levels, so that the k-th largest falls inside a run of equal values:
    top-k (chosen by one pass of insertions up to 256, by a threshold search and a sort above)
    keeps the lowest ids of the tied run, as the reference does."""
    rng = np.random.default_rng(top_k)
    logits = rng.choice(np.array([0.0, -0.5, -1.0, -3.0], np.float32), size=5000)
    # (top-p 0.913: over k equal values its cut never falls on a whole number of them)
    for setting in ((1.0, top_k, 1.0, 0.0), (0.7, top_k, 0.913, 0.0), (1.0, top_k, 1.0, 0.3)):
        got = _core.process_logits(logits, *setting)
        ref = process_ref(logits, *setting)
        np.testing.assert_array_equal(got > 0, ref > 0, err_msg=str(setting))
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-9)


@pytest.mark.parametrize("top", [0.25, 0.7])
def test_top_p_alone_breaks_ties_by_id(top):
    """Top-p without top-k over logits of a few levels, the cut inside a run of equal values:
    the candidates are ordered by a stable radix sort where they are at most half the vocabulary
    (the two top levels 25 % of the tokens) and by qsort where they are more (70 %); both keep
    the lowest ids of the tied run, as the reference does."""
    rng = np.random.default_rng(int(top * 100))
    # two levels near the top, two below a thousandth of it (the first threshold takes the two)
    logits = rng.choice(np.array([0.0, -0.5, -8.0, -9.0], np.float32), size=20_000,
                        p=[top / 2, top / 2, (1 - top) / 2, (1 - top) / 2])
    for setting in ((1.0, 0, 0.3, 0.0), (1.0, 0, 0.8, 0.0), (0.9, 0, 0.913, 0.0)):
        got = _core.process_logits(logits, *setting)
        ref = process_ref(logits, *setting)
        np.testing.assert_array_equal(got > 0, ref > 0, err_msg=str(setting))
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-9)


def test_softmax_exponentials_are_within_a_few_ulp():
    """The softmax's exponentials (sd_hd_expf's arithmetic, vectorised) against float64 exp over
    the whole range: a row whose largest logit is 0 holds exp(x) times one normaliser, so each
    probability over the largest one's is exp(x) to within 3 ulp (2 of the exponential, 1 of
    the products) wherever the probability is a normal float; below -87.33 they are 0."""
    x = np.concatenate([[0.0], -np.geomspace(1e-6, 87.3, 40_000), -np.linspace(0.0, 87.3, 9_999),
                        [-87.34, -100.0, -np.inf]]).astype(np.float32)
    p = _core.process_logits(x, 1.0, 0, 1.0, 0.0)
    ratio = p[:-3].astype(np.float64) / np.float64(p[0])
    want = np.exp(x[:-3].astype(np.float64))
    live = p[:-3] >= np.finfo(np.float32).tiny  # subnormal probabilities keep fewer digits
    assert live.sum() > 45_000
    np.testing.assert_allclose(ratio[live], want[live], rtol=3 * 2.0**-23, atol=0)
    assert (p[-3:] == 0).all()


CHILD_SOFTMAX_BITS = """
import json
import numpy as np
from specdec import _core
rng = np.random.default_rng(5)
out = []
for V in (1, 2, 7, 8, 9, 15, 16, 17, 31, 33, 97, 5000, 49152):
    for T in (1.0, 0.7, 2.3, 0.05):
        x = (rng.standard_normal(V) * 4).astype(np.float32)
        p = _core.process_logits(x, T, 0, 1.0, 0.0)
        out.append(p.tobytes().hex())
        # draws from it (sd_sample_probs): 200 uniforms, 2 of them a hair from a cumulative sum
        u = rng.random((200, 1))
        c = np.cumsum(p.astype(np.float64)) / p.astype(np.float64).sum()
        u[:2, 0] = np.nextafter(c[V // 2], 0.0), np.nextafter(c[V // 3], 1.0)
        nxt = _core.verify_chains(p[None], None, np.zeros((200, 0), np.int32),
                                  np.zeros((200, 0)), u)[1]
        out.append(nxt.tobytes().hex())
print(json.dumps([_core.simd_name(), out]))
"""


@pytest.mark.parametrize("simd", ["avx2", "scalar"])
def test_softmax_has_the_same_bits_on_every_kernel(simd):
    """Sampling's softmax (sd_softmax_exp) from the kernels this CPU does not pick by default
    (AVX2 where AVX-512 exists, and the portable one, in child processes) has the default
    kernels' bits at every row length (every tail of a vector) and temperature, and so do the
    draws from it (sd_sample_probs adds in sd_sum_f32's lanes): the same seed draws the same
    tokens whichever kernels a CPU runs."""
    if simd == "avx2":
        require_simd("avx2", "avx2", "this CPU has no AVX2")
    name, got = child_json(CHILD_SOFTMAX_BITS, timeout=120, SPECDEC_SIMD=simd)
    assert name == ("avx2+fma+f16c" if simd == "avx2" else "scalar")
    _, want = child_json(CHILD_SOFTMAX_BITS, timeout=120)
    assert got == want


def test_greedy_takes_the_first_largest_logit():
    """The argmax (sd_argmax_f32, vectorised): the lowest index among equal largest values
    wherever they sit in the vectors and the tail, NaNs passed over, 0 when the first logit is a
    NaN (as the scalar loop it replaced)."""
    rng = np.random.default_rng(3)
    for V in (1, 2, 9, 31, 32, 33, 47, 1000, 49152):
        for first in sorted({0, V // 3, V - 1, max(V - 5, 0)}):
            x = rng.standard_normal(V).astype(np.float32)
            x[first:] = np.minimum(x[first:], 5.0)
            x[first] = 9.0
            x[-1] = 9.0  # a tie with the last: the first wins
            if V > 2:
                x[(first + 1) % V or 1] = np.nan
            got = _core.process_logits(x, 0.0, 0, 1.0, 0.0)
            assert got[first] == 1.0 and got.sum() == 1.0, (V, first)
    x = np.array([np.nan, 1.0, 2.0], np.float32)
    assert _core.process_logits(x, 0.0, 0, 1.0, 0.0)[0] == 1.0
    x = np.full(50, -np.inf, np.float32)
    assert _core.process_logits(x, 0.0, 0, 1.0, 0.0)[0] == 1.0


@pytest.mark.parametrize("bad,match", [((-0.1, 0, 1.0, 0.0), "temperature"),
                                       ((1.0, -1, 1.0, 0.0), "top_k"),
                                       ((1.0, 0, 0.0, 0.0), "top_p"),
                                       ((1.0, 0, 1.5, 0.0), "top_p"),
                                       ((1.0, 0, 1.0, 1.0), "min_p"),
                                       ((float("nan"), 0, 1.0, 0.0), "temperature")])
def test_process_logits_rejects_bad_settings(bad, match):
    with pytest.raises(ValueError, match=match):
        _core.process_logits(np.zeros(4, np.float32), *bad)


# ---------------------------------------------------------------------------------------------
# the chain rule: a NumPy twin, correct and broken
# ---------------------------------------------------------------------------------------------


def draw(p, u):
    """Inverse CDF draw of each row's token (rows of p, uniforms u), as sd_sample_probs."""
    c = np.cumsum(p, axis=-1)
    idx = (c > (u * c[..., -1])[..., None]).argmax(axis=-1)
    return idx


def chain_numpy(p, q, drafts, ua, un, broken=False):
    """The chain rule of verify.h over N runs (un[:, n]: the uniform of the token emitted after n
    accepted drafts); `broken` draws the correction from p instead of
    norm(max(0, p - q)) (a classic mistake that biases the output towards the draft)."""
    N, K = drafts.shape
    n_acc = np.full(N, K)
    nxt = np.zeros(N, dtype=np.int64)
    done = np.zeros(N, dtype=bool)
    for k in range(K):
        d = drafts[:, k]
        qd = q[k, d]
        acc = ua[:, k] * qd < p[k, d]
        rej = ~acc & ~done
        if rej.any():
            res = np.maximum(0.0, p[k][None, :] - q[k][None, :])
            if broken:
                res = np.broadcast_to(p[k], res.shape)
            res = np.broadcast_to(res, (rej.sum(), p.shape[1]))
            nxt[rej] = draw(res, un[rej, k])
            n_acc[rej] = k
            done |= rej
    rest = ~done
    nxt[rest] = draw(np.broadcast_to(p[K], (rest.sum(), p.shape[1])), un[rest, K])
    return n_acc, nxt


def make_rows(rng, K, V, setting):
    """Target and draft rows, each processed with the same sampling setting."""
    p = np.stack([_core.process_logits((rng.standard_normal(V) * 1.5).astype(np.float32),
                                       *setting) for _ in range(K + 1)])
    q = np.stack([_core.process_logits((rng.standard_normal(V) * 1.5).astype(np.float32),
                                       *setting) for _ in range(K)])
    return p.astype(np.float32), q.astype(np.float32)


def test_c_rule_equals_numpy_twin_on_the_same_uniforms():
    rng = np.random.default_rng(1)
    K, V, N = 4, 9, 20000
    p, q = make_rows(rng, K, V, (1.0, 0, 1.0, 0.0))
    drafts = np.stack([draw(np.broadcast_to(q[k], (N, V)), rng.random(N)) for k in range(K)],
                      axis=1).astype(np.int32)
    ua, un = rng.random((N, K)), rng.random((N, K + 1))
    n_c, next_c = _core.verify_chains(p, q, drafts, ua, un)
    n_np, next_np = chain_numpy(p.astype(np.float64), q.astype(np.float64), drafts, ua, un)
    assert np.array_equal(n_c, n_np)
    agree = next_c == next_np
    # float32 vs float64 cumulative sums may differ only at a uniform on a boundary
    assert agree.mean() > 0.9999


def simulate_stream(rule, p_rows, q_rows, K, M, N, rng):
    """N runs of speculative generation until M tokens are emitted, with target and draft rows
    that depend on the position only (p_rows[pos], q_rows[pos]). Returns (N, M) tokens."""
    V = p_rows.shape[1]
    out = np.full((N, M), -1, dtype=np.int64)
    pos = np.zeros(N, dtype=np.int64)
    while (pos < M).any():
        for start in range(M):
            runs = np.nonzero(pos == start)[0]
            if len(runs) == 0:
                continue
            n = len(runs)
            p = p_rows[start:start + K + 1]
            q = q_rows[start:start + K]
            drafts = np.stack([draw(np.broadcast_to(q[k], (n, V)), rng.random(n))
                               for k in range(K)], axis=1).astype(np.int32)
            n_acc, nxt = rule(p, q, drafts, rng.random((n, K)), rng.random((n, K + 1)))
            for j in range(min(K + 1, M - start)):
                emit = j <= n_acc
                tok = np.where(j < n_acc, drafts[:, min(j, K - 1)], nxt)
                out[runs[emit], start + j] = tok[emit]
            pos[runs] = start + n_acc + 1
    return out


@pytest.mark.parametrize("setting", [(1.0, 0, 1.0, 0.0), (0.7, 4, 1.0, 0.0),
                                     (1.0, 0, 0.9, 0.0), (1.0, 0, 1.0, 0.15)],
                         ids=["T1", "T0.7-topk4", "top_p0.9", "min_p0.15"])
def test_emitted_tokens_are_distributed_as_the_target(setting):
    """The joint distribution of the first three emitted tokens equals the product of the
    target's rows (rows depend on the position only, so the exact joint is that product)."""
    rng = np.random.default_rng(abs(hash(setting)) % 2**32)
    K, V, M = 3, 5, 3
    p_rows, q_rows = make_rows(rng, M + K, V, setting)
    p_rows, q_rows = p_rows[: M + K], np.concatenate([q_rows, q_rows[:1]])[: M + K]

    def c_rule(p, q, d, ua, un):
        return _core.verify_chains(p, q, d, ua, un)

    exact = np.einsum("a,b,c->abc", *[p_rows[i].astype(np.float64) for i in range(M)])
    exact /= exact.sum()
    toks = simulate_stream(c_rule, p_rows, q_rows, K, M, runs_for(exact.ravel()), rng)
    counts = np.bincount(toks[:, 0] * V * V + toks[:, 1] * V + toks[:, 2],
                         minlength=V ** 3).astype(np.float64)
    stat, df = chi2_stat(counts, exact.ravel())
    assert stat < chi2_critical(df), (stat, df)


def test_the_chi_square_test_catches_a_broken_rule():
    """Power: the same test, on a rule whose correction ignores the draft (draws from p), fails
    by a wide margin, while the NumPy twin of the correct rule passes."""
    setting = (1.0, 0, 1.0, 0.0)
    rng = np.random.default_rng(5)
    K, V, M = 3, 5, 3
    p_rows, q_rows = make_rows(rng, M + K, V, setting)
    q_rows = np.concatenate([q_rows, q_rows[:1]])
    exact = np.einsum("a,b,c->abc", *[p_rows[i].astype(np.float64) for i in range(M)]).ravel()
    N = runs_for(exact / exact.sum())
    for broken, should_pass in ((False, True), (True, False)):
        def rule(p, q, d, ua, un, broken=broken):
            return chain_numpy(p.astype(np.float64), q.astype(np.float64), d, ua, un, broken)

        toks = simulate_stream(rule, p_rows, q_rows, K, M, N, rng)
        counts = np.bincount(toks[:, 0] * V * V + toks[:, 1] * V + toks[:, 2],
                             minlength=V ** 3).astype(np.float64)
        stat, df = chi2_stat(counts, exact / exact.sum())
        assert (stat < chi2_critical(df)) == should_pass, (broken, stat, chi2_critical(df))


def test_greedy_rows_accept_exactly_the_argmax():
    """At temperature 0 every row is one-hot: a draft is accepted iff it is the argmax, and the
    token after the accepted prefix is the argmax at that position — plain greedy decoding."""
    rng = np.random.default_rng(3)
    K, V = 4, 11
    logits = (rng.standard_normal((K + 1, V)) * 2).astype(np.float32)
    p = np.stack([_core.process_logits(l, 0.0, 0, 1.0, 0.0) for l in logits])
    greedy = logits.argmax(axis=1)
    for n_good in range(K + 1):
        draft = greedy[:K].copy()
        if n_good < K:
            draft[n_good] = (draft[n_good] + 1) % V
        n_acc, nxt = _core.verify_chains(p, None, draft[None, :].astype(np.int32),
                                         rng.random((1, K)), rng.random((1, K + 1)))
        assert n_acc[0] == n_good and nxt[0] == greedy[n_good]
