"""verify/problems.py: deterministic generators and graph invariants."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from scipy.sparse.csgraph import connected_components

from verify import problems as P


def _edges(a: sp.csr_matrix) -> int:
    return a.nnz // 2


def _assert_simple_undirected(a, n):
    assert sp.isspmatrix_csr(a) or isinstance(a, sp.csr_array)
    assert a.shape == (n, n)
    assert (a != a.T).nnz == 0, "not symmetric"
    assert np.all(a.diagonal() == 0), "self-loops"
    assert np.all(a.data == 1.0), "weights other than 1 (or explicit zeros)"


def test_qkv_deterministic_shapes_and_norms():
    a = P.qkv(9, 4, 3, batch=(2, 3), norm=2.5, seed=7)
    b = P.qkv(9, 4, 3, batch=(2, 3), norm=2.5, seed=7)
    c = P.qkv(9, 4, 3, batch=(2, 3), norm=2.5, seed=8)
    for x, y, z in zip(a, b, c):
        assert np.array_equal(x, y)
        assert not np.allclose(x, z)
    q, k, v = a
    assert q.shape == k.shape == (2, 3, 9, 4) and v.shape == (2, 3, 9, 3)
    np.testing.assert_allclose(np.linalg.norm(q, axis=-1), 2.5, rtol=1e-14)
    np.testing.assert_allclose(np.linalg.norm(k, axis=-1), 2.5, rtol=1e-14)
    assert not np.allclose(q, k)  # independent draws
    with pytest.raises(ValueError, match="n must be >= 1"):
        P.qkv(0)


@pytest.mark.parametrize("n, d_qk, d, batch, norm", [(9, 4, 3, (2, 3), 2.5), (300, 16, 16, (), 1.0),
                                                   (64, 32, 32, (4,), 1.0), (1, 1, 1, (), 0.3), (257, 7, 5, (), 1e3)])
def test_qkv_is_bit_identical_to_its_formula(n, d_qk, d, batch, norm):
    """qkv normalises in place (the scale problems draw it at N = 2^20) but must give exactly
    norm * x / np.linalg.norm(x, axis=-1, keepdims=True) on the same draws: every equivalence
    problem, and every figure drawn from one, depends on these bits."""
    rng = P.rng_for(11, 1)
    x1, x2 = rng.standard_normal((*batch, n, d_qk)), rng.standard_normal((*batch, n, d_qk))
    want = (norm * x1 / np.linalg.norm(x1, axis=-1, keepdims=True),
            norm * x2 / np.linalg.norm(x2, axis=-1, keepdims=True), rng.standard_normal((*batch, n, d)))
    got = P.qkv(n, d_qk, d, batch=batch, norm=norm, seed=11)
    for w, g in zip(want, got):
        assert g.dtype == w.dtype == np.float64 and g.shape == w.shape and g.flags.c_contiguous
        assert g.tobytes() == w.tobytes()


def test_rng_for_is_independent_of_global_state():
    np.random.seed(1)
    a = P.rng_for(3, 1).standard_normal(4)
    np.random.seed(2)
    b = P.rng_for(3, 1).standard_normal(4)
    assert np.array_equal(a, b)
    assert not np.allclose(a, P.rng_for(3, 2).standard_normal(4))  # the salt matters
    assert not np.allclose(a, P.rng_for(4, 1).standard_normal(4))


@pytest.mark.parametrize("n", [1, 2, 10])
def test_path_graph(n):
    a = P.path_graph(n)
    _assert_simple_undirected(a, n)
    assert _edges(a) == n - 1
    for i in range(n - 1):
        assert a[i, i + 1] == 1


@pytest.mark.parametrize("shape", [(5,), (3, 4), (1, 6), (2, 3, 4)])
def test_grid_graph_edge_count(shape):
    a = P.grid_graph(shape)
    n = int(np.prod(shape))
    _assert_simple_undirected(a, n)
    # along each axis: (n_axis - 1) * (product of the other sides) edges
    expected = sum((s - 1) * n // s for s in shape)
    assert _edges(a) == expected
    degrees = np.asarray(a.sum(axis=1)).ravel()
    assert degrees.max() <= 2 * len(shape)
    if len(shape) == 2 and min(shape) > 1:  # row-major order: node (0, 1) is 1, node (1, 0) is n_2
        assert a[0, 1] == 1 and a[0, shape[1]] == 1 and a[shape[1] - 1, shape[1]] == 0


def test_grid_graph_rejects_bad_shapes():
    for shape in ((), (0, 3), (-1,)):
        with pytest.raises(ValueError, match="grid shape"):
            P.grid_graph(shape)


@pytest.mark.parametrize("make", [lambda n: P.random_tree(n, seed=3), P.complete_binary_tree], ids=["random", "binary"])
@pytest.mark.parametrize("n", [1, 2, 17, 64])
def test_trees_have_n_minus_1_edges_and_are_connected(make, n):
    a = make(n)
    _assert_simple_undirected(a, n)
    assert _edges(a) == n - 1
    assert connected_components(a, directed=False)[0] == 1


def test_random_tree_deterministic():
    assert (P.random_tree(40, seed=1) != P.random_tree(40, seed=1)).nnz == 0
    assert (P.random_tree(40, seed=1) != P.random_tree(40, seed=2)).nnz > 0


@pytest.mark.parametrize("k", [0, 1, 3, 5])
def test_hypercube(k):
    a = P.hypercube(k)
    n = 2**k
    _assert_simple_undirected(a, n)
    assert _edges(a) == k * 2**k // 2  # k 2^(k-1)
    degrees = np.asarray(a.sum(axis=1)).ravel()
    assert np.all(degrees == k)
    rows, cols = a.nonzero()
    assert all(bin(int(i) ^ int(j)).count("1") == 1 for i, j in zip(rows, cols))


def test_erdos_renyi_and_knn_deterministic_and_simple():
    for make in (lambda s: P.erdos_renyi(60, 0.1, seed=s), lambda s: P.knn_graph(60, k=4, seed=s)):
        a, b, c = make(1), make(1), make(2)
        _assert_simple_undirected(a, 60)
        assert (a != b).nnz == 0
        assert (a != c).nnz > 0
    degrees = np.asarray(P.knn_graph(60, k=4, seed=0).sum(axis=1)).ravel()
    assert degrees.min() >= 4  # every node keeps its k nearest neighbours after symmetrising


@pytest.mark.parametrize("name", sorted(P.GRAPHS))
def test_graph_families_registry(name):
    a = P.GRAPHS[name](64, seed=0)
    _assert_simple_undirected(a, a.shape[0])
    assert a.shape[0] == 64  # 64 = 8^2 = 4^3 = 2^6: every family hits it exactly
    assert (P.GRAPHS[name](64, seed=0) != a).nnz == 0


@pytest.mark.parametrize("make", [P.path_graph, P.complete_binary_tree, lambda n: P.random_tree(n, seed=0),
                                  lambda n: P.erdos_renyi(n, 0.5, seed=0), lambda n: P.grid_graph((n,))],
                         ids=["path", "binary-tree", "random-tree", "erdos-renyi", "grid"])
def test_single_node_graphs(make):
    a = make(1)
    assert a.shape == (1, 1) and a.nnz == 0


def test_knn_graph_single_node():
    a = P.knn_graph(1)
    assert a.shape == (1, 1) and a.nnz == 0


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 6, 7, 12, 64, 101])
def test_random_regular_is_simple_and_regular(n):
    a = P.random_regular(n, 4, seed=0)
    _assert_simple_undirected(a, n)
    degrees = np.diff(a.indptr)
    assert np.all(degrees == min(4, n - 1))  # K_n when n <= degree
    assert (P.random_regular(n, 4, seed=0) != a).nnz == 0


def test_random_regular_seeds_degrees_and_parity():
    a, b = P.random_regular(200, 4, seed=1), P.random_regular(200, 4, seed=2)
    assert (a != b).nnz > 0
    c = P.random_regular(200, 3, seed=1)
    _assert_simple_undirected(c, 200)
    assert np.all(np.diff(c.indptr) == 3)
    assert P.random_regular(5, 0).nnz == 0
    with pytest.raises(ValueError, match="needs n \\* degree even, got 15"):
        P.random_regular(5, 3)
    with pytest.raises(ValueError, match="n >= 1"):
        P.random_regular(0, 4)
    # not always the same few graphs: 50 seeds on 8 nodes give many distinct 4-regular graphs
    shapes = {P.random_regular(8, 4, seed=s).toarray().tobytes() for s in range(50)}
    assert len(shapes) > 10


def test_karate_graph_is_the_club_then_tiles():
    import networkx as nx

    club = nx.to_scipy_sparse_array(nx.karate_club_graph(), nodelist=range(34), weight=None).toarray()
    a = P.karate_graph(34)
    _assert_simple_undirected(a, 34)
    np.testing.assert_array_equal(a.toarray(), club)
    assert connected_components(a, directed=False)[0] == 1
    for n in (1, 5, 33, 35, 40, 68, 100):
        a = P.karate_graph(n)
        _assert_simple_undirected(a, n)
        dense = a.toarray()
        copies, rest = divmod(n, 34)
        for c in range(copies):
            s = slice(34 * c, 34 * (c + 1))
            np.testing.assert_array_equal(dense[s, s], club)
        tail = slice(34 * copies, n)
        np.testing.assert_array_equal(dense[tail, tail], club[:rest, :rest])
        blocks = np.arange(n) // 34
        assert not dense[blocks[:, None] != blocks[None, :]].any()  # no edge between copies
        if n > 34:
            assert connected_components(a, directed=False)[0] >= 2
    with pytest.raises(ValueError, match="n >= 1"):
        P.karate_graph(0)


def test_knn4_entry_and_new_families_registered():
    assert {"regular", "karate", "knn4"} <= set(P.GRAPHS)
    assert (P.GRAPHS["knn4"](50, seed=3) != P.knn_graph(50, k=4, seed=3)).nnz == 0
    assert (P.GRAPHS["knn"](50, seed=3) != P.knn_graph(50, seed=3)).nnz == 0  # the k = 8 entry is unchanged
    assert (P.GRAPHS["regular"](30, seed=2) != P.random_regular(30, 4, seed=2)).nnz == 0
    for name in ("regular", "karate", "knn4"):
        for n in (1, 2, 3, 37):
            assert P.GRAPHS[name](n, seed=0).shape == (n, n)
