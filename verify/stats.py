"""Statistics for the checks (docs/methods.md): error budgets, deviation bounds, exact moments of
the random-feature estimators (FAVOR+, trigonometric, hyperbolic).

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


def bernstein_radius(sigma: float, bound: float, n: int, delta: float) -> float:
    """Radius t with P(|mean - mu| > t) <= delta for the mean of n iid X with Var X <= sigma^2 and
    |X - mu| <= bound almost surely (Bernstein).

    Bernstein: P(|mean - mu| > t) <= 2 exp(-n t^2 / (2 sigma^2 + 2 bound t / 3)). Setting the
    right side to delta, L = ln(2/delta), gives n t^2 = L (2 sigma^2 + 2 bound t / 3), whose
    positive root is t = (bound L / 3 + sqrt((bound L / 3)^2 + 2 n sigma^2 L)) / n
    (<= sqrt(2 sigma^2 L / n) + 2 bound L / (3 n)). For bounded terms with a known variance it is
    about sqrt(16 ln(1/delta) / ln(2/delta)) ~ 4x tighter than the median-of-means radius.
    """
    if not 0 < delta < 1:
        raise ValueError(f"delta must lie in (0, 1), got {delta}")
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if sigma < 0 or bound < 0:
        raise ValueError(f"sigma and bound must be >= 0, got sigma={sigma}, bound={bound}")
    log_term = math.log(2 / delta)
    a = bound * log_term / 3
    return (a + math.sqrt(a * a + 2 * n * sigma * sigma * log_term)) / n


def z_radius(se: float, delta: float) -> float:
    """Two-sided CLT radius z_{1 - delta/2} * se (light tails only)."""
    return float(stats.norm.isf(delta / 2) * se)


def clopper_pearson_lower(k: int, n: int, confidence: float) -> float:
    """One-sided exact lower confidence bound on a binomial proportion k/n."""
    if k == 0:
        return 0.0
    return float(stats.beta.ppf(1 - confidence, k, n - k + 1))


# ------------------------------------------------------------------ random-feature estimator moments
#
# Each estimator of SM(x, y) = exp(x.y) below is Z = (1/m) sum_k Y_k, a mean of m copies of ONE
# feature product Y_k = Y(w_k), w_k ~ N(0, I_d) (iid rows: independent copies). Y depends on w
# only through g a, with g ~ N(0, 1) and a = |u| for one vector u (w.u ~ N(0, |u|^2)):
#   FAVOR+:      Y = c exp(w.s),   c = exp(-(|x|^2 + |y|^2)/2), s = x + y
#   hyperbolic:  Y = c cosh(w.s),  same c and s (features exp(+-w.x - |x|^2/2) / sqrt(2m))
#   trig RFF:    Y = c cos(w.u),   c = exp(+(|x|^2 + |y|^2)/2), u = x - y
#                (cos(w.x) cos(w.y) + sin(w.x) sin(w.y) = cos(w.(x - y)))
# so E[Y^p] = c^p E[f(g a)^p], and the power reductions
#   cos^p t  = 2^-p sum_j C(p, j) cos((p - 2j) t),   cosh^p t = 2^-p sum_j C(p, j) exp((p - 2j) t)
# with E cos(k g a) = exp(-k^2 a^2 / 2) and E exp(k g a) = exp(+k^2 a^2 / 2) give every moment in
# closed form (binomial_power_moment). The mean and variance of Z follow:
#   E Z = E Y = exp(x.y) for all three (unbiased),   Var Z = Var Y / m (iid rows),
#   trig:        Var Y = c^2 (E cos^2 - (E cos)^2) = c^2 ((1 + e^{-2a^2})/2 - e^{-a^2})
#                      = (1/2) exp(|x|^2 + |y|^2) (1 - exp(-|x - y|^2))^2
#   hyperbolic:  Var Y = c^2 ((1 + e^{2a^2})/2 - e^{a^2}) = (1/2) exp(-(|x|^2 + |y|^2)) (exp(|x + y|^2) - 1)^2
#   FAVOR+:      Var Y = exp(|x + y|^2) SM^2 (1 - exp(-|x + y|^2))   (Performer Lemma 1)


def binomial_power_moment(a2: float, p: int, hyperbolic: bool) -> float:
    """E[f(g a)^p] for g ~ N(0, 1), a^2 = a2 >= 0, f = cos (hyperbolic=False) or cosh (True).

    f(t)^p = 2^-p sum_{j=0}^{p} C(p, j) f((p - 2j) t) (expand ((e^{it} + e^{-it})/2)^p, or with
    e^{+-t} for cosh), and E cos(k g a) = exp(-k^2 a2 / 2), E cosh(k g a) = exp(+k^2 a2 / 2).
    """
    if p < 0:
        raise ValueError(f"p must be >= 0, got {p}")
    if a2 < 0:
        raise ValueError(f"a2 must be >= 0, got {a2}")
    sign = 1.0 if hyperbolic else -1.0
    return sum(math.comb(p, j) * math.exp(sign * 0.5 * (p - 2 * j) ** 2 * a2) for j in range(p + 1)) / 2.0**p


def _norms(x: np.ndarray, y: np.ndarray) -> tuple[float, float, float]:
    """(|x|^2 + |y|^2, |x + y|^2, |x - y|^2)."""
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    return float(x @ x + y @ y), float(np.sum((x + y) ** 2)), float(np.sum((x - y) ** 2))


def prf_single_moments(x: np.ndarray, y: np.ndarray, p: int) -> float:
    """E[Y^p] for one positive feature product Y = exp(w.(x+y) - (|x|^2 + |y|^2)/2), w ~ N(0, I).

    w.(x+y) ~ N(0, |x+y|^2), so E[Y^p] = exp(p^2 |x+y|^2 / 2 - p (|x|^2 + |y|^2) / 2).
    """
    both, s2, _ = _norms(x, y)
    return math.exp(0.5 * p * p * s2 - 0.5 * p * both)


def trig_single_moments(x: np.ndarray, y: np.ndarray, p: int) -> float:
    """E[Y^p] for one trigonometric feature product Y = exp((|x|^2 + |y|^2)/2) cos(w.(x - y)).

    = exp(p (|x|^2 + |y|^2)/2) E[cos^p(g |x - y|)] (binomial_power_moment). |Y| <= the prefactor.
    """
    both, _, d2 = _norms(x, y)
    return math.exp(0.5 * p * both) * binomial_power_moment(d2, p, hyperbolic=False)


def hyperbolic_single_moments(x: np.ndarray, y: np.ndarray, p: int) -> float:
    """E[Y^p] for one hyperbolic feature product Y = exp(-(|x|^2 + |y|^2)/2) cosh(w.(x + y)).

    (The 2m features [exp(W x - |x|^2/2), exp(-W x - |x|^2/2)] / sqrt(2m) give, per row w,
    (e^{w.s} + e^{-w.s}) c / (2m) = c cosh(w.s) / m.) = c^p E[cosh^p(g |x + y|)].
    """
    both, s2, _ = _norms(x, y)
    return math.exp(-0.5 * p * both) * binomial_power_moment(s2, p, hyperbolic=True)


def prf_variance(x: np.ndarray, y: np.ndarray, m: int) -> float:
    """Var of the m-feature FAVOR+ estimate phi(x).phi(y) with iid rows (Performer Lemma 1):

        (1/m) exp(|x+y|^2) SM(x, y)^2 (1 - exp(-|x+y|^2)),   SM(x, y) = exp(x.y).
    """
    s2 = float(np.sum((x + y) ** 2))
    sm = math.exp(float(np.dot(x, y)))
    return math.exp(s2) * sm * sm * (1 - math.exp(-s2)) / m


def trig_variance(x: np.ndarray, y: np.ndarray, m: int) -> float:
    """Var of the m-row trigonometric RFF estimate phi(x).phi(y) with iid rows:

        (1/(2m)) exp(|x|^2 + |y|^2) (1 - exp(-|x - y|^2))^2.

    Var Y = c^2 (E cos^2(w.u) - (E cos(w.u))^2), c = exp((|x|^2 + |y|^2)/2), u = x - y, and
    E cos^2 = (1 + exp(-2|u|^2))/2, E cos = exp(-|u|^2/2): c^2 (1 - exp(-|u|^2))^2 / 2.
    """
    both, _, d2 = _norms(x, y)
    return math.exp(both) * (-math.expm1(-d2)) ** 2 / (2 * m)


def hyperbolic_variance(x: np.ndarray, y: np.ndarray, m: int) -> float:
    """Var of the m-row (2m-feature) hyperbolic estimate phi(x).phi(y) with iid rows:

        (1/(2m)) exp(-(|x|^2 + |y|^2)) (exp(|x + y|^2) - 1)^2.

    Var Y = c^2 (E cosh^2(w.s) - (E cosh(w.s))^2), c = exp(-(|x|^2 + |y|^2)/2), s = x + y, and
    E cosh^2 = (1 + exp(2|s|^2))/2, E cosh = exp(|s|^2/2): c^2 (exp(|s|^2) - 1)^2 / 2.
    """
    both, s2, _ = _norms(x, y)
    return math.exp(-both) * math.expm1(s2) ** 2 / (2 * m)


def squared_error_variance(raw_moments: tuple[float, float, float, float], m: int) -> float:
    """Var[(Z - EY)^2] for Z the mean of m iid copies of Y, from E[Y^p], p = 1..4.

    With X_k = Y_k - EY centred and mu_j = E X^j: E(sum X_k)^4 = m mu_4 + 3 m (m - 1) mu_2^2 (the
    only non-vanishing index patterns are kkkk and kkll), so E(Z - EY)^4 = (mu_4 + 3 (m - 1) mu_2^2)
    / m^3, and Var[(Z - EY)^2] = E(Z - EY)^4 - (mu_2 / m)^2. Central from raw moments:
    mu_2 = e2 - e1^2, mu_4 = e4 - 4 e1 e3 + 6 e1^2 e2 - 3 e1^4. Exact, so a variance check's
    tolerance is a bound, not a plug-in estimate.
    """
    if m < 1:
        raise ValueError(f"m must be >= 1, got {m}")
    e1, e2, e3, e4 = raw_moments
    mu2 = e2 - e1 * e1
    mu4 = e4 - 4 * e1 * e3 + 6 * e1 * e1 * e2 - 3 * e1**4
    fourth = (mu4 + 3 * (m - 1) * mu2 * mu2) / m**3
    return fourth - (mu2 / m) ** 2


def prf_squared_error_variance(x: np.ndarray, y: np.ndarray, m: int) -> float:
    """Var[(Z - SM)^2] for the iid m-feature FAVOR+ estimate Z (squared_error_variance)."""
    return squared_error_variance(tuple(prf_single_moments(x, y, p) for p in (1, 2, 3, 4)), m)
