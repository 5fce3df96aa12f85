"""reference/masks/power_series.py: M_alpha = sum_k alpha_k W^k, the (de)convolution of alpha, the
named kernels against their closed forms, and the convergence check (reid25; papers.md Sec. 3)."""
from __future__ import annotations

import math

import networkx as nx
import numpy as np
import pytest
import scipy.linalg
import scipy.sparse as sp

from reference.graphs import adjacency, normalized_adjacency
from reference.masks.power_series import (
    check_series_radius,
    convolve,
    deconvolve,
    diffusion_alpha,
    heat_alpha,
    power_series_mask,
    regularised_laplacian_alpha,
    regularised_laplacian_radius,
    spectral_radius,
)


def karate():
    return adjacency(nx.Graph(list(nx.karate_club_graph().edges())))  # unweighted


def w_norm():
    return normalized_adjacency(karate())


def test_power_series_mask_is_the_polynomial():
    w = w_norm().toarray()
    alpha = [0.5, -0.25, 2.0, 0.125]
    expected = 0.5 * np.eye(34) - 0.25 * w + 2.0 * w @ w + 0.125 * w @ w @ w
    np.testing.assert_allclose(power_series_mask(w_norm(), alpha), expected, atol=1e-14)
    np.testing.assert_allclose(power_series_mask(w_norm(), [3.0]), 3.0 * np.eye(34))


def test_factorisation_m_alpha_equals_phi_phi_t():
    f = np.array([0.9, 0.3, -0.2, 0.05])
    phi = power_series_mask(w_norm(), f)
    np.testing.assert_allclose(power_series_mask(w_norm(), convolve(f)), phi @ phi.T, atol=1e-14)


def test_deconvolve_inverts_convolve():
    rng = np.random.default_rng(0)
    for k in (0, 1, 5, 12):
        f = rng.standard_normal(k + 1)
        f[0] = abs(f[0]) + 0.1
        np.testing.assert_allclose(deconvolve(convolve(f, k_max=k)), f, rtol=1e-12, atol=1e-12)
        full = deconvolve(convolve(f))  # the 2K + 1 coefficients: f then zeros
        np.testing.assert_allclose(full[: k + 1], f, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(full[k + 1:], 0, atol=1e-11)
    alpha = rng.uniform(0.1, 1, 9)
    np.testing.assert_allclose(convolve(deconvolve(alpha), k_max=8), alpha, rtol=1e-12)


def test_heat_deconvolution_is_half_beta():
    """exp(beta W) = exp(beta W / 2)^2: f_k = (beta / 2)^k / k! (papers.md Sec. 3)."""
    for beta in (0.7, 2.0, -1.5):
        f = deconvolve(heat_alpha(beta, 15))
        np.testing.assert_allclose(f, [(beta / 2) ** k / math.factorial(k) for k in range(16)], rtol=1e-12, atol=1e-15)
    # no k! overflow past k = 170
    assert heat_alpha(2.0, 200)[-1] == pytest.approx(math.exp(200 * math.log(2.0) - math.lgamma(201)), rel=1e-12)


def test_named_kernels_match_closed_forms():
    w = w_norm().toarray()
    eye = np.eye(34)
    np.testing.assert_allclose(power_series_mask(w_norm(), heat_alpha(1.3, 40)), scipy.linalg.expm(1.3 * w), atol=1e-12)
    np.testing.assert_allclose(power_series_mask(w_norm(), diffusion_alpha(1.3, 40)),
                               scipy.linalg.expm(-1.3 * (eye - w)), atol=1e-12)
    # regularised Laplacian: r = 0.5 / 1.5 = 1/3, rho(W) = 1: the tail after k_max is < (1/3)^k_max
    np.testing.assert_allclose(power_series_mask(w_norm(), regularised_laplacian_alpha(0.5, 60)),
                               np.linalg.inv(eye + 0.5 * (eye - w)), atol=1e-12)


def test_convergence_check_names_both_radii():
    a = karate()
    rho = spectral_radius(a)
    assert rho == pytest.approx(6.7256977, rel=1e-6)
    assert regularised_laplacian_radius(0.2) == pytest.approx(6.0)
    with pytest.raises(ValueError, match=r"converges for spectral radius\(W\) < 6\.0.*spectral radius is 6\.7256"):
        regularised_laplacian_alpha(0.2, 5, adj=a)
    assert regularised_laplacian_alpha(0.1, 5, adj=a)[0] == pytest.approx(1 / 1.1)  # radius 11 > 6.73
    assert check_series_radius(w_norm(), regularised_laplacian_radius(100.0)) == pytest.approx(1.0)
    assert regularised_laplacian_radius(0.0) == math.inf


def test_errors():
    with pytest.raises(ValueError, match="alpha_0 > 0"):
        deconvolve([0.0, 1.0])
    with pytest.raises(ValueError, match="alpha_0 > 0"):
        deconvolve([-1.0])
    with pytest.raises(ValueError, match="non-empty 1-D"):
        power_series_mask(w_norm(), [])
    with pytest.raises(ValueError, match="non-empty 1-D"):
        power_series_mask(w_norm(), np.ones((2, 2)))
    with pytest.raises(ValueError, match="non-finite"):
        power_series_mask(w_norm(), [1.0, math.nan])
    with pytest.raises(TypeError, match="alpha must be real"):
        power_series_mask(w_norm(), [1j])
    with pytest.raises(ValueError, match="sigma2 must be >= 0"):
        regularised_laplacian_alpha(-0.5, 3)
    with pytest.raises(ValueError, match="beta must be finite"):
        heat_alpha(math.inf, 3)
    with pytest.raises(ValueError, match="k_max must be an int >= 0"):
        heat_alpha(1.0, -1)
    with pytest.raises(ValueError, match="not symmetric"):
        power_series_mask(sp.csr_matrix(np.array([[0, 1.0], [0, 0]])), [1.0])
