"""reference/masks/diffusion.py: the generators T and exp(-lam T) of choromanski22 Thm. 4.1, dense.

Checked against independent facts: the spectral form V exp(-lam Lambda) V^T of a symmetric L, the
stochasticity of each kernel, and the Markov (Poisson random-walk) series of L D^-1.
"""
from __future__ import annotations

import math

import networkx as nx
import numpy as np
import pytest
import scipy.sparse as sp

from reference.masks.diffusion import KINDS, diffusion_mask, generator_matrix, random_walk_series


def mixed():
    """A triangle with a self-loop and a weighted edge, an isolated node, a 4-path, an isolated node."""
    tri = np.array([[0.5, 1, 1], [1, 0, 2.0], [1, 2.0, 0]])
    p4 = nx.to_numpy_array(nx.path_graph(4))
    return sp.csr_matrix(sp.block_diag([tri, np.zeros((1, 1)), p4, np.zeros((1, 1))]))


def test_generators_on_a_small_graph():
    a = mixed()
    w = a.toarray()
    d = w.sum(1)
    lap = generator_matrix(a, "laplacian")
    np.testing.assert_allclose(lap, np.diag(d) - w)
    np.testing.assert_allclose(lap.sum(1), 0, atol=1e-15)  # rows of L sum to 0
    assert lap[0, 0] == pytest.approx(2.0)  # d_0 = 2.5, the loop 0.5 cancels on the diagonal
    rw = generator_matrix(a, "random-walk")
    np.testing.assert_allclose(rw.sum(0), 0, atol=1e-15)  # columns of L D^-1 sum to 0
    assert not rw[:, 3].any() and not rw[:, 8].any()  # isolated columns are 0
    np.testing.assert_allclose(rw[:, 1], lap[:, 1] / d[1])
    np.testing.assert_allclose(generator_matrix(a, "adjacency"), -w)


@pytest.mark.parametrize("lam", [0.0, 0.3, 2.5])
def test_laplacian_kernel_matches_spectral_form(lam):
    a = sp.csr_matrix(nx.to_scipy_sparse_array(nx.random_regular_graph(3, 12, seed=1), dtype=float))
    lap = generator_matrix(a, "laplacian")
    vals, vecs = np.linalg.eigh(lap)
    np.testing.assert_allclose(diffusion_mask(a, lam), vecs @ np.diag(np.exp(-lam * vals)) @ vecs.T, atol=1e-13)


@pytest.mark.parametrize("kind", KINDS)
def test_kernels_are_nonnegative_and_stochastic(kind):
    a = mixed()
    m = diffusion_mask(a, 1.7, kind)
    assert (m >= -1e-15).all()
    if kind == "laplacian":
        np.testing.assert_allclose(m.sum(0), 1, atol=1e-13)
        np.testing.assert_allclose(m.sum(1), 1, atol=1e-13)
        np.testing.assert_allclose(m, m.T, atol=1e-15)
    elif kind == "random-walk":
        np.testing.assert_allclose(m.sum(0), 1, atol=1e-13)  # column-stochastic
        assert m[3, 3] == 1.0 and m[8, 8] == 1.0  # isolated nodes stay put
    else:
        np.testing.assert_allclose(m, m.T, atol=1e-12)


def test_markov_identity():
    """exp(-lam L D^-1) = e^-lam sum_i lam^i / i! (W D^-1)^i (papers.md Sec. 3)."""
    a = mixed()
    for lam in (0.5, 3.0):
        np.testing.assert_allclose(random_walk_series(a, lam, 80), diffusion_mask(a, lam, "random-walk"), atol=1e-13)
    # truncation: the omitted mass of column j is exactly P(Poisson(lam) > terms)
    short = random_walk_series(a, 3.0, 4)
    tail = 1 - math.exp(-3.0) * sum(3.0**i / math.factorial(i) for i in range(5))
    np.testing.assert_allclose(1 - short.sum(0), tail, rtol=1e-12)


def test_accepts_dense_and_networkx():
    a = mixed()
    np.testing.assert_allclose(diffusion_mask(a.toarray(), 0.4), diffusion_mask(a, 0.4))
    g = nx.path_graph(5)
    np.testing.assert_allclose(generator_matrix(g), nx.laplacian_matrix(g).toarray())


@pytest.mark.parametrize("lam", [-1.0, math.nan, math.inf])
def test_rejects_bad_lam(lam):
    with pytest.raises(ValueError, match="lam must be a finite diffusion time"):
        diffusion_mask(mixed(), lam)


def test_rejects_non_real_lam_kind_and_graph():
    with pytest.raises(TypeError, match="lam must be a real number"):
        diffusion_mask(mixed(), "1")
    with pytest.raises(ValueError, match="kind must be one of"):
        generator_matrix(mixed(), "normalized")
    with pytest.raises(ValueError, match="not symmetric"):
        diffusion_mask(np.array([[0, 1.0], [0, 0]]), 1.0)
    with pytest.raises(ValueError, match="terms must be an int >= 0"):
        random_walk_series(mixed(), 1.0, -1)
