"""Statistics for the distribution tests: Pearson's chi-square statistic, its critical value, and
the number of runs a test needs to catch a stated deviation (a power calculation).

Every distribution test compares counts of N seeded runs with exact cell probabilities p (from
the float64 reference) and rejects at ALPHA. Its power against an alternative q is that of a
noncentral chi-square: Pearson's statistic is approximately chi2(df, lam) with noncentrality
lam = N * sum((q - p)**2 / p). By Cauchy-Schwarz, (sum |q - p|)**2 <= sum((q - p)**2 / p) *
sum(p), so any q at total variation tv = sum|q - p| / 2 from p has lam >= 4 * N * tv**2. So

    N = lam_min(df) / (4 * tv**2)      (runs_for_power)

runs reject every alternative at total variation >= tv (over the cells the test keeps) with
probability >= POWER, where lam_min(df) is the noncentrality at which chi2(df, lam) exceeds the
critical value with probability POWER. Survival functions here are exact sums (central chi-square
of integer degrees of freedom in closed form, the noncentral one as its Poisson mixture), so
nothing depends on scipy.
"""

from __future__ import annotations

import math

import numpy as np

ALPHA = 0.001  # each chi-square test's significance level
Z_999 = 3.090232  # the standard normal quantile of 1 - ALPHA
POWER = 0.99  # the probability of rejecting an alternative at the stated distance
#: the deviation the sampled-output tests are sized to catch: a total variation of 0.04 from
#: the target's joint distribution (a broken chain rule moves far more: the residual drawn from
#: p instead of norm(max(0, p - q)) moves test_draft_model's v5 pair 0.21 away, measured over
#: 200,000 runs of its NumPy twin)
TV = 0.04


def chi2_critical(df: int, z: float = Z_999) -> float:
    """The 1 - alpha quantile of chi2(df) by the Wilson-Hilferty approximation (z: the normal
    quantile of 1 - alpha), within well under 1 % at the degrees of freedom used here."""
    h = 2.0 / (9.0 * df)
    return df * (1.0 - h + z * math.sqrt(h)) ** 3


def chi2_stat(counts: np.ndarray, probs: np.ndarray) -> tuple[float, int]:
    """Pearson's statistic over cells with expected count >= 5 (the rest pooled into one cell
    when that has >= 5), and its degrees of freedom."""
    n = counts.sum()
    exp = probs * n
    big = exp >= 5
    stat = float((((counts[big] - exp[big]) ** 2) / exp[big]).sum())
    df = int(big.sum()) - 1
    if (~big).any() and exp[~big].sum() >= 5:
        stat += float((counts[~big].sum() - exp[~big].sum()) ** 2 / exp[~big].sum())
        df += 1
    return stat, df


def chi2_sf(x: float, df: int) -> float:
    """P(chi2(df) > x) for an integer df >= 1, from the closed forms (a Poisson sum for even
    df; erfc plus half-integer terms for odd df), each term taken in logs."""
    if x <= 0.0:
        return 1.0
    h = x / 2.0
    if df % 2 == 0:
        terms = (i * math.log(h) - math.lgamma(i + 1) - h for i in range(df // 2))
        return min(1.0, sum(math.exp(t) for t in terms))
    terms = ((i - 0.5) * math.log(h) - math.lgamma(i + 0.5) - h for i in range(1, (df + 1) // 2))
    return min(1.0, math.erfc(math.sqrt(h)) + sum(math.exp(t) for t in terms))


def ncx2_sf(x: float, df: int, lam: float) -> float:
    """P(chi2(df, lam) > x): the Poisson(lam / 2) mixture of chi2(df + 2j), summed over j
    within 12 standard deviations of lam / 2."""
    m = lam / 2.0
    if m == 0.0:
        return chi2_sf(x, df)
    lo = max(0, int(m - 12.0 * math.sqrt(m) - 5))
    hi = int(m + 12.0 * math.sqrt(m) + 20)
    return sum(math.exp(j * math.log(m) - m - math.lgamma(j + 1)) * chi2_sf(x, df + 2 * j)
               for j in range(lo, hi + 1))


def noncentrality_for_power(df: int, power: float = POWER, z: float = Z_999) -> float:
    """The noncentrality at which chi2(df, lam) exceeds chi2_critical(df, z) with probability
    `power` (bisection; the power grows with lam)."""
    crit = chi2_critical(df, z)
    lo, hi = 0.0, 1.0
    while ncx2_sf(crit, df, hi) < power:
        lo, hi = hi, 2.0 * hi
    for _ in range(60):
        mid = (lo + hi) / 2.0
        if ncx2_sf(crit, df, mid) < power:
            lo = mid
        else:
            hi = mid
    return hi


def runs_for_power(df: int, tv: float, power: float = POWER, z: float = Z_999) -> int:
    """Runs that make a chi-square test over df + 1 cells (at the level of z) reject, with
    probability >= power, every distribution at total variation >= tv from the exact one."""
    if not 0.0 < tv <= 1.0:
        raise ValueError(f"tv must be in (0, 1], got {tv!r}")
    return math.ceil(noncentrality_for_power(df, power, z) / (4.0 * tv * tv))


def pooled_df(probs: np.ndarray, n: int) -> int:
    """The degrees of freedom chi2_stat has for n runs over cells of probabilities `probs`."""
    exp = np.asarray(probs, float) * n
    big = exp >= 5
    small = exp[~big].sum()
    return int(big.sum()) - 1 + (1 if (~big).any() and small >= 5 else 0)


def runs_for(probs: np.ndarray, tv: float = TV, power: float = POWER) -> int:
    """Runs for a chi-square test against `probs` (chi2_stat's pooling) with the given power
    against every alternative at total variation >= tv over the cells it keeps: the df to size
    by depends on the runs (more runs keep more cells), so start from all cells and lower the
    runs while the df they keep asks for fewer (the df, hence the runs needed, only fall)."""
    n = runs_for_power(len(probs) - 1, tv, power)
    while True:
        m = runs_for_power(max(1, pooled_df(probs, n)), tv, power)
        if m >= n:
            return n
        n = m


def total_variation(p: np.ndarray, q: np.ndarray) -> float:
    """Half the L1 distance of two distributions over the same cells."""
    return 0.5 * float(np.abs(np.asarray(p, float) - np.asarray(q, float)).sum())
