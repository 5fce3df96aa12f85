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
