"""Statistics for the checks (docs/methods.md): error budgets, deviation bounds, exact PRF moments.

Every bound returns a radius t such that a correct implementation exceeds it with probability
at most delta, so a check's false-failure rate is stated, not guessed.
"""
from __future__ import annotations

import math

import numpy as np
from scipy import stats

#: Family-wise false-failure budgets (docs/methods.md): the whole quick suite <= 1e-6, full <= 1e-3.
SUITE_ALPHA = {"quick": 1e-6, "full": 1e-3}
#: Per statistical check in each mode: room for up to 100 such checks across all issues.
CHECK_ALPHA = {"quick": 1e-8, "full": 1e-5}


def check_alpha(quick: bool) -> float:
    """The false-failure budget of one statistical check (Bonferroni share of the suite's)."""
    return CHECK_ALPHA["quick" if quick else "full"]


def mom_groups(delta: float) -> int:
    """Median-of-means group count k = ceil(8 ln(1/delta)) (Hoeffding on the failing groups)."""
    if not 0 < delta < 1:
        raise ValueError(f"delta must lie in (0, 1), got {delta}")
    return math.ceil(8 * math.log(1 / delta))


def median_of_means(x: np.ndarray, groups: int) -> float:
    """Median of the means of ``groups`` contiguous equal groups of the 1-D sample x (tail cut)."""
    x = np.asarray(x, dtype=np.float64).ravel()
    size = len(x) // groups
    if size < 1:
        raise ValueError(f"need at least {groups} samples for {groups} groups, got {len(x)}")
    return float(np.median(x[: size * groups].reshape(groups, size).mean(axis=1)))


def mom_radius(sigma: float, n: int, delta: float) -> float:
    """Radius t with P(|MoM - mean| > t) <= delta for n samples of standard deviation <= sigma.

    Each of k = mom_groups(delta) group means (size n/k) is within 2 sigma / sqrt(n/k) with
    probability >= 3/4 (Chebyshev); the median fails only if half the groups do, which has
    probability <= exp(-k/8) = delta (Hoeffding). Needs only a finite variance: right for the
    heavy tails of positive random features (exp of a Gaussian).
    """
    size = n // mom_groups(delta)
    if size < 1:
        raise ValueError(f"n={n} samples are fewer than the {mom_groups(delta)} groups delta={delta} needs")
    return 2.0 * sigma / math.sqrt(size)


def z_radius(se: float, delta: float) -> float:
    """Two-sided CLT radius z_{1 - delta/2} * se (light tails only)."""
    return float(stats.norm.isf(delta / 2) * se)


def clopper_pearson_lower(k: int, n: int, confidence: float) -> float:
    """One-sided exact lower confidence bound on a binomial proportion k/n."""
    if k == 0:
        return 0.0
    return float(stats.beta.ppf(1 - confidence, k, n - k + 1))


# ------------------------------------------------------------------ FAVOR+ estimator moments


def prf_single_moments(x: np.ndarray, y: np.ndarray, p: int) -> float:
    """E[Y^p] for one positive feature product Y = exp(w.(x+y) - (|x|^2 + |y|^2)/2), w ~ N(0, I).

    w.(x+y) ~ N(0, |x+y|^2), so E[Y^p] = exp(p^2 |x+y|^2 / 2 - p (|x|^2 + |y|^2) / 2).
    """
    s2 = float(np.sum((x + y) ** 2))
    c = 0.5 * float(np.sum(x * x) + np.sum(y * y))
    return math.exp(0.5 * p * p * s2 - p * c)


def prf_variance(x: np.ndarray, y: np.ndarray, m: int) -> float:
    """Var of the m-feature FAVOR+ estimate phi(x).phi(y) with iid rows (Performer Lemma 1):

        (1/m) exp(|x+y|^2) SM(x, y)^2 (1 - exp(-|x+y|^2)),   SM(x, y) = exp(x.y).
    """
    s2 = float(np.sum((x + y) ** 2))
    sm = math.exp(float(np.dot(x, y)))
    return math.exp(s2) * sm * sm * (1 - math.exp(-s2)) / m


def prf_squared_error_variance(x: np.ndarray, y: np.ndarray, m: int) -> float:
    """Var[(Z - SM)^2] for the iid m-feature estimate Z (a mean of m iid copies of Y).

    With mu_j the central moments of Y: E(Z - SM)^4 = (mu_4 + 3 (m - 1) mu_2^2) / m^3, and
    Var[(Z - SM)^2] = E(Z - SM)^4 - (mu_2 / m)^2. Exact, so the variance check's tolerance is
    a bound, not a plug-in estimate.
    """
    e1, e2, e3, e4 = (prf_single_moments(x, y, p) for p in (1, 2, 3, 4))
    mu2 = e2 - e1 * e1
    mu4 = e4 - 4 * e1 * e3 + 6 * e1 * e1 * e2 - 3 * e1**4
    fourth = (mu4 + 3 * (m - 1) * mu2 * mu2) / m**3
    return fourth - (mu2 / m) ** 2
