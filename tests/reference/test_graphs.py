"""reference/graphs.py: canonical adjacency matrices, degrees, normalisation, validation."""
from __future__ import annotations

import networkx as nx
import numpy as np
import pytest
import scipy.sparse as sp

from reference.graphs import SYMMETRY_RTOL, adjacency, degree, normalized_adjacency, weighted_degree
from verify import problems as P


def _assert_canonical(a):
    assert isinstance(a, sp.csr_matrix) and a.dtype == np.float64
    assert a.has_canonical_format  # sorted indices, no duplicates
    assert np.all(a.data > 0) and np.all(np.isfinite(a.data))
    assert (a != a.T).nnz == 0


def test_formats_agree_and_are_canonical():
    rng = np.random.default_rng(0)
    s = sp.random(9, 9, density=0.4, random_state=rng, format="csr")
    s = s + s.T
    dense = s.toarray()
    G = nx.Graph()
    G.add_nodes_from(range(9))
    for i, j in zip(*np.nonzero(np.triu(dense))):
        G.add_edge(int(i), int(j), weight=float(dense[i, j]))
    for x in (s, s.tocoo(), s.tocsc(), s.tolil(), sp.csr_array(s), dense, G):
        a = adjacency(x)
        _assert_canonical(a)
        np.testing.assert_array_equal(a.toarray(), dense)


def test_duplicates_summed_zeros_dropped_loops_and_isolated():
    a = sp.coo_matrix(([1.0, 1.0, 2.0, 0.0, 0.0, 4.0], ([0, 0, 1, 1, 2, 3], [1, 1, 0, 2, 1, 3])), shape=(5, 5))
    w = adjacency(a)
    _assert_canonical(w)
    assert w.nnz == 3
    assert w.toarray()[:4, :4].tolist() == [[0, 2, 0, 0], [2, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 4]]
    assert degree(w).tolist() == [1, 1, 0, 1, 0] and degree(w).dtype == np.int64
    assert weighted_degree(w).tolist() == [2.0, 2.0, 0.0, 4.0, 0.0]
    assert adjacency(np.zeros((1, 1))).nnz == 0  # n = 1 is fine


def test_symmetrize_and_asymmetry_error():
    x = np.array([[0, 1.0, 0], [3.0, 0, 0], [2.0, 0, 0]])
    with pytest.raises(ValueError, match=r"^adj is not symmetric \(W\[0, 1\] = 1.0 but W\[1, 0\] = 3.0\); "
                                         r"pass symmetrize=True to use max\(W, W\^T\)"):
        adjacency(x, name="adj")
    np.testing.assert_array_equal(adjacency(x, symmetrize=True).toarray(), np.maximum(x, x.T))
    with pytest.raises(ValueError, match="not symmetric"):
        adjacency(nx.DiGraph([(0, 1)]))
    w, w2 = 0.3, 0.3 * (1 + 4 * np.finfo(float).eps)  # round-off apart: accepted, made exact
    assert abs(w2 - w) <= SYMMETRY_RTOL * w2
    a = adjacency(np.array([[0, w], [w2, 0]]))
    assert a.data.tolist() == [w2, w2]


def test_normalized_adjacency_matches_dense_formula():
    a = adjacency(sp.block_diag([P.grid_graph((3, 3)), sp.csr_matrix((2, 2))]).tocsr() * 1.5)
    nrm = normalized_adjacency(a)
    d = a.toarray().sum(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        expected = np.where(a.toarray() > 0, a.toarray() / np.sqrt(np.outer(d, d)), 0)
    np.testing.assert_allclose(nrm.toarray(), expected, rtol=1e-15, atol=0)
    np.testing.assert_array_equal(nrm.toarray(), nrm.toarray().T)
    # the spectral radius of D^-1/2 W D^-1/2 is 1 on a graph with edges
    assert abs(np.abs(np.linalg.eigvalsh(nrm.toarray())).max() - 1) < 1e-12


@pytest.mark.parametrize("w", [1e300, 1e160, 1e-170, 1e-200, 1e-300])
def test_normalized_adjacency_at_extreme_weight_scales(w):
    """N(w A) = N(A) at any scale: w / sqrt(d_i d_j) gave 0 at 1e160 and inf at 1e-170 (d_i d_j
    over/underflowed); w / (sqrt(d_i) sqrt(d_j)) does not, and stays exactly symmetric."""
    a = adjacency(np.array([[0, 1.0, 0], [1.0, 0, 1.0], [0, 1.0, 0]]))
    np.testing.assert_allclose(normalized_adjacency(a * w).data, np.full(4, 2 ** -0.5), rtol=4e-16, atol=0)
    b = adjacency(sp.block_diag([P.grid_graph((3, 3)), sp.csr_matrix((2, 2))]).tocsr() * 1.5)
    b = b + sp.diags(np.r_[np.arange(1.0, 10.0), 0.0, 0.0])  # self-loops too
    nrm = normalized_adjacency(sp.csr_matrix(b * w)).toarray()
    np.testing.assert_array_equal(nrm, nrm.T)
    np.testing.assert_allclose(nrm, normalized_adjacency(b).toarray(), rtol=1e-15, atol=0)


@pytest.mark.parametrize("x,exc,match", [
    ("x", TypeError, "graph must be a scipy.sparse matrix, a dense ndarray .* got str"),
    (np.zeros(3), ValueError, r"shape \(n, n\), got \(3,\)"),
    (np.zeros((2, 3)), ValueError, r"must be square \(n, n\), got shape \(2, 3\)"),
    (np.zeros((0, 0)), ValueError, r"n >= 1 nodes, got shape \(0, 0\)"),
    (np.array([[0, np.nan], [np.nan, 0]]), ValueError, r"must be finite, got nan at entry \(0, 1\)"),
    (np.array([[0, np.inf], [np.inf, 0]]), ValueError, r"must be finite, got inf at entry \(0, 1\)"),
    (np.array([[0, -1.0], [-1.0, 0]]), ValueError, r"must be >= 0 .* got -1.0 at entry \(0, 1\)"),
    (np.array([[0, 1j], [1j, 0]]), TypeError, "real entries"),
    (nx.Graph(), ValueError, "empty networkx graph"),
])
def test_bad_inputs(x, exc, match):
    with pytest.raises(exc, match=match):
        adjacency(x)


def test_symmetrize_must_be_bool():
    with pytest.raises(TypeError, match="symmetrize must be a bool"):
        adjacency(np.eye(2), symmetrize="yes")
