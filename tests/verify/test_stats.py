"""verify/stats.py: the closed forms behind the statistical checks, against independent
computations (quadrature, scipy), and the median-of-means machinery."""
from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from verify import stats as S

#: Gauss-Hermite quadrature with 120 nodes integrates exp(a g) against N(0, 1) to ~1e-13 relative
#: for |a| <= 4 (the integrand is entire and the weights decay like exp(-g^2/2)).
QUAD_RTOL = 1e-10
NODES, WEIGHTS = np.polynomial.hermite_e.hermegauss(120)
WEIGHTS = WEIGHTS / WEIGHTS.sum()  # expectation under N(0, 1)


def _pair(seed=0, scale=0.4):
    rng = np.random.default_rng(seed)
    return rng.standard_normal(5) * scale, rng.standard_normal(5) * scale


def _y(x, y, g):
    """One positive feature product as a function of g = w.(x+y)/|x+y| ~ N(0, 1)."""
    s = math.sqrt(float(np.sum((x + y) ** 2)))
    return np.exp(s * g - 0.5 * (np.sum(x * x) + np.sum(y * y)))


@pytest.mark.parametrize("p", [1, 2, 3, 4])
def test_prf_single_moments_match_quadrature(p):
    x, y = _pair(1)
    expected = float(np.sum(WEIGHTS * _y(x, y, NODES) ** p))
    assert S.prf_single_moments(x, y, p) == pytest.approx(expected, rel=QUAD_RTOL)


def test_prf_unbiased_and_lemma_1_variance():
    x, y = _pair(2)
    assert S.prf_single_moments(x, y, 1) == pytest.approx(math.exp(float(x @ y)), rel=1e-14)  # E Y = SM(x, y)
    for m in (1, 7, 64):
        second = (S.prf_single_moments(x, y, 2) - S.prf_single_moments(x, y, 1) ** 2) / m
        assert S.prf_variance(x, y, m) == pytest.approx(second, rel=1e-12)


def test_prf_squared_error_variance_for_two_features_by_2d_quadrature():
    """m = 2: Var[(Z - SM)^2], Z = (Y1 + Y2) / 2 with independent Y1, Y2, integrated directly."""
    x, y = _pair(3)
    sm = math.exp(float(x @ y))
    y1 = _y(x, y, NODES)
    z = 0.5 * (y1[:, None] + y1[None, :])
    w2 = WEIGHTS[:, None] * WEIGHTS[None, :]
    sq = (z - sm) ** 2
    expected = float(np.sum(w2 * sq**2) - np.sum(w2 * sq) ** 2)
    assert S.prf_squared_error_variance(x, y, 2) == pytest.approx(expected, rel=1e-8)


def test_mom_groups_and_radius():
    assert S.mom_groups(math.exp(-1)) == 8
    assert S.mom_groups(1e-8) == math.ceil(8 * math.log(1e8))
    for bad in (0.0, 1.0, -0.1, 2.0):
        with pytest.raises(ValueError, match="delta must lie in"):
            S.mom_groups(bad)
    k = S.mom_groups(1e-3)
    assert S.mom_radius(3.0, 100 * k, 1e-3) == pytest.approx(2 * 3.0 / 10)
    with pytest.raises(ValueError, match="fewer than the"):
        S.mom_radius(1.0, k - 1, 1e-3)


def test_median_of_means():
    x = np.arange(12, dtype=float)  # groups of 4: means 1.5, 5.5, 9.5
    assert S.median_of_means(x, 3) == 5.5
    assert S.median_of_means(np.append(x, 1e9), 3) == 5.5  # the tail beyond groups * size is cut
    spiked = x.copy()
    spiked[0] = 1e12  # one wild group cannot move the median past the clean ones
    assert 5.5 <= S.median_of_means(spiked, 3) <= 9.5
    with pytest.raises(ValueError, match="need at least 5 samples"):
        S.median_of_means(np.ones(4), 5)


@pytest.mark.parametrize("k, n", [(0, 50), (1, 50), (17, 200), (200, 200)])
def test_clopper_pearson_lower_matches_scipy(k, n):
    expected = stats.binomtest(k, n, alternative="greater").proportion_ci(confidence_level=0.99, method="exact").low
    assert S.clopper_pearson_lower(k, n, 0.99) == pytest.approx(expected, rel=1e-10, abs=1e-15)


def test_z_radius_and_alphas():
    assert S.z_radius(2.0, 0.05) == pytest.approx(2.0 * 1.959963984540054, rel=1e-12)
    assert S.check_alpha(True) < S.check_alpha(False)
    assert S.check_alpha(True) <= S.SUITE_ALPHA["quick"] and S.check_alpha(False) <= S.SUITE_ALPHA["full"]


# ------------------------------------------------ trigonometric and hyperbolic feature products


def _trig_y(x, y, g):
    """One trigonometric feature product exp((|x|^2 + |y|^2)/2) cos(w.(x - y)), g = w.u / |u|."""
    return math.exp(0.5 * float(x @ x + y @ y)) * np.cos(math.sqrt(float(np.sum((x - y) ** 2))) * g)


def _hyperbolic_y(x, y, g):
    """One hyperbolic feature product exp(-(|x|^2 + |y|^2)/2) cosh(w.(x + y)), g = w.s / |s|."""
    return math.exp(-0.5 * float(x @ x + y @ y)) * np.cosh(math.sqrt(float(np.sum((x + y) ** 2))) * g)


CLOSED_FORMS = {  # name -> (one product of g, its moments, Var Z for m iid rows)
    "trig": (_trig_y, S.trig_single_moments, S.trig_variance),
    "hyperbolic": (_hyperbolic_y, S.hyperbolic_single_moments, S.hyperbolic_variance),
    "favor+": (_y, S.prf_single_moments, S.prf_variance),
}


@pytest.mark.parametrize("hyperbolic", [False, True])
@pytest.mark.parametrize("p", [0, 1, 2, 3, 4, 5])
def test_binomial_power_moment_matches_quadrature(p, hyperbolic):
    a = 0.9
    f = np.cosh if hyperbolic else np.cos
    expected = float(np.sum(WEIGHTS * f(a * NODES) ** p))
    assert S.binomial_power_moment(a * a, p, hyperbolic) == pytest.approx(expected, rel=QUAD_RTOL)


def test_binomial_power_moment_small_cases_and_errors():
    a2 = 0.7
    assert S.binomial_power_moment(a2, 1, False) == pytest.approx(math.exp(-a2 / 2), rel=1e-15)  # E cos(g a)
    assert S.binomial_power_moment(a2, 2, False) == pytest.approx((1 + math.exp(-2 * a2)) / 2, rel=1e-15)
    assert S.binomial_power_moment(a2, 3, False) == pytest.approx(  # cos^3 = (3 cos t + cos 3t) / 4
        (3 * math.exp(-a2 / 2) + math.exp(-9 * a2 / 2)) / 4, rel=1e-15)
    assert S.binomial_power_moment(a2, 4, True) == pytest.approx(  # cosh^4 = (3 + 4 cosh 2t + cosh 4t) / 8
        (3 + 4 * math.exp(2 * a2) + math.exp(8 * a2)) / 8, rel=1e-14)
    with pytest.raises(ValueError, match="p must be >= 0"):
        S.binomial_power_moment(a2, -1, False)
    with pytest.raises(ValueError, match="a2 must be >= 0"):
        S.binomial_power_moment(-0.1, 2, True)


@pytest.mark.parametrize("name", sorted(CLOSED_FORMS))
@pytest.mark.parametrize("p", [1, 2, 3, 4])
def test_single_moments_match_quadrature(name, p):
    one, moments, _ = CLOSED_FORMS[name]
    x, y = _pair(4)
    expected = float(np.sum(WEIGHTS * one(x, y, NODES) ** p))
    assert moments(x, y, p) == pytest.approx(expected, rel=QUAD_RTOL)


@pytest.mark.parametrize("name", sorted(CLOSED_FORMS))
def test_estimators_are_unbiased_and_variance_formulas_match_moments(name):
    """E Y = exp(x.y); the closed forms (docstrings) equal (E Y^2 - (E Y)^2) / m."""
    _, moments, variance = CLOSED_FORMS[name]
    for seed in (5, 6):
        x, y = _pair(seed, scale=0.5)
        assert moments(x, y, 1) == pytest.approx(math.exp(float(x @ y)), rel=1e-13)
        for m in (1, 7, 64):
            assert variance(x, y, m) == pytest.approx((moments(x, y, 2) - moments(x, y, 1) ** 2) / m, rel=1e-10)


def test_variance_formulas_in_the_papers_forms():
    """trig: (1/2m) exp(|x+y|^2) SM^-2 (1 - exp(-|x-y|^2))^2 (Performer's form);
    hyperbolic: (1/2) (1 - exp(-|x+y|^2)) times the FAVOR+ variance."""
    x, y = _pair(7, scale=0.5)
    s2, d2, sm = float(np.sum((x + y) ** 2)), float(np.sum((x - y) ** 2)), math.exp(float(x @ y))
    m = 16
    assert S.trig_variance(x, y, m) == pytest.approx(math.exp(s2) / sm**2 * (1 - math.exp(-d2)) ** 2 / (2 * m),
                                                     rel=1e-12)
    assert S.hyperbolic_variance(x, y, m) == pytest.approx(0.5 * (1 - math.exp(-s2)) * S.prf_variance(x, y, m),
                                                           rel=1e-12)


@pytest.mark.parametrize("name", ["trig", "hyperbolic"])
def test_squared_error_variance_for_two_rows_by_2d_quadrature(name):
    """m = 2: Var[(Z - SM)^2], Z = (Y1 + Y2) / 2 with independent rows, integrated directly."""
    one, moments, _ = CLOSED_FORMS[name]
    x, y = _pair(8)
    sm = math.exp(float(x @ y))
    y1 = one(x, y, NODES)
    z = 0.5 * (y1[:, None] + y1[None, :])
    w2 = WEIGHTS[:, None] * WEIGHTS[None, :]
    sq = (z - sm) ** 2
    expected = float(np.sum(w2 * sq**2) - np.sum(w2 * sq) ** 2)
    assert S.squared_error_variance(tuple(moments(x, y, p) for p in (1, 2, 3, 4)), 2) == pytest.approx(expected,
                                                                                                      rel=1e-8)


def test_squared_error_variance_of_a_two_point_law():
    """Y = +-1 with probability 1/2: Z = mean of m signs, (Z - 0)^2 = Z^2; m = 1: Z^2 = 1, variance 0;
    m = 2: Z^2 is 0 or 1 with probability 1/2 each, variance 1/4."""
    signs = (0.0, 1.0, 0.0, 1.0)  # E Y, E Y^2, E Y^3, E Y^4
    assert S.squared_error_variance(signs, 1) == pytest.approx(0.0, abs=1e-15)
    assert S.squared_error_variance(signs, 2) == pytest.approx(0.25, rel=1e-15)
    with pytest.raises(ValueError, match="m must be >= 1"):
        S.squared_error_variance(signs, 0)


def test_bernstein_radius_solves_the_bound_and_covers_a_bounded_mean():
    sigma, bound, n, delta = 0.7, 3.0, 1000, 1e-6
    t = S.bernstein_radius(sigma, bound, n, delta)
    assert 2 * math.exp(-n * t * t / (2 * sigma**2 + 2 * bound * t / 3)) == pytest.approx(delta, rel=1e-9)
    log_term = math.log(2 / delta)
    assert t <= math.sqrt(2 * sigma**2 * log_term / n) + 2 * bound * log_term / (3 * n)
    assert S.bernstein_radius(0.0, 0.0, n, delta) == 0.0
    # exact binomial tail of a mean of n fair +-1 signs (sigma = 1, |X - 0| <= 1) stays below delta
    k = math.ceil(n * (1 + S.bernstein_radius(1.0, 1.0, n, 1e-3)) / 2)  # heads needed to exceed t
    assert 2 * stats.binom.sf(k - 1, n, 0.5) <= 1e-3
    for bad in ((0.5, 1.0, 0, 0.1), (-1.0, 1.0, 10, 0.1), (1.0, -1.0, 10, 0.1), (1.0, 1.0, 10, 1.0)):
        with pytest.raises(ValueError):
            S.bernstein_radius(*bad)
