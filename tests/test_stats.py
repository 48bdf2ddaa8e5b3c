"""The statistics that size and judge the distribution tests (tests/stats.py), against NumPy's
own chi-square samplers and closed forms: a wrong survival function or power calculation would
size every distribution test wrongly without any of them failing."""

from __future__ import annotations

import math

import numpy as np
import pytest

import stats


@pytest.mark.parametrize("df", [5, 15, 24, 59, 124])
def test_critical_value_and_survival_agree_with_sampling(df):
    """P(chi2(df) > chi2_critical(df)) is ALPHA: by the exact sum within 10 % (the
    Wilson-Hilferty value; the tests keep 15 or more degrees of freedom, it is 16 % off at 1
    or 2), and as the fraction of 400,000 NumPy draws above it (within 5 binomial standard
    deviations)."""
    c = stats.chi2_critical(df)
    assert abs(stats.chi2_sf(c, df) - stats.ALPHA) < 0.1 * stats.ALPHA
    x = np.random.default_rng(df).chisquare(df, 400_000)
    sd = math.sqrt(stats.ALPHA * (1 - stats.ALPHA) / len(x))
    assert abs((x > c).mean() - stats.chi2_sf(c, df)) < 5 * sd


def test_survival_closed_forms():
    """chi2(2) is exponential with mean 2; chi2(1) is a squared standard normal."""
    for x in (0.1, 1.0, 7.5, 30.0):
        assert stats.chi2_sf(x, 2) == pytest.approx(math.exp(-x / 2), rel=1e-12)
        assert stats.chi2_sf(x, 1) == pytest.approx(math.erfc(math.sqrt(x / 2)), rel=1e-12)
    assert stats.chi2_sf(0.0, 7) == 1.0
    assert stats.ncx2_sf(3.0, 4, 0.0) == stats.chi2_sf(3.0, 4)


@pytest.mark.parametrize("df", [15, 59, 124])
def test_power_is_what_numpy_samples(df):
    """At the noncentrality noncentrality_for_power finds, 200,000 NumPy noncentral draws
    exceed the critical value POWER of the time."""
    lam = stats.noncentrality_for_power(df)
    y = np.random.default_rng(7 + df).noncentral_chisquare(df, lam, 200_000)
    sd = math.sqrt(stats.POWER * (1 - stats.POWER) / len(y))
    assert abs((y > stats.chi2_critical(df)).mean() - stats.POWER) < 5 * sd


def test_runs_catch_the_stated_deviation():
    """The hardest alternative at total variation TV (the one of least chi-square distance:
    every cell moved by the same fraction 2 TV of its probability, up on one half of the mass
    and down on the other) is rejected by a test of runs_for(p) runs in about POWER of 300
    simulated tests (a quarter of the runs would catch it about a third of the time), and p
    itself about ALPHA of the time."""
    rng = np.random.default_rng(11)
    half = rng.dirichlet(np.full(12, 3.0)) / 2
    p = np.concatenate([half, half])
    q = np.concatenate([half * (1 + 2 * stats.TV), half * (1 - 2 * stats.TV)])
    assert stats.total_variation(p, q) == pytest.approx(stats.TV)
    n = stats.runs_for(p)
    assert stats.pooled_df(p, n) == len(p) - 1  # no cell pooled: the distance is all there
    rejected = {"p": 0, "q": 0}
    for _ in range(300):
        for name, dist in (("p", p), ("q", q)):
            stat, df = stats.chi2_stat(rng.multinomial(n, dist).astype(float), p)
            rejected[name] += stat >= stats.chi2_critical(df)
    assert rejected["q"] >= 290 and rejected["p"] <= 3, rejected


def test_bad_deviation_is_refused():
    with pytest.raises(ValueError, match="tv must be in"):
        stats.runs_for_power(10, 0.0)
