"""reference/masks/lowrank.py: low-rank masks and the stochastic RPE, exact properties only.

(Unbiasedness of the stochastic RPE is statistical: verify's choromanski22/section-3.4 check.)
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from reference.features import favor_plus
from reference.masks.lowrank import (
    low_rank_mask,
    sinusoidal_encodings,
    stochastic_rpe_expected_mask,
    stochastic_rpe_factors,
)
from reference.masks.toeplitz import toeplitz_mask

seeds = st.integers(0, 2**31 - 1)


@given(n=st.integers(1, 12), r=st.integers(1, 5), seed=seeds)
def test_low_rank_mask_is_the_product(n, r, seed):
    rng = np.random.default_rng(seed)
    left, right = rng.standard_normal((n, r)), rng.standard_normal((r, n))
    m = low_rank_mask(left, right)
    assert m.shape == (n, n)
    for i in range(n):
        for j in range(n):
            assert m[i, j] == pytest.approx(sum(left[i, k] * right[k, j] for k in range(r)), rel=1e-12, abs=1e-12)
    assert np.linalg.matrix_rank(m) <= r


@pytest.mark.parametrize("left, right, match", [
    (np.ones((4, 2)), np.ones((3, 4)), "do not match"),   # r mismatch
    (np.ones((4, 2)), np.ones((2, 5)), "do not match"),   # N mismatch
    (np.ones(4), np.ones((1, 4)), "left"),                 # 1-D
    (np.ones((0, 2)), np.ones((2, 0)), "left"),            # empty
    (np.array([[np.nan]]), np.ones((1, 1)), "left"),
    (np.ones((1, 1)), np.array([[np.inf]]), "right"),
])
def test_low_rank_mask_rejects_bad_factors(left, right, match):
    with pytest.raises(ValueError, match=match):
        low_rank_mask(left, right)


@pytest.mark.parametrize("n, k, scale", [(1, 1, 0.7), (9, 4, 0.7), (33, 3, 1.3)])
def test_sinusoidal_encodings(n, k, scale):
    p = sinusoidal_encodings(n, k, scale)
    assert p.shape == (n, 2 * k)
    np.testing.assert_allclose(np.linalg.norm(p, axis=1), scale, rtol=1e-14)
    omega = 10_000.0 ** (-np.arange(k) / k)
    for i in range(n):
        for j in range(n):
            expected = scale**2 / k * np.cos(omega * (i - j)).sum()
            assert p[i] @ p[j] == pytest.approx(expected, rel=1e-12, abs=1e-14)


def test_sinusoidal_encodings_make_the_expected_mask_toeplitz():
    """exp(p_i . p_j) depends on i - j only: it equals the Toeplitz mask of its first column/row."""
    n = 20
    m = stochastic_rpe_expected_mask(sinusoidal_encodings(n, 4))
    coeffs = np.concatenate([m[0, ::-1], m[1:, 0]])  # offsets -(N-1)..-1 from row 0, 0..N-1 from column 0
    np.testing.assert_allclose(m, toeplitz_mask(coeffs), rtol=1e-13)
    np.testing.assert_allclose(m, m.T, rtol=1e-14)  # cos is even
    assert np.ptp(m) > 0.1  # not a constant mask: the Toeplitz structure is not trivial


def test_toeplitz_control_random_encodings_are_not_toeplitz():
    p = np.random.default_rng(0).standard_normal((6, 4)) * 0.5
    m = stochastic_rpe_expected_mask(p)
    assert np.abs(m[1:, 1:] - m[:-1, :-1]).max() > 1e-3


@given(n=st.integers(1, 10), r=st.integers(1, 8), seed=seeds)
def test_stochastic_rpe_factors(n, r, seed):
    enc = sinusoidal_encodings(n, 3)
    w = np.random.default_rng(seed).standard_normal((r, enc.shape[1]))
    left, right = stochastic_rpe_factors(enc, w)
    assert left.shape == (n, r) and right.shape == (r, n)
    np.testing.assert_array_equal(right, left.T)
    np.testing.assert_array_equal(left, favor_plus(enc, w))
    assert np.all(left > 0)
    m_hat = low_rank_mask(left, right)
    assert np.all(m_hat > 0) and np.allclose(m_hat, m_hat.T)
    # one feature, by hand: phi(p) = exp(w.p - |p|^2 / 2) / sqrt(r)
    np.testing.assert_allclose(left[:, 0], np.exp(enc @ w[0] - 0.5 * (enc**2).sum(1)) / np.sqrt(r), rtol=1e-14)


def test_stochastic_rpe_expected_mask():
    p = sinusoidal_encodings(7, 2)
    m = stochastic_rpe_expected_mask(p)
    assert m.shape == (7, 7) and np.all(m > 0)
    np.testing.assert_allclose(np.diag(m), np.exp(0.7**2), rtol=1e-14)  # |p_i| = scale


def test_stochastic_rpe_rejects_bad_input():
    enc = sinusoidal_encodings(4, 2)
    with pytest.raises(ValueError, match="projection"):
        stochastic_rpe_factors(enc, np.ones((3, 5)))
    with pytest.raises(ValueError, match="encodings"):
        stochastic_rpe_factors(enc[0], np.ones((3, 4)))
    with pytest.raises(ValueError, match="encodings"):
        stochastic_rpe_expected_mask(np.full((2, 2), np.nan))
    for n, k, name in [(0, 2, "n"), (3, 0, "num_freqs"), (-1, 1, "n")]:
        with pytest.raises(ValueError, match=f"{name} must be an int >= 1"):
            sinusoidal_encodings(n, k)
