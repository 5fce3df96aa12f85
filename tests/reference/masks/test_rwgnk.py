"""reference.masks.rwgnk: RWGNK features (choromanski22 Eq. 5), closed form, Gamma and Thm. 4.2."""
from __future__ import annotations

import math

import networkx as nx
import numpy as np
import pytest
import scipy.sparse as sp

from reference.masks.rwgnk import (gamma, rwgnk_closed_form, rwgnk_expected_frequencies, rwgnk_features,
                                   rwgnk_frequencies, rwgnk_mask, thm42_bounds, transition_matrix)
from tests.reference.masks.test_grf import enumerate_walks, sample, small_graph, walks_dict


def test_hand_computed_frequencies():
    """Path 0-1-2, walk 0, 1, 2, 1 with lam = 1/2: f_0 = [1, 1/2 + 1/8, 1/4]."""
    adj = sp.csr_matrix(np.array([[0, 1, 0], [1, 0, 1], [0, 1, 0]], dtype=float))
    w = walks_dict(3, 1, 0.5, [[0, 1, 2, 1], [1], [2]])
    f = rwgnk_frequencies(adj, w, 0.5)
    np.testing.assert_allclose(f[0], [1.0, 0.5 + 0.125, 0.25], rtol=1e-15)
    psi = rwgnk_features(adj, w, 0.5, alpha=1)
    np.testing.assert_allclose(psi[0], f[0] / np.linalg.norm(f[0]), rtol=1e-15)
    np.testing.assert_allclose(np.linalg.norm(psi, axis=1), 1.0, rtol=1e-15)
    np.testing.assert_allclose(rwgnk_features(adj, w, 0.5, alpha=0), f)
    np.testing.assert_allclose(rwgnk_mask(adj, w, 0.5, 1), psi @ psi.T)


@pytest.mark.parametrize("mode", [{"p_halt": 0.3, "i_max": 3}, {"fixed_length": 2}])
def test_expectation_over_all_walks(mode):
    """sum over every walk of P(walk) f(walk) (weighted choice) = E[F] of the truncated series."""
    adj = small_graph()
    n, lam = adj.shape[0], 0.8
    p_halt = mode.get("p_halt", 0.0)
    i_max = mode.get("i_max", mode.get("fixed_length"))
    expected = np.zeros((n, n))
    for h in range(n):
        for path, prob in enumerate_walks(adj, h, p_halt, i_max, weighted=True):
            paths = [[i] for i in range(n)]
            paths[h] = path
            expected[h] += prob * rwgnk_frequencies(adj, walks_dict(n, 1, p_halt, paths), lam)[h]
    np.testing.assert_allclose(expected, rwgnk_expected_frequencies(adj, lam, **mode), rtol=1e-12, atol=1e-15)


def test_closed_form_is_the_inverse_and_the_limit_of_the_caps():
    adj = small_graph()
    lam, p = 0.9, 0.2
    rho = (1 - p) * lam
    inv = np.linalg.inv(np.eye(6) - rho * transition_matrix(adj))
    np.testing.assert_allclose(rwgnk_expected_frequencies(adj, lam, p_halt=p), inv, rtol=1e-13)
    np.testing.assert_allclose(rwgnk_closed_form(adj, lam, p_halt=p), inv @ inv.T, rtol=1e-13)
    np.testing.assert_allclose(rwgnk_expected_frequencies(adj, lam, p_halt=p, i_max=400), inv, rtol=1e-12)
    assert np.abs(rwgnk_expected_frequencies(adj, lam, p_halt=p, i_max=3) - inv).max() > 0.1
    norm = inv / np.linalg.norm(inv, axis=1, keepdims=True)
    np.testing.assert_allclose(rwgnk_closed_form(adj, lam, p_halt=p, alpha=1), norm @ norm.T, rtol=1e-13)
    # P = D^-1 W with weighted degrees; the isolated node's row is 0
    pm = transition_matrix(adj)
    np.testing.assert_allclose(pm.sum(axis=1), [1, 1, 1, 1, 0, 1], rtol=1e-15)


def test_monte_carlo_row_within_hoeffding_bound():
    """Mean of f_h over N iid weighted walks vs e_h^T (I - rho P)^-1: each walk's f_h(i) lies in
    [0, sum_t lam^t] = [0, 1 / (1 - lam)]; Hoeffding plus a union over the N^2 entries at 1e-6."""
    adj = small_graph()
    n, lam, p_halt, n_walkers = adj.shape[0], 0.6, 0.3, 4000
    walks = sample(adj, n_walkers, np.random.default_rng(11), p_halt=p_halt, weighted=True)
    mean = rwgnk_frequencies(adj, walks, lam)
    t = (1 / (1 - lam)) * math.sqrt(math.log(2 * n * n / 1e-6) / (2 * n_walkers))
    target = rwgnk_expected_frequencies(adj, lam, p_halt=p_halt)
    assert np.abs(mean - target).max() <= t
    # uniform choice would estimate another matrix: the test can tell (W is weighted)
    deg = np.maximum(np.asarray((adj != 0).sum(axis=1)).ravel(), 1)
    unif = np.linalg.inv(np.eye(n) - (1 - p_halt) * lam * (adj.toarray() != 0) / deg[:, None])
    walks_u = sample(adj, n_walkers, np.random.default_rng(12), p_halt=p_halt)
    mean_u = rwgnk_frequencies(adj, walks_u, lam)
    assert np.abs(mean_u - unif).max() <= t and np.abs(mean_u - target).max() > t


def test_gamma_is_the_series_and_refuses_divergence():
    rng = np.random.default_rng(0)
    x = rng.uniform(0, 1, (5, 5))
    x *= 0.7 / np.abs(np.linalg.eigvals(x)).max()
    series = sum((i + 1) * np.linalg.matrix_power(x, i) for i in range(400))
    np.testing.assert_allclose(gamma(x), series, rtol=1e-10)
    with pytest.raises(ValueError, match=r"spectral radius of X is 1\.4"):
        gamma(2 * x)
    with pytest.raises(ValueError, match="square"):
        gamma(np.ones((2, 3)))


def _graphs():
    cycle = sp.csr_matrix(nx.to_scipy_sparse_array(nx.cycle_graph(7), dtype=float))
    path = sp.csr_matrix(nx.to_scipy_sparse_array(nx.path_graph(6), dtype=float))
    star = sp.csr_matrix(nx.to_scipy_sparse_array(nx.star_graph(4), dtype=float))
    return {"cycle": cycle, "path": path, "star": star, "small": small_graph()}


@pytest.mark.parametrize("name", ["cycle", "path", "star", "small"])
def test_theorem_42_bounds_hold(name):
    """Gamma(rho/d_max W) <= K <= Gamma(rho/d_min W) elementwise, where the upper bound is finite;
    on a regular graph (the cycle) both bounds are K itself."""
    adj = _graphs()[name]
    lam, p = 0.5, 0.5  # rho = 0.25: the upper bound is finite on these graphs (rho specrad(W) / d_min < 1)
    k = rwgnk_closed_form(adj, lam, p_halt=p)
    lower, upper = thm42_bounds(adj, lam, p)
    assert upper is not None
    scale = np.abs(k).max()
    assert (lower <= k + 1e-12 * scale).all() and (k <= upper + 1e-12 * scale).all()
    if name == "cycle":
        np.testing.assert_allclose(lower, k, rtol=1e-12)
        np.testing.assert_allclose(upper, k, rtol=1e-12)
    else:  # not regular: the bounds are strict somewhere
        assert (k - lower).max() > 1e-3 and (upper - k).max() > 1e-3


def test_theorem_42_upper_vacuous_and_inputs():
    path = _graphs()["path"]
    lower, upper = thm42_bounds(path, 1.0, 0.1)  # rho = 0.9, specrad ~ 1.8 / d_min = 1
    assert upper is None
    assert (lower <= rwgnk_closed_form(path, 1.0, p_halt=0.1) + 1e-12).all()
    with pytest.raises(ValueError, match=r"lam must be in \[0, 1\] for Thm. 4.2"):
        thm42_bounds(path, 1.5, 0.5)
    with pytest.raises(ValueError, match=r"p_halt must be in \(0, 1\)"):
        thm42_bounds(path, 0.5, 1.0)
    empty = sp.csr_matrix((3, 3))
    lo, up = thm42_bounds(empty, 0.5, 0.5)
    np.testing.assert_array_equal(lo, np.eye(3))
    np.testing.assert_array_equal(rwgnk_closed_form(empty, 0.5, p_halt=0.5), np.eye(3))


def test_bad_input():
    adj = small_graph()
    w = walks_dict(6, 1, 0.5, [[i] for i in range(6)])
    with pytest.raises(ValueError, match="lam must be a finite real >= 0"):
        rwgnk_features(adj, w, -0.1)
    with pytest.raises(ValueError, match="lam must be a finite real >= 0"):
        rwgnk_features(adj, w, np.nan)
    with pytest.raises(ValueError, match="alpha must be 0 or 1"):
        rwgnk_features(adj, w, 0.5, alpha=2)
    with pytest.raises(ValueError, match="alpha must be 0 or 1"):
        rwgnk_features(adj, w, 0.5, alpha=True)
    with pytest.raises(ValueError, match="graph of 4 nodes"):
        rwgnk_features(adj, walks_dict(4, 1, 0.5, [[i] for i in range(4)]), 0.5)
    with pytest.raises(ValueError, match="p_halt must be in"):
        rwgnk_features(adj, {**w, "p_halt": 1.5}, 0.5)
    with pytest.raises(ValueError, match="not an edge"):
        rwgnk_features(adj, walks_dict(6, 1, 0.5, [[0, 3]] + [[i] for i in range(1, 6)]), 0.5)
    with pytest.raises(ValueError, match="exactly one of p_halt"):
        rwgnk_closed_form(adj, 0.5)
    with pytest.raises(ValueError, match="exactly one of p_halt"):
        rwgnk_closed_form(adj, 0.5, p_halt=0.5, fixed_length=3)
    with pytest.raises(ValueError, match=r"spectral radius of rho P is 1\.2"):
        rwgnk_closed_form(adj, 2.0, p_halt=0.4)  # rho = 1.2: diverges (lam > 1 is fine when rho < 1)
    np.testing.assert_allclose(rwgnk_expected_frequencies(adj, 1.5, p_halt=0.5),
                               np.linalg.inv(np.eye(6) - 0.75 * transition_matrix(adj)), rtol=1e-13)
    with pytest.raises(ValueError, match="i_max caps halting walks"):
        rwgnk_closed_form(adj, 0.5, fixed_length=2, i_max=3)
